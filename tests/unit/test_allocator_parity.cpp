// pyramidkv, adakv and duoattention against the authors' code re-implemented line by line
// (tools/allocator_reference.py, tools/duo_reference.py): the same visible set for every step,
// layer and query head of a decode of co-reference sample 0 on the demo model, the same per-layer
// (PyramidKV) or per-head (Ada-KV) budgets, and the same next-token losses to float rounding.
// Fixtures: dropped[step][layer][head] positions, budgets[step][layer] or [step][layer][head];
// duo's pattern[layer][kv_head] and streaming[step] as [begin, end) column ranges.
#include <catch2/catch.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/json_fixture.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

namespace {

// f32 on both sides with the attention summed in another order: a few 1e-5 nats (the tools'
// dense check is 4.4e-6), as the tova parity test allows.
constexpr double kNllMargin = 1e-4;

std::shared_ptr<const BackendModel> load_model(const nlohmann::json& reference, Backend& backend) {
  return upload_model(Model::load(test::source_path(reference["model"].get<std::string>())),
                      backend);
}

// A decode of `tokens` under `policy` alone, run to the end (the recorder owns the trace).
std::unique_ptr<TraceRecorder> record(const std::shared_ptr<const BackendModel>& model,
                                      const std::vector<int32_t>& tokens,
                                      const PolicyConfig& policy) {
  auto recorder =
      std::make_unique<TraceRecorder>(model, nullptr, tokens, std::vector<PolicyConfig>{policy});
  while (recorder->step()) {
  }
  return recorder;
}

void check_nll(const Trace& trace, const nlohmann::json& nll) {
  REQUIRE(int64_t(nll.size()) == trace.step_count() - 1);
  for (int64_t t = 0; t + 1 < trace.step_count(); ++t) {
    INFO("step " << t);
    CHECK(trace.steps()[size_t(t)][0].metrics.nll ==
          Approx(nll[size_t(t)].get<double>()).margin(kNllMargin));
  }
}

// The allocator run `name` of tests/fixtures/allocators/reference.json: kvlens's policy `name`
// with the reference's knobs (no sinks, every layer selecting, as the authors' code).
void check_allocator_run(const nlohmann::json& reference, const std::string& name) {
  const nlohmann::json& run = reference[name];
  const nlohmann::json& settings = run["settings"];
  std::vector<std::string> params = {
      "budget_tokens=" + std::to_string(settings["budget_tokens"].get<int64_t>()),
      "sinks=0",
      "dense_layers=0",
      "obs_window=" + std::to_string(settings["window"].get<int64_t>()),
      "pool=" + settings["pool"].get<std::string>(),
      "pool_kernel=" + std::to_string(settings["kernel"].get<int64_t>())};
  const bool pyramid = name == "pyramidkv";
  if (pyramid)
    params.push_back("pyramid_beta=" + std::to_string(settings["beta"].get<int64_t>()));
  else
    params.push_back("floor_alpha=" + std::to_string(settings["floor_alpha"].get<double>()));
  const auto tokens = reference["tokens"].get<std::vector<int32_t>>();
  auto backend = make_cpu_backend(2);
  const auto model = load_model(reference, *backend);
  const auto recorder = record(model, tokens, {name, 0.0, params});
  const Trace& trace = recorder->trace();
  REQUIRE(trace.step_count() == int64_t(tokens.size()));
  const int64_t layers = model->model->config.num_layers;
  const int64_t heads = model->model->config.num_heads;
  // visible[layer][head] of the step before, grown by the new token and less the dropped ones.
  using Rows = std::vector<std::vector<uint8_t>>;
  std::vector<Rows> visible(static_cast<size_t>(layers), Rows(static_cast<size_t>(heads)));
  int64_t dropped = 0, budgets_differ = 0;
  for (int64_t t = 0; t < trace.step_count(); ++t) {
    const StepRecord& record = trace.steps()[size_t(t)][0];
    for (int64_t layer = 0; layer < layers; ++layer) {
      INFO("step " << t << " layer " << layer);
      const nlohmann::json& budgets = run["budgets"][size_t(t)][size_t(layer)];
      for (int64_t head = 0; head < heads; ++head) {
        INFO("head " << head);
        std::vector<uint8_t>& want = visible[size_t(layer)][size_t(head)];
        want.push_back(1);
        for (const int64_t j : run["dropped"][size_t(t)][size_t(layer)][size_t(head)]) {
          REQUIRE(want[size_t(j)] == 1);  // the reference drops a token once
          want[size_t(j)] = 0;
          ++dropped;
        }
        const HeadRow row = head_row_at(trace, 0, t, layer, head, HeadQuantity::Logits);
        REQUIRE(row.kept);
        CHECK(row.visible == want);
        const int64_t budget =
            pyramid ? budgets.get<int64_t>() : budgets[size_t(head)].get<int64_t>();
        CHECK(record.visible_counts[size_t(layer * heads + head)] == budget);
        if (budget != (pyramid ? run["budgets"][size_t(t)][0] : budgets[0]).get<int64_t>())
          ++budgets_differ;
      }
    }
  }
  // The fixture exercises the allocator: tokens were dropped, and budgets differ between layers
  // (PyramidKV) or between a layer's heads (Ada-KV) at many steps.
  CHECK(dropped > 0);
  CHECK(budgets_differ > 0);
  check_nll(trace, run["nll"]);
}

}  // namespace

