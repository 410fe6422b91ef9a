// Policies on sliding-window layers (gemma3's local layers, mistral's every layer): every
// registered built-in, the example C plug-ins and test plug-ins choose only among the window's
// keys, and a head sees exactly the budget of the window's candidates (B of min(t + 1, window)
// keys), not B(t) over every key with the picks before the window then hidden.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/policy/plugin_policy.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/registry.h"
#include "engine/session/decoder_session.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using Catch::Matchers::Contains;
using namespace kvlens;

namespace {

constexpr double kSparsity = 0.5;

// The most tokens a head may see on layer `layer` at step t: the policy's budget over the keys
// the layer attends to (its window's), or every one of them where the layer stays dense.
int64_t expected_budget(const std::string& id, const ModelConfig& c, int64_t layer, int64_t t) {
  const int64_t window = c.layer_window(layer);
  const int64_t candidates = window > 0 ? std::min(t + 1, window) : t + 1;
  CommonKnobs knobs;
  knobs.sparsity = kSparsity;
  knobs.sinks = 1;
  if (id == "lazyllm") {
    const double keep = lazyllm_keep_schedule(c.num_layers, 1, kSparsity)[size_t(layer)];
    knobs.sparsity = 1.0 - keep;
  }
  return knobs.budget(candidates - 1);
}

// A plug-in's visible set: per row, the current token and the budget's most recent candidates
// before it, from `first` on (scores 0).
int32_t answer_recent(const kvlens_step* step, kvlens_answer* answer, int64_t first) {
  const int64_t begin = std::max(first, step->cols - step->budget);
  for (int64_t h = 0; h < step->selection_rows; ++h) {
    std::fill_n(answer->scores + h * step->stride, step->cols, 0.0f);
    std::memset(answer->visible + h * step->stride + begin, 1, size_t(step->cols - begin));
  }
  return KVLENS_VISIBLE;
}

// A plug-in that answers with its own visible set: the budget's most recent tokens from
// step->first_candidate on where it honours the window, else the oldest ones.
kvlens_policy_plugin recent_visible_table(const char* name, bool honours_window) {
  kvlens_policy_plugin table{};
  table.abi_version = KVLENS_POLICY_ABI_VERSION;
  table.struct_size = sizeof table;
  table.name = name;
  table.family = "test";
  table.rule = "The budget's most recent tokens, as its own visible set.";
  table.memories = KVLENS_ACCEPTS_HOST;
  table.needs = KVLENS_ANSWERS_VISIBLE;
  table.create = [](const kvlens_model_shape*, const double*, char*, size_t) -> void* {
    static int state;
    return &state;
  };
  table.destroy = [](void*) {};
  if (honours_window) {
    table.select = [](void*, const kvlens_step* step, kvlens_answer* answer, char*,
                      size_t) -> int32_t {
      return answer_recent(step, answer, step->first_candidate);
    };
  } else {
    // The oldest budget - 1 tokens and the current one: before the window once it slides.
    table.select = [](void*, const kvlens_step* step, kvlens_answer* answer, char*,
                      size_t) -> int32_t {
      for (int64_t h = 0; h < step->selection_rows; ++h) {
        uint8_t* row = answer->visible + h * step->stride;
        std::fill_n(answer->scores + h * step->stride, step->cols, 0.0f);
        std::memset(row, 1, size_t(std::min(step->budget - 1, step->cols - 1)));
        row[step->cols - 1] = 1;
      }
      return KVLENS_VISIBLE;
    };
  }
  return table;
}

void check_windowed_runs(const std::string& fixture, int64_t steps,
                         const std::vector<std::string>& ids) {
  auto backend = make_cpu_backend(2);
  // With calibration files for loki and doublesparsity beside it.
  const auto model = upload_model(
      Model::load(test::copy_with_calibration(test::source_path("tests/fixtures/" + fixture))),
      *backend);
  const ModelConfig& c = model->config();
  const int64_t heads = c.num_heads;
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < int32_t(steps); ++i) tokens.push_back((i * 37 + 11) % 320);
  int64_t windowed_checks = 0;
  for (const std::string& id : ids) {
    INFO(fixture << " " << id);
    const PolicyInfo& info = policy_info(id);
    PolicyConfig policy{id, info.reference ? 0.0 : kSparsity, {}};
    // Layer 0 dense, as most policies' default (Quest's is 2, which leaves no local layer of the
    // gemma3 fixture to select on).
    const int64_t dense_layers = 1;
    for (const ParamSpec& spec : info.params) {
      if (spec.name == "dense_layers") policy.args.push_back("dense_layers=1");
      if (spec.name == "sinks") policy.args.push_back("sinks=1");
      if (spec.name == "obs_window") policy.args.push_back("obs_window=4");
      if (spec.name == "page_size") policy.args.push_back("page_size=4");
    }
    // magicpig's default window (64 exact tokens) covers these layers' windows: a short one.
    if (id == "magicpig") policy.args.push_back("window=2");
    TraceRecorder recorder(model, nullptr, tokens, {policy});
    while (recorder.step()) {
    }
    const Trace& trace = recorder.trace();
    for (int64_t t = 0; t < trace.step_count(); ++t) {
      const StepRecord& record = trace.steps()[size_t(t)][0];
      for (int64_t layer = 0; layer < c.num_layers; ++layer) {
        const int64_t window = c.layer_window(layer);
        if (window <= 0 || t + 1 <= window) continue;  // the window hides nothing yet
        const LayerDecision decision = record.decisions[size_t(layer)];
        const int64_t budget = expected_budget(id, c, layer, t);
        // Allocators share the budget out: Ada-KV over the layer's heads (their sum is the
        // uniform one), PyramidKV over the layers (each head within its window).
        const bool adaptive = id == "adakv" || id.ends_with("+adakv");
        const bool pyramid = id == "pyramidkv" || id.ends_with("+pyramidkv");
        if (adaptive && decision == LayerDecision::Masked) {
          int64_t total = 0;
          for (int64_t head = 0; head < heads; ++head)
            total += record.visible_counts[size_t(layer * heads + head)];
          INFO("step " << t << " layer " << layer);
          CHECK(total == heads * budget);
        }
        for (int64_t head = 0; head < heads; ++head) {
          INFO("step " << t << " layer " << layer << " head " << head);
          const int64_t count = record.visible_counts[size_t(layer * heads + head)];
          // Nothing before the window is ever visible, whatever the decision.
          const HeadRow row = head_row_at(trace, 0, t, layer, head, HeadQuantity::Probabilities);
          if (row.kept) {
            const auto outside =
                std::count(row.visible.begin(), row.visible.begin() + (t + 1 - window), uint8_t(1));
            CHECK(outside == 0);
          }
          if (decision == LayerDecision::Dense) {
            CHECK(count == window);  // the whole window: nothing selected
            // A budgeted policy is dense on a local layer only where its budget covers it.
            if (!info.reference && id != "tokenfilter" && id != "duoattention" &&
                layer >= dense_layers)
              CHECK(budget >= window);
          } else if (decision == LayerDecision::Skipped) {
            CHECK(count == 0);
          } else if (id == "duoattention") {
            // A retrieval head sees the window, a streaming one its recent_tokens (16) and the
            // sink_tokens (4) still inside the window.
            const int64_t sinks_inside = std::max<int64_t>(0, 4 - (t + 1 - window));
            CHECK((count == window || count == std::min<int64_t>(16 + sinks_inside, window)));
          } else if (adaptive || pyramid) {
            CHECK(count >= 1);  // the current token at least
            CHECK(count <= std::min(t + 1, window));
          } else if (id == "magicpig") {
            // An LSH sample within the window (its size is an expected value, not B): the two
            // exact recent tokens at least, never a key outside the window (checked above).
            CHECK(count >= 2);
            CHECK(count <= window);
          } else if (id == "twilight") {
            // Top-p keeps the fewest of the base's candidates (whole pages within the budget)
            // reaching the mass: at most the budget, the current token at least.
            CHECK(count <= budget);
            CHECK(count >= 1);
          } else if (id == "quest" || id == "quest_c" || id == "seerattention") {
            // Whole pages (seerattention's blocks: 4 in the fixtures' gates) within the budget:
            // never more, at most a page's worth fewer.
            CHECK(count <= budget);
            CHECK(count > budget - 4);
          } else {
            CHECK(count == budget);
          }
          ++windowed_checks;
        }
      }
    }
  }
  CHECK(windowed_checks > 0);
}

