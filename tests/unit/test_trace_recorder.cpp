// TraceRecorder on a tiny random model: what the trace holds agrees with what scoring measures
// independently (NLL, effective sparsity), the oracle is its own recall reference, the dense
// reference run is added when not traced, the memory budget degrades, and kvlens-cli trace writes
// a file that loads without the model.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>

#include "engine/model/model.h"
#include "engine/session/scoring.h"
#include "engine/session/trace_recorder.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"
#include "tests/support/trace_rows_check.h"

using namespace kvlens;

namespace {

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const BackendModel> model;
  std::string dir;
};

Loaded load_tiny(const std::string& tag) {
  Loaded loaded;
  loaded.dir = test::write_tiny_llama(test::make_temp_dir(tag), test::TinyLlamaSpec{});
  loaded.backend = make_cpu_backend(2);
  loaded.model = upload_model(Model::load(loaded.dir), *loaded.backend);
  return loaded;
}

const std::vector<int32_t> kTokens = {1, 5, 9, 2, 33, 7, 7, 12, 40, 3, 8, 61, 17, 4};

Trace record(const Loaded& loaded, std::vector<PolicyConfig> policies, TraceOptions options = {}) {
  TraceRecorder recorder(loaded.model, nullptr, kTokens, std::move(policies), options);
  while (recorder.step()) {
  }
  CHECK_FALSE(recorder.step());
  return recorder.trace();
}

}  // namespace

TEST_CASE("a recorded trace agrees with scoring and the session's own counts", "[trace]") {
  Loaded loaded = load_tiny("trace-rec");
  const std::vector<PolicyConfig> policies = {
      {"dense", 0.0, {}}, {"h2o", 0.5, {"sinks=1"}}, {"oracle", 0.5, {"sinks=1"}}};
  const Trace trace = record(loaded, policies);
  REQUIRE(trace.step_count() == int64_t(kTokens.size()));
  REQUIRE(trace.runs.size() == 3);
  CHECK(trace.runs[1].policy == "h2o");
  CHECK(std::find(trace.runs[1].params.begin(), trace.runs[1].params.end(), "sinks=1") !=
        trace.runs[1].params.end());
  CHECK(trace.model.layers == 2);
  CHECK(trace.model.heads == 4);
  CHECK(trace.degraded_from_step() == -1);

  const std::vector<ScoreResult> scored = score_tokens_lockstep(loaded.model, kTokens, policies);
  for (size_t r = 0; r < policies.size(); ++r) {
    INFO(policies[r].id);
    double hidden = 0.0;
    for (int64_t t = 0; t < trace.step_count(); ++t) {
      const StepRecord& s = trace.steps()[size_t(t)][r];
      REQUIRE(s.columns == t + 1);
      if (t + 1 < trace.step_count()) {
        // The same lockstep arithmetic, the log-softmax in double in both: equal within 1e-9.
        CHECK(s.metrics.nll == Approx(scored[r].nll[size_t(t)]).margin(1e-9));
        CHECK(s.argmax == scored[r].argmax[size_t(t)]);
        CHECK(s.top.ids.front() == s.argmax);
      } else {
        CHECK(std::isnan(s.metrics.nll));
        CHECK(s.metrics.true_rank == -1);
      }
      hidden += s.metrics.effective_sparsity;
      // Counts are the visible rows' sums.
      for (int64_t i = 0; i < 8; ++i) {
        int64_t count = 0;
        for (int64_t j = 0; j <= t; ++j) count += s.visible[size_t(i * s.columns + j)];
        CHECK(count == s.visible_counts[size_t(i)]);
      }
    }
    // The session counts hidden tokens in its own pass over the masks (SparsityStats); the
    // trace's per-step means must average to the same overall figure (sums in another order).
    const double expected = r == 0 ? 0.0 : scored[r].sparsity.overall();
    CHECK(hidden / double(trace.step_count()) == Approx(expected).margin(1e-12));
  }
  for (int64_t t = 0; t < trace.step_count(); ++t) {
    const auto& step = trace.steps()[size_t(t)];
    CHECK(step[0].metrics.kl_vs_dense == 0.0);            // the dense run is the reference
    CHECK(std::isnan(step[0].metrics.recall_vs_oracle));  // nothing selected
    CHECK(step[0].metrics.true_rank == step[0].metrics.dense_true_rank);
    // Layer 0 is dense (dense_layers = 1): no scores; layer 1 was ranked.
    CHECK(step[1].decisions[0] == LayerDecision::Dense);
    CHECK(std::isnan(step[1].scores[0]));
    CHECK(step[1].decisions[1] == LayerDecision::Masked);
    // The oracle is its own reference: recall 1; its scores are probabilities, which rank like
    // the true logits, so the top-half classification agrees everywhere.
    CHECK(step[2].metrics.recall_vs_oracle == Approx(1.0));
    CHECK(step[2].metrics.classification_accuracy == Approx(1.0));
    if (t >= 4) CHECK(step[1].metrics.kl_vs_dense > 0.0);
  }
}

