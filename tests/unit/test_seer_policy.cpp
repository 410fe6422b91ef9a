// seerattention (docs/policies/seerattention.md) on the policy bench (tests/support/
// policy_harness.h: H = 4 over G = 2, D = 4) with a hand-made gate (d = 2, blocks of 4): the block
// logits equal the formula, whole blocks best first fill B(t) per KV group, the scores are the
// block logits per column, and a step-by-step run equals one after a prefill; the gate loader's
// errors; in a real decode, the demo gate's logits equal the trainer's (tools/seer_reference.py).
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/policy/registry.h"
#include "engine/policy/seer_gate.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/json_fixture.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using kvlens::test::Harness;

namespace {

constexpr const char* kGateJson =
    R"({"format": "kvlens-seer-gate", "version": 1, "layers": 2, "heads": 4, "kv_heads": 2,
        "head_dim": 4, "gate_dim": 2, "block_size": 4, "norm_eps": 1e-6})";

// The gate of every layer and KV head: gate query = the group's first head's channels 0 and 1,
// block key = the block's key maximum in channels 0 and 1 (the minimum unused), unit norms.
std::vector<test::TestTensor> gate_tensors() {
  std::vector<float> q_proj(16 * 2, 0.0f), k_max(16, 0.0f), k_min(16, 0.0f), ones(4, 1.0f);
  for (int64_t g = 0; g < 2; ++g) {
    q_proj[size_t(g * 16 + 0 * 8 + 0)] = 1.0f;  // [g, 0, 0]
    q_proj[size_t(g * 16 + 1 * 8 + 1)] = 1.0f;  // [g, 1, 1]
    k_max[size_t(g * 8 + 0 * 4 + 0)] = 1.0f;
    k_max[size_t(g * 8 + 1 * 4 + 1)] = 1.0f;
  }
  std::vector<test::TestTensor> tensors;
  for (int l = 0; l < 2; ++l) {
    const std::string at = "layers." + std::to_string(l) + ".";
    tensors.push_back(test::make_tensor(at + "q_proj.weight", "F32", {2, 2, 8}, q_proj));
    tensors.push_back(test::make_tensor(at + "k_max_proj.weight", "F32", {2, 2, 4}, k_max));
    tensors.push_back(test::make_tensor(at + "k_min_proj.weight", "F32", {2, 2, 4}, k_min));
    tensors.push_back(test::make_tensor(at + "q_norm.weight", "F32", {2, 2}, ones));
    tensors.push_back(test::make_tensor(at + "k_norm.weight", "F32", {2, 2}, ones));
  }
  return tensors;
}

std::string write_gate(const std::string& json = kGateJson,
                       const std::vector<test::TestTensor>& tensors = gate_tensors()) {
  const std::string dir = test::make_temp_dir("seer_gate");
  test::write_file(dir + "/seer_gate.json", json);
  test::write_safetensors(dir + "/seer_gate.safetensors", tensors);
  return dir;
}

std::set<int64_t> range(int64_t begin, int64_t end) {
  std::set<int64_t> out;
  for (int64_t j = begin; j < end; ++j) out.insert(j);
  return out;
}

std::set<int64_t> join(std::set<int64_t> a, const std::set<int64_t>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

// 14 tokens, blocks {0..3} {4..7} {8..11} {12, 13}. KV head 0: block 1's keys point along the
// query (1, 0), block 0's across it (0, 1), block 2's against it (-1, 0); KV head 1 swaps blocks
// 0 and 1. The current block's keys are 0.
void set_block_keys(Harness& h) {
  std::vector<std::vector<std::vector<float>>> keys(2, std::vector<std::vector<float>>(14));
  const std::vector<float> along = {1, 0, 0, 0}, across = {0, 1, 0, 0}, against = {-1, 0, 0, 0},
                           zero = {0, 0, 0, 0};
  for (int64_t j = 0; j < 14; ++j) {
    const int64_t b = j / 4;
    keys[0][size_t(j)] = b == 0 ? across : b == 1 ? along : b == 2 ? against : zero;
    keys[1][size_t(j)] = b == 0 ? along : b == 1 ? across : b == 2 ? against : zero;
  }
  h.set_keys(keys);
  h.set_q({{1, 0, 0, 0}, {0, 5, 0, 0}, {1, 0, 0, 0}, {0, 5, 0, 0}});
}

const std::vector<std::string> kArgs = {"sinks=0", "budget_tokens=8"};

}  // namespace

