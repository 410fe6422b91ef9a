// loki and doublesparsity (docs/policies/loki.md, doublesparsity.md) on hand-made queries, keys
// and calibration files: the approximate logits equal the formula worked out below and the visible
// sets are their top-B(t); the calibration loader's errors; the projected keys kept across steps;
// then a real decode on the demo model with its committed calibration files.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "engine/model/model.h"
#include "engine/policy/channel_calibration.h"
#include "engine/policy/registry.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/chosen_split.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using kvlens::test::Harness;

namespace {

// The harness' model: 2 layers, 4 query heads over 2 KV heads, D = 4.
constexpr int64_t kLayers = 2, kHeads = 4, kGroups = 2, kDim = 4;

// Layer 1 of KV head 0: direction 0 = (1, 1, 0, 0) / sqrt(2), direction 1 = (1, -1, 0, 0) /
// sqrt(2), then channels 2 and 3; KV head 1: channels in reverse order. Layer 0: identity.
void write_loki(const std::string& dir) {
  std::vector<float> basis(size_t(kLayers * kGroups * kDim * kDim), 0.0f);
  auto at = [&](int64_t l, int64_t g, int64_t c, int64_t i) -> float& {
    return basis[size_t(((l * kGroups + g) * kDim + c) * kDim + i)];
  };
  const float r = float(1.0 / std::sqrt(2.0));
  for (int64_t g = 0; g < kGroups; ++g)
    for (int64_t c = 0; c < kDim; ++c) at(0, g, c, c) = 1.0f;
  at(1, 0, 0, 0) = r, at(1, 0, 1, 0) = r, at(1, 0, 0, 1) = r, at(1, 0, 1, 1) = -r;
  at(1, 0, 2, 2) = 1.0f, at(1, 0, 3, 3) = 1.0f;
  for (int64_t i = 0; i < kDim; ++i) at(1, 1, kDim - 1 - i, i) = 1.0f;
  test::write_safetensors(
      dir + "/" + kLokiCalibrationFile,
      {test::make_tensor("basis", "F32", {kLayers, kGroups, kDim, kDim}, basis)});
}

// Every head's channels, most important first: head h of layer 1 starts at channel (h + 2) % 4
// and goes up; layer 0 in order.
void write_doublesparsity(const std::string& dir, std::vector<float> channels = {}) {
  if (channels.empty()) {
    for (int64_t l = 0; l < kLayers; ++l)
      for (int64_t h = 0; h < kHeads; ++h)
        for (int64_t i = 0; i < kDim; ++i)
          channels.push_back(float(l == 0 ? i : (h + 2 + i) % kDim));
  }
  test::write_safetensors(
      dir + "/" + kDoubleSparsityCalibrationFile,
      {test::make_tensor("channels", "F32", {kLayers, kHeads, kDim}, channels)});
}

void set_example(Harness& h) {
  h.set_q({{1, 3, 0, 2}, {2, 0, 1, 0}, {0, 1, 2, 0}, {1, 0, 0, 4}});
  h.set_keys({{{1, 1, 0, 0}, {2, -1, 5, 0}, {0, 0, 0, 3}, {-1, 2, 0, 1}},
              {{1, 0, 0, 1}, {0, 2, 0, 0}, {3, 0, 1, 0}, {0, 0, 1, 1}}});
  h.set_logits(std::vector<float>{0, 0, 0, 0});  // never read
}

}  // namespace

