// The decode products of a single activation row (gemv_row.cu), which is every dense decode step
// and every run decoded alone: launch_gemv hands them here. Same call, same bits as the general
// kernel of gemv.cu (each feature's sum in the same order), with far less bookkeeping per weight.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gemv.cuh"

namespace kvlens::cuda {

// Whether launch_gemv_row takes a call the warp kernel takes (gemv_fusable): one row whose whole
// width fits in shared memory, `total` features, unless $KVLENS_GEMV_ROW_KERNEL is 0 (for
// measuring the general kernel against it).
bool gemv_row_takes(const GemvCall& call, int64_t total);
// `products` is the call's with out[] zeroed past its count; `total` the features laid end to
// end (the SiLU pair's width for a pair).
void launch_gemv_row(const GemvCall& call, const GemvProducts& products, int64_t total,
                     int sm_count, cudaStream_t stream);

}  // namespace kvlens::cuda
