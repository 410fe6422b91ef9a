// Shared pieces of kvlens-cli's commands: common flags, model/backend set-up, output helpers.
// Each command lives in its own cmd_<name>.cpp and registers itself through add_<name>_command.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/backend.h"

namespace kvlens::cli {

struct CommonOptions {
  std::string backend = "cpu";  // cpu | cuda
  int threads = 0;              // 0 = all cores
  bool progress = false;        // progress bar on stderr
};

// Every command's run function; exceptions (kvlens::Error and others) are reported by main().
using CommandFn = std::function<int()>;

// Backend by name; throws kvlens::Error when it is not available in this build or machine.
std::unique_ptr<Backend> make_backend(const CommonOptions& common);

// A progress bar on stderr: "label [=====>    ] done/total  rate/s"; no-op when disabled.
class ProgressBar {
 public:
  ProgressBar(bool enabled, std::string label);
  ~ProgressBar();
  void update(int64_t done, int64_t total);

 private:
  bool enabled_;
  std::string label_;
  double start_seconds_;
  double last_draw_seconds_ = -1.0;
  bool drawn_ = false;
};

// Adds --backend, --threads and --progress to a subcommand.
void add_common_options(CLI::App& command, CommonOptions& common);

// "1,2,3" -> ids; throws kvlens::Error naming `flag` for anything that is not a comma-separated
// list of non-negative integers.
std::vector<int32_t> parse_token_list(const std::string& text, const std::string& flag);

// Registration of subcommands (one per cmd_*.cpp). Each returns the function main() runs when
// that subcommand was chosen.
void add_info_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_tokenize_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_generate_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_score_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_bench_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_coref_samples_command(CLI::App& app, CommonOptions& common, CommandFn& run);

}  // namespace kvlens::cli
