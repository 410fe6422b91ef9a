// Paths tests need: the source tree, ../shared beside it, the built kvlens-cli, a scratch dir.
#pragma once

#include <string>

namespace kvlens::test {

std::string source_path(const std::string& relative);  // <repo>/relative
std::string shared_path(const std::string& relative);  // <repo>/../shared/relative
std::string cli_path();                                // built kvlens-cli
// A fresh empty directory under the build's temp area, unique per call.
std::string make_temp_dir(const std::string& tag);

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs a shell command line, capturing stdout and stderr separately.
CommandResult run_command(const std::string& command_line);

}  // namespace kvlens::test
