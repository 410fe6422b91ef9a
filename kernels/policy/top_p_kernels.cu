// Twilight's top-p pruning kernel (top_p_kernels.cuh). The arithmetic is top_p_math.h's, the
// code the CPU runs: the same columns kept.
#include "engine/policy/top_p_math.h"
#include "kernels/policy/top_p_kernels.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void top_p_prune_kernel(TopPPruneArgs a) {
  __shared__ unsigned long long partial[kThreads];
  __shared__ float best, total;
  const int64_t h = blockIdx.x;
  const float* s = a.scores.data + h * a.scores.stride;
  uint8_t* v = a.visible.data + h * a.visible.stride;
  if (threadIdx.x == 0) {
    best = visible_max(s, v, a.cols);
    total = visible_mass(s, v, a.cols, best);
  }
  __syncthreads();
  // Called by every thread with the same bound; returns the same key to all.
  auto next_below = [&](uint64_t bound) -> uint64_t {
    uint64_t found = 0;
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      if (v[j] == 0) continue;
      const uint64_t key = top_k_key(s[j], uint32_t(j));
      if (key < bound && key > found) found = key;
    }
    partial[threadIdx.x] = found;
    __syncthreads();
    for (int width = kThreads / 2; width > 0; width /= 2) {
      if (int(threadIdx.x) < width && partial[threadIdx.x + width] > partial[threadIdx.x])
        partial[threadIdx.x] = partial[threadIdx.x + width];
      __syncthreads();
    }
    const uint64_t result = partial[0];
    __syncthreads();
    return result;
  };
  const uint64_t last = top_p_last_key(s, best, total, a.top_p, next_below);
  for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x)
    if (v[j] != 0 && !top_p_keeps(s, j, last, a.sink_end, a.recent_begin)) v[j] = 0;
}

}  // namespace

void launch_top_p_prune(const TopPPruneArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.cols <= 0) return;
  top_p_prune_kernel<<<unsigned(args.rows), kThreads, 0, stream>>>(args);
}

}  // namespace kvlens::cuda
