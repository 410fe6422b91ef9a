// duoattention (docs/policies/duoattention.md) on the policy bench with hand-made gates: retrieval
// KV groups see every token, streaming ones the sinks and the recent tokens; the budget rule's
// number of retrieval heads; the gate file's errors; a real decode on the demo model with its
// committed gates (every head full or sinks + recent, as many full heads as the rule says).
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "engine/model/model.h"
#include "engine/policy/duo_gates.h"
#include "engine/policy/registry.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/error_message.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using Catch::Matchers::Contains;
using namespace kvlens;
using kvlens::test::Harness;

namespace {

std::set<int64_t> range(int64_t begin, int64_t end) {
  std::set<int64_t> out;
  for (int64_t j = begin; j < end; ++j) out.insert(j);
  return out;
}

// gates [layers, kv_heads] as duo_gates.safetensors in a new folder; returns the folder.
std::string gates_folder(const std::vector<std::vector<float>>& gates) {
  const std::string dir = test::make_temp_dir("duo-gates");
  std::vector<float> flat;
  for (const auto& row : gates) flat.insert(flat.end(), row.begin(), row.end());
  test::write_safetensors(
      dir + "/" + kDuoGatesFile,
      {test::make_tensor("gates", "F32", {int64_t(gates.size()), int64_t(gates[0].size())}, flat)});
  return dir;
}

// The bench's 2 layers x 2 KV heads ranked by gate: (layer 0, KV 1) 0.9, (1, 0) 0.8, (1, 1) 0.2,
// (0, 0) 0.1.
Harness bench() {
  Harness h;
  h.shape.model_dir = gates_folder({{0.1f, 0.9f}, {0.8f, 0.2f}});
  return h;
}

}  // namespace

TEST_CASE("duoattention: retrieval groups see every token, streaming ones sinks + recent",
          "[policy][duo]") {
  Harness h = bench();
  // Two of the four KV heads are retrieval heads: (0, 1) and (1, 0), the top two by gate.
  auto policy =
      h.make("duoattention", 0.5, {"retrieval_frac=0.5", "sink_tokens=2", "recent_tokens=3"});
  CHECK_FALSE(policy->reads_logits(h.step(9, 1)));
  const std::set<int64_t> all = range(0, 10), streaming = {0, 1, 7, 8, 9};
  // Layer 1: KV head 0 (query heads 0, 1) retrieves, KV head 1 (heads 2, 3) streams.
  auto sets = h.run(*policy, 9, 1);
  CHECK(h.last_decision == LayerDecision::Masked);
  CHECK(sets == std::vector<std::set<int64_t>>{all, all, streaming, streaming});
  // Each head's scores row is its KV head's gate on every candidate.
  CHECK(h.score_row(1, 9) == std::vector<float>(10, 0.8f));
  CHECK(h.score_row(2, 9) == std::vector<float>(10, 0.2f));
  // Layer 0 the other way round (dense_layers is 0 by default: the paper gates every layer).
  sets = h.run(*policy, 9, 0);
  CHECK(sets == std::vector<std::set<int64_t>>{streaming, streaming, all, all});
  // While sinks + recent cover the step every head sees everything: the layer is dense.
  sets = h.run(*policy, 4, 1);
  CHECK(h.last_decision == LayerDecision::Dense);
  // retrieval_frac = 0: every head streams; 1: every head retrieves.
  auto none = h.make("duoattention", 0.5, {"retrieval_frac=0", "sink_tokens=2", "recent_tokens=3"});
  CHECK(h.run(*none, 9, 1) == std::vector<std::set<int64_t>>(4, streaming));
  auto every = h.make("duoattention", 0.5, {"retrieval_frac=1", "sink_tokens=2"});
  h.run(*every, 9, 1);
  CHECK(h.last_decision == LayerDecision::Dense);
  // A dense layer is not ranked: with dense_layers = 1 the top two are (1, 0) and (1, 1).
  auto skip0 = h.make("duoattention", 0.5,
                      {"retrieval_frac=1", "dense_layers=1", "sink_tokens=2", "recent_tokens=3"});
  h.run(*skip0, 9, 0);
  CHECK(h.last_decision == LayerDecision::Dense);
}

TEST_CASE("duoattention: the budget rule picks the most retrieval heads that fit",
          "[policy][duo]") {
  // 4 heads, 10 candidates, streaming heads keep 5, B = 8 per head (32 in all): 2 retrieval
  // heads keep 2 * 10 + 2 * 5 = 30 <= 32; 3 would keep 35.
  CHECK(duo_retrieval_count(4, 10, 5, 8) == 2);
  CHECK(duo_retrieval_count(4, 10, 5, 10) == 4);
  CHECK(duo_retrieval_count(4, 10, 5, 5) == 0);  // the streaming heads alone fill it
  CHECK(duo_retrieval_count(4, 10, 5, 3) == 0);  // over it: none, the closest there is
  CHECK(duo_retrieval_count(4, 4, 5, 1) == 4);   // streaming heads already see everything
  // The demo model at the co-reference sample's last step: 25 * 111 + 39 * 20 = 3555 <= 64 * 56.
  CHECK(duo_retrieval_count(64, 111, 20, 56) == 25);

  // Through the policy: s = 0.25 at step 9 gives B = 8, so R = 2, the same sets as above.
  Harness h = bench();
  auto policy = h.make("duoattention", 0.25, {"sink_tokens=2", "recent_tokens=3"});
  const std::set<int64_t> all = range(0, 10), streaming = {0, 1, 7, 8, 9};
  CHECK(h.run(*policy, 9, 1) == std::vector<std::set<int64_t>>{all, all, streaming, streaming});
  // At s = 0.5, B = 5: what a streaming head keeps already, so none retrieves.
  auto half = h.make("duoattention", 0.5, {"sink_tokens=2", "recent_tokens=3"});
  CHECK(h.run(*half, 9, 0) == std::vector<std::set<int64_t>>(4, streaming));
}

