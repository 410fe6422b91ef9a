// The decode products of BF16 weights on the tensor cores (gemv_mma.cu): the same call as
// gemv.cuh's kernels, 1..16 rows. A batch of rows (lockstep runs) then costs about what one row
// does: the CUDA-core kernels' multiply-adds grow with the rows, the tensor cores' do not, and the
// weights are read once either way. Where enabled (below), launch_gemv hands every BF16 call here,
// one row or many, so that a row's result has the same bits alone and in a batch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gemv.cuh"

namespace kvlens::cuda {

// Whether BF16 products take the tensor cores. A row's bits then differ from the CUDA-core
// kernels' (another summation order), so the choice is one for the whole process, never made by
// the rows: lone and lockstep runs keep the same bits either way. Off by default: measured on an
// H200 (1B shape, docs/performance.md round 21), 8 policies in lockstep take 3.24-3.26 ms a
// step against 4.35-4.38 ms, but a lone dense step 1.23-1.24 ms against 1.04 ms. $KVLENS_GEMV_MMA=1
// (or all) turns it on; set_gemv_mma_scope overrides both for the process (the cuda tests), between
// steps only.
enum class GemvMmaScope { None, All };
GemvMmaScope gemv_mma_scope();
void set_gemv_mma_scope(GemvMmaScope scope);

// Whether launch_gemv_mma takes a call the warp kernels take (gemv_fusable): BF16 weights with the
// scope All, on a GPU with BF16 tensor cores (compute capability 8.0 or later).
bool gemv_mma_takes(const GemvCall& call);
// `products` is the call's with out[] zeroed past its count; `total` the features laid end to
// end (the SiLU pair's width for a pair).
void launch_gemv_mma(const GemvCall& call, const GemvProducts& products, int64_t total,
                     int sm_count, cudaStream_t stream);

}  // namespace kvlens::cuda