std::vector<std::string> runnable_builtins() {
  std::vector<std::string> ids;
  for (const PolicyInfo& info : policy_infos()) {
    // The fixtures have no TokenButler predictor; plug-ins registered by other tests are theirs.
    if (!info.needs_predictor && policy_source(info.id).empty()) ids.push_back(info.id);
  }
  // Composed scorer+allocator ids (not in policy_infos).
  for (const char* id : {"snapkv+adakv", "h2o+pyramidkv", "tova+adakv"}) ids.push_back(id);
  return ids;
}

}  // namespace

TEST_CASE("every policy spends the window's budget within the window on Gemma 3's local layers",
          "[policy][window][gemma3]") {
  // Layers 0 and 1 local (window 16), layer 2 global; 30 steps run 14 past the window.
  check_windowed_runs("gemma3-window-softcap-f32", 30, runnable_builtins());
}

TEST_CASE("every policy spends the window's budget within the window on Mistral's window",
          "[policy][window]") {
  // Every layer has the window of 24; 36 steps run 12 past it.
  check_windowed_runs("mistral-window-bf16", 36, runnable_builtins());
}

TEST_CASE("plug-ins choose within a sliding window: first_candidate and the window's budget",
          "[policy][window][plugin]") {
  for (const char* name : {"h2o", "quest"})
    load_policy_plugin(std::string(KVLENS_EXAMPLE_PLUGIN_DIR) + "/libkvlens_" + name + "_c.so");
  static kvlens_policy_plugin honours = recent_visible_table("window_recent", true);
  register_plugin_policy(&honours, "window_recent.so", nullptr);
  check_windowed_runs("gemma3-window-softcap-f32", 30, {"h2o_c", "quest_c", "window_recent"});

  // A visible set reaching before the window is an error naming the plug-in and the field.
  static kvlens_policy_plugin ignores = recent_visible_table("window_blind", false);
  register_plugin_policy(&ignores, "window_blind.so", nullptr);
  const std::string message = test::error_message(
      [] { check_windowed_runs("gemma3-window-softcap-f32", 30, {"window_blind"}); });
  CHECK_THAT(message, Contains("window_blind (window_blind.so)") && Contains("first_candidate") &&
                          Contains("layer 1"));
}

