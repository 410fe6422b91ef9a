// kvlens-cli trace: records a lockstep run of several policies over a prompt or a co-reference
// sample into a .kvtrace file (engine/trace) and prints each run's step-metric means.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "app/cli/cli_common.h"
#include "app/session/policy_runs.h"
#include "app/session/recording.h"
#include "engine/common/error.h"
#include "engine/policy/registry.h"
#include "engine/session/trace_recorder.h"

namespace kvlens::cli {
namespace {

struct TraceFlags {
  std::string model_dir, prompt, policies = reference_policy().id, sparsities = "0.5", out_path,
                                 pools_path;
  std::string selected_heads;
  std::vector<std::string> policy_args;
  int64_t coref_index = -1, max_tokens = 0, prefill = 0, top_k = 10, memory_mb = 2048;
  uint64_t seed = 0;
  bool hard = false;
};
TraceFlags flags;

// "l:h,l:h" -> layer * heads + head, each checked against the model.
std::vector<int32_t> parse_heads(const std::string& text, const ModelConfig& config) {
  std::vector<int32_t> heads;
  if (text.empty()) return heads;
  for (const std::string& item : split_comma_list(text)) {
    int layer = -1, head = -1;
    char tail = 0;
    if (std::sscanf(item.c_str(), "%d:%d%c", &layer, &head, &tail) != 2 || layer < 0 ||
        layer >= config.num_layers || head < 0 || head >= config.num_heads) {
      throw Error("--select-heads", "head",
                  "layer:head with layer < " + std::to_string(config.num_layers) + " and head < " +
                      std::to_string(config.num_heads),
                  "'" + item + "'");
    }
    heads.push_back(int32_t(layer * config.num_heads + head));
  }
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  return heads;
}

// Mean of a metric over the steps where it is defined.
template <class Get>
double mean_over_steps(const Trace& trace, size_t run, Get get) {
  double sum = 0.0;
  int64_t count = 0;
  for (const auto& step : trace.steps()) {
    const double value = double(get(step[run]));
    if (std::isfinite(value)) sum += value, ++count;
  }
  return count ? sum / double(count) : NAN;
}

int run_trace(const CommonOptions& common, bool from_prompt) {
  if (from_prompt == (flags.coref_index >= 0)) {
    throw Error("trace", "--prompt or --coref-sample", "exactly one of them");
  }
  const std::vector<PolicyConfig> runs =
      resolve_policy_runs(flags.policies, flags.sparsities, flags.policy_args);
  if (flags.top_k < 1) throw Error("--top-k", "top_k", "at least 1", std::to_string(flags.top_k));
  if (flags.memory_mb < 0) {
    throw Error("--memory-budget-mb", "budget", "a non-negative size in MiB",
                std::to_string(flags.memory_mb));
  }
  { AtomicOutputFile probe(flags.out_path, "--out"); }  // an unwritable path fails before the run

  const std::shared_ptr<const Model> model = load_model(common, flags.model_dir);
  TraceOptions options;
  options.top_k = flags.top_k;
  options.memory_budget = uint64_t(flags.memory_mb) << 20;
  options.selected_heads = parse_heads(flags.selected_heads, model->config);
  options.prefill = flags.prefill;
  session::RecordingSource source;
  source.prompt = flags.prompt;
  source.coref_index = from_prompt ? -1 : flags.coref_index;
  source.seed = flags.seed;
  source.hard = flags.hard;
  source.pools_path = flags.pools_path;
  source.max_tokens = flags.max_tokens;
  session::Recording recording = session::open_recording(common, model, source, runs, options);
  TraceRecorder& recorder = *recording.recorder;
  const auto start = std::chrono::steady_clock::now();
  {
    ProgressBar bar(common.progress, "trace");
    while (recorder.step()) bar.update(recorder.trace().step_count(), recorder.steps_total());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const Trace& trace = recorder.trace();
  const auto saving = std::chrono::steady_clock::now();
  save_trace(trace, flags.out_path);
  const double save_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - saving).count();

  std::printf("trace %s: %lld steps x %zu runs in %.3f s, rows %.1f MiB saved in %.3f s",
              flags.out_path.c_str(), (long long)trace.step_count(), trace.runs.size(), seconds,
              double(trace.row_bytes()) / double(1 << 20), save_seconds);
  if (recording.shards.size() > 1)
    std::printf(" on %s", session::placement_text(recording).c_str());
  if (trace.degraded_from_step() >= 0) {
    std::printf(" (memory budget reached at step %lld: later steps keep %zu selected heads)",
                (long long)trace.degraded_from_step(), trace.selected_heads.size());
  }
  // Each run's policy and its own knobs (h2o:window=16; the sparsity has a column), so that two
  // runs of one policy and sparsity are told apart.
  std::vector<std::string> labels;
  int width = 12;
  for (const TraceRun& run : trace.runs) {
    const std::string spec = session::run_spec(PolicyConfig{run.policy, run.sparsity, run.params});
    const size_t knobs = spec.find(':');
    labels.push_back(run.policy + (knobs == std::string::npos ? "" : spec.substr(knobs)));
    width = std::max(width, int(labels.back().size()));
  }
  std::printf("\n%-*s %8s %9s %8s %8s %9s %9s %9s\n", width, "policy", "sparsity", "effective",
              "ppl", "kl", "recall", "classify", "consensus");
  for (size_t r = 0; r < trace.runs.size(); ++r) {
    const double nll = mean_over_steps(trace, r, [](const StepRecord& s) { return s.metrics.nll; });
    std::printf(
        "%-*s %8.3f %9.3f %8.3f %8.4f %9.3f %9.3f %9.3f\n", width, labels[r].c_str(),
        trace.runs[r].sparsity,
        mean_over_steps(trace, r, [](const StepRecord& s) { return s.metrics.effective_sparsity; }),
        std::exp(nll),
        mean_over_steps(trace, r, [](const StepRecord& s) { return s.metrics.kl_vs_dense; }),
        mean_over_steps(trace, r, [](const StepRecord& s) { return s.metrics.recall_vs_oracle; }),
        mean_over_steps(trace, r,
                        [](const StepRecord& s) { return s.metrics.classification_accuracy; }),
        mean_over_steps(trace, r, [](const StepRecord& s) { return s.metrics.consensus; }));
  }
  return 0;
}

}  // namespace

void add_trace_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command = app.add_subcommand(
      "trace", "Record several policies in lockstep over a text into a .kvtrace file");
  command->add_option("--model", flags.model_dir, "Hugging Face checkpoint folder")->required();
  auto* prompt = command->add_option("--prompt", flags.prompt, "Text to trace (BOS is added)");
  auto* coref = command
                    ->add_option("--coref-sample", flags.coref_index,
                                 "Trace co-reference sample I instead of a prompt")
                    ->check(CLI::NonNegativeNumber);
  prompt->excludes(coref);
  command
      ->add_option("--policies", flags.policies,
                   "Comma-separated policy ids or run specs ID@SPARSITY[:KEY=VALUE...], e.g. "
                   "dense,h2o@0.3,h2o@0.7:window=16 (docs/policy_specs.md)")
      ->capture_default_str();
  command
      ->add_option("--sparsity", flags.sparsities,
                   "Comma-separated sparsities in [0,1), for each plain id of --policies")
      ->capture_default_str();
  command->add_option("--policy-arg", flags.policy_args,
                      "Policy parameter key=value or policy.key=value (repeatable; a run "
                      "spec's own :key=value wins)");
  command->add_option("--out", flags.out_path, "The .kvtrace file to write")->required();
  command->add_option("--seed", flags.seed, "coref: generator seed (default 0)");
  command->add_flag("--hard", flags.hard, "coref: 2-3 locations per sample");
  command->add_option("--coref-pools", flags.pools_path, "coref: pools JSON");
  command->add_option("--max-tokens", flags.max_tokens, "prompt: keep only the first N tokens")
      ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--prefill", flags.prefill,
                   "Process the first N tokens densely (prefill + decode); 0: decode simulation")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--top-k", flags.top_k, "Next-token candidates kept per step")
      ->capture_default_str();
  command
      ->add_option("--memory-budget-mb", flags.memory_mb,
                   "Rows kept in full up to this many MiB, then only the selected heads")
      ->capture_default_str();
  command->add_option("--select-heads", flags.selected_heads,
                      "layer:head,... whose rows are kept past the memory budget");
  add_tensor_parallel_options(*command, common);
  add_common_options(*command, common);
  add_predictor_option(*command, common);
  add_plugin_option(*command, common);
  command->callback([&run, &common, prompt] {
    run = [&common, prompt] { return run_trace(common, bool(*prompt)); };
  });
}

}  // namespace kvlens::cli
