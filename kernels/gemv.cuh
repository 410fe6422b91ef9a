// Weight-streaming products for decode: y[n, out] = x[n, in] * w[out, in]^T with few rows
// (n <= kMaxGemvRows: one token per lockstep run), x and y F32, w in its stored dtype (F32, BF16
// or F16, widened in registers). Each weight byte is read once for all n rows, at memory bandwidth.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

constexpr int64_t kMaxGemvRows = 16;
constexpr int kMaxGemvProducts = 4;

// Products of one input x[rows, in]: y[m][rows, out[m]] = x * w[m]^T for m < count, every w of
// one dtype.
struct GemvProducts {
  const void* w[kMaxGemvProducts] = {};
  float* y[kMaxGemvProducts] = {};
  int64_t out[kMaxGemvProducts] = {};
  int count = 0;
};

// Enqueues the products (a launch each: one launch over all of them measured 3x slower on an
// H100, cause not yet found); rows must be in [1, kMaxGemvRows]. Any alignment and width work
// (16-byte vector loads where the rows allow them, scalar loads otherwise). accumulate: y += the
// product (one addition per element, the bits of add_inplace after the product).
void launch_gemv(const float* x, const GemvProducts& products, DType w_dtype, int64_t rows,
                 int64_t in, bool accumulate, int sm_count, cudaStream_t stream);

}  // namespace kvlens::cuda
