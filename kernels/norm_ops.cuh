// Elementwise and per-row activation kernels of the CUDA backend: embedding gather, RMSNorm,
// silu(gate) * up, in-place add, and widening of BF16/F16 weights to F32. Activations are F32,
// row-major: [rows, width]. Launchers only enqueue on `stream`; the caller checks for errors.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

// dst[i] = float(src[i]) for i < count (src F32/BF16/F16).
void launch_widen_to_f32(const void* src, DType dtype, int64_t count, float* dst,
                         cudaStream_t stream);
// A few token ids passed in a kernel's arguments.
struct SmallIds {
  static constexpr int64_t kCapacity = 64;
  int32_t ids[kCapacity] = {};
};
// out[r, :] = table[ids[r], :] for r < rows; table [vocab, width] F32/BF16/F16; ids in device
// memory, or null: then small.ids (rows <= SmallIds::kCapacity). Already checked against vocab.
void launch_embed(const void* table, DType dtype, int64_t width, const int32_t* ids,
                  const SmallIds& small, int64_t rows, float* out, cudaStream_t stream);
// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight (weight [width] F32/BF16/F16).
// y may alias x.
void launch_rmsnorm(const float* x, const void* weight, DType weight_dtype, int64_t rows,
                    int64_t width, float eps, float* y, cudaStream_t stream);
// y[r, :] = (x[r, :] - mean) * rsqrt(var + eps) * weight + bias (LayerNorm, biased variance;
// weight and bias [width] of one dtype F32/BF16/F16). y may alias x.
void launch_layer_norm(const float* x, const void* weight, const void* bias, DType dtype,
                       int64_t rows, int64_t width, float eps, float* y, cudaStream_t stream);
// x[i] = act(x[i] + bias[i % width]) (bias F32/BF16/F16 or null); act 0 none, 1 GELU (erf),
// 2 SiLU.
void launch_bias_activation(float* x, int64_t count, const void* bias, DType bias_dtype,
                            int64_t width, int act, cudaStream_t stream);
// out[i] = silu(gate[i]) * up[i]
void launch_silu_mul(const float* gate, const float* up, int64_t count, float* out,
                     cudaStream_t stream);
// x[i] += y[i]
void launch_add_inplace(float* x, const float* y, int64_t count, cudaStream_t stream);
// out = gelu_tanh(gate) * up (Backend::gelu_tanh_mul); x = tanh(x / cap) * cap (soft_cap).
void launch_gelu_tanh_mul(const float* gate, const float* up, int64_t count, float* out,
                          cudaStream_t stream);
void launch_soft_cap(float* x, int64_t count, float cap, cudaStream_t stream);

}  // namespace kvlens::cuda