TEST_CASE("seerattention: gate block logits by the formula, the best whole blocks fill B(t)",
          "[policy]") {
  Harness h;
  h.shape.model_dir = write_gate();
  set_block_keys(h);
  // The gate query is the group's first head's (1, 0): rmsnorm -> (sqrt 2, 0); a block key
  // rmsnorm(kmax channels 0, 1) has length sqrt 2 too, so a = 2 cos / sqrt(2) = sqrt(2) cos:
  // along sqrt 2, across 0, against -sqrt 2, the zero block 0. (eps 1e-6 scales by ~1 - 1e-6.)
  const float s = std::sqrt(2.0f);
  auto policy = h.make("seerattention", 0.0, kArgs);
  // t = 13, B = 8: the current block {12, 13} is forced, the best block fits (4 of 6 left), the
  // next does not. Each KV group chooses its own blocks; the heads of a group alike.
  const std::vector<std::set<int64_t>> sets = h.run(*policy, 13);
  CHECK(h.last_decision == LayerDecision::Masked);
  CHECK(sets[0] == join(range(4, 8), {12, 13}));
  CHECK(sets[1] == sets[0]);
  CHECK(sets[2] == join(range(0, 4), {12, 13}));
  CHECK(sets[3] == sets[2]);
  // The scores: each column its block's gate logit, in every head of the group.
  for (int64_t head = 0; head < 4; ++head) {
    const std::vector<float> row = h.score_row(head, 13);
    for (int64_t j = 0; j <= 13; ++j) {
      INFO("head " << head << " column " << j);
      const int64_t b = j / 4;
      const float along = head < 2 ? float(b == 1) : float(b == 0);
      const float want = b == 2 ? -s : b == 3 ? 0.0f : along * s;
      CHECK(row[size_t(j)] == Approx(want).margin(1e-5));
    }
  }

  SECTION("a larger budget takes blocks in gate order") {
    // B = 12: current (2) + the best (4) + the zero-logit one (4) = 10; the last (4) no longer
    // fits.
    auto wide = h.make("seerattention", 0.0, {"sinks=0", "budget_tokens=12"});
    const std::vector<std::set<int64_t>> more = h.run(*wide, 13);
    CHECK(more[0] == join(range(0, 8), {12, 13}));
    CHECK(more[2] == join(range(0, 8), {12, 13}));
  }

  SECTION("block keys built step by step equal those built after a prefill") {
    auto stepwise = h.make("seerattention", 0.0, kArgs);
    std::vector<std::set<int64_t>> last;
    std::vector<std::vector<float>> rows;
    for (int64_t t = 0; t <= 13; ++t) last = h.run(*stepwise, t);
    CHECK(last == sets);
    for (int64_t head = 0; head < 4; ++head) {
      const std::vector<float> row = h.score_row(head, 13);
      CHECK(row[1] == Approx(head < 2 ? 0.0f : s).margin(1e-5));
      CHECK(row[9] == Approx(-s).margin(1e-5));
    }
  }

  SECTION("dense layers and a budget holding every token stay dense") {
    auto dense_first = h.make("seerattention", 0.0, kArgs);
    h.run(*dense_first, 13, 0);
    CHECK(h.last_decision == LayerDecision::Dense);
    auto everything = h.make("seerattention", 0.0, {"sinks=0", "budget_tokens=14"});
    h.run(*everything, 13);
    CHECK(h.last_decision == LayerDecision::Dense);
  }
}

TEST_CASE("seerattention: listed as a built-in whose scores are predicted logits", "[policy]") {
  const PolicyInfo& info = policy_info("seerattention");
  CHECK(info.predicts_logits);
  CHECK_FALSE(info.needs_predictor);
  CHECK_FALSE(info.reference);
}

