// rocketkv (docs/policies/rocketkv.md) on hand-made queries and keys: the budget split after the
// authors' get_params_for_token_budget, stage 2's sign-chosen page estimate and top-B(t), stage
// 1's permanent eviction taking tokens out of stage 2's reach; then a real decode on the demo
// model whose recorded scores and sets are checked against stage 2's rule.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/registry.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"

using namespace kvlens;
using kvlens::test::Harness;

TEST_CASE("rocketkv: the budget split follows get_params_for_token_budget", "[policy]") {
  // rho = 2: alpha = 0.26, C = 2^-0.26 = 0.835 of the tokens, rho2 = 1.67: pages of 1,
  // r = round(32 / 1.67) = 19.
  const RocketkvSplit half = rocketkv_split(0.5, 32);
  CHECK(half.stage1_sparsity == Approx(1.0 - std::pow(2.0, -0.26)));
  CHECK(half.page_size == 1);
  CHECK(half.channels == 19);
  // rho = 10: alpha = 0.2 + 0.06 log2 10 = 0.399, rho2 = 10^0.601 = 3.99: pages of
  // min(3, 2) = 2, r = round(32 * 2 / 3.99) = 16.
  const RocketkvSplit tenth = rocketkv_split(0.9, 32);
  CHECK(tenth.stage1_sparsity == Approx(1.0 - std::pow(10.0, -(0.2 + 0.06 * std::log2(10.0)))));
  CHECK(tenth.page_size == 2);
  CHECK(tenth.channels == 16);
  const RocketkvSplit dense = rocketkv_split(0.0, 32);
  CHECK(dense.stage1_sparsity == 0.0);
  CHECK(dense.page_size == 1);
  CHECK(dense.channels == 32);
}

TEST_CASE("rocketkv: stage 2 ranks stage 1's kept tokens by the sign-chosen page estimate",
          "[policy]") {
  Harness h;
  // Group 0 (heads 0, 1): summed |q| (1, 7, 1.5, 3) keeps channels {1, 3}; summed q is -1 on
  // channel 1 (page minimum) and +1 on channel 3 (page maximum); scale 1 / sqrt(4 * 0.8).
  // Group 1 (heads 2, 3): channels {0, 3}, summed q +2 (maximum) and -1 (minimum); scale 1 / 2.
  h.set_q({{1, -4, 0.5f, 2}, {0, 3, 1, -1}, {2, 0, 0, 0}, {0, 0, 0, -1}});
  // Pages of 2: {0, 1}, {2, 3}, {4, 5}, {6}.
  h.set_keys({{{1, 1, 1, 9},
               {0, -1, 0, 2},
               {5, 0, 5, 0},
               {0, 1, 0, 0},
               {0, 2, 0, -1},
               {0, -2, 0, 1},
               {0, 0, 0, 0}},
              {{1, 0, 0, 0},
               {-1, 0, 0, 0},
               {0, 0, 0, -3},
               {0, 0, 0, 0},
               {2, 0, 0, 0},
               {0, 0, 0, 1},
               {0, 0, 0, 0}}});
  // s = 0.5: B(t) = ceil((t + 1) / 2); stage 1 keeps ceil(0.835 (t + 1)), every token up to t = 5
  // and 6 of 7 at t = 6. Stage 1 scores by the previous step's attention alone (w = 1, no
  // pooling, only the current token protected).
  auto policy = h.make("rocketkv", 0.5,
                       {"sinks=0", "dense_layers=0", "page_size=2", "channels=2", "obs_window=1",
                        "pool_kernel=1", "protect_window=false"});
  REQUIRE_FALSE(policy->reads_logits(h.step(0, 0)));
  CHECK(policy_info("rocketkv").predicts_logits);
  std::vector<std::set<int64_t>> sets;
  for (int64_t t = 0; t <= 5; ++t) {
    h.set_logits(std::vector<float>(size_t(t + 1), 0.0f));
    sets = h.run(*policy, t, 0);
  }
  const float s01 = float(1.0 / std::sqrt(3.2));
  // Head 0 = (-4 min_c1 + 2 max_c3) s01: page {0, 1}: (4 + 18) s01, {2, 3}: 0, {4, 5}: 10 s01.
  const std::vector<float> head0 = h.score_row(0, 5);
  CHECK(head0[0] == Approx(22 * s01));
  CHECK(head0[1] == Approx(22 * s01));
  CHECK(head0[2] == Approx(0.0f).margin(1e-7));
  CHECK(head0[4] == Approx(10 * s01));
  // Head 1 = (3 min_c1 - max_c3) s01: -12 s01, 0, -7 s01.
  CHECK(h.score_row(1, 5)[0] == Approx(-12 * s01));
  CHECK(h.score_row(1, 5)[5] == Approx(-7 * s01));
  // Head 2 = 2 max_c0 / 2: 1, 0, 2. Head 3 = -min_c3 / 2: 0, 1.5, 0.
  CHECK(h.score_row(2, 5) == std::vector<float>{1, 1, 0, 0, 2, 2});
  CHECK(h.score_row(3, 5) == std::vector<float>{0, 0, 1.5f, 1.5f, 0, 0});
  // B(5) = 3: the current token 5 and the two best of 0..4 (ties to the recent).
  CHECK(sets[0] == std::set<int64_t>{0, 1, 5});
  CHECK(sets[1] == std::set<int64_t>{2, 3, 5});
  CHECK(sets[2] == std::set<int64_t>{1, 4, 5});
  CHECK(sets[3] == std::set<int64_t>{2, 3, 5});

  // t = 6: stage 1 drops, per head, the oldest token step 5 gave no attention: 2 for head 0
  // (it saw {0, 1, 5}), 0 for the others. Group 0's new query reads channel 3's maximum (and
  // channel 0's minimum, times 0): page {0, 1} = 9 / 2 ranks first for both heads of the group,
  // but head 1 no longer has token 0.
  h.set_q({{0, 0, 0, 1}, {0, 0, 0, 1}, {2, 0, 0, 0}, {0, 0, 0, -1}});
  h.set_logits(std::vector<float>(7, 0.0f));
  sets = h.run(*policy, 6, 0);
  CHECK(h.score_row(0, 6) == std::vector<float>{4.5f, 4.5f, 0, 0, 0.5f, 0.5f, 0});
  CHECK(h.score_row(1, 6) == h.score_row(0, 6));
  CHECK(sets[0] == std::set<int64_t>{0, 1, 5, 6});
  CHECK(sets[1] == std::set<int64_t>{1, 4, 5, 6});
  CHECK(sets[2] == std::set<int64_t>{1, 4, 5, 6});
  CHECK(sets[3] == std::set<int64_t>{2, 3, 5, 6});
}

