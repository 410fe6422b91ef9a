// Argument checks shared by the CPU backend's source files (cpu_backend.cpp, cpu_policy_ops.cpp,
// cpu_attention_ops.cpp, cpu_matmul.cpp) and by Backend's default ops (engine/backend/backend.cpp:
// the checks read only shapes and dtypes, so they hold for any backend), and the weight widening
// they share.
// Shape/dtype mistakes are programming errors in the caller, but they still surface as a
// kvlens::Error naming the op and argument rather than as memory corruption. Internal header.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/common/error.h"

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

// The argument a check names, kept as up to three pieces ("attention_visible", ": ", "probs")
// and joined only when the check fails: decode issues hundreds of ops per step, and building the
// strings of checks that pass cost about a microsecond per op. Holds views: use it only within
// the full expression that made it.
struct Field {
  std::string_view a, b, c;
  Field(const char* text) : a(text) {}  // NOLINT: implicit on purpose
  Field(std::string_view text) : a(text) {}
  Field(const std::string& text) : a(text) {}
  Field(std::string_view first, std::string_view second, std::string_view third = {})
      : a(first), b(second), c(third) {}
  std::string text() const { return cat(a, b, c); }
};

// An op's name: `op + ": x"` names its argument x without building a string.
struct OpName {
  std::string_view name;
  Field operator+(const char* argument) const { return Field(name, argument); }
};

[[noreturn]] inline void fail(const Field& field, const std::string& expected,
                              const std::string& found = {}) {
  throw Error(kWhere, field.text(), expected, found);
}

}  // namespace kvlens::cpu_checks

// Checks `ok`; only when it fails are the field, expected and found arguments evaluated (they
// often build strings) and a kvlens::Error thrown.
#define KVLENS_REQUIRE(ok, ...)                \
  do {                                         \
    if (!(ok)) [[unlikely]]                    \
      ::kvlens::cpu_checks::fail(__VA_ARGS__); \
  } while (false)

namespace kvlens::cpu_checks {

inline void require_data(const DeviceTensor& t, const Field& field) {
  KVLENS_REQUIRE(!t.empty() || t.numel() == 0, field, "a tensor with storage", "an empty tensor");
}

inline void require_f32(const DeviceTensor& t, const Field& field) {
  KVLENS_REQUIRE(t.dtype == DType::F32, field, "an F32 tensor", describe(t));
  require_data(t, field);
}

// Both caches F32 and of one [G, capacity, D] shape.
inline void require_kv_caches(const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                              std::string_view op) {
  require_f32(k_cache, Field(op, ": k_cache"));
  require_f32(v_cache, Field(op, ": v_cache"));
  KVLENS_REQUIRE(k_cache.shape.size() == 3 && v_cache.shape == k_cache.shape, Field(op, ": caches"),
                 "two [G, capacity, D] tensors", describe(k_cache) + ", " + describe(v_cache));
}

// Widens `count` weight elements starting at element `first` into dst.
inline void widen(const DeviceTensor& t, int64_t first, int64_t count, float* dst) {
  switch (t.dtype) {
    case DType::F32:
      std::memcpy(dst, t.as<const float>() + first, size_t(count) * sizeof(float));
      return;
    case DType::BF16: {
      const uint16_t* src = t.as<const uint16_t>() + first;
      for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(src[i]);
      return;
    }
    case DType::F16: {
      const uint16_t* src = t.as<const uint16_t>() + first;
      for (int64_t i = 0; i < count; ++i) dst[i] = f16_to_f32(src[i]);
      return;
    }
    default:
      throw Error(kWhere, "weight", "an F32, BF16 or F16 tensor", describe(t));
  }
}

// --- shared by the policy and attention ops ---

struct RowShape {
  int64_t rows = 0, stride = 0;
};

// `t` as a [rows, stride] tensor of `dtype` with stride >= cols (rows < 0: any row count).
inline RowShape row_shape(const DeviceTensor& t, DType dtype, int64_t rows, int64_t cols,
                          const Field& field) {
  KVLENS_REQUIRE(
      t.dtype == dtype && t.shape.size() == 2 && (rows < 0 || t.dim(0) == rows) && t.dim(0) >= 0 &&
          t.dim(1) >= cols,
      field,
      cat("a ", dtype_name(dtype), " [", rows < 0 ? std::string("rows") : std::to_string(rows),
          ", >= ", cols, "] tensor"),
      describe(t));
  require_data(t, field);
  return {t.dim(0), t.dim(1)};
}

// Candidate columns are packed into 32 bits by top_k_key; every op keeps to the same range.
inline void require_cols(int64_t cols, OpName op) {
  KVLENS_REQUIRE(cols >= 0 && cols <= std::numeric_limits<int32_t>::max(), op + ": cols",
                 "a column count in [0, 2^31)", std::to_string(cols));
}

// Per-head work of about `work` multiply-adds: ~64K per chunk, as the attention op schedules.
inline int64_t grain_for(int64_t work) {
  return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, work));
}

// A KV cache [G, capacity, D] F32 holding at least `cols` positions.
struct CacheShape {
  int64_t groups, capacity, head_dim;
};
inline CacheShape cache_shape(const DeviceTensor& cache, int64_t cols, OpName op,
                              std::string_view name) {
  require_f32(cache, Field(op.name, ": ", name));
  KVLENS_REQUIRE(cache.shape.size() == 3, Field(op.name, ": ", name), "a [G, capacity, D] tensor",
                 describe(cache));
  const CacheShape shape{cache.dim(0), cache.dim(1), cache.dim(2)};
  KVLENS_REQUIRE(cols <= shape.capacity, op + ": cols",
                 cat("at most the capacity ", shape.capacity), std::to_string(cols));
  return shape;
}

}  // namespace kvlens::cpu_checks