TEST_CASE("duoattention: the gate file's errors name the file, the tool and the shape",
          "[policy][duo]") {
  Harness h;
  h.shape.model_dir = test::make_temp_dir("duo-none");
  std::string message = test::error_message([&] { h.make("duoattention", 0.5); });
  CHECK_THAT(message, Contains("duo_gates.safetensors") && Contains("tools/train_duo_gates.py"));
  CHECK(message.find('\n') == std::string::npos);
  h.shape.model_dir = gates_folder({{0.5f, 0.5f, 0.5f}});  // [1, 3] for a [2, 2] model
  message = test::error_message([&] { h.make("duoattention", 0.5); });
  CHECK_THAT(message, Contains("gates") && Contains("[2, 2]") && Contains("[1, 3]"));
  h.shape.model_dir = gates_folder({{0.5f, 1.5f}, {0.5f, 0.5f}});
  message = test::error_message([&] { h.make("duoattention", 0.5); });
  CHECK_THAT(message, Contains("[0, 1]") && Contains("layer 0, KV head 1"));
  h.shape.model_dir = gates_folder({{0.5f, 0.5f}, {0.5f, 0.5f}});
  message = test::error_message([&] { h.make("duoattention", 0.5, {"retrieval_frac=-0.5"}); });
  CHECK_THAT(message, Contains("retrieval_frac") && Contains("-1 (off)"));
}

TEST_CASE("duoattention in a real decode on the demo model, with its committed gates",
          "[policy][duo]") {
  auto backend = make_cpu_backend(2);
  const auto model = upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  const ModelConfig& c = model->config();
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 60; ++i) tokens.push_back((i * 37 + 11) % 300 + 3);
  const double sparsity = 0.5;
  TraceRecorder recorder(model, nullptr, tokens,
                         {{"h2o", sparsity, {}}, {"duoattention", sparsity, {}}});
  while (recorder.step()) {
  }
  const Trace& trace = recorder.trace();
  const int64_t group = c.num_heads / c.num_kv_heads, keep = 4 + 16;
  PolicyShape shape;
  shape.layers = c.num_layers;
  shape.kv_heads = c.num_kv_heads;
  shape.model_dir = test::source_path("assets/models/demo");
  const std::vector<float> gates = load_duo_gates(shape);  // [layers * kv_heads]
  int64_t checked = 0;
  for (int64_t t = 0; t < trace.step_count(); ++t) {
    const StepRecord& record = trace.steps()[size_t(t)][1];
    CommonKnobs knobs;
    knobs.sparsity = sparsity;
    const int64_t want =
        duo_retrieval_count(c.num_layers * c.num_kv_heads, t + 1, keep, knobs.budget(t));
    int64_t full = 0, total = 0;
    for (int64_t layer = 0; layer < c.num_layers; ++layer) {
      for (int64_t g = 0; g < c.num_kv_heads; ++g) {
        const int32_t count = record.visible_counts[size_t(layer * c.num_heads + g * group)];
        INFO("step " << t << " layer " << layer << " KV head " << g);
        for (int64_t q = 1; q < group; ++q)  // one set per KV group
          CHECK(record.visible_counts[size_t(layer * c.num_heads + g * group + q)] == count);
        INFO("count " << count);
        CHECK((count == t + 1 || count == keep));
        full += count == t + 1 ? 1 : 0;
        total += count;
      }
    }
    // The heads grid's query marks exactly the full heads once some are limited, with the gate.
    const FullHeads marks = full_heads_at(trace, 1, t);
    for (int64_t i = 0; i < c.num_layers * c.num_heads; ++i) {
      const bool saw_all = record.visible_counts[size_t(i)] == t + 1;
      CHECK(bool(marks.full[size_t(i)]) ==
            (saw_all && t + 1 > keep && full < c.num_layers * c.num_kv_heads));
      if (marks.full[size_t(i)]) CHECK(marks.score[size_t(i)] == gates[size_t(i / group)]);
    }
    if (t + 1 <= keep) continue;
    CHECK(full == want);
    // The total kept is within the budget of B(t) per head where the streaming heads alone fit
    // it; where they do not, every head streams (the closest to the budget there is).
    if (keep <= knobs.budget(t))
      CHECK(total <= c.num_layers * c.num_kv_heads * knobs.budget(t));
    else
      CHECK(full == 0);
    ++checked;
  }
  CHECK(checked > 30);
}
