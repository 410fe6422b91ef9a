// Rotate-half RoPE, in place on x[rows, heads, head_dim]: for i < R/2 (R = rotary_dim <= D) the
// pair (x[i], x[i + R/2]) is rotated by angle positions[row] * inv_freq[i], with cos and sin
// scaled by an attention factor; channels R..D-1 are left alone. The fused form also appends
// each run's rotated key row and its value row to the run's caches.
#include <algorithm>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/rope.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 64;

// The rotation of one head's first rotary_dim channels, in place on v[head_dim], by the block's
// threads over the pairs (i, i + half); store(d, value) also receives every value written.
template <typename Store>
__device__ __forceinline__ void rotate_head(float* v, int64_t rotary_dim, float position,
                                            const float* inv_freq, float scale, Store&& store) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    float a = v[i];
    float b = v[i + half];
    rotate_pair(a, b, position, inv_freq[i], scale);
    v[i] = a;
    v[i + half] = b;
    store(i, a);
    store(i + half, b);
  }
}

// One block per (row, head) of x, then per (row, head) of x2; threads over the R/2 rotation pairs.
__global__ void rope_kernel(float* x, int64_t heads, float* x2, int64_t heads2, int64_t head_dim,
                            int64_t rotary_dim, const int64_t* positions, int64_t first_position,
                            int64_t position_stride, const int64_t* step_position,
                            const float* inv_freq, float scale) {
  begin_dependent_grid();
  const int64_t rows = gridDim.x / (heads + heads2);
  const bool second = int64_t(blockIdx.x) >= rows * heads;
  const int64_t block = second ? int64_t(blockIdx.x) - rows * heads : int64_t(blockIdx.x);
  const int64_t row = block / (second ? heads2 : heads);
  const float position = float(positions != nullptr       ? positions[row]
                               : step_position != nullptr ? *step_position
                                                          : first_position + row * position_stride);
  rotate_head((second ? x2 : x) + block * head_dim, rotary_dim, position, inv_freq, scale,
              [](int64_t, float) {});
}

// rope_kernel's rotation of each run's query heads (blocks [0, q_heads)) and key heads (blocks
// [q_heads, q_heads + kv_heads)), blockIdx.z the run; a key head's block also writes its rotated
// row and its value row into the caches, as kv_append_kernel does.
template <typename C, int kRuns>
__global__ void rope_append_kernel(const __grid_constant__ RunBatch<RopeAppendArgs, kRuns> batch,
                                   int64_t rotary_dim, const float* inv_freq, float scale) {
  begin_dependent_grid();
  const RopeAppendArgs& a = batch_run(batch);
  const int64_t position = a.step_position != nullptr ? *a.step_position : a.position;
  const int64_t D = a.head_dim;
  const int64_t block = blockIdx.x;
  if (block < a.q_heads) {
    rotate_head(a.q + block * D, rotary_dim, float(position), inv_freq, scale,
                [](int64_t, float) {});
    return;
  }
  const int64_t g = block - a.q_heads;
  if (g >= a.kv_heads) return;
  float* k = a.k + g * D;
  C* k_row = static_cast<C*>(a.k_cache) + (g * a.capacity + position) * D;
  rotate_head(k, rotary_dim, float(position), inv_freq, scale,
              [&](int64_t d, float value) { k_row[d] = from_f32<C>(value); });
  for (int64_t d = rotary_dim + threadIdx.x; d < D; d += blockDim.x) k_row[d] = from_f32<C>(k[d]);
  C* v_row = static_cast<C*>(a.v_cache) + (g * a.capacity + position) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) v_row[d] = from_f32<C>(a.v[g * D + d]);
}

}  // namespace

void launch_rope(float* x, int64_t heads, float* x2, int64_t heads2, int64_t rows, int64_t head_dim,
                 int64_t rotary_dim, const int64_t* positions, int64_t first_position,
                 int64_t position_stride, const int64_t* step_position, const float* inv_freq,
                 float scale, cudaStream_t stream) {
  if (x2 == nullptr) heads2 = 0;
  if (rows <= 0 || heads <= 0 || heads2 < 0 || rotary_dim < 2 || rotary_dim > head_dim) return;
  launch_dependent(rope_kernel, unsigned(rows * (heads + heads2)), kThreads, 0, stream, x, heads,
                   x2, heads2, head_dim, rotary_dim, positions, first_position, position_stride,
                   step_position, inv_freq, scale);
}

void launch_rope_append(std::span<const RopeAppendArgs> runs, int64_t rotary_dim,
                        const float* inv_freq, float scale, DType cache_dtype,
                        cudaStream_t stream) {
  int64_t heads = 0;
  for (const RopeAppendArgs& run : runs) heads = std::max(heads, run.q_heads + run.kv_heads);
  if (heads <= 0) return;
  dispatch_weight(cache_dtype, [&](auto tag) {
    using C = decltype(tag);
    for_run_batches(runs, [&]<int kRuns>(const RunBatch<RopeAppendArgs, kRuns>& batch, int count) {
      const dim3 grid(unsigned(heads), 1, unsigned(count));
      launch_dependent(rope_append_kernel<C, kRuns>, grid, kThreads, 0, stream, batch, rotary_dim,
                       inv_freq, scale);
    });
  });
}

}  // namespace kvlens::cuda
