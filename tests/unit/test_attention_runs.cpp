// attention_logits_runs / attention_visible_runs: the lockstep forms of the policy path's
// attention read the rows every run's cache holds alike once for all runs, and must give each run
// exactly the bits of the single-run ops (both on the AVX2 and on the portable kernels); a run
// whose visible set is given gets its logits at those columns only.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/common/error.h"
#include "tests/support/backend_checks.h"
#include "tests/support/random_values.h"

using namespace kvlens;
using kvlens::test::make_f32;
using kvlens::test::make_u8;
using kvlens::test::random_values;
using kvlens::test::read_f32;
using kvlens::test::read_u8;

namespace {

constexpr int64_t kHeads = 4, kGroups = 2, kCapacity = 300, kRuns = 3;

// The masks' kinds: half the columns at random (the CPU backend computes such a run's logits
// over spans of columns its heads see), one in twenty (at those columns only), and the first 4
// and the last 40 columns (spans with a gap between them).
enum class MaskKind { Half, Sparse, SinksAndRecent };

// Three runs' caches: rows [0, shared) equal in all of them (the common prompt), the rest each
// run's own; a mask of the kind per run.
struct Runs {
  std::vector<DeviceTensor> k, v, q, logits, out, probs, visible;
};

Runs make_runs(Backend& backend, int64_t shared, int64_t cols, int64_t dim, MaskKind kind) {
  Runs runs;
  const std::vector<float> common_k = random_values(size_t(kGroups * kCapacity * dim), 11);
  const std::vector<float> common_v = random_values(size_t(kGroups * kCapacity * dim), 12);
  std::mt19937 rng(13);
  for (int64_t r = 0; r < kRuns; ++r) {
    std::vector<float> k = random_values(common_k.size(), uint32_t(20 + r));
    std::vector<float> v = random_values(common_v.size(), uint32_t(30 + r));
    for (int64_t g = 0; g < kGroups; ++g)
      for (int64_t j = 0; j < shared * dim; ++j) {
        const size_t at = size_t(g * kCapacity * dim + j);
        k[at] = common_k[at];
        v[at] = common_v[at];
      }
    runs.k.push_back(make_f32(backend, k, {kGroups, kCapacity, dim}));
    runs.v.push_back(make_f32(backend, v, {kGroups, kCapacity, dim}));
    runs.q.push_back(
        make_f32(backend, random_values(size_t(kHeads * dim), uint32_t(40 + r)), {1, kHeads, dim}));
    runs.logits.push_back(backend.alloc(DType::F32, {kHeads, kCapacity}));
    runs.out.push_back(backend.alloc(DType::F32, {1, kHeads, dim}));
    runs.probs.push_back(backend.alloc(DType::F32, {kHeads, kCapacity}));
    std::vector<uint8_t> mask(size_t(kHeads * kCapacity), 0);
    for (int64_t h = 0; h < kHeads; ++h)
      for (int64_t j = 0; j < cols; ++j) {
        const bool shown = kind == MaskKind::Half     ? rng() % 2 == 0
                           : kind == MaskKind::Sparse ? rng() % 20 == 0
                                                      : j < 4 || j >= cols - 40;
        mask[size_t(h * kCapacity + j)] = uint8_t(shown);
      }
    runs.visible.push_back(make_u8(backend, mask, {kHeads, kCapacity}));
  }
  return runs;
}

void check_runs_equal_single(Backend& backend, int64_t shared, int64_t position, int64_t window,
                             int64_t dim = 40, MaskKind kind = MaskKind::Half) {
  const int64_t cols = position + 1;
  Runs together = make_runs(backend, shared, cols, dim, kind);
  Runs alone = make_runs(backend, shared, cols, dim, kind);
  // Run 0 dense without probs, run 1 masked with probs, run 2 masked without probs.
  auto item = [](Runs& runs, int64_t r) {
    Backend::RunAttention a;
    a.q = &runs.q[size_t(r)];
    a.k_cache = &runs.k[size_t(r)];
    a.v_cache = &runs.v[size_t(r)];
    a.logits = &runs.logits[size_t(r)];
    a.visible = r == 0 ? nullptr : &runs.visible[size_t(r)];
    a.out = &runs.out[size_t(r)];
    a.probs = r == 1 ? &runs.probs[size_t(r)] : nullptr;
    return a;
  };
  std::vector<Backend::RunAttention> items;
  for (int64_t r = 0; r < kRuns; ++r) items.push_back(item(together, r));
  backend.attention_logits_runs(items, shared, position, window);
  backend.attention_visible_runs(items, shared, cols);
  for (int64_t r = 0; r < kRuns; ++r) {
    const Backend::RunAttention a = item(alone, r);
    backend.attention_logits(*a.q, *a.k_cache, position, window, *a.logits);
    backend.attention_visible(*a.logits, cols, a.visible, *a.v_cache, *a.out, a.probs);
    INFO("run " << r << ", shared " << shared << ", position " << position << ", window " << window
                << ", head_dim " << dim << ", mask kind " << int(kind));
    // A masked run's logits are computed at its visible columns only (backend.h): those, and
    // the -inf before the window, are the single-run op's bits.
    const std::vector<float> got = read_f32(backend, together.logits[size_t(r)]);
    const std::vector<float> want = read_f32(backend, alone.logits[size_t(r)]);
    const std::vector<uint8_t> shown = read_u8(backend, together.visible[size_t(r)]);
    const int64_t lo = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
    for (int64_t h = 0; h < kHeads; ++h) {
      std::vector<float> got_seen, want_seen;
      for (int64_t j = 0; j < cols; ++j) {
        const size_t at = size_t(h * kCapacity + j);
        if (r > 0 && j >= lo && shown[at] == 0) continue;
        got_seen.push_back(got[at]);
        want_seen.push_back(want[at]);
      }
      // (a sparse mask may leave a head nothing: no memcmp of empty vectors' null data)
      CHECK((got_seen.empty() ||
             std::memcmp(got_seen.data(), want_seen.data(), got_seen.size() * sizeof(float)) == 0));
    }
    CHECK(read_f32(backend, together.out[size_t(r)]) == read_f32(backend, alone.out[size_t(r)]));
    if (r == 1)
      CHECK(read_f32(backend, together.probs[size_t(r)]) ==
            read_f32(backend, alone.probs[size_t(r)]));
  }
}

}  // namespace

