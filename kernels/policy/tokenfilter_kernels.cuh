// Token filtering's kernels: TokenFilterOps (engine/policy/tokenfilter_ops.h) on the GPU.
// Launchers only enqueue on `stream`; the extension (cuda_policy_ops.cpp) checks the arguments
// first and the launch afterwards.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"
#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {

// similarity[g] = cosine_similarity(cache[g, column], anchor[g]); then anchor[g] = decay *
// anchor[g] + (1 - decay) * cache[g, column]. One thread per KV head.
// head_dim at most kMaxAnchorDim (the column is widened into registers first).
constexpr int64_t kMaxAnchorDim = 512;
struct AnchorCosineArgs {
  const void* cache = nullptr;  // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;
  float* anchor = nullptr;      // [kv_heads, head_dim]
  float* similarity = nullptr;  // [kv_heads]
  int64_t kv_heads = 0, capacity = 0, head_dim = 0, column = 0;
  float decay = 0.0f;
};
void launch_anchor_cosine_update(const AnchorCosineArgs& args, cudaStream_t stream);

// TokenFilterOps::token_filter_step: one thread decides (token_filter_step of policy_op_math.h on
// the doubles of `state`), the block writes the scores column. similarity null: the layer's first
// step.
void launch_token_filter_step(const float* similarity, int64_t kv_heads, double eta, double target,
                              int64_t column, double* state, RowsRef<float> scores, int64_t rows,
                              uint8_t* keep, cudaStream_t stream);

}  // namespace kvlens::cuda
