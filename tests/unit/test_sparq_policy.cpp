// sparq (docs/policies/sparq.md) on hand-made queries and keys: the channels each KV group keeps,
// the authors' temperature, the approximate logits as the policy's scores and the top-B(t) set
// by them, worked out by hand below; the channels knob's checks; then a real decode on the demo
// model, in lockstep with dense, against the recorded true logits.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/policy/registry.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/chosen_split.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"

using namespace kvlens;
using kvlens::test::Harness;

namespace {

// Group 0 (heads 0, 1): sum of |q_c| = (1, 7, 1.5, 3), so 2 channels keep {1, 3}; both heads
// cover 0.8 of their L1 (6 of 7.5, 4 of 5): scale 1 / sqrt(4 * 0.8). Group 1 (heads 2, 3): sums
// (2, 0, 0, 1): channels {0, 3}, coverage 1: scale 1 / 2.
void set_example(Harness& h) {
  h.set_q({{1, -4, 0.5f, 2}, {0, 3, 1, -1}, {2, 0, 0, 0}, {0, 0, 0, -1}});
  h.set_keys({{{1, 1, 1, 1}, {0, -1, 0, 2}, {5, 0, 5, 0}, {0, 1, 0, 0}},
              {{1, 0, 0, 0}, {-1, 0, 0, 0}, {0, 0, 0, -3}, {0, 0, 0, 0}}});
  h.set_logits(std::vector<float>{0, 0, 0, 0});  // never read
}

}  // namespace

TEST_CASE("sparq: approximate logits from the group's largest query channels, then top-B(t)",
          "[policy]") {
  Harness h;
  set_example(h);
  auto policy = h.make("sparq", 0.0, {"sinks=0", "budget_tokens=3", "channels=2"});
  REQUIRE_FALSE(policy->reads_logits(h.step(3, 1)));
  const auto sets = h.run(*policy, 3);
  CHECK(h.last_decision == LayerDecision::Masked);
  const float s01 = float(1.0 / std::sqrt(3.2));
  // Head 0: q[1,3] = (-4, 2) against keys' channels 1, 3: (1, 1), (-1, 2), (0, 0), (1, 0).
  const std::vector<float> head0 = h.score_row(0, 3);
  CHECK(head0[0] == Approx(-2 * s01));
  CHECK(head0[1] == Approx(8 * s01));
  CHECK(head0[2] == Approx(0.0f).margin(1e-7));
  CHECK(head0[3] == Approx(-4 * s01));
  const std::vector<float> head1 = h.score_row(1, 3);  // q[1,3] = (3, -1)
  CHECK(head1[0] == Approx(2 * s01));
  CHECK(head1[1] == Approx(-5 * s01));
  CHECK(head1[3] == Approx(3 * s01));
  const std::vector<float> head3 = h.score_row(3, 3);  // q[0,3] = (0, -1), scale 1/2
  CHECK(head3[2] == Approx(1.5f));
  // B = 3: the current token 3 and the two best of 0..2 by the approximate logits (head 3: 0 and
  // 1 tie at 0, the later token wins). Head 0's true logit of token 2 (7.5 / 2) would have kept it
  // over token 1; the approximation did not see channel 0.
  CHECK(sets[0] == std::set<int64_t>{1, 2, 3});
  CHECK(sets[1] == std::set<int64_t>{0, 2, 3});
  CHECK(sets[2] == std::set<int64_t>{0, 2, 3});
  CHECK(sets[3] == std::set<int64_t>{1, 2, 3});
}

