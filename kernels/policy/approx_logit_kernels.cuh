// The approximate-logit policies' kernels: ApproxLogitOps (engine/policy/approx_logit_ops.h) on
// the GPU, with approx_logit_math.h's arithmetic (the CPU's bits). Launchers only enqueue on
// `stream`; the extension (approx_logit_ops_cuda.cpp) checks the arguments first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"
#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {

// sparq_logits: one block per (query head, tile of columns): the KV group's channel magnitudes
// (a thread per channel), then its first thread picks the channels and the head's scale into
// shared memory, then a thread per column.
struct SparqLogitArgs {
  const float* q = nullptr;       // [heads, head_dim]
  const void* k_cache = nullptr;  // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;
  RowsRef<float> out;  // [heads, stride]
  int64_t heads = 0, kv_heads = 0, head_dim = 0, capacity = 0, rank = 0, cols = 0;
};
void launch_sparq_logits(const SparqLogitArgs& args, cudaStream_t stream);

// project_keys: one thread per (basis row, column in [begin, end), direction).
struct ProjectKeysArgs {
  const void* k_cache = nullptr;  // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;
  const float* basis = nullptr;  // [rows, head_dim, dims]
  float* projected = nullptr;    // [rows, width, dims]
  int64_t rows = 0, kv_heads = 0, head_dim = 0, capacity = 0, dims = 0, width = 0;
  int64_t begin = 0, end = 0;
};
void launch_project_keys(const ProjectKeysArgs& args, cudaStream_t stream);

// projected_logits: one block per (query head, tile of columns); the head's projected query in
// shared memory (a thread per direction), then a thread per column.
struct ProjectedLogitArgs {
  const float* q = nullptr;          // [heads, head_dim]
  const float* basis = nullptr;      // [rows, head_dim, dims]
  const float* projected = nullptr;  // [rows, width, dims]
  RowsRef<float> out;                // [heads, stride]
  int64_t heads = 0, rows = 0, head_dim = 0, dims = 0, width = 0, cols = 0;
  float scale = 1.0f;
};
void launch_projected_logits(const ProjectedLogitArgs& args, cudaStream_t stream);

}  // namespace kvlens::cuda