TEST_CASE("rocketkv: a fixed token budget is refused, the knobs are checked", "[policy]") {
  Harness h;
  CHECK_THROWS_WITH(h.make("rocketkv", 0.5, {"budget_tokens=4"}),
                    Catch::Contains("policy rocketkv: budget_tokens: expected 0"));
  CHECK_THROWS_WITH(h.make("rocketkv", 0.5, {"channels=5"}),
                    Catch::Contains("policy rocketkv: channels"));
  CHECK_THROWS_WITH(h.make("rocketkv", 0.5, {"pool_kernel=4"}), Catch::Contains("pool_kernel"));
}

TEST_CASE("rocketkv in a real decode: B(t) tokens, the best kept ones by the recorded estimate",
          "[policy]") {
  auto backend = make_cpu_backend(2);
  const auto model = upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 40; ++i) tokens.push_back((i * 37 + 11) % 300 + 3);
  TraceRecorder recorder(
      model, nullptr, tokens,
      {{"dense", 0.0, {}}, {"rocketkv", 0.7, {"sinks=0", "dense_layers=0", "obs_window=4"}}});
  while (recorder.step()) {
  }
  const Trace& trace = recorder.trace();
  const int64_t layers = int64_t(trace.steps()[0][1].decisions.size());
  const int64_t heads = int64_t(trace.steps()[0][1].visible_counts.size()) / layers;
  const int64_t steps = trace.step_count();
  int64_t passed_over = 0;
  for (int64_t layer = 0; layer < layers; ++layer) {
    for (int64_t head = 0; head < heads; ++head) {
      // A token stage 2 passed over for a lower-ranked one was out of reach: stage 1 had
      // evicted it, so it is never visible again.
      std::vector<int64_t> evicted_at(size_t(steps), steps);
      std::vector<int64_t> last_visible(size_t(steps), -1);
      for (int64_t t = 0; t < steps; ++t) {
        INFO("step " << t << " layer " << layer << " head " << head);
        const HeadRow row = head_row_at(trace, 1, t, layer, head, HeadQuantity::Scores);
        REQUIRE(row.kept);
        const int64_t budget = int64_t(std::ceil(0.3 * double(t + 1) - 1e-9));
        CHECK(std::count(row.visible.begin(), row.visible.begin() + t + 1, uint8_t(1)) ==
              std::max<int64_t>(budget, 1));
        CHECK(row.visible[size_t(t)] == 1);
        float lowest_chosen = INFINITY;
        for (int64_t j = 0; j < t; ++j) {
          if (row.visible[size_t(j)]) {
            lowest_chosen = std::min(lowest_chosen, row.values[size_t(j)]);
            last_visible[size_t(j)] = t;
          }
        }
        for (int64_t j = 0; j < t; ++j)
          if (!row.visible[size_t(j)] && row.values[size_t(j)] > lowest_chosen)
            evicted_at[size_t(j)] = std::min(evicted_at[size_t(j)], t);
      }
      for (int64_t j = 0; j < steps; ++j) {
        if (evicted_at[size_t(j)] == steps) continue;
        ++passed_over;
        INFO("layer " << layer << " head " << head << " token " << j);
        CHECK(last_visible[size_t(j)] < evicted_at[size_t(j)]);
      }
    }
  }
  // Stage 1 did evict tokens stage 2 would have ranked in (the check above is not vacuous).
  CHECK(passed_over > 0);
}
