// RocketKV's stage-2 kernel: RocketkvOps::page_logits (engine/policy/rocketkv_ops.h) on the GPU,
// with rocketkv_math.h's arithmetic (the CPU's bits). The launcher only enqueues on `stream`; the
// extension (rocketkv_ops_cuda.cpp) checks the arguments first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {

// page_logits: one block per (query head, tile of columns): the KV group's channel magnitudes (a
// thread per channel), then its first thread picks the channels, their min/max choice and the
// head's scale into shared memory, then a thread per column estimates its page.
struct RocketPageLogitArgs {
  const float* q = nullptr;         // [heads, head_dim]
  const float* page_min = nullptr;  // [kv_heads, pages, head_dim]
  const float* page_max = nullptr;  // [kv_heads, pages, head_dim]
  RowsRef<float> out;               // [heads, stride]
  int64_t heads = 0, kv_heads = 0, head_dim = 0, pages = 0, page_size = 1, rank = 0, cols = 0;
};
void launch_rocket_page_logits(const RocketPageLogitArgs& args, cudaStream_t stream);

}  // namespace kvlens::cuda
