// Seeded normal values for backend tests (std::mt19937 + normal_distribution: reproducible with
// one standard library; tests compare backends on the same values, never against stored numbers).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvlens::test {

inline std::vector<float> random_values(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

}  // namespace kvlens::test
