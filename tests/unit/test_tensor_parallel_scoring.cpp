// Scoring and evaluation over a tensor-parallel group (lead_tensor_parallel, score_tokens_lockstep
// on a lead, the eval's engines): a model split over 2 and 4 CPU ranks scores a text as one
// backend does, its sparsity and hit rate counted over every head, with a policy whose rule sums
// over heads run beside per-head ones.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/eval/eval_workers.h"
#include "engine/session/scoring.h"
#include "engine/session/tensor_parallel_session.h"
#include "tests/support/cpu_rank_group.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

namespace {

std::shared_ptr<const BackendModel> split_model(const std::shared_ptr<const Model>& model,
                                                const test::CpuRankGroup& group) {
  return lead_tensor_parallel(model, upload_tensor_parallel(model, group.pointers));
}

}  // namespace

TEST_CASE("tensor parallel: a text scored on a split model gives one backend's results",
          "[tensor_parallel]") {
  const int ranks = GENERATE(2, 4);
  INFO(ranks << " ranks");
  const auto model = Model::load(test::source_path("assets/models/demo"));
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 40; ++i) tokens.push_back((i * 53 + 7) % 8000 + 10);
  // tova sums over heads (a collective each step): it runs alone beside the lockstep of the rest.
  const std::vector<PolicyConfig> policies = {{"dense", 0.0, {}},
                                              {"h2o", 0.5, {}},
                                              {"tova", 0.5, {}},
                                              {"oracle", 0.7, {}},
                                              {"streaming", 0.5, {}}};
  ScoreOptions options;
  options.hit_rate = true;
  options.prefill = 8;
  options.chunk = 4;
  const auto one = make_cpu_backend(1);
  const std::vector<ScoreResult> want =
      score_tokens_lockstep(upload_model(model, *one), tokens, policies, options);
  const test::CpuRankGroup group(ranks);
  const auto lead = split_model(model, group);
  REQUIRE(lead->tensor_parallel != nullptr);
  REQUIRE(lead->backend == group.pointers.front());
  // tova's pass follows the lockstep's: the progress the caller sees still only grows, to the end.
  std::vector<int64_t> reported;
  options.progress = [&](int64_t done, int64_t total) {
    CHECK(total == int64_t(tokens.size()));
    reported.push_back(done);
  };
  const std::vector<ScoreResult> got = score_tokens_lockstep(lead, tokens, policies, options);
  CHECK(std::is_sorted(reported.begin(), reported.end()));
  REQUIRE(!reported.empty());
  CHECK(reported.back() == int64_t(tokens.size()));
  REQUIRE(got.size() == want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    INFO(policies[r].id);
    CHECK(got[r].argmax == want[r].argmax);
    REQUIRE(got[r].nll.size() == want[r].nll.size());
    // The split sums o_proj and down_proj in another order (test_tensor_parallel.cpp: 1e-4 of the
    // logits' scale); a log-probability moves by at most about that.
    for (size_t i = 0; i < want[r].nll.size(); ++i)
      CHECK(got[r].nll[i] == Approx(want[r].nll[i]).margin(1e-3));
    // The visible sets are the same, so each (layer, head) cell holds the same sum: the joined
    // stats equal one backend's bit for bit, and so do the hit rates' row counts.
    CHECK(got[r].sparsity.steps == want[r].sparsity.steps);
    CHECK(got[r].sparsity.heads == want[r].sparsity.heads);
    CHECK(got[r].sparsity.hidden_sum == want[r].sparsity.hidden_sum);
    CHECK(got[r].hit_rate.rows == want[r].hit_rate.rows);
    CHECK(got[r].hit_rate.sum == Approx(want[r].hit_rate.sum).epsilon(1e-9));
  }
  CHECK(want[1].hit_rate.rows > 0);
  CHECK(want[1].sparsity.heads == model->config.num_heads);
}

TEST_CASE("tensor parallel: an eval's engine may be a split model that takes one task at a time",
          "[tensor_parallel]") {
  const auto model = Model::load(test::source_path("assets/models/demo"));
  // Two threads a rank: a plain engine of two threads runs two tasks at once (the control), a
  // split one must not (its sessions' collectives would pair up across tasks).
  const test::CpuRankGroup first(2, 2), second(2, 2);
  const auto plain_backend = make_cpu_backend(2);
  const bool split = GENERATE(false, true);
  INFO((split ? "split engines" : "plain engine"));
  std::vector<std::shared_ptr<const BackendModel>> engines;
  if (split) {
    engines = {split_model(model, first), split_model(model, second)};
  } else {
    engines = {upload_model(model, *plain_backend)};
  }
  constexpr int64_t kTasks = 12;
  std::vector<int64_t> ran(kTasks, 0);
  std::vector<std::atomic<int>> in_flight(engines.size());
  std::atomic<int> most{0};
  run_on_engines(engines, kTasks, true, [&](size_t engine, int64_t task) {
    const int now = ++in_flight[engine];
    for (int seen = most.load(); now > seen && !most.compare_exchange_weak(seen, now);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ++ran[size_t(task)];
    --in_flight[engine];
  });
  CHECK(ran == std::vector<int64_t>(kTasks, 1));
  CHECK((most.load() == 1) == split);
}
