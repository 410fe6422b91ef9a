// Catch2's implementation, compiled once for every test executable (it takes about 20 s a
// compile); each executable's main (catch_main.cpp, ui/ui_main.cpp, cuda/cuda_main.cpp) runs its
// session through run_catch_session.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/support/catch_session.h"

int run_catch_session(int argc, char** argv) {
  return Catch::Session().run(argc, argv);
}
