// Reading the committed JSON parity fixtures (tests/fixtures/<method>/reference.json) that the
// policy parity tests compare against: the file parsed, JSON number arrays as floats, and the
// small q/K example of the approximate-logit fixtures put into a policy harness.
#pragma once

#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/policy_harness.h"
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

// The fixture's q [4 heads, D = 4] and keys [2 KV heads, tokens, 4] in the harness (its logits
// are never read); returns the step, tokens - 1.
inline int64_t load_qk_example(Harness& h, const nlohmann::json& f) {
  const int64_t t = f["tokens"];
  REQUIRE(int64_t(f["heads"]) == 4);
  REQUIRE(int64_t(f["kv_heads"]) == 2);
  REQUIRE(int64_t(f["head_dim"]) == 4);
  const std::vector<float> q = json_floats(f["q"]), k = json_floats(f["k"]);
  std::vector<std::vector<float>> q_rows(4);
  for (int64_t r = 0; r < 4; ++r)
    q_rows[size_t(r)].assign(q.begin() + r * 4, q.begin() + r * 4 + 4);
  h.set_q(q_rows);
  std::vector<std::vector<std::vector<float>>> keys(2);
  for (int64_t g = 0; g < 2; ++g)
    for (int64_t j = 0; j < t; ++j)
      keys[size_t(g)].push_back(
          std::vector<float>(k.begin() + (g * t + j) * 4, k.begin() + (g * t + j) * 4 + 4));
  h.set_keys(keys);
  h.set_logits(std::vector<float>(size_t(t), 0.0f));
  return t - 1;
}

}  // namespace kvlens::test
