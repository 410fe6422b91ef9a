// Twilight's top-p pruning kernel (top_p_kernels.cuh). The arithmetic is top_p_math.h's, the
// code the CPU runs: the same columns kept.
#include "engine/policy/top_p_math.h"
#include "kernels/device_common.cuh"
#include "kernels/policy/top_p_kernels.cuh"
#include "kernels/radix_select.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;
// Keys the prefix takes per pass: the next kBatch keys below the last one found by a radix
// select, sorted in shared memory, then added in order. One pass per key (a block-wide maximum
// each) made a long prefix cost thousands of passes over the row: 70 ms a step on the 1B shape
// at 4096 tokens, where random weights attend nearly uniformly.
constexpr int kBatch = 1024;

// keys[0 .. kBatch) sorted in descending order (bitonic network; the block's threads share it).
__device__ void sort_descending(uint64_t* keys) {
  for (int size = 2; size <= kBatch; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < kBatch; i += blockDim.x) {
        const int other = i ^ stride;
        if (other <= i) continue;
        const bool descending = (i & size) == 0;
        const uint64_t a = keys[i], b = keys[other];
        if (descending ? a < b : a > b) keys[i] = b, keys[other] = a;
      }
      __syncthreads();
    }
  }
}

__global__ void top_p_prune_kernel(TopPPruneArgs a) {
  __shared__ uint64_t batch[kBatch];
  __shared__ unsigned scratch[32];
  __shared__ unsigned filled;
  __shared__ float best, total;
  __shared__ uint64_t last;
  __shared__ bool done;
  const int64_t h = blockIdx.x;
  const float* s = a.scores.data + h * a.scores.stride;
  uint8_t* v = a.visible.data + h * a.visible.stride;
  if (threadIdx.x == 0) {
    best = visible_max(s, v, a.cols);
    total = visible_mass(s, v, a.cols, best);
    last = 0;
    done = false;
  }
  __syncthreads();
  // top_p_last_key's walk (top_p_math.h, the CPU's): visible columns in descending key order,
  // their weights added one by one by thread 0 until the sum reaches top_p * total. A key of 0
  // (NaN at column 0) is never taken there, nor here.
  const float target = mul_rn(a.top_p, total);
  float taken = 0.0f;  // thread 0's
  uint64_t bound = ~uint64_t(0);
  auto key_below = [&](int64_t j, uint64_t& key) {
    if (v[j] == 0) return false;
    key = top_k_key(s[j], uint32_t(j));
    return key != 0 && key < bound;
  };
  for (;;) {
    unsigned count = 0;
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      uint64_t key;
      count += key_below(j, key) ? 1u : 0u;
    }
    count = block_reduce(count, SumOp{}, 0u, scratch);
    if (count == 0) break;
    const unsigned take = count < unsigned(kBatch) ? count : unsigned(kBatch);
    // The smallest key of this pass: the take-th largest below the bound (all of them: 0).
    const uint64_t smallest =
        count <= take ? 0
                      : radix_select_key<false>(a.cols, take,
                                                [&](int64_t j, uint64_t& key, unsigned& weight) {
                                                  weight = key_below(j, key) ? 1u : 0u;
                                                  if (weight == 0) key = 0;
                                                });
    if (threadIdx.x == 0) filled = 0;
    __syncthreads();
    for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
      uint64_t key;
      if (key_below(j, key) && key >= smallest) batch[atomicAdd(&filled, 1u)] = key;
    }
    __syncthreads();
    for (int i = int(take) + threadIdx.x; i < kBatch; i += blockDim.x) batch[i] = 0;
    __syncthreads();
    sort_descending(batch);
    if (threadIdx.x == 0) {
      for (unsigned i = 0; i < take; ++i) {
        last = batch[i];
        const uint32_t col = uint32_t(batch[i] & 0xffffffffu);
        taken = add_rn(taken, exp_nonpositive(add_rn(s[col], -best)));
        if (taken >= target) {
          done = true;
          break;
        }
      }
    }
    __syncthreads();
    if (done || count <= take) break;
    bound = batch[take - 1];
    __syncthreads();  // every thread has read the batch before the next pass refills it
  }
  const uint64_t prefix_last = last;
  for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x)
    if (v[j] != 0 && !top_p_keeps(s, j, prefix_last, a.sink_end, a.recent_begin)) v[j] = 0;
}

}  // namespace

void launch_top_p_prune(const TopPPruneArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.cols <= 0) return;
  top_p_prune_kernel<<<unsigned(args.rows), kThreads, 0, stream>>>(args);
}

}  // namespace kvlens::cuda
