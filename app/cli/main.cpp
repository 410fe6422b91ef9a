// kvlens-cli: the headless front end over the same engine as the app (see DESIGN.md for the
// stable interface). Every error is reported on stderr as one line with a non-zero exit code.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "app/cli/cli_common.h"
#include "app/session/python_policies.h"
#include "engine/common/error.h"
#include "engine/eval/eval_workers.h"

int main(int argc, char** argv) {
  using namespace kvlens::cli;
  // Before anything could start NCCL or torch: NVLink multicast off unless the user set it.
  kvlens::set_multicast_off_defaults();
  CLI::App app{"kvlens-cli: run Llama-family checkpoints and KV-cache policies headless"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kvlens-cli 0.1.0");
  CommonOptions common;
  CommandFn run;
  add_info_command(app, common, run);
  add_tokenize_command(app, common, run);
  add_generate_command(app, common, run);
  add_score_command(app, common, run);
  add_bench_command(app, common, run);
  add_coref_samples_command(app, common, run);
  add_policies_command(app, common, run);
  add_eval_command(app, common, run);
  add_trace_command(app, common, run);
  add_figure_command(app, common, run);
  add_merge_command(app, common, run);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  try {
    // Plug-ins first, so that every command sees their policies as built-ins.
    std::vector<std::string> warnings;
    kvlens::session::load_plugins(common, warnings);
    for (const std::string& warning : warnings)
      std::fprintf(stderr, "kvlens-cli: warning: %s\n", warning.c_str());
    kvlens::session::load_policy_files(common.policy_files);
    return run ? run() : 2;
  } catch (const kvlens::Error& error) {
    std::fprintf(stderr, "kvlens-cli: error: %s\n", error.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kvlens-cli: error: out of memory\n");
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "kvlens-cli: error: %s\n", error.what());
    return 1;
  }
}
