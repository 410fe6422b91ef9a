// error_message(action): runs `action`, which must throw kvlens::Error, and returns its message
// (the test fails when nothing or something else is thrown).
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "engine/common/error.h"

namespace kvlens::test {

template <class F>
std::string error_message(F&& action) {
  try {
    action();
  } catch (const kvlens::Error& error) {
    return error.what();
  }
  FAIL("expected a kvlens::Error");
  return {};
}

}  // namespace kvlens::test
