// The main of the unit, parity and real test executables.
#include "tests/support/catch_session.h"

int main(int argc, char** argv) {
  return run_catch_session(argc, argv);
}