TEST_CASE("loki: logits of queries and keys projected on the first principal directions",
          "[policy]") {
  Harness h;
  h.shape.model_dir = test::make_temp_dir("loki");
  write_loki(h.shape.model_dir);
  set_example(h);
  auto policy = h.make("loki", 0.0, {"sinks=0", "budget_tokens=3", "dims=1", "dense_layers=1"});
  REQUIRE_FALSE(policy->reads_logits(h.step(3, 1)));
  const auto sets = h.run(*policy, 3);
  CHECK(h.last_decision == LayerDecision::Masked);
  // KV head 0, one direction u = (1, 1, 0, 0) / sqrt(2): s = (q . u)(k . u) / 2 = (q0 + q1)(k0 +
  // k1) / 4. Head 0: q0 + q1 = 4; keys' k0 + k1 = 2, 1, 0, 1: s = 2, 1, 0, 1.
  const std::vector<float> head0 = h.score_row(0, 3);
  CHECK(head0[0] == Approx(2.0f));
  CHECK(head0[1] == Approx(1.0f));
  CHECK(head0[2] == Approx(0.0f).margin(1e-6));
  CHECK(head0[3] == Approx(1.0f));
  // KV head 1, direction channel 3: s = q3 k3 / 2. Head 3: q3 = 4, keys' k3 = 1, 0, 0, 1.
  const std::vector<float> head3 = h.score_row(3, 3);
  CHECK(head3 == std::vector<float>{2, 0, 0, 2});
  // B = 3: token 3 and the best two of 0..2. Head 0: 0 then 1 (the true logits 2, -0.5, 3 would
  // keep 2: its weight is on channel 3, which the one direction does not see). Head 3: 0, then 1
  // and 2 tie at 0: the later.
  CHECK(sets[0] == std::set<int64_t>{0, 1, 3});
  CHECK(sets[3] == std::set<int64_t>{0, 2, 3});

  SECTION("every direction gives the true logits") {
    auto exact = h.make("loki", 0.5, {"sinks=0", "dims=4"});
    h.run(*exact, 3);
    // Head 1 (KV head 0), q = (2, 0, 1, 0): q . k / 2 = 1, 4.5, 0, -1.
    const std::vector<float> row = h.score_row(1, 3);
    CHECK(row[0] == Approx(1.0f));
    CHECK(row[1] == Approx(4.5f));
    CHECK(row[2] == Approx(0.0f).margin(1e-6));
    CHECK(row[3] == Approx(-1.0f));
  }
  SECTION("keys are projected once: a later step reuses them, a new key is added") {
    // Step 4 with key 4 of KV head 0 = (3, 3, 0, 0): k0 + k1 = 6, s = 4 * 6 / 4 = 6 for head 0.
    h.set_keys({{{1, 1, 0, 0}, {2, -1, 5, 0}, {0, 0, 0, 3}, {-1, 2, 0, 1}, {3, 3, 0, 0}},
                {{1, 0, 0, 1}, {0, 2, 0, 0}, {3, 0, 1, 0}, {0, 0, 1, 1}, {0, 0, 0, 0}}});
    h.run(*policy, 4);
    const std::vector<float> later = h.score_row(0, 4);
    CHECK(later[0] == Approx(2.0f));
    CHECK(later[4] == Approx(6.0f));
    // Changing an old key behind the policy's back does not change its projection (each key is
    // projected once, as the authors' cache of projected keys), but the current one is redone.
    h.set_keys({{{9, 9, 0, 0}, {2, -1, 5, 0}, {0, 0, 0, 3}, {-1, 2, 0, 1}, {3, 3, 0, 0}},
                {{1, 0, 0, 1}, {0, 2, 0, 0}, {3, 0, 1, 0}, {0, 0, 1, 1}, {0, 0, 0, 0}}});
    h.run(*policy, 5);
    CHECK(h.score_row(0, 5)[0] == Approx(2.0f));
  }
}

TEST_CASE("doublesparsity: logits from each head's calibrated label channels", "[policy]") {
  Harness h;
  h.shape.model_dir = test::make_temp_dir("doublesparsity");
  write_doublesparsity(h.shape.model_dir);
  set_example(h);
  auto policy = h.make("doublesparsity", 0.0, {"sinks=0", "budget_tokens=2", "channels=2"});
  const auto sets = h.run(*policy, 3);
  CHECK(h.last_decision == LayerDecision::Masked);
  // Layer 1, head h: channels (h + 2) % 4 and (h + 3) % 4; s = sum over them of q_c k_c / 2.
  // Head 0: channels 2, 3: q = (0, 2) there; KV head 0's keys (0, 0), (5, 0), (0, 3), (0, 1):
  // s = 0, 0, 3, 1. Head 1: channels 3, 0: q = (0, 2): s = 1, 2, 0, -1.
  CHECK(h.score_row(0, 3) == std::vector<float>{0, 0, 3, 1});
  CHECK(h.score_row(1, 3) == std::vector<float>{1, 2, 0, -1});
  // Head 2 (KV head 1): channels 0, 1: q = (0, 1): keys' channel 1 = 0, 2, 0, 0: s = 0, 1, 0, 0.
  CHECK(h.score_row(2, 3) == std::vector<float>{0, 1, 0, 0});
  // B = 2: token 3 and the best other.
  CHECK(sets[0] == std::set<int64_t>{2, 3});
  CHECK(sets[1] == std::set<int64_t>{1, 3});
  CHECK(sets[2] == std::set<int64_t>{1, 3});
}

