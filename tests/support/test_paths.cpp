// Test path helpers and a small process runner for CLI tests.
#include "tests/support/test_paths.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace kvlens::test {

std::string source_path(const std::string& relative) {
  return std::string(KVLENS_SOURCE_DIR) + "/" + relative;
}
std::string shared_path(const std::string& relative) {
  return std::string(KVLENS_SHARED_DIR) + "/" + relative;
}
std::string cli_path() {
  return KVLENS_CLI_PATH;
}

namespace {
// One root per test process, removed when the process exits so /tmp does not fill up.
struct TempRoot {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kvlens-test-" + std::to_string(::getpid()));
  ~TempRoot() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};
}  // namespace

std::string make_temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  static TempRoot root;
  namespace fs = std::filesystem;
  const fs::path dir = root.path / (tag + "-" + std::to_string(counter++));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

namespace {
std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}
}  // namespace

CommandResult run_command(const std::string& command_line) {
  const std::string dir = make_temp_dir("cmd");
  const std::string out_path = dir + "/stdout", err_path = dir + "/stderr";
  const std::string full = command_line + " >" + out_path + " 2>" + err_path;
  const int status = std::system(full.c_str());
  CommandResult result;
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = slurp(out_path);
  result.err = slurp(err_path);
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace kvlens::test
