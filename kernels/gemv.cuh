// Weight-streaming products for decode: y[n, out] = x[n, in] * w[out, in]^T with few rows
// (n <= kMaxGemvRows: one token per lockstep run), x and y F32, w in its stored dtype (F32, BF16
// or F16, widened in registers). Each weight byte is read once for all n rows, at memory bandwidth.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

constexpr int64_t kMaxGemvRows = 16;

// Enqueues the product; rows must be in [1, kMaxGemvRows]. Any alignment and width work (16-byte
// vector loads where the rows allow them, scalar loads otherwise).
void launch_gemv(const float* x, const void* w, DType w_dtype, float* y, int64_t rows, int64_t in,
                 int64_t out, int sm_count, cudaStream_t stream);

}  // namespace kvlens::cuda