TEST_CASE("seerattention: the gate loader names the file, the field and the tool", "[policy]") {
  auto message = [](const std::string& dir) {
    try {
      load_seer_gate(dir, 2, 4, 2, 4);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  using Catch::Matchers::Contains;
  CHECK_THAT(message(""), Contains("no model folder"));
  const std::string empty = test::make_temp_dir("seer_gate_missing");
  CHECK_THAT(message(empty), Contains("seer_gate.safetensors") &&
                                 Contains("tools/train_seer_gate.py") && Contains("missing"));
  // Through the registry: a session's shape without a gate beside the model.
  Harness h;
  h.shape.model_dir = empty;
  CHECK_THROWS_WITH(h.make("seerattention", 0.5), Contains("tools/train_seer_gate.py"));

  CHECK_THAT(message(write_gate(R"({"format": "other"})")), Contains("format"));
  CHECK_THAT(message(write_gate(R"({"format": "kvlens-seer-gate", "layers": 2})")),
             Contains("heads"));
  std::string wrong_heads = kGateJson;
  wrong_heads.replace(wrong_heads.find("\"kv_heads\": 2"), 13, "\"kv_heads\": 4");
  CHECK_THAT(message(write_gate(wrong_heads)), Contains("the model's 2, 4, 2, 4"));
  std::vector<test::TestTensor> narrow = gate_tensors();
  narrow[0] =
      test::make_tensor("layers.0.q_proj.weight", "F32", {2, 2, 4}, std::vector<float>(16, 0.0f));
  CHECK_THAT(message(write_gate(kGateJson, narrow)), Contains("layers.0.q_proj.weight") &&
                                                         Contains("F32 tensor [2, 2, 8]") &&
                                                         Contains("found F32 [2, 2, 4]"));
  std::vector<test::TestTensor> short_of_one = gate_tensors();
  short_of_one.pop_back();
  CHECK_THAT(message(write_gate(kGateJson, short_of_one)),
             Contains("layers.1.k_norm.weight") && Contains("missing"));
  // A good gate loads with its settings.
  const auto gate = load_seer_gate(write_gate(), 2, 4, 2, 4);
  CHECK(gate->config.block_size == 4);
  CHECK(gate->config.gate_dim == 2);
  CHECK(gate->layers.size() == 2);
}

TEST_CASE("seerattention in a real decode: the demo gate's logits as the trainer computes them",
          "[policy]") {
  // tools/seer_reference.py applies the bundled gate with train_seer_gate.py's PyTorch code to the
  // demo model's dense keys and queries. The first gated layer of a run sees the dense model's
  // keys and queries (the layers before it are dense), so run r = dense_layers r (in lockstep)
  // is compared at layer r: the C++ gate is the one the trainer trained.
  const nlohmann::json reference = test::read_json_fixture("tests/fixtures/seer/reference.json");
  const std::vector<int32_t> tokens = reference["tokens"].get<std::vector<int32_t>>();
  const int64_t block = reference["block_size"].get<int64_t>();
  auto backend = make_cpu_backend(2);
  const auto model = upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  const int64_t heads = model->config().num_heads;
  const int64_t group = heads / model->config().num_kv_heads;
  const int64_t layer_count = model->config().num_layers;
  std::vector<PolicyConfig> runs;
  for (int64_t l = 0; l < layer_count; ++l)
    runs.push_back({"seerattention", 0.5, {"dense_layers=" + std::to_string(l)}});
  TraceRecorder recorder(model, nullptr, tokens, runs);
  while (recorder.step()) {
  }
  const Trace& trace = recorder.trace();
  int64_t compared = 0;
  const auto& steps = reference["steps"];
  for (size_t s = 0; s < steps.size(); ++s) {
    const int64_t t = steps[s].get<int64_t>();
    const auto& layers = reference["logits"][s];
    REQUIRE(int64_t(layers.size()) == layer_count);
    for (size_t layer = 0; layer < layers.size(); ++layer) {
      for (int64_t head = 0; head < heads; ++head) {
        INFO("step " << t << " layer " << layer << " head " << head);
        const int64_t run = int64_t(layer);
        const HeadRow row = head_row_at(trace, run, t, int64_t(layer), head, HeadQuantity::Scores);
        REQUIRE(row.kept);
        const auto& blocks = layers[layer][size_t(head / group)];
        REQUIRE(int64_t(blocks.size()) == t / block + 1);
        for (int64_t j = 0; j <= t; ++j) {
          CHECK(row.values[size_t(j)] ==
                Approx(blocks[size_t(j / block)].get<double>()).margin(1e-4));
          ++compared;
        }
      }
    }
  }
  CHECK(compared > 10000);
}
