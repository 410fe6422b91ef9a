// The projection GEMM of the CUDA backend: y[n, out] = x[n, in] * w[out, in]^T, all F32
// row-major, through cuBLAS SGEMM (column-major) without any transposition copies.
#pragma once

#include <cublas_v2.h>

#include <cstdint>

namespace kvlens::cuda {

// Dimensions must fit in int (the backend checks). y's rows are y_stride floats apart (>= out).
// Enqueued on the handle's stream.
cublasStatus_t sgemm_x_wt(cublasHandle_t handle, const float* x, const float* w, float* y,
                          int64_t n, int64_t in, int64_t out, int64_t y_stride);

}  // namespace kvlens::cuda
