// Rotary position embedding (rotate-half convention, as in Hugging Face Llama) of the CUDA
// backend, in place on x[rows, heads, head_dim] (and x2[rows, heads2, head_dim], the keys with
// the queries, in the same launch): the first rotary_dim channels of each head are rotated with
// inv_freq[rotary_dim / 2] (F32), the others pass through (phi3 partial rotary).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

// Row r sits at positions[r] (device memory); with positions null at *step_position (device
// memory: a captured step, every row at the step's position) or, with that null too, at
// first_position + r * position_stride. cos and sin are multiplied by `scale` (F32) first.
// x2 may be null (heads2 ignored).
void launch_rope(float* x, int64_t heads, float* x2, int64_t heads2, int64_t rows, int64_t head_dim,
                 int64_t rotary_dim, const int64_t* positions, int64_t first_position,
                 int64_t position_stride, const int64_t* step_position, const float* inv_freq,
                 float scale, cudaStream_t stream);

// One run of a decode step's RoPE + cache append (Backend::rope_append_runs): q [q_heads, D] and
// k [kv_heads, D] rotated in place at the position (read from *step_position where set: a recorded
// step), then k and v [kv_heads, D] written to the caches [kv_heads, capacity, D] there.
struct RopeAppendArgs {
  float* q = nullptr;
  float* k = nullptr;
  const float* v = nullptr;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  int64_t q_heads = 0, kv_heads = 0, head_dim = 0, capacity = 0, position = 0;
  const int64_t* step_position = nullptr;
};
// One launch for up to kBatchRuns runs whose caches have cache_dtype; the rotation is
// launch_rope's, bit for bit, and the cache rows those of launch_kv_append.
void launch_rope_append(std::span<const RopeAppendArgs> runs, int64_t rotary_dim,
                        const float* inv_freq, float scale, DType cache_dtype, cudaStream_t stream);

}  // namespace kvlens::cuda
