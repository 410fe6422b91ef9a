// Quest's kernels: QuestOps (engine/policy/quest_ops.h) on the GPU. Launchers only enqueue on
// `stream`; the extension (cuda_policy_ops.cpp) checks the arguments first and the launch
// afterwards.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"
#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {

// Quest's page summaries: for pages first..last, page_min / page_max [kv_heads, pages, D] =
// channel-wise min / max of the keys in [p * page_size, min((p + 1) * page_size, end)). One
// thread per (KV head, page, channel), columns in order.
struct PageMinMaxArgs {
  const void* k_cache = nullptr;  // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;
  float* page_min = nullptr;  // [kv_heads, pages, head_dim]
  float* page_max = nullptr;
  int64_t kv_heads = 0, capacity = 0, head_dim = 0, pages = 0;
  int64_t page_size = 1, first = 0, last = -1, end = 0;
};
void launch_page_minmax_update(const PageMinMaxArgs& args, cudaStream_t stream);

// out[h, j] = page_bound(q[h], page summaries of KV head h / (H/G), page j / page_size) for
// j < cols. One thread per (head, page), channels in order.
struct PageBoundArgs {
  const float* q = nullptr;  // [heads, head_dim]
  const float* page_min = nullptr;
  const float* page_max = nullptr;  // [kv_heads, pages, head_dim]
  RowsRef<float> out;               // [heads, stride]
  int64_t heads = 0, kv_heads = 0, head_dim = 0, pages = 0, page_size = 1, cols = 0;
  bool max_only = false;
  float scale = 1.0f;
};
void launch_page_bounds(const PageBoundArgs& args, cudaStream_t stream);

}  // namespace kvlens::cuda
