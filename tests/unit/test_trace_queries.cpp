// The views' reads of a trace (engine/eval/trace_queries): head matrices, consensus, predicted vs
// true, retention counts and Spearman, against values computed by hand from small_trace's rules.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/small_trace.h"

using namespace kvlens;

TEST_CASE("spearman ranks with average ties and skips non-finite pairs", "[trace_queries]") {
  const float nan = std::nanf("");
  const float inf = INFINITY;
  CHECK(spearman(std::vector<float>{1, 5, 9, 20}, std::vector<float>{0, 1, 2, 3}) == Approx(1.0));
  CHECK(spearman(std::vector<float>{1, 5, 9, 20}, std::vector<float>{3, 2, 1, 0}) == Approx(-1.0));
  // Ranks x = {1, 2.5, 2.5, 4}, y = {1, 2, 3, 4}: r = 4.5 / sqrt(4.5 * 5).
  CHECK(spearman(std::vector<float>{1, 2, 2, 3, nan, inf}, std::vector<float>{1, 2, 3, 4, 5, 6}) ==
        Approx(4.5 / std::sqrt(4.5 * 5.0)).epsilon(1e-12));
  CHECK(std::isnan(spearman(std::vector<float>{1, nan}, std::vector<float>{1, 2})));
  CHECK(std::isnan(spearman(std::vector<float>{2, 2, 2}, std::vector<float>{1, 2, 3})));
  CHECK_THROWS_AS(spearman(std::vector<float>{1}, std::vector<float>{1, 2}), Error);
}

TEST_CASE("head_matrix lays out steps x tokens with visibility and softmax rows",
          "[trace_queries]") {
  const Trace trace = test::make_small_trace(5);
  const HeadMatrix logits = head_matrix(trace, 1, 1, 1, HeadQuantity::Logits, 3);
  REQUIRE(logits.rows == 4);
  REQUIRE(logits.cols == 4);
  CHECK(logits.missing_rows == 0);
  // Head 3 (layer 1, head 1), run 1: logit = 0.5 c * 4 - 0.25 c = 1.75 c; column 0 is -inf.
  CHECK(std::isnan(logits.values[2 * 4 + 0]));
  CHECK(logits.values[2 * 4 + 1] == 1.75f);
  CHECK(logits.values[2 * 4 + 2] == 3.5f);
  CHECK(std::isnan(logits.values[2 * 4 + 3]));  // after step 2: not a candidate
  CHECK(logits.visible[2 * 4 + 3] == 2);
  // Visible where (c + 3) % 2 == 0 or c == step.
  CHECK(logits.visible[3 * 4 + 0] == 0);
  CHECK(logits.visible[3 * 4 + 1] == 1);
  CHECK(logits.visible[3 * 4 + 2] == 0);
  CHECK(logits.visible[3 * 4 + 3] == 1);

  const HeadMatrix probs = head_matrix(trace, 0, 0, 1, HeadQuantity::Probabilities, 4);
  for (int64_t t = 0; t < probs.rows; ++t) {
    double total = 0;
    for (int64_t c = 0; c <= t; ++c) total += probs.values[size_t(t * probs.cols + c)];
    CHECK(total == Approx(1.0).epsilon(1e-6));  // float rows of at most 5 terms
  }
  // Row 1: logits {0, 1} -> softmax {1 / (1 + e), e / (1 + e)}.
  CHECK(probs.values[1 * 5 + 1] == Approx(std::exp(1.0) / (1 + std::exp(1.0))).epsilon(1e-6));

  const HeadMatrix scores = head_matrix(trace, 1, 0, 0, HeadQuantity::Scores, 2);
  CHECK(std::isnan(scores.values[2 * 3 + 1]));  // layer 0 is dense: no scores

  CHECK_THROWS_AS(head_matrix(trace, 2, 0, 0, HeadQuantity::Logits, 1), Error);
  CHECK_THROWS_AS(head_matrix(trace, 0, 2, 0, HeadQuantity::Logits, 1), Error);
  CHECK_THROWS_AS(head_matrix(trace, 0, 0, 2, HeadQuantity::Logits, 1), Error);
  CHECK_THROWS_AS(head_matrix(trace, 0, 0, 0, HeadQuantity::Logits, 5), Error);
}

