// Argument checks shared by the CPU backend's source files (cpu_backend.cpp, cpu_policy_ops.cpp).
// Shape/dtype mistakes are programming errors in the caller, but they still surface as a
// kvlens::Error naming the op and argument rather than as memory corruption. Internal header.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/error.h"
#include "engine/runtime/backend.h"

namespace kvlens::cpu_checks {

inline constexpr const char* kWhere = "cpu backend";

// Concatenates strings and integers for messages (one buffer, no temporaries chained by +).
inline void append_part(std::string& text, std::string_view part) {
  text += part;
}
inline void append_part(std::string& text, int64_t number) {
  text += std::to_string(number);
}
template <typename... Parts>
std::string cat(const Parts&... parts) {
  std::string text;
  (append_part(text, parts), ...);
  return text;
}

inline std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

inline std::string describe(const DeviceTensor& t) {
  return std::string(dtype_name(t.dtype)) + " " + shape_string(t.shape);
}

inline void require(bool ok, const std::string& field, const std::string& expected,
                    const std::string& found = {}) {
  if (!ok) throw Error(kWhere, field, expected, found);
}

inline void require_data(const DeviceTensor& t, const std::string& field) {
  require(!t.empty() || t.numel() == 0, field, "a tensor with storage", "an empty tensor");
}

inline void require_f32(const DeviceTensor& t, const std::string& field) {
  require(t.dtype == DType::F32, field, "an F32 tensor", describe(t));
  require_data(t, field);
}

// Both caches F32 and of one [G, capacity, D] shape.
inline void require_kv_caches(const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                              const std::string& op) {
  require_f32(k_cache, op + ": k_cache");
  require_f32(v_cache, op + ": v_cache");
  require(k_cache.shape.size() == 3 && v_cache.shape == k_cache.shape, op + ": caches",
          "two [G, capacity, D] tensors", describe(k_cache) + ", " + describe(v_cache));
}

}  // namespace kvlens::cpu_checks
