// Weight-streaming products for decode: y[n, out] = x[n, in] * w[out, in]^T with few rows
// (n <= kMaxGemvRows: one token per lockstep run), x and y F32, w in its stored dtype (F32, BF16
// or F16, widened in registers). Each weight byte is read once for all n rows, at memory bandwidth;
// the products of one input (q, k, v; gate, up) go in one launch, with the RMSNorm before them and
// the SiLU gate or the residual add after them fused where asked. launch_gemv hands a single row
// to the one-row kernel (gemv_row.cuh), several rows to the general one (gemv.cu): same bits.
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

// One call of the decode products: x[rows, in] times every product's weights, optionally after
// an RMSNorm of x (fused: the rows are normalised in shared memory with the rmsnorm op's
// arithmetic, so the bits are those of rmsnorm then the products) and optionally with the
// residual add (y += product) or SiLU-gated (products 0 and 1 are gate and up of one width; y[0]
// receives silu(gate) * up with silu_mul's bits).
struct GemvCall {
  const float* x = nullptr;
  int64_t rows = 0, in = 0;
  GemvProducts products;  // all of w_dtype
  DType w_dtype = DType::F32;
  // Every w is an uploaded weight (is_uploaded_weight), which no kernel writes: its first batches
  // are then requested before the kernel waits for the kernels ahead of it (dependent_launch.cuh).
  bool weights_uploaded = false;
  bool norm_uploaded = false;  // the norm weight is one too (read before the wait likewise)
  bool accumulate = false;
  bool silu_pair = false;
  // The norm (only where gemv_stages_rows): weight [in] of norm_dtype (F32 or w_dtype), eps, and
  // the normalised rows written to `normed` [rows, in] (may be null).
  const void* norm_weight = nullptr;
  DType norm_dtype = DType::F32;
  float eps = 0.0f;
  float* normed = nullptr;
};

// Whether the warp kernel takes these operands (16-byte aligned x and weights, `in` a multiple
// of the vector width, 1..kMaxGemvRows rows); otherwise launch_gemv uses a scalar kernel per
// product, which takes neither a norm nor the SiLU pair.
bool gemv_fusable(const float* x, const GemvProducts& products, DType w_dtype, int64_t rows,
                  int64_t in);
// Whether the rows fit in shared memory (needed for a fused norm).
bool gemv_stages_rows(int64_t rows, int64_t in);

// Enqueues the call: every product of it in one launch (warp per output feature).
void launch_gemv(const GemvCall& call, int sm_count, cudaStream_t stream);

}  // namespace kvlens::cuda