TEST_CASE("head_matrix counts the rows a degraded trace did not keep", "[trace_queries]") {
  Trace trace = test::make_small_trace(1);
  trace.memory_budget = trace.row_bytes() + 1;  // the next step goes past it
  trace.selected_heads = {0};
  const Trace full = test::make_small_trace(3);
  trace.add_step(std::vector<StepRecord>(full.steps()[1]));
  trace.add_step(std::vector<StepRecord>(full.steps()[2]));
  REQUIRE(trace.degraded_from_step() == 1);
  const HeadMatrix kept = head_matrix(trace, 0, 0, 0, HeadQuantity::Logits, 2);
  CHECK(kept.missing_rows == 0);
  const HeadMatrix lost = head_matrix(trace, 0, 1, 0, HeadQuantity::Logits, 2);
  CHECK(lost.missing_rows == 2);
  CHECK(lost.visible[2 * 3 + 0] == 2);
  const RetentionCounts counts = retention_counts(trace, 0, 2, -1, -1);
  CHECK_FALSE(counts.known);
}

TEST_CASE("consensus_matrix gives Pearson and Jaccard over the kept heads", "[trace_queries]") {
  const Trace trace = test::make_small_trace(4);
  const ConsensusMatrix pearson = consensus_matrix(trace, 0, 3, ConsensusMetric::Pearson);
  REQUIRE(pearson.heads.size() == 4);
  // Dense rows of heads 0-2 are multiples of c: perfectly correlated.
  CHECK(pearson.values[0 * 4 + 1] == Approx(1.0));
  CHECK(pearson.values[1 * 4 + 2] == Approx(1.0));
  const ConsensusMatrix jaccard = consensus_matrix(trace, 1, 3, ConsensusMetric::Jaccard);
  // Run 1 at step 3: heads 0, 1 see {0..3}; head 2 sees {0, 2, 3}; head 3 sees {1, 3}.
  CHECK(jaccard.values[0 * 4 + 1] == Approx(1.0));
  CHECK(jaccard.values[0 * 4 + 2] == Approx(3.0 / 4.0));
  CHECK(jaccard.values[2 * 4 + 3] == Approx(1.0 / 4.0));
  CHECK(jaccard.values[3 * 4 + 2] == Approx(1.0 / 4.0));
  const double mean = (1.0 + 0.75 + 0.5 + 0.75 + 0.5 + 0.25) / 6.0;
  CHECK(jaccard.mean == Approx(mean));
}

TEST_CASE("predicted_vs_true pairs scores with logits where the policy ranked", "[trace_queries]") {
  const Trace trace = test::make_small_trace(5);
  const PredictedVsTrue dense_layer = predicted_vs_true(trace, 1, 4, 0, 0);
  CHECK(std::isnan(dense_layer.pearson));
  CHECK(std::isnan(dense_layer.accuracy));
  // Layer 1 head 0 (h = 2): scores = logits / 2 + 1, an increasing map.
  const PredictedVsTrue ranked = predicted_vs_true(trace, 1, 4, 1, 0);
  REQUIRE(ranked.scores.size() == 5);
  CHECK(ranked.pearson == Approx(1.0));
  CHECK(ranked.spearman == Approx(1.0));
  CHECK(ranked.accuracy == Approx(1.0));
  const std::vector<double> grid = head_accuracy_grid(trace, 1, 4);
  REQUIRE(grid.size() == 4);
  CHECK(std::isnan(grid[0]));
  CHECK(grid[2] == Approx(1.0));
  CHECK(grid[3] == Approx(1.0));
}

