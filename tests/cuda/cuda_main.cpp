// Main of the CUDA test suite (kvlens_cuda_tests). Listing runs as usual, so ctest can discover
// the tests on machines without a GPU; any other run exits with 4 there, which ctest reports as
// Skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt).
#include "tests/support/catch_session.h"

#include <cstdio>
#include <string_view>

#include "kernels/cuda_backend.h"
#include "kernels/policy/cuda_policy_ops.h"

namespace {

// True when the command line asks Catch2 to list something (what catch_discover_tests does
// with --list-test-names-only) or for help: those need no device.
bool asks_only_to_list(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--list-test-names-only" || arg == "--list-tests" || arg == "-l" ||
        arg == "--list-tags" || arg == "-t" || arg == "--list-reporters" || arg == "-h" ||
        arg == "-?" || arg == "--help")
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (!asks_only_to_list(argc, argv) && !kvlens::cuda_device_available()) {
    std::printf("skipped: no CUDA device\n");
    return 4;
  }
  // Every test's CUDA backend gets the policies' op extensions (keydiff, quest, tokenfilter).
  kvlens::register_cuda_policy_ops();
  return run_catch_session(argc, argv);
}
