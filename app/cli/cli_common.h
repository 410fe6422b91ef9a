// Shared pieces of kvlens-cli's commands: common flags, model/backend set-up, output helpers.
// Each command lives in its own cmd_<name>.cpp and registers itself through add_<name>_command.
#pragma once

#include <CLI/CLI.hpp>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/comma_list.h"
#include "engine/model/model.h"
#include "engine/runtime/backend.h"

namespace kvlens::cli {

struct CommonOptions {
  std::string backend = "cpu";  // cpu | cuda
  int threads = 0;              // 0 = all cores
  // CPU kernel set: auto (the fastest the CPU has), avx2 (no AVX-512) or generic (portable
  // loops); auto and avx2 give the same bits, generic differs in the attention's last bits.
  std::string cpu_kernels = "auto";
  bool progress = false;  // progress bar on stderr
  // --predictor: a predictor.safetensors (predictor.json beside it) overriding the model
  // folder's own TokenButler predictor (commands that open a model).
  std::string predictor;
};

// Every command's run function; exceptions (kvlens::Error and others) are reported by main().
using CommandFn = std::function<int()>;

// Backend by name; throws kvlens::Error when it is not available in this build or machine.
std::unique_ptr<Backend> make_backend(const CommonOptions& common);

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

// An output file written under a temporary name ("<path>.partial") and renamed into place by
// commit(), so a failed run never leaves half a file behind. Created by the constructor: an
// unwritable path fails before a long run rather than after it.
class AtomicOutputFile {
 public:
  // Throws kvlens::Error naming `path` and `flag` (the option that gave it) when it cannot be
  // created.
  AtomicOutputFile(std::string path, std::string flag);
  ~AtomicOutputFile();  // removes the temporary file unless commit() succeeded
  AtomicOutputFile(const AtomicOutputFile&) = delete;
  AtomicOutputFile& operator=(const AtomicOutputFile&) = delete;

  std::ostream& stream() { return out_; }
  // Flushes, closes and renames; throws kvlens::Error when the data could not be written or
  // moved (the destructor then removes the temporary file).
  void commit();

 private:
  std::string path_, flag_, partial_;
  std::ofstream out_;
  bool committed_ = false;
};

// Adds --backend, --threads and --progress to a subcommand.
void add_common_options(CLI::App& command, CommonOptions& common);
// Adds --predictor to a subcommand that opens a model.
void add_predictor_option(CLI::App& command, CommonOptions& common);
// Model::load with the --predictor override.
std::shared_ptr<const Model> load_model(const CommonOptions& common, const std::string& model_dir);

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
void add_policies_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_eval_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_trace_command(CLI::App& app, CommonOptions& common, CommandFn& run);
void add_figure_command(CLI::App& app, CommonOptions& common, CommandFn& run);

}  // namespace kvlens::cli