TEST_CASE("retention_counts counts the heads in scope that see each token", "[trace_queries]") {
  const Trace trace = test::make_small_trace(5);
  // Run 1 at step 3: layer 0 heads see {0..3}; head 2 sees {0, 2, 3}; head 3 sees {1, 3}.
  const RetentionCounts all = retention_counts(trace, 1, 3, -1, -1);
  CHECK(all.heads_in_scope == 4);
  CHECK(all.known);
  CHECK(all.seen_by == std::vector<int32_t>{3, 3, 3, 4, -1, -1});
  const RetentionCounts layer = retention_counts(trace, 1, 3, 1, -1);
  CHECK(layer.heads_in_scope == 2);
  CHECK(layer.seen_by == std::vector<int32_t>{1, 1, 1, 2, -1, -1});
  const RetentionCounts head = retention_counts(trace, 1, 3, 1, 1);
  CHECK(head.heads_in_scope == 1);
  CHECK(head.seen_by == std::vector<int32_t>{0, 1, 0, 1, -1, -1});
  CHECK_THROWS_AS(retention_counts(trace, 1, 3, 2, -1), Error);
  CHECK_THROWS_AS(retention_counts(trace, 1, 5, -1, -1), Error);
}

TEST_CASE("answer_predictions compares each answer token with the run's argmax",
          "[trace_queries]") {
  // Answer tokens [4, 6): positions 3 and 4 predict tokens 4 (id 14) and 5 (id 15). Run 1
  // gets the first right (argmax 14 at step 3) and the second wrong (11 at step 4).
  Trace trace = test::make_small_trace(3);
  const Trace full = test::make_small_trace(5);
  for (const int64_t t : {3, 4}) {
    std::vector<StepRecord> records = full.steps()[size_t(t)];
    records[1].argmax = t == 3 ? 14 : 11;
    if (t == 3) {  // step 3's top-k with texts: the prediction's text comes from there
      records[1].top.ids[0] = 14;
      records[1].top.texts = {" A", "<s>"};
    }
    trace.add_step(std::move(records));
  }
  const std::vector<AnswerPrediction> p = answer_predictions(trace, 1);
  REQUIRE(p.size() == 2);
  CHECK(p[0].position == 3);
  CHECK(p[0].truth == 14);
  CHECK(p[0].predicted == 14);
  CHECK(p[0].correct);
  CHECK(p[1].position == 4);
  CHECK(p[1].truth == 15);
  CHECK(p[1].predicted == 11);
  CHECK_FALSE(p[1].correct);
  CHECK(p[0].predicted_text == " A");
  CHECK(p[1].predicted_text.empty());  // step 4's record has no top-k texts
  CHECK(answer_predictions(test::make_small_trace(4), 0).size() == 1);  // step 4 not yet run
  Trace plain = test::make_small_trace(2);
  plain.coref.present = false;
  CHECK(answer_predictions(plain, 0).empty());
}

TEST_CASE("head_matrix pools long texts to a bounded size by block maxima", "[trace_queries]") {
  // 5 steps at most 2 cells a side: blocks of 4 steps x 4 tokens (the smallest power of two).
  const Trace trace = test::make_small_trace(5);
  const HeadMatrix m = head_matrix(trace, 0, 0, 0, HeadQuantity::Logits, 4, 2);
  REQUIRE(m.block == 4);
  REQUIRE(m.rows == 2);
  REQUIRE(m.cols == 2);
  CHECK(m.values[0] == 1.5f);      // steps 0-3, tokens 0-3: the largest is c = 3
  CHECK(std::isnan(m.values[1]));  // steps 0-3, tokens 4-7: none is a candidate yet
  CHECK(m.visible[1] == 2);
  CHECK(m.values[2] == 1.5f);  // step 4, tokens 0-3
  CHECK(m.values[3] == 2.0f);  // step 4, token 4
  CHECK(m.visible[3] == 1);
  CHECK(map_block(5, 2) == 4);
  CHECK(map_block(256, 128) == 2);
  CHECK(map_block(257, 128) == 4);
  CHECK(map_block(1000, 0) == 1);
  // No pooling where the text fits.
  CHECK(head_matrix(trace, 0, 0, 0, HeadQuantity::Logits, 4, 8).block == 1);
  const HeadRow row = head_row_at(trace, 1, 3, 1, 1, HeadQuantity::Logits);
  REQUIRE(row.kept);
  CHECK(row.values.size() == 4);
  CHECK(row.visible == std::vector<uint8_t>{0, 1, 0, 1});
}

