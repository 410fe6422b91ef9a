// Dot-product kernels of the CPU backend's matmul and attention: y[r] = x . w[r] for up to
// kMaxDotRows consecutive weight rows (F32, BF16 or F16 weights; x F32), AVX2/FMA when the CPU
// has it (chosen at run time, so the binary stays portable), portable loops otherwise.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/common/dtype.h"

namespace kvlens {

using DotRowsFn = void (*)(const float* x, const void* w, int64_t in, int rows, float* y);
inline constexpr int kMaxDotRows = 4;
// y[i * y_stride + r] = x[i * x_stride ...] . w[r * in ...] for i < nx <= kMaxBlockX rows of x
// and r < rows <= kMaxBlockRows weight rows: a register block that loads (and widens) each weight
// once for several x rows (lockstep runs, prefill). Every output is summed in exactly the order of
// the DotRowsFn kernels, so the result is bit-identical to nx separate calls.
using DotBlockFn = void (*)(const float* x, int64_t x_stride, int nx, const void* w, int64_t in,
                            int rows, float* y, int64_t y_stride);
inline constexpr int kMaxBlockX = 4;
inline constexpr int kMaxBlockRows = 3;

struct DotKernels {
  const char* isa = "generic";  // set by pick_dot_kernels
  DotRowsFn f32 = nullptr;
  DotRowsFn bf16 = nullptr;
  DotRowsFn f16 = nullptr;
  DotBlockFn f32_block = nullptr;
  DotBlockFn bf16_block = nullptr;
  DotBlockFn f16_block = nullptr;

  DotRowsFn for_dtype(DType dtype) const {
    return dtype == DType::F32 ? f32 : dtype == DType::BF16 ? bf16 : f16;
  }
  DotBlockFn block_for_dtype(DType dtype) const {
    return dtype == DType::F32 ? f32_block : dtype == DType::BF16 ? bf16_block : f16_block;
  }
};

// The fastest kernel set this CPU supports (portable ones when allow_simd is false).
DotKernels pick_dot_kernels(bool allow_simd);

// The attention logit scale head_dim^-0.5, rounded to F32 once (transformers multiplies the F32
// scores by the Python float `scaling`).
inline float attention_scale(int64_t head_dim) {
  return float(1.0 / std::sqrt(double(head_dim)));
}

// One query head's logits over consecutive cache rows: row[j] = (q . keys[j * head_dim ...]) *
// scale for j in [lo, hi], -inf for j in [0, lo). The dots go kMaxDotRows rows at a time with `dot`
// (an F32 kernel). The attention and attention_logits ops both call this, so their logits agree bit
// for bit.
void scaled_logits_row(DotRowsFn dot, const float* q, const float* keys, int64_t head_dim,
                       int64_t lo, int64_t hi, float scale, float* row);

}  // namespace kvlens
