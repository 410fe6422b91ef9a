// Quest's kernels (quest_kernels.cuh), moved from kernels/policy_ops.cu unchanged: the policy's
// op extension on the CUDA backend (cuda_policy_ops.cpp). The page bound arithmetic is
// page_bound of engine/backend/policy_op_math.h, the code the CPU runs: the same bits.
#include <algorithm>

#include "engine/backend/policy_op_math.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/policy/quest_kernels.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBoundThreads = 128;
constexpr int kStageBatch = 8;  // loads a thread has in flight while staging page summaries

// Grid-stride loop over the cells of a rows x cols region: f(r, j) for each.
template <typename F>
__device__ __forceinline__ void for_each_cell(int64_t rows, int64_t cols, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x)
    f(i / cols, i % cols);
}

// Quest's page summaries: one thread per (KV head, page, channel), columns in order with the
// CPU's comparisons (exact, so the same bits).
template <typename C>
__global__ void page_minmax_kernel(PageMinMaxArgs a) {
  begin_dependent_grid();
  const int64_t count = a.last - a.first + 1, D = a.head_dim;
  for_each_cell(a.kv_heads * count, D, [&](int64_t row, int64_t d) {
    const int64_t g = row / count, p = a.first + row % count;
    const C* keys = static_cast<const C*>(a.k_cache) + g * a.capacity * D;
    const int64_t j0 = p * a.page_size;
    const int64_t j1 = j0 + a.page_size < a.end ? j0 + a.page_size : a.end;
    float lo = to_f32(keys[j0 * D + d]), hi = lo;
    for (int64_t j = j0 + 1; j < j1; ++j) {
      const float x = to_f32(keys[j * D + d]);
      lo = x < lo ? x : lo;
      hi = hi < x ? x : hi;
    }
    a.page_min[(g * a.pages + p) * D + d] = lo;
    a.page_max[(g * a.pages + p) * D + d] = hi;
  });
}

// Block (KV head g, tile of `tile` pages): the tile's page summaries and the group's queries in
// shared memory, a thread per (query head of the group, page) running the shared page_bound
// arithmetic, then the bounds written to the tile's columns by every thread. A page's summaries
// sit D + 1 floats after the previous page's, so the 32 pages a warp bounds at once read 32
// different banks: at D floats apart every lane of a warp read the same bank, each channel 32
// accesses in turn (17 us a call at 512 tokens on an H200, most of a quest step's own work).
// Shared memory (dynamic): page_min | page_max [tile][D + 1] | q [group][D] | bounds [group][tile].
__global__ void page_bounds_kernel(PageBoundArgs a, int64_t tile) {
  begin_dependent_grid();
  extern __shared__ float shared[];
  const int64_t D = a.head_dim, group = a.heads / a.kv_heads, g = blockIdx.x;
  const int64_t used = (a.cols + a.page_size - 1) / a.page_size;
  const int64_t first = int64_t(blockIdx.y) * tile;
  const int64_t pages = used - first < tile ? used - first : tile;
  const int64_t pitch = D + 1;
  float* low = shared;
  float* high = low + tile * pitch;
  float* q = high + tile * pitch;
  float* bounds = q + group * D;
  const float* __restrict__ lows = a.page_min + (g * a.pages + first) * D;
  const float* __restrict__ highs = a.page_max + (g * a.pages + first) * D;
  // kStageBatch elements of each a thread requested before any is stored (one at a time, each
  // load waited for the one before: 22.7 us a call, against 18.4).
  const int64_t staged = pages * D;
  for (int64_t i0 = threadIdx.x; i0 < staged; i0 += int64_t(blockDim.x) * kStageBatch) {
    float low_batch[kStageBatch], high_batch[kStageBatch];
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int64_t i = i0 + int64_t(b) * blockDim.x;
      low_batch[b] = i < staged ? lows[i] : 0.0f;
      high_batch[b] = i < staged ? highs[i] : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int64_t i = i0 + int64_t(b) * blockDim.x;
      if (i < staged) {
        const int64_t at = (i / D) * pitch + i % D;
        low[at] = low_batch[b], high[at] = high_batch[b];
      }
    }
  }
  for (int64_t i = threadIdx.x; i < group * D; i += blockDim.x) q[i] = a.q[g * group * D + i];
  __syncthreads();
  for (int64_t c = threadIdx.x; c < group * pages; c += blockDim.x) {
    const int64_t h = c / pages, p = c % pages;
    bounds[h * tile + p] =
        page_bound(q + h * D, low + p * pitch, high + p * pitch, D, a.max_only, a.scale);
  }
  __syncthreads();
  const int64_t begin = first * a.page_size;
  const int64_t end = begin + pages * a.page_size < a.cols ? begin + pages * a.page_size : a.cols;
  for (int64_t i = threadIdx.x; i < group * (end - begin); i += blockDim.x) {
    const int64_t h = i / (end - begin), j = begin + i % (end - begin);
    a.out.data[(g * group + h) * a.out.stride + j] = bounds[h * tile + (j / a.page_size - first)];
  }
}

}  // namespace

void launch_page_minmax_update(const PageMinMaxArgs& args, cudaStream_t stream) {
  const int64_t count = args.kv_heads * (args.last - args.first + 1) * args.head_dim;
  if (count <= 0) return;
  dispatch_weight(args.cache_dtype, [&](auto tag) {
    launch_dependent(page_minmax_kernel<decltype(tag)>, grid_for(count, kThreads), kThreads, 0,
                     stream, args);
  });
}

void launch_page_bounds(const PageBoundArgs& args, cudaStream_t stream) {
  const int64_t used = (args.cols + args.page_size - 1) / args.page_size;
  if (args.heads <= 0 || args.kv_heads <= 0 || used <= 0) return;
  // Pages a block: up to 32, with the tile's summaries in 32 KiB.
  int64_t tile = std::clamp<int64_t>(4096 / args.head_dim, 1, 32);
  const int64_t group = args.heads / args.kv_heads;
  auto bytes = [&](int64_t pages) {
    return size_t(2 * pages * (args.head_dim + 1) + group * args.head_dim + group * pages) *
           sizeof(float);
  };
  while (tile > 1 && bytes(tile) > 48 * 1024) tile /= 2;
  const size_t shared_bytes = bytes(tile);
  const dim3 grid(unsigned(args.kv_heads), unsigned((used + tile - 1) / tile));
  launch_dependent(page_bounds_kernel, grid, kBoundThreads, shared_bytes, stream, args, tile);
}

}  // namespace kvlens::cuda