TEST_CASE("a step hands a policy every layer's rows only while no layer's window leaves out a key",
          "[policy][window][gemma3]") {
  // LayerStep::every_layer_scores / every_layer_visible (a policy that chooses every layer at once,
  // tokenbutler, reads them): the session's rows of every layer, of which this layer's scores and
  // visible are rows l * H ..; null once a local layer's window (16 here) hides a key, since the
  // layers' candidates then differ.
  struct Probe final : Policy {
    struct Seen {
      int64_t step, layer;
      bool rows_given, rows_match;
    };
    std::vector<Seen> seen;
    LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                         DeviceTensor& scores) override {
      bool match = false;
      if (step.every_layer_scores != nullptr && step.every_layer_visible != nullptr) {
        const int64_t rows = visible.dim(0), stride = visible.dim(1);
        const auto* all_scores = static_cast<const std::byte*>(step.every_layer_scores->data);
        const auto* all_visible = static_cast<const std::byte*>(step.every_layer_visible->data);
        match = step.every_layer_scores->dim(1) == stride &&
                step.every_layer_visible->dim(1) == stride &&
                scores.data == all_scores + step.layer * rows * stride * int64_t(sizeof(float)) &&
                visible.data == all_visible + step.layer * rows * stride;
      }
      seen.push_back({step.step, step.layer, step.every_layer_scores != nullptr, match});
      return LayerDecision::Dense;
    }
  };
  auto backend = make_cpu_backend(1);
  const auto model = upload_model(
      Model::load(test::source_path("tests/fixtures/gemma3-window-softcap-f32")), *backend);
  const int64_t window = 16;
  REQUIRE(model->config().layer_window(0) == window);
  DecoderSession session(model);
  auto probe = std::make_unique<Probe>();
  Probe& seen = *probe;
  session.set_policy(std::move(probe));
  for (int32_t t = 0; t < 24; ++t) session.forward(std::span(&t, 1));
  REQUIRE(seen.seen.size() == size_t(24 * model->config().num_layers));
  for (const auto& s : seen.seen) {
    INFO("step " << s.step << " layer " << s.layer);
    CHECK(s.rows_given == (s.step + 1 <= window));
    if (s.rows_given) CHECK(s.rows_match);
  }
}
