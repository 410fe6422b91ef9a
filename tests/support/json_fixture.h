// Reading the committed JSON parity fixtures (tests/fixtures/<method>/reference.json) that the
// policy parity tests compare against: the file parsed, and JSON number arrays as floats.
#pragma once

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/test_paths.h"

namespace kvlens::test {

// `relative` from the source tree's root; a missing file fails the test that reads it.
inline nlohmann::json read_json_fixture(const std::string& relative) {
  std::ifstream in(source_path(relative));
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

inline std::vector<float> json_floats(const nlohmann::json& values) {
  std::vector<float> out;
  for (const auto& v : values) out.push_back(v.get<float>());
  return out;
}

}  // namespace kvlens::test
