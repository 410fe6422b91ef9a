// RocketKV's stage-2 kernel (rocketkv_kernels.cuh). The arithmetic is rocketkv_math.h's, the code
// the CPU runs: the same bits.
#include "engine/policy/rocketkv_math.h"
#include "kernels/device_common.cuh"
#include "kernels/policy/rocketkv_kernels.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rocket_page_logits_kernel(RocketPageLogitArgs a) {
  __shared__ float magnitudes[kApproxMaxHeadDim];
  __shared__ int32_t channels[kApproxMaxHeadDim];
  __shared__ bool reads_max[kApproxMaxHeadDim];
  __shared__ float scale;
  const int64_t h = blockIdx.x, D = a.head_dim, group = a.heads / a.kv_heads, g = h / group;
  const float* q_group = a.q + g * group * D;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x)
    magnitudes[c] = sparq_magnitude(q_group, group, D, c);
  __syncthreads();
  if (threadIdx.x == 0) {
    sparq_pick(magnitudes, D, a.rank, channels);
    for (int64_t i = 0; i < a.rank; ++i)
      reads_max[i] = rocket_reads_max(q_group, group, D, channels[i]);
    scale = sparq_scale(a.q + h * D, D, channels, a.rank);
  }
  __syncthreads();
  const int64_t j = int64_t(blockIdx.y) * blockDim.x + threadIdx.x;
  if (j >= a.cols) return;
  const int64_t page = (g * a.pages + j / a.page_size) * D;
  a.out.data[h * a.out.stride + j] = rocket_page_logit(
      a.q + h * D, a.page_min + page, a.page_max + page, channels, reads_max, a.rank, scale);
}

}  // namespace

void launch_rocket_page_logits(const RocketPageLogitArgs& args, cudaStream_t stream) {
  if (args.heads <= 0 || args.cols <= 0) return;
  const dim3 grid(unsigned(args.heads), unsigned((args.cols + kThreads - 1) / kThreads));
  rocket_page_logits_kernel<<<grid, kThreads, 0, stream>>>(args);
}

}  // namespace kvlens::cuda
