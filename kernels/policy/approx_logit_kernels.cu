// The approximate-logit policies' kernels (approx_logit_kernels.cuh). The arithmetic is
// approx_logit_math.h's, the code the CPU runs: the same bits for an F32 cache.
#include "engine/policy/approx_logit_math.h"
#include "kernels/device_common.cuh"
#include "kernels/policy/approx_logit_kernels.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;

template <typename C>
__global__ void sparq_logits_kernel(SparqLogitArgs a) {
  __shared__ float magnitudes[kApproxMaxHeadDim];
  __shared__ int32_t channels[kApproxMaxHeadDim];
  __shared__ float scale;
  const int64_t h = blockIdx.x, D = a.head_dim, group = a.heads / a.kv_heads, g = h / group;
  // A thread per channel sums the group's magnitudes; one thread picks the top and the scale.
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x)
    magnitudes[c] = sparq_magnitude(a.q + g * group * D, group, D, c);
  __syncthreads();
  if (threadIdx.x == 0) {
    sparq_pick(magnitudes, D, a.rank, channels);
    scale = sparq_scale(a.q + h * D, D, channels, a.rank);
  }
  __syncthreads();
  const int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= a.cols) return;
  const C* key = static_cast<const C*>(a.k_cache) + (g * a.capacity + j) * D;
  a.out.data[h * a.out.stride + j] = sparq_logit(
      a.q + h * D, [key](int64_t c) { return to_f32(key[c]); }, channels, a.rank, scale);
}

template <typename C>
__global__ void project_keys_kernel(ProjectKeysArgs a) {
  const int64_t span = a.end - a.begin, count = a.rows * span * a.dims;
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < count;
       n += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = n / (span * a.dims), j = a.begin + (n / a.dims) % span, i = n % a.dims;
    const int64_t g = b / (a.rows / a.kv_heads), D = a.head_dim;
    const C* key = static_cast<const C*>(a.k_cache) + (g * a.capacity + j) * D;
    a.projected[(b * a.width + j) * a.dims + i] = project_component(
        [key](int64_t c) { return to_f32(key[c]); }, a.basis + b * D * a.dims, D, a.dims, i);
  }
}

__global__ void projected_logits_kernel(ProjectedLogitArgs a) {
  extern __shared__ float query[];  // [dims]
  const int64_t h = blockIdx.x, D = a.head_dim, b = h / (a.heads / a.rows);
  const float* row = a.q + h * D;
  for (int64_t i = threadIdx.x; i < a.dims; i += blockDim.x)
    query[i] = project_component([row](int64_t c) { return row[c]; }, a.basis + b * D * a.dims, D,
                                 a.dims, i);
  __syncthreads();
  const int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= a.cols) return;
  a.out.data[h * a.out.stride + j] =
      projected_logit(query, a.projected + (b * a.width + j) * a.dims, a.dims, a.scale);
}

unsigned column_tiles(int64_t cols) {
  return unsigned((cols + kThreads - 1) / kThreads);
}

}  // namespace

void launch_sparq_logits(const SparqLogitArgs& args, cudaStream_t stream) {
  if (args.heads <= 0 || args.cols <= 0) return;
  const dim3 grid(unsigned(args.heads), column_tiles(args.cols));
  dispatch_weight(args.cache_dtype, [&](auto tag) {
    sparq_logits_kernel<decltype(tag)><<<grid, kThreads, 0, stream>>>(args);
  });
}

void launch_project_keys(const ProjectKeysArgs& args, cudaStream_t stream) {
  const int64_t count = args.rows * (args.end - args.begin) * args.dims;
  if (count <= 0) return;
  dispatch_weight(args.cache_dtype, [&](auto tag) {
    project_keys_kernel<decltype(tag)><<<grid_for(count, kThreads), kThreads, 0, stream>>>(args);
  });
}

void launch_projected_logits(const ProjectedLogitArgs& args, cudaStream_t stream) {
  if (args.heads <= 0 || args.cols <= 0) return;
  const dim3 grid(unsigned(args.heads), column_tiles(args.cols));
  projected_logits_kernel<<<grid, kThreads, size_t(args.dims) * sizeof(float), stream>>>(args);
}

}  // namespace kvlens::cuda
