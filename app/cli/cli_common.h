// Shared pieces of kvlens-cli's commands: the common flags (CLI11), the progress bar, and the
// session set-up they share with the desktop app (app/session/) under short names. Each command
// lives in its own cmd_<name>.cpp and registers itself through add_<name>_command.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/session/common_options.h"
#include "app/session/model_input.h"
#include "app/session/output_file.h"
#include "app/session/policy_runs.h"
#include "engine/common/comma_list.h"

namespace kvlens::cli {

// The session set-up (app/session/) the commands use.
using session::AtomicOutputFile;
using session::check_input_tokens;
using session::CommonOptions;
using session::load_coref_pools_option;
using session::load_model;
using session::make_backend;
using session::parse_token_list;
using session::PolicyOptions;
using session::resolve_input_tokens;
using session::resolve_policy;
using session::resolve_policy_runs;

// Every command's run function; exceptions (kvlens::Error and others) are reported by main().
using CommandFn = std::function<int()>;

// A progress bar on stderr: "label [=====>    ] done/total  rate unit/s"; no-op when disabled.
class ProgressBar {
 public:
  ProgressBar(bool enabled, std::string label, std::string unit = "tok");
  ~ProgressBar();
  void update(int64_t done, int64_t total);

 private:
  bool enabled_;
  std::string label_;
  std::string unit_;
  double start_seconds_;
  double last_draw_seconds_ = -1.0;
  bool drawn_ = false;
};

// Before any work on the CPU backend (other backends pass): the weights plus `runs` runs'
// caches (and policy rows where `policies`) over `tokens` positions must fit MemAvailable
// (engine/session/memory_estimate.h); throws kvlens::Error naming `what` and both figures.
void check_cpu_memory(const CommonOptions& common, const Model& model, int64_t tokens, int64_t runs,
                      bool policies, const std::string& what);

// Adds --backend, --threads, --cpu-kernels and --progress to a subcommand.
void add_common_options(CLI::App& command, CommonOptions& common);
// Adds --predictor to a subcommand that opens a model.
void add_predictor_option(CLI::App& command, CommonOptions& common);
// Adds --plugin FILE.so and --policy-file FILE.py (repeatable) to a subcommand that takes
// policies: main() registers them (with the plug-in folders' own) before the command runs.
void add_plugin_option(CLI::App& command, CommonOptions& common);
// Adds --policy, --sparsity and --policy-arg (generate, score).
void add_policy_options(CLI::App& command, PolicyOptions& options);

// Adds --gpus N and --devices LIST (CommonOptions::gpus, devices) to a command that can split
// one model over several GPUs (generate, bench, trace).
void add_tensor_parallel_options(CLI::App& command, CommonOptions& common);

// Registration of subcommands (one per cmd_*.cpp). Each returns the function main() runs when
// that subcommand was chosen.
void add_info_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_tokenize_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_generate_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_score_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_bench_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_coref_samples_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_policies_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_eval_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_trace_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_figure_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_merge_command(CLI::App& app, CommonOptions& common, CommandFn& run);

}  // namespace kvlens::cli
