// Rotate-half RoPE, in place on x[rows, heads, head_dim]: for i < R/2 (R = rotary_dim <= D) the
// pair (x[i], x[i + R/2]) is rotated by angle positions[row] * inv_freq[i], with cos and sin
// scaled by an attention factor; channels R..D-1 are left alone.
#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/rope.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 64;

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
  float* v = (second ? x2 : x) + block * head_dim;
  const int64_t half = rotary_dim / 2;
  // The angle is the F32 product of F32 position and inverse frequency, as Hugging Face computes
  // it (inv_freq.float() @ position_ids.float()); at large positions the F32 rounding of the
  // angle is visible in the output, so matching it matters more than a more exact angle.
  const float position = float(positions != nullptr       ? positions[row]
                               : step_position != nullptr ? *step_position
                                                          : first_position + row * position_stride);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = position * inv_freq[i];
    // cos/sin of that F32 angle in double, rounded once to F32 (as the CPU reference does), then
    // scaled in F32 as transformers does (emb.cos() * attention_scaling): a few double ops per
    // pair cost nothing next to the memory traffic.
    double sd, cd;
    sincos(double(angle), &sd, &cd);
    const float s = __fmul_rn(float(sd), scale);
    const float c = __fmul_rn(float(cd), scale);
    const float a = v[i];
    const float b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
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

}  // namespace kvlens::cuda