TEST_CASE("pyramidkv keeps the sets and layer budgets of the authors' PyramidKV, re-implemented",
          "[policy][parity]") {
  check_allocator_run(test::read_json_fixture("tests/fixtures/allocators/reference.json"),
                      "pyramidkv");
}

TEST_CASE("adakv keeps the sets and head budgets of the authors' Ada-KV, re-implemented",
          "[policy][parity]") {
  check_allocator_run(test::read_json_fixture("tests/fixtures/allocators/reference.json"), "adakv");
}

TEST_CASE("duoattention keeps the sets of the authors' streaming and full heads, re-implemented",
          "[policy][parity]") {
  // tests/fixtures/duo/reference.json (tools/duo_reference.py): the authors' head pattern at a
  // head sparsity s (gates at or above their s-quantile are full heads) and their streaming
  // cache of sink_size + recent_size tokens plus the new one. kvlens: retrieval_frac = 1 - s,
  // sink_tokens = sink_size, recent_tokens = recent_size + 1 (kvlens's count includes the
  // current token).
  const nlohmann::json reference = test::read_json_fixture("tests/fixtures/duo/reference.json");
  const auto tokens = reference["tokens"].get<std::vector<int32_t>>();
  auto backend = make_cpu_backend(2);
  const auto model = load_model(reference, *backend);
  const int64_t layers = model->model->config.num_layers;
  const int64_t heads = model->model->config.num_heads;
  const int64_t group = heads / model->model->config.num_kv_heads;
  const std::vector<std::string> knobs = {
      "sink_tokens=" + std::to_string(reference["sink_size"].get<int64_t>()),
      "recent_tokens=" + std::to_string(reference["recent_size"].get<int64_t>() + 1),
      "dense_layers=0"};
  REQUIRE(reference["runs"].size() == 3);
  for (const nlohmann::json& run : reference["runs"]) {
    const double sparsity = run["sparsity"].get<double>();
    INFO("head sparsity " << sparsity);
    std::vector<std::string> params = knobs;
    params.push_back("retrieval_frac=" + std::to_string(1.0 - sparsity));
    const auto recorder = record(model, tokens, {"duoattention", 0.0, params});
    const Trace& trace = recorder->trace();
    REQUIRE(trace.step_count() == int64_t(tokens.size()));
    int64_t streaming_rows = 0;
    for (int64_t t = 0; t < trace.step_count(); ++t) {
      std::vector<uint8_t> streaming(size_t(t + 1), 0);
      for (const nlohmann::json& range : reference["streaming"][size_t(t)])
        for (int64_t j = range[0].get<int64_t>(); j < range[1].get<int64_t>(); ++j)
          streaming[size_t(j)] = 1;
      for (int64_t layer = 0; layer < layers; ++layer) {
        for (int64_t head = 0; head < heads; ++head) {
          INFO("step " << t << " layer " << layer << " head " << head);
          const bool full = run["pattern"][size_t(layer)][size_t(head / group)].get<int>() == 1;
          const HeadRow row = head_row_at(trace, 0, t, layer, head, HeadQuantity::Logits);
          REQUIRE(row.kept);
          CHECK(row.visible == (full ? std::vector<uint8_t>(size_t(t + 1), 1) : streaming));
          if (!full && t > 20) ++streaming_rows;
        }
      }
    }
    CHECK(streaming_rows > 0);  // some heads streamed past the sinks and recent tokens
    check_nll(trace, run["nll"]);
  }
}
