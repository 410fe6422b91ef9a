// Element types of weights and activations, and exact conversions of BF16/F16 to F32.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvlens {

enum class DType : uint8_t { F32, F16, BF16, I32, U8 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);  // safetensors spelling: "F32", "F16", "BF16", ...

// BF16 is the top half of an F32, so widening is exact.
inline float bf16_to_f32(uint16_t bits) {
  return std::bit_cast<float>(uint32_t(bits) << 16);
}

// Round-to-nearest-even, NaN kept quiet; matches torch's float -> bfloat16 conversion.
inline uint16_t f32_to_bf16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// IEEE binary16 -> binary32, exact (subnormals, infinities and NaN included).
float f16_to_f32(uint16_t bits);

// dst[i] = element i of `src` (F32, BF16 or F16, at any alignment: mapped checkpoint data) as
// F32, exactly, for i < count. Returns false for another dtype (nothing written).
bool widen_to_f32(const std::byte* src, DType dtype, int64_t count, float* dst);

}  // namespace kvlens
