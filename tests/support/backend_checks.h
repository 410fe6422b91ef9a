// Helpers shared by the backend tests: host values into a backend tensor and back, and an
// elementwise tolerance check that reports the count and the worst element instead of one line
// per element.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backend/backend.h"

namespace kvlens::test {

inline DeviceTensor make_f32(Backend& backend, const std::vector<float>& values,
                             std::vector<int64_t> shape) {
  DeviceTensor t = backend.alloc(DType::F32, std::move(shape));
  REQUIRE(size_t(t.numel()) == values.size());
  backend.from_host(t, values.data(), values.size() * sizeof(float));
  return t;
}

inline DeviceTensor make_u8(Backend& backend, const std::vector<uint8_t>& values,
                            std::vector<int64_t> shape) {
  DeviceTensor t = backend.alloc(DType::U8, std::move(shape));
  REQUIRE(size_t(t.numel()) == values.size());
  backend.from_host(t, values.data(), values.size());
  return t;
}

inline std::vector<float> read_f32(Backend& backend, const DeviceTensor& t) {
  std::vector<float> values(size_t(t.numel()));
  backend.to_host(t, values.data(), values.size() * sizeof(float));
  return values;
}

inline std::vector<uint8_t> read_u8(Backend& backend, const DeviceTensor& t) {
  std::vector<uint8_t> values(size_t(t.numel()));
  backend.to_host(t, values.data(), values.size());
  return values;
}

// |got[i] - want[i]| <= tolerance[i] (equal infinities pass, NaN fails).
inline void check_within(const std::vector<float>& want, const std::vector<float>& got,
                         const std::vector<double>& tolerance, const std::string& what) {
  REQUIRE(want.size() == got.size());
  REQUIRE(tolerance.size() == want.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = want[i], g = got[i];
    double ratio = 0.0;
    if (std::isinf(w) || std::isinf(g)) {
      ratio = w == g ? 0.0 : std::numeric_limits<double>::infinity();
    } else if (std::isnan(w) || std::isnan(g)) {
      ratio = std::numeric_limits<double>::infinity();
    } else {
      const double error = std::fabs(g - w);
      ratio = error == 0.0 ? 0.0 : error / tolerance[i];
    }
    if (ratio > 1.0) {
      ++bad;
      if (ratio > worst_ratio || bad == 1) worst = i, worst_ratio = ratio;
    }
  }
  std::ostringstream message;
  message.precision(9);
  message << what << ": " << bad << " of " << want.size() << " outside tolerance";
  if (bad) {
    message << "; worst [" << worst << "] want " << want[worst] << " got " << got[worst]
            << " tolerance " << tolerance[worst];
  }
  INFO(message.str());
  CHECK(bad == 0);
}

}  // namespace kvlens::test