TEST_CASE("loki and doublesparsity: the calibration files' errors", "[policy]") {
  Harness h;
  SECTION("no model folder") {
    CHECK_THROWS_WITH(h.make("loki", 0.5),
                      Catch::Contains("policy loki: loki_pca.safetensors: expected the model's "
                                      "folder") &&
                          Catch::Contains("tools/calibrate_channels.py"));
  }
  h.shape.model_dir = test::make_temp_dir("calibration-errors");
  SECTION("no file: which tool makes it") {
    CHECK_THROWS_WITH(h.make("doublesparsity", 0.5),
                      Catch::Contains("policy doublesparsity: doublesparsity_channels.safetensors: "
                                      "expected the calibration file beside the model") &&
                          Catch::Contains("tools/calibrate_channels.py") &&
                          Catch::Contains("found none in " + h.shape.model_dir));
  }
  SECTION("a .gguf model looks in its folder") {
    write_loki(h.shape.model_dir);
    test::write_safetensors(h.shape.model_dir + "/model.gguf", {});
    h.shape.model_dir += "/model.gguf";
    CHECK_NOTHROW(h.make("loki", 0.5));
  }
  SECTION("a basis of another shape") {
    test::write_safetensors(
        h.shape.model_dir + "/" + kLokiCalibrationFile,
        {test::make_tensor("basis", "F32", {kLayers, kHeads, kDim, kDim},
                           std::vector<float>(size_t(kLayers * kHeads * kDim * kDim), 0.0f))});
    CHECK_THROWS_WITH(h.make("loki", 0.5),
                      Catch::Contains("loki_pca.safetensors: basis: expected an F32 [2, 2, 4, 4] "
                                      "tensor, found F32 [2, 4, 4, 4]"));
  }
  SECTION("no basis tensor") {
    write_doublesparsity(h.shape.model_dir);
    std::filesystem::rename(h.shape.model_dir + "/" + kDoubleSparsityCalibrationFile,
                            h.shape.model_dir + "/" + kLokiCalibrationFile);
    CHECK_THROWS_WITH(h.make("loki", 0.5),
                      Catch::Contains("basis: expected an F32") && Catch::Contains("found none"));
  }
  SECTION("channels repeated or out of range") {
    std::vector<float> channels(size_t(kLayers * kHeads * kDim));
    for (size_t i = 0; i < channels.size(); ++i) channels[i] = float(i % kDim);
    channels[size_t((1 * kHeads + 2) * kDim + 1)] = 0.0f;  // layer 1, head 2: 0, 0, ...
    write_doublesparsity(h.shape.model_dir, channels);
    CHECK_THROWS_WITH(h.make("doublesparsity", 0.5, {"channels=2"}),
                      Catch::Contains("channels: expected distinct whole channel numbers in [0, "
                                      "4) in each row, found 0.000000 at layer 1, head 2, rank 1"));
    // One channel only reads the first of each row: fine.
    CHECK_NOTHROW(h.make("doublesparsity", 0.5, {"channels=1"}));
    channels[size_t((1 * kHeads + 2) * kDim + 1)] = 4.0f;
    write_doublesparsity(h.shape.model_dir, channels);
    CHECK_THROWS_WITH(h.make("doublesparsity", 0.5, {"channels=2"}),
                      Catch::Contains("found 4.000000 at layer 1, head 2, rank 1"));
  }
  SECTION("the knob against head_dim") {
    write_loki(h.shape.model_dir);
    CHECK_THROWS_WITH(h.make("loki", 0.5, {"dims=6"}),
                      Catch::Contains("policy loki: dims: expected a fraction of head_dim"));
  }
}

TEST_CASE(
    "loki and doublesparsity in a real decode: scores on the true logits' scale, the "
    "top-B(t) of them",
    "[policy]") {
  auto backend = make_cpu_backend(2);
  const auto model = upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 30; ++i) tokens.push_back((i * 37 + 11) % 300 + 3);
  const std::vector<std::string> common = {"budget_tokens=9", "sinks=0", "dense_layers=0"};
  auto with = [&](const char* knob) {
    std::vector<std::string> args = common;
    args.push_back(knob);
    return args;
  };
  TraceRecorder recorder(model, nullptr, tokens,
                         {{"dense", 0.0, {}},
                          {"loki", 0.0, with("dims=32")},
                          {"doublesparsity", 0.0, with("channels=32")},
                          {"loki", 0.0, with("dims=0.25")},
                          {"doublesparsity", 0.0, with("channels=0.125")}});
  while (recorder.step()) {
  }
  const Trace& trace = recorder.trace();
  const int64_t layers = int64_t(trace.steps()[0][1].decisions.size());
  const int64_t heads = int64_t(trace.steps()[0][1].visible_counts.size()) / layers;
  for (const int64_t full : {int64_t(1), int64_t(2)}) {
    double worst_gap = 0.0;
    for (int64_t t = 9; t < trace.step_count(); ++t)
      for (int64_t layer = 0; layer < layers; ++layer)
        for (int64_t head = 0; head < heads; ++head) {
          const HeadRow truth = head_row_at(trace, full, t, layer, head, HeadQuantity::Logits);
          const HeadRow exact = head_row_at(trace, full, t, layer, head, HeadQuantity::Scores);
          REQUIRE(exact.kept);
          for (int64_t j = 0; j <= t; ++j)
            if (exact.visible[size_t(j)])
              worst_gap = std::max(worst_gap, std::abs(double(exact.values[size_t(j)]) -
                                                       double(truth.values[size_t(j)])));
        }
    INFO("run " << full);
    // Every direction (an orthonormal basis) or every channel: the true logits to rounding.
    CHECK(worst_gap < 1e-3);
  }
  for (const int64_t run : {int64_t(3), int64_t(4)}) {
    for (int64_t t = 9; t < trace.step_count(); ++t)
      for (int64_t layer = 0; layer < layers; ++layer)
        for (int64_t head = 0; head < heads; ++head) {
          INFO("run " << run << " step " << t << " layer " << layer << " head " << head);
          const HeadRow approx = head_row_at(trace, run, t, layer, head, HeadQuantity::Scores);
          REQUIRE(approx.kept);
          CHECK(std::count(approx.visible.begin(), approx.visible.end(), uint8_t(1)) == 9);
          CHECK(approx.visible[size_t(t)] == 1);
          const test::ChosenSplit split = test::chosen_split(approx, t);
          CHECK(split.highest_left <= split.lowest_chosen);
        }
  }
}