TEST_CASE("the head map cache grows maps step by step to what head_matrix gives",
          "[trace_queries]") {
  // Every map the cache hands out, step after step (blocks doubling on the way) and after a step
  // back, equals the one made from scratch.
  const Trace trace = test::make_small_trace(6);
  HeadMapCache cache;
  for (const HeadQuantity q : {HeadQuantity::Logits, HeadQuantity::Probabilities}) {
    for (const int64_t step : {0, 1, 2, 3, 4, 5, 2, 5}) {
      for (int64_t l = 0; l < test::kSmallLayers; ++l) {
        for (int64_t h = 0; h < test::kSmallHeads; ++h) {
          const auto kept = cache.get(trace, 1, l, h, q, step, 2);
          const HeadMatrix fresh = head_matrix(trace, 1, l, h, q, step, 2);
          INFO("step " << step << " head " << l << "." << h);
          CHECK(kept->block == fresh.block);
          REQUIRE(kept->rows == fresh.rows);
          CHECK(kept->visible == fresh.visible);
          for (size_t i = 0; i < fresh.values.size(); ++i)
            CHECK((kept->values[i] == fresh.values[i] ||
                   (std::isnan(kept->values[i]) && std::isnan(fresh.values[i]))));
        }
      }
    }
  }
  // A map a figure still holds is not changed under it.
  const auto held = cache.get(trace, 0, 0, 0, HeadQuantity::Logits, 1, 2);
  const std::vector<float> before = held->values;
  cache.get(trace, 0, 0, 0, HeadQuantity::Logits, 5, 2);
  REQUIRE(held->values.size() == before.size());
  CHECK(std::memcmp(held->values.data(), before.data(), before.size() * sizeof(float)) == 0);
  CHECK(held->steps == 2);
  // update() folds every head of the runs on several threads to the same maps.
  HeadMapCache grid;
  for (const int64_t step : {3, 5, 1}) {
    grid.update(trace, {0, 1}, HeadQuantity::Probabilities, step, 2, 3);
    for (const int64_t run : {0, 1}) {
      for (int64_t l = 0; l < test::kSmallLayers; ++l) {
        for (int64_t h = 0; h < test::kSmallHeads; ++h) {
          const HeadMatrix fresh =
              head_matrix(trace, run, l, h, HeadQuantity::Probabilities, step, 2);
          const auto kept = grid.get(trace, run, l, h, HeadQuantity::Probabilities, step, 2);
          INFO("update to step " << step << ", run " << run << " head " << l << "." << h);
          CHECK(kept->steps == step + 1);
          CHECK(kept->visible == fresh.visible);
          CHECK(std::memcmp(kept->values.data(), fresh.values.data(),
                            fresh.values.size() * sizeof(float)) == 0);
        }
      }
    }
  }
  CHECK_THROWS_AS(grid.update(trace, {7}, HeadQuantity::Logits, 1, 2), Error);
  // Another level of detail (the view zoomed) gives that level's map, not the kept one.
  const auto finer = cache.get(trace, 0, 0, 0, HeadQuantity::Logits, 5, 4);
  const HeadMatrix fresh = head_matrix(trace, 0, 0, 0, HeadQuantity::Logits, 5, 4);
  CHECK(finer->block == fresh.block);
  CHECK(finer->rows == fresh.rows);
  CHECK(finer->visible == fresh.visible);
}
