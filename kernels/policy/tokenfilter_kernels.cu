// Token filtering's kernels (tokenfilter_kernels.cuh), moved from kernels/policy_ops.cu
// unchanged: the policy's op extension on the CUDA backend (cuda_policy_ops.cpp). The cosine and
// the decision are cosine_similarity and token_filter_step of engine/backend/policy_op_math.h,
// the code the CPU runs: the same bits.
#include <algorithm>

#include "engine/backend/policy_op_math.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/policy/tokenfilter_kernels.cuh"

namespace kvlens::cuda {
namespace {

// One thread per KV head: the shared cosine_similarity, then the EMA step with the CPU's
// roundings (both products, then the sum).
template <typename C>
__global__ void anchor_cosine_kernel(AnchorCosineArgs a) {
  begin_dependent_grid();
  const int64_t D = a.head_dim;
  const float keep = a.decay, take = 1.0f - a.decay;
  for (int64_t g = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; g < a.kv_heads;
       g += int64_t(gridDim.x) * blockDim.x) {
    const C* column = static_cast<const C*>(a.cache) + (g * a.capacity + a.column) * D;
    float x[kMaxAnchorDim];  // the column widened (exact), for the shared host/device arithmetic
    for (int64_t d = 0; d < D; ++d) x[d] = to_f32(column[d]);
    float* anchor = a.anchor + g * D;
    a.similarity[g] = cosine_similarity(x, anchor, D);
    for (int64_t d = 0; d < D; ++d) anchor[d] = add_rn(mul_rn(keep, anchor[d]), mul_rn(take, x[d]));
  }
}

__global__ void token_filter_step_kernel(const float* similarity, int64_t kv_heads, double eta,
                                         double target, int64_t column, double* state,
                                         RowsRef<float> scores, int64_t rows, uint8_t* keep) {
  begin_dependent_grid();
  __shared__ float score;
  if (threadIdx.x == 0) {
    double s_kv = 0.0;
    const bool skip = token_filter_step(similarity, kv_heads, eta, target, state, &s_kv);
    keep[0] = skip ? 0 : 1;
    score = float(s_kv);
  }
  __syncthreads();
  if (similarity == nullptr) return;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x)
    scores.data[r * scores.stride + column] = score;
}

}  // namespace

void launch_anchor_cosine_update(const AnchorCosineArgs& args, cudaStream_t stream) {
  if (args.kv_heads <= 0) return;
  constexpr int kAnchorHeadThreads = 64;
  dispatch_weight(args.cache_dtype, [&](auto tag) {
    launch_dependent(anchor_cosine_kernel<decltype(tag)>,
                     grid_for(args.kv_heads, kAnchorHeadThreads), kAnchorHeadThreads, 0, stream,
                     args);
  });
}

void launch_token_filter_step(const float* similarity, int64_t kv_heads, double eta, double target,
                              int64_t column, double* state, RowsRef<float> scores, int64_t rows,
                              uint8_t* keep, cudaStream_t stream) {
  launch_dependent(token_filter_step_kernel, 1, 128, 0, stream, similarity, kv_heads, eta, target,
                   column, state, scores, rows, keep);
}

}  // namespace kvlens::cuda