TEST_CASE("sparq: every channel gives the true logits, one channel keeps the lower of equals",
          "[policy]") {
  Harness h;
  set_example(h);
  SECTION("channels = D") {
    auto policy = h.make("sparq", 0.5, {"sinks=0", "channels=4"});
    h.run(*policy, 3);
    // Head 2's query (2, 0, 0, 0): true logits 2 * k_c0 / 2.
    const std::vector<float> head2 = h.score_row(2, 3);
    CHECK(head2 == std::vector<float>{1, -1, 0, 0});
    const std::vector<float> head0 = h.score_row(0, 3);  // (1 - 4 + 0.5 + 2) / 2 for key 0
    CHECK(head0[0] == Approx(-0.25f));
    CHECK(head0[2] == Approx(3.75f));
  }
  SECTION("a fraction of head_dim, rounded up") {
    // 0.2 of 4 -> 1 channel: group 1's sums (2, 0, 0, 1) keep channel 0 only, head 3's query
    // is 0 there: every logit 0 (a scale of 1 / sqrt(4 * 0) would make them NaN).
    auto policy = h.make("sparq", 0.5, {"sinks=0", "channels=0.2"});
    h.run(*policy, 3);
    for (const float s : h.score_row(3, 3)) CHECK(s == 0.0f);
  }
  SECTION("equal magnitudes keep the lower channel") {
    h.set_q({{1, 1, 1, 1}, {1, 1, 1, 1}, {0, 0, 1, 1}, {0, 0, 1, 1}});
    auto policy = h.make("sparq", 0.5, {"sinks=0", "channels=1"});
    h.run(*policy, 3);
    // Group 0 keeps channel 0: head 0's logits are key channel 0 / sqrt(4 * 1/4) = key[0].
    CHECK(h.score_row(0, 3) == std::vector<float>{1, 0, 5, 0});
    // Group 1 keeps channel 2: every key of group 1 is 0 there.
    CHECK(h.score_row(2, 3) == std::vector<float>{0, 0, 0, 0});
  }
}

TEST_CASE("sparq: the channels knob is checked against head_dim", "[policy]") {
  Harness h;  // head_dim 4
  for (const char* bad : {"channels=0", "channels=1.5", "channels=5"}) {
    INFO(bad);
    CHECK_THROWS_WITH(h.make("sparq", 0.5, {bad}),
                      Catch::Contains("policy sparq: channels: expected a fraction of head_dim") &&
                          Catch::Contains("(head_dim 4)"));
  }
  CHECK_NOTHROW(h.make("sparq", 0.5, {"channels=4"}));
  CHECK(policy_info("sparq").predicts_logits);
}

TEST_CASE("sparq in a real decode: scores on the true logits' scale, the top-B(t) of them",
          "[policy]") {
  auto backend = make_cpu_backend(2);
  const auto model = upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 30; ++i) tokens.push_back((i * 37 + 11) % 300 + 3);
  const std::vector<std::string> common = {"budget_tokens=9", "sinks=0", "dense_layers=0"};
  std::vector<std::string> full = common, part = common;
  full.push_back("channels=32");  // every channel of the demo model's heads
  part.push_back("channels=0.125");
  TraceRecorder recorder(model, nullptr, tokens,
                         {{"dense", 0.0, {}}, {"sparq", 0.0, full}, {"sparq", 0.0, part}});
  while (recorder.step()) {
  }
  const Trace& trace = recorder.trace();
  const int64_t layers = int64_t(trace.steps()[0][1].decisions.size());
  const int64_t heads = int64_t(trace.steps()[0][1].visible_counts.size()) / layers;
  double worst_gap = 0.0;
  int64_t misses = 0;
  for (int64_t t = 9; t < trace.step_count(); ++t) {
    for (int64_t layer = 0; layer < layers; ++layer) {
      for (int64_t head = 0; head < heads; ++head) {
        INFO("step " << t << " layer " << layer << " head " << head);
        // Every channel: the scores are the true logits (to rounding).
        const HeadRow truth = head_row_at(trace, 1, t, layer, head, HeadQuantity::Logits);
        const HeadRow exact = head_row_at(trace, 1, t, layer, head, HeadQuantity::Scores);
        REQUIRE(truth.kept);
        REQUIRE(exact.kept);
        for (int64_t j = 0; j <= t; ++j)
          if (exact.visible[size_t(j)])
            worst_gap = std::max(worst_gap, std::abs(double(exact.values[size_t(j)]) -
                                                     double(truth.values[size_t(j)])));
        // Part of the channels: B(t) tokens, the current one and the best of the rest by the
        // recorded approximate logits.
        const HeadRow approx = head_row_at(trace, 2, t, layer, head, HeadQuantity::Scores);
        REQUIRE(approx.kept);
        CHECK(std::count(approx.visible.begin(), approx.visible.end(), uint8_t(1)) == 9);
        CHECK(approx.visible[size_t(t)] == 1);
        const test::ChosenSplit split = test::chosen_split(approx, t);
        CHECK(split.highest_left <= split.lowest_chosen);
        misses += std::isfinite(split.highest_left) ? 0 : 1;
      }
    }
  }
  CHECK(worst_gap < 1e-4);
  CHECK(misses == 0);
}