TEST_CASE("a trace without dense compares against a hidden dense run", "[trace]") {
  Loaded loaded = load_tiny("trace-hidden-dense");
  const Trace trace = record(loaded, {{"streaming", 0.6, {"sinks=1"}}});
  REQUIRE(trace.runs.size() == 1);
  const std::vector<ScoreResult> dense =
      score_tokens_lockstep(loaded.model, kTokens, std::vector<PolicyConfig>{{}});
  double kl_total = 0.0;
  for (int64_t t = 0; t + 1 < trace.step_count(); ++t) {
    const StepRecord& s = trace.steps()[size_t(t)][0];
    kl_total += s.metrics.kl_vs_dense;
    // The dense rank of the true next token: 0 exactly where dense predicted it.
    CHECK((s.metrics.dense_true_rank == 0) ==
          (dense[0].argmax[size_t(t)] == kTokens[size_t(t + 1)]));
  }
  CHECK(kl_total > 0.0);
}

TEST_CASE("the trace memory budget keeps the selected heads and says from when", "[trace]") {
  Loaded loaded = load_tiny("trace-budget");
  TraceOptions options;
  // Rows of a step: 2 runs x 8 heads x (t + 1) x 9 bytes; 3000 bytes hold steps 0..3 in full
  // (2 x 8 x 9 x (1 + 2 + 3 + 4) = 1440, step 4 adds 720 = 2160, step 5 adds 864 = 3024 > 3000).
  options.memory_budget = 3000;
  options.selected_heads = {5};  // layer 1, head 1
  const Trace trace = record(loaded, {{"dense", 0.0, {}}, {"keydiff", 0.5, {}}}, options);
  CHECK(trace.degraded_from_step() == 5);
  const StepRecord& late = trace.steps()[10][1];
  CHECK(late.kept_heads == std::vector<int32_t>{5});
  CHECK(late.logits_row(1, 1, 4) != nullptr);
  CHECK(late.logits_row(0, 0, 4) == nullptr);
  CHECK(late.visible_counts.size() == 8);  // summaries stay
  CHECK(std::isfinite(late.metrics.kl_vs_dense));
  CHECK(trace.steps()[4][1].kept_heads.size() == 8);
}

TEST_CASE("kvlens-cli trace writes a .kvtrace that loads without the model", "[trace][cli]") {
  const std::string dir = test::make_temp_dir("cli-trace");
  const std::string out = dir + "/run.kvtrace";
  const std::string model = test::source_path("assets/models/demo");
  const test::CommandResult ok = test::run_command(
      test::cli_path() + " trace --model " + model +
      " --coref-sample 2 --policies dense,h2o,streaming --sparsity 0.5 --out " + out);
  INFO(ok.err);
  REQUIRE(ok.exit_code == 0);
  CHECK_THAT(ok.out, Catch::Contains("h2o") && Catch::Contains("recall"));
  const Trace trace = load_trace(out);
  CHECK(trace.runs.size() == 3);
  CHECK(trace.coref.present);
  CHECK(trace.coref.answer_token_end > trace.coref.answer_token_begin);
  CHECK(trace.step_count() == int64_t(trace.tokens.size()));
  CHECK_FALSE(trace.tokens[5].text.empty());

  const test::CommandResult both =
      test::run_command(test::cli_path() + " trace --model " + model + " --out " + out);
  CHECK(both.exit_code != 0);
  CHECK_THAT(both.err, Catch::Contains("--prompt or --coref-sample"));
  const test::CommandResult heads =
      test::run_command(test::cli_path() + " trace --model " + model +
                        " --prompt hi --select-heads 9:0 --out " + out);
  CHECK(heads.exit_code != 0);
  CHECK_THAT(heads.err, Catch::Contains("--select-heads") && Catch::Contains("'9:0'"));
}

TEST_CASE("every recorded step holds its own rows (captured while the next step runs)", "[trace]") {
  // Masked (h2o), skipped (tokenfilter's skipped layers) and dense layers, and a run before its
  // window fills (streaming): the capture of step t must not show step t + 1's rows.
  Loaded loaded = load_tiny("trace-rows");
  const std::vector<PolicyConfig> policies = {{"dense", 0.0, {}},
                                              {"h2o", 0.5, {"sinks=1"}},
                                              {"tokenfilter", 0.5, {}},
                                              {"streaming", 0.6, {"sinks=1"}}};
  CHECK(test::check_trace_rows_match_session(loaded.model, kTokens, policies) ==
        int64_t(kTokens.size()));
}