TEST_CASE("attention ops over several runs give each run's single-run bits", "[policy_ops]") {
  for (const bool simd : {true, false}) {
    auto backend = make_cpu_backend(CpuBackendOptions{.threads = 2, .allow_simd = simd});
    INFO((simd ? "simd" : "portable"));
    // Common prompts of 0, 7 (inside the first block), 200 (several blocks, not a multiple of 8)
    // and every row but the current one; windows that cut the common rows or start past them.
    for (const int64_t shared : {0, 7, 200, 259}) check_runs_equal_single(*backend, shared, 259, 0);
    check_runs_equal_single(*backend, 200, 259, 100);
    check_runs_equal_single(*backend, 200, 259, 50);
    check_runs_equal_single(*backend, 3, 4, 0);
    // head_dim 32: the AVX-512 set's rows kernel sums the common rows' values for all runs at
    // once; sparse masks: logits at the visible columns; sinks and recent: spans with a gap, one
    // of them across the end of the common rows.
    for (const MaskKind kind : {MaskKind::Half, MaskKind::Sparse, MaskKind::SinksAndRecent}) {
      for (const int64_t dim : {int64_t(32), int64_t(40)}) {
        check_runs_equal_single(*backend, 200, 259, 0, dim, kind);
        check_runs_equal_single(*backend, 230, 259, 0, dim, kind);
        check_runs_equal_single(*backend, 200, 259, 50, dim, kind);
      }
    }
  }
}

TEST_CASE("attention ops over several runs: bad arguments are clear errors", "[policy_ops]") {
  auto backend = make_cpu_backend(2);
  constexpr int64_t kDim = 40;
  Runs runs = make_runs(*backend, 10, 20, kDim, MaskKind::Half);
  Backend::RunAttention a;
  a.q = &runs.q[0];
  a.k_cache = &runs.k[0];
  a.v_cache = &runs.v[0];
  a.logits = &runs.logits[0];
  a.out = &runs.out[0];
  std::vector<Backend::RunAttention> items = {a};
  // More common rows than the position (the current token's row is never common).
  CHECK_THROWS_AS(backend->attention_logits_runs(items, 21, 20, 0), Error);
  CHECK_THROWS_AS(backend->attention_visible_runs(items, 22, 21), Error);
  // Runs of different shapes.
  DeviceTensor other_k = backend->alloc(DType::F32, {1, kCapacity, kDim});
  Backend::RunAttention b = a;
  b.k_cache = &other_k;
  items = {a, b};
  CHECK_THROWS_AS(backend->attention_logits_runs(items, 0, 20, 0), Error);
  // A missing output.
  Backend::RunAttention c = a;
  c.out = nullptr;
  items = {c};
  CHECK_THROWS_AS(backend->attention_visible_runs(items, 0, 21), Error);
}
