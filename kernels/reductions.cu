// Row reductions over logits x[rows, cols] (F32): argmax with ties toward the lower index, and
// log-softmax at a target column with the exponential sum in double. One block per row.
#include <cfloat>
#include <climits>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/reductions.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;

// Is (v, i) a better argmax candidate than (best, best_index)? NaN counts as the largest value,
// as in torch.argmax; among equal values (or NaNs) the lower index wins.
__device__ __forceinline__ bool better(float v, int32_t i, float best, int32_t best_index) {
  const bool v_nan = isnan(v);
  const bool best_nan = isnan(best);
  if (v_nan || best_nan) return v_nan && (!best_nan || i < best_index);
  return v > best || (v == best && i < best_index);
}

__global__ void argmax_kernel(const float* x, int64_t cols, int32_t* out) {
  begin_dependent_grid();
  __shared__ float values[32];
  __shared__ int32_t indices[32];
  const float* row = x + int64_t(blockIdx.x) * cols;
  // INT32_MAX as the start index makes any first element (even -inf) win its comparison.
  float best = -INFINITY;
  int32_t best_index = INT32_MAX;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    if (better(row[j], int32_t(j), best, best_index)) best = row[j], best_index = int32_t(j);
  // Warp then block reduction of (value, index) pairs with the same ordering.
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float v = __shfl_xor_sync(0xffffffffu, best, offset);
    const int32_t i = __shfl_xor_sync(0xffffffffu, best_index, offset);
    if (better(v, i, best, best_index)) best = v, best_index = i;
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) values[warp] = best, indices[warp] = best_index;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    best = lane < warps ? values[lane] : -INFINITY;
    best_index = lane < warps ? indices[lane] : INT32_MAX;
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best, offset);
      const int32_t i = __shfl_xor_sync(0xffffffffu, best_index, offset);
      if (better(v, i, best, best_index)) best = v, best_index = i;
    }
    if (lane == 0) out[blockIdx.x] = best_index;
  }
}

__global__ void log_prob_kernel(const float* x, int64_t cols, const int32_t* targets, double* out) {
  begin_dependent_grid();
  __shared__ float scratch_f[32];
  __shared__ double scratch_d[32];
  const float* row = x + int64_t(blockIdx.x) * cols;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_reduce(m, MaxOp{}, -INFINITY, scratch_f);
  // Subtracting the max keeps every term in (0, 1]; double accumulation makes the sum over a
  // 100k+ vocabulary exact to well below F32 resolution.
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += exp(double(row[j]) - double(m));
  sum = block_reduce(sum, SumOp{}, 0.0, scratch_d);
  if (threadIdx.x == 0) out[blockIdx.x] = double(row[targets[blockIdx.x]]) - double(m) - log(sum);
}

}  // namespace

void launch_argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out,
                        cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  launch_dependent(argmax_kernel, unsigned(rows), kThreads, 0, stream, x, cols, out);
}

void launch_log_prob_rows(const float* x, int64_t rows, int64_t cols, const int32_t* targets,
                          double* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  launch_dependent(log_prob_kernel, unsigned(rows), kThreads, 0, stream, x, cols, targets, out);
}

namespace {

__global__ void count_nonfinite_kernel(const float* x, int64_t stride, int64_t cols,
                                       int64_t* counts) {
  begin_dependent_grid();
  __shared__ int partial[32];
  const float* row = x + int64_t(blockIdx.x) * stride;
  int bad = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) bad += isfinite(row[j]) ? 0 : 1;
  for (int offset = 16; offset > 0; offset >>= 1) bad += __shfl_xor_sync(0xffffffffu, bad, offset);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = bad;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t total = 0;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) total += partial[w];
    counts[blockIdx.x] = total;
  }
}

}  // namespace

void launch_count_nonfinite_rows(const float* x, int64_t rows, int64_t stride, int64_t cols,
                                 int64_t* counts, cudaStream_t stream) {
  if (rows <= 0) return;
  launch_dependent(count_nonfinite_kernel, unsigned(rows), kThreads, 0, stream, x, stride, cols,
                   counts);
}

}  // namespace kvlens::cuda
