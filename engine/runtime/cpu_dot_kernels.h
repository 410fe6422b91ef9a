// Dot-product kernels of the CPU backend's matmul and attention: y[r] = x . w[r] for up to
// kMaxDotRows consecutive weight rows (F32, BF16 or F16 weights; x F32), AVX2/FMA when the CPU
// has it (chosen at run time, so the binary stays portable), portable loops otherwise.
#pragma once

#include <cstdint>

#include "engine/common/dtype.h"

namespace kvlens {

using DotRowsFn = void (*)(const float* x, const void* w, int64_t in, int rows, float* y);
inline constexpr int kMaxDotRows = 4;

struct DotKernels {
  const char* isa = "generic";  // set by pick_dot_kernels
  DotRowsFn f32 = nullptr;
  DotRowsFn bf16 = nullptr;
  DotRowsFn f16 = nullptr;

  DotRowsFn for_dtype(DType dtype) const {
    return dtype == DType::F32 ? f32 : dtype == DType::BF16 ? bf16 : f16;
  }
};

// The fastest kernel set this CPU supports (portable ones when allow_simd is false).
DotKernels pick_dot_kernels(bool allow_simd);

}  // namespace kvlens
