// KeyDiff's kernel (keydiff_kernels.cuh), moved from kernels/policy_ops.cu unchanged: the policy's
// op extension on the CUDA backend (cuda_policy_ops.cpp).
#include <algorithm>

#include "engine/backend/policy_op_math.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/policy/keydiff_kernels.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kAnchorThreads = 256;

// One block per row, a thread per key where the work is per key: first the member keys' norms,
// a tile of kAnchorThreads keys at a time, whose normalised keys the threads then sum by channel
// (splits = threads / D partial sums per channel, each over every splits-th key of the tile), then
// each key's cosine to the anchor. A warp per key, with a butterfly for every norm and dot, took
// 105 us a row at 512 tokens on an H100; this takes 44 us (32 blocks: still a chain of memory
// latencies). Fixed assignment and order: the result does not depend on scheduling. Shared memory
// (dynamic): anchor[D] | partial sums[max(threads, D)] | inverse norms[threads].
template <typename C>
__global__ void __launch_bounds__(kAnchorThreads) key_anchor_scores_kernel(KeyAnchorArgs a) {
  begin_dependent_grid();
  extern __shared__ float shared[];
  __shared__ unsigned scratch[32];
  const int64_t D = a.head_dim;
  const int threads = blockDim.x;
  const int64_t splits = D < threads ? threads / D : 1, sums = splits * D;
  float* anchor = shared;
  float* partial = shared + D;                                   // [splits][D]
  float* inverse = partial + (sums > threads ? sums : threads);  // [threads], 0: not a member
  const int64_t r = blockIdx.x;
  const C* keys = static_cast<const C*>(a.k_cache) + (r / a.rows_per_group) * a.capacity * D;
  const uint8_t* member =
      a.members.data + (a.members_per_group ? r / a.rows_per_group : r) * a.members.stride;
  float* out = a.out.data + r * a.out.stride;
  constexpr float kTiny = 1e-12f;
  auto squared_norm = [&](const C* key) {
    float sum = 0.0f;
#pragma unroll 4
    for (int64_t d0 = 0; d0 < D; d0 += kKeyChunk) {
      float chunk[kKeyChunk];
      load_chunk(key, D, d0, chunk);
#pragma unroll
      for (int i = 0; i < kKeyChunk; ++i) sum = fmaf(chunk[i], chunk[i], sum);
    }
    return sum;
  };

  for (int64_t c = threadIdx.x; c < sums; c += threads) partial[c] = 0.0f;
  unsigned count = 0;
  for (int64_t tile = 0; tile < a.cols; tile += threads) {
    const int64_t j = tile + threadIdx.x;
    float inv = 0.0f;
    if (j < a.cols && member[j] != 0) {
      inv = 1.0f / fmaxf(sqrtf(squared_norm(keys + j * D)), kTiny);
      ++count;
    }
    inverse[threadIdx.x] = inv;
    __syncthreads();
    const int64_t in_tile = a.cols - tile < threads ? a.cols - tile : threads;
    for (int64_t c = threadIdx.x; c < sums; c += threads) {
      const int64_t d = c % D;
      float sum = partial[c];
#pragma unroll 8
      for (int64_t i = c / D; i < in_tile; i += splits) {
        const float weight = inverse[i];
        const float value = to_f32(keys[(tile + i) * D + d]);
        if (weight != 0.0f) sum = fmaf(value, weight, sum);
      }
      partial[c] = sum;
    }
    __syncthreads();
  }
  count = block_reduce(count, SumOp{}, 0u, scratch);  // also a barrier
  for (int64_t d = threadIdx.x; d < D; d += threads) {
    float sum = 0.0f;
    for (int64_t s = 0; s < splits; ++s) sum += partial[s * D + d];
    anchor[d] = count > 0 ? sum / float(count) : 0.0f;
  }
  __syncthreads();
  float anchor_squared = 0.0f;
  for (int64_t d = 0; d < D; ++d) anchor_squared = fmaf(anchor[d], anchor[d], anchor_squared);
  const float anchor_norm = fmaxf(sqrtf(anchor_squared), kTiny);
  for (int64_t j = threadIdx.x; j < a.cols; j += threads) {
    const C* key = keys + j * D;
    float dot = 0.0f, squared = 0.0f;
#pragma unroll 4
    for (int64_t d0 = 0; d0 < D; d0 += kKeyChunk) {
      float chunk[kKeyChunk];
      load_chunk(key, D, d0, chunk);
#pragma unroll
      for (int i = 0; i < kKeyChunk; ++i) {
        const float weight = d0 + i < D ? anchor[d0 + i] : 0.0f;
        dot = fmaf(weight, chunk[i], dot);
        squared = fmaf(chunk[i], chunk[i], squared);
      }
    }
    out[j] = -dot / (fmaxf(sqrtf(squared), kTiny) * anchor_norm);
  }
}

}  // namespace

void launch_key_anchor_scores(const KeyAnchorArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.cols <= 0) return;
  const int64_t sums = std::max<int64_t>(args.head_dim, kAnchorThreads);
  const size_t shared_bytes = size_t(args.head_dim + sums + kAnchorThreads) * sizeof(float);
  dispatch_weight(args.cache_dtype, [&](auto tag) {
    launch_dependent(key_anchor_scores_kernel<decltype(tag)>, unsigned(args.rows), kAnchorThreads,
                     shared_bytes, stream, args);
  });
}

}  // namespace kvlens::cuda
