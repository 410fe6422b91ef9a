// Attention of the CUDA backend: appending k/v rows to the per-layer cache [G, capacity, D] and
// causal (optionally windowed and masked) attention of q[rows, H, D] over it, with GQA (query
// head h reads KV head h / (H / G)). One thread block per (query row, head).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

// k, v [rows, G, D] -> caches [G, capacity, D] of the cache dtype (F32, BF16 or F16: rounded to
// nearest even) at positions first_position + r (first_position read from *step_position,
// device memory, where that is set: a captured step). v_cache null: the keys alone.
struct AppendArgs {
  const float* k = nullptr;
  const float* v = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t rows = 0, kv_heads = 0, head_dim = 0, capacity = 0, first_position = 0;
  const int64_t* step_position = nullptr;
};
// One launch for up to kBatchRuns runs (device_common.cuh) of caches of one dtype: a lockstep
// step's runs of one layer.
void launch_kv_append(std::span<const AppendArgs> runs, DType cache_dtype, cudaStream_t stream);

struct AttentionArgs {
  const float* q = nullptr;        // [rows, heads, head_dim]
  const void* k_cache = nullptr;   // [kv_heads, capacity, head_dim] of cache_dtype
  const void* v_cache = nullptr;   // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;  // F32, BF16 or F16
  float* out = nullptr;            // [rows, heads, head_dim]
  float* logits = nullptr;         // optional [rows, heads, logits_stride], columns < context
  const uint8_t* mask = nullptr;   // optional [heads, mask_stride] (rows == 1): key j visible to
  int64_t mask_stride = 0;         // head h when mask[h * mask_stride + j] != 0
  int64_t rows = 0, heads = 0, kv_heads = 0, head_dim = 0, capacity = 0;
  int64_t first_position = 0;
  int64_t window = 0;         // > 0: query at p sees keys [p - window + 1, p]
  int64_t context = 0;        // first_position + rows
  int64_t logits_stride = 0;  // >= context
  float scale = 1.0f;         // applied to q.k before the softmax
  // Decode only (launch_decode_attention): the query's position read from device memory (a
  // captured step) instead of first_position (context is then not read).
  const int64_t* step_position = nullptr;
};

void launch_attention(const AttentionArgs& args, cudaStream_t stream);

}  // namespace kvlens::cuda
