// KeyDiff's kernel: KeyDiffOps::key_anchor_scores (engine/policy/keydiff_ops.h) on the GPU.
// Launchers only enqueue on `stream`; the extension (cuda_policy_ops.cpp) checks the arguments
// first and the launch afterwards.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"
#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {

// out[r, j] = -cos(k[g, j], mean of the normalised member keys of row r), g = r / rows_per_group.
// A cluster of up to 8 blocks per row, each over a segment of the columns; head_dim at most
// kMaxKeyAnchorDim.
constexpr int64_t kMaxKeyAnchorDim = 1024;
struct KeyAnchorArgs {
  const void* k_cache = nullptr;  // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;
  RowsRef<const uint8_t> members;  // [rows, stride], or [kv_heads, stride] (members_per_group)
  RowsRef<float> out;              // [rows, stride]
  int64_t rows = 0, rows_per_group = 1, head_dim = 0, capacity = 0, cols = 0;
  bool members_per_group = false;  // one members row per KV head, shared by its rows
};
void launch_key_anchor_scores(const KeyAnchorArgs& args, cudaStream_t stream);

}  // namespace kvlens::cuda
