// Op extensions (engine/backend/op_extension.h): one instance per backend object, made once even
// when asked for from several threads at once, and an error naming the extension and the backend
// where none is registered; the policies' extensions on the CPU backend register on first use.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/op_extension.h"
#include "engine/common/error.h"
#include "engine/policy/approx_logit_ops.h"
#include "engine/policy/keydiff_ops.h"
#include "engine/policy/quest_ops.h"
#include "engine/policy/tokenfilter_ops.h"

using namespace kvlens;

namespace {

// An extension that counts its instances, and one registered nowhere.
struct Counting : OpExtension {
  static constexpr std::string_view kExtensionName = "test-counting";
  explicit Counting(Backend& b) : backend(&b) {}
  Backend* backend;
};
struct Missing : OpExtension {
  static constexpr std::string_view kExtensionName = "no-such-extension";
};

std::atomic<int> made{0};

}  // namespace

TEST_CASE("op extensions: made once per backend object, errors name the extension and backend",
          "[op_extension]") {
  register_op_extension(Counting::kExtensionName, "cpu", [](Backend& b) {
    ++made;
    return std::make_unique<Counting>(b);
  });
  CHECK(has_op_extension("test-counting", "cpu"));
  CHECK_FALSE(has_op_extension("test-counting", "cuda"));
  const auto a = make_cpu_backend(1), b = make_cpu_backend(1);
  made = 0;
  // Concurrent first calls on one backend: one instance, the same for every caller.
  std::vector<Counting*> seen(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < seen.size(); ++i)
    threads.emplace_back([&, i] { seen[i] = &a->extension<Counting>(); });
  for (std::thread& thread : threads) thread.join();
  CHECK(made == 1);
  CHECK(std::all_of(seen.begin(), seen.end(), [&](Counting* c) { return c == seen[0]; }));
  CHECK(seen[0]->backend == a.get());
  // Another backend object: its own instance.
  Counting& other = b->extension<Counting>();
  CHECK(made == 2);
  CHECK(&other != seen[0]);
  CHECK(other.backend == b.get());
  CHECK(&b->extension<Counting>() == &other);
  // None registered: kvlens::Error naming both.
  try {
    (void)a->extension<Missing>();
    FAIL("no error");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK(message.find("no-such-extension") != std::string::npos);
    CHECK(message.find("'cpu'") != std::string::npos);
  }
}

TEST_CASE("op extensions: the policies' CPU implementations register on their first use",
          "[op_extension]") {
  const auto a = make_cpu_backend(1), b = make_cpu_backend(1);
  // keydiff_ops, quest_ops and tokenfilter_ops register the CPU implementation once, then the
  // backend hands out its one instance (backend.extension<T>() gives the same afterwards).
  KeyDiffOps& keydiff = keydiff_ops(*a);
  CHECK(&keydiff == &keydiff_ops(*a));
  CHECK(&keydiff == &a->extension<KeyDiffOps>());
  QuestOps& quest = quest_ops(*a);
  CHECK(&quest == &a->extension<QuestOps>());
  TokenFilterOps& filter = tokenfilter_ops(*b);
  CHECK(&filter == &b->extension<TokenFilterOps>());
  CHECK(&filter != &tokenfilter_ops(*a));
  approx_logit_ops(*a);
  for (const char* name : {"keydiff", "quest", "tokenfilter", "approx_logits"})
    CHECK(has_op_extension(name, "cpu"));
}
