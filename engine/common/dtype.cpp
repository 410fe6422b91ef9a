// DType sizes and names, and the widening of F16 and BF16 (arrays of them too).
#include "engine/common/dtype.h"

#include <cstring>

namespace kvlens {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 4;
    case DType::F16:
      return 2;
    case DType::BF16:
      return 2;
    case DType::I32:
      return 4;
    case DType::U8:
      return 1;
  }
  return 0;
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "F32";
    case DType::F16:
      return "F16";
    case DType::BF16:
      return "BF16";
    case DType::I32:
      return "I32";
    case DType::U8:
      return "U8";
  }
  return "?";
}

bool widen_to_f32(const std::byte* src, DType dtype, int64_t count, float* dst) {
  if (dtype == DType::F32) {
    std::memcpy(dst, src, size_t(count) * sizeof(float));
    return true;
  }
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  for (int64_t i = 0; i < count; ++i) {
    uint16_t bits;
    std::memcpy(&bits, src + 2 * i, sizeof bits);  // the data may be unaligned
    dst[i] = dtype == DType::BF16 ? bf16_to_f32(bits) : f16_to_f32(bits);
  }
  return true;
}

float f16_to_f32(uint16_t bits) {
  const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu;
  uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // Subnormal: normalise the mantissa.
    exponent = 127 - 15 + 1;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= 0x3ffu;
    return std::bit_cast<float>(sign | (exponent << 23) | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

}  // namespace kvlens
