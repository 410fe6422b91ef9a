// MagicPIG's kernels: MagicpigOps (engine/policy/magicpig_ops.h) on the GPU with
// magicpig_math.h's arithmetic (the CPU's bits). Launchers only enqueue on `stream`; the
// extension (magicpig_ops_cuda.cpp) checks the arguments first. Codes F32 [G, stride, tables].
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"
#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {

// hash_keys: a thread per (KV head, column, table).
struct HashKeysArgs {
  const void* k_cache = nullptr;  // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;
  const float* planes = nullptr;  // [tables * bits, head_dim]
  float* codes = nullptr;         // [kv_heads, code_stride, tables]
  int64_t kv_heads = 0, capacity = 0, head_dim = 0, code_stride = 0, tables = 0, bits = 0;
  int64_t begin = 0, end = 0;
};
void launch_hash_keys(const HashKeysArgs& args, cudaStream_t stream);

// lsh_sample: one block per query head; its threads hash the query (a table each) into shared
// memory, then take a column each.
struct LshSampleArgs {
  const float* q = nullptr;       // [heads, head_dim]
  const void* k_cache = nullptr;  // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;
  const float* codes = nullptr;   // [kv_heads, code_stride, tables]
  const float* planes = nullptr;  // [tables * bits, head_dim]
  RowsRef<uint8_t> visible;       // [heads, stride]
  RowsRef<float> log_weights;     // [heads, stride]
  RowsRef<float> scores;          // [heads, stride]
  int64_t heads = 0, kv_heads = 0, capacity = 0, head_dim = 0, code_stride = 0, tables = 0;
  int64_t bits = 0, cols = 0, sink_end = 0, recent_begin = 0;
};
void launch_lsh_sample(const LshSampleArgs& args, cudaStream_t stream);

}  // namespace kvlens::cuda
