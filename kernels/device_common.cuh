// Device-side helpers shared by the kernel files of the CUDA backend: reading weights stored as
// F32 / BF16 / F16, warp and block reductions, and the grid size for grid-stride loops.
// Included by .cu files only (it needs nvcc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

// Widening to F32 is exact for all three weight types, so kernels templated on the stored type
// give the same values as a kernel reading pre-widened F32 weights.
__device__ __forceinline__ float to_f32(float v) {
  return v;
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_f32(__half v) {
  return __half2float(v);
}

// Narrowing for stores into a KV cache of the model's dtype: round to nearest even, as torch's
// .to(dtype) does.
template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

// Calls f(T{}) with T the device element type of a weight dtype. Returns false for non-weight
// dtypes (the backend validates dtypes before calling a launcher, so that never happens there).
template <typename F>
bool dispatch_weight(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32:
      f(float{});
      return true;
    case DType::BF16:
      f(__nv_bfloat16{});
      return true;
    case DType::F16:
      f(__half{});
      return true;
    default:
      return false;
  }
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// q . key over D elements by one warp (every lane gets the result): lane l sums the fused
// products d = l, l + 32, ... in order, then the butterfly reduction. Every kernel that produces
// attention logits uses this arithmetic (or group_dots, the same), so their logits agree bit for
// bit.
// The key may be stored as F32, BF16 or F16 (a KV cache of the model's dtype); widening is exact,
// so a narrow cache gives the bits of an F32 cache holding the same values.
template <typename K>
__device__ __forceinline__ float warp_dot(const float* q, const K* key, int64_t D, int lane) {
  float dot = 0.0f;
  for (int64_t d = lane; d < D; d += 32) dot = fmaf(q[d], to_f32(key[d]), dot);
  return warp_reduce(dot, SumOp{});
}

// warp_dot(v, v): the squared norm of a vector stored in any of the three types.
template <typename K>
__device__ __forceinline__ float warp_dot_self(const K* v, int64_t D, int lane) {
  float dot = 0.0f;
  for (int64_t d = lane; d < D; d += 32) {
    const float x = to_f32(v[d]);
    dot = fmaf(x, x, dot);
  }
  return warp_reduce(dot, SumOp{});
}

// warp_dot of one key with each of `group` query rows q[h * D ..] (a GQA group), the key read
// from memory once into registers; emit(h, dot) on every lane. Same bits as warp_dot.
constexpr int64_t kMaxGroupDotDim = 256;
template <typename K, typename Emit>
__device__ __forceinline__ void group_dots(const float* q, int64_t group, const K* key, int64_t D,
                                           int lane, Emit&& emit) {
  constexpr int kRegisters = int(kMaxGroupDotDim / 32);
  float k[kRegisters];
#pragma unroll
  for (int i = 0; i < kRegisters; ++i) {
    const int64_t d = lane + 32 * i;
    k[i] = d < D ? to_f32(key[d]) : 0.0f;
  }
  for (int64_t h = 0; h < group; ++h) {
    float dot = 0.0f;
#pragma unroll
    for (int i = 0; i < kRegisters; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) dot = fmaf(q[h * D + d], k[i], dot);
    }
    emit(h, warp_reduce(dot, SumOp{}));
  }
}

// Reduction over the whole block; every thread gets the result. blockDim.x must be a multiple
// of 32 and at most 1024; `scratch` is shared memory for 32 values. The trailing barrier lets
// callers run several reductions back to back with the same scratch.
template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity, T* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  v = warp_reduce(v, op);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = lane < warps ? scratch[lane] : identity;
  r = warp_reduce(r, op);
  __syncthreads();
  return r;
}

// Blocks for a grid-stride loop over `count` elements: enough to fill the GPU, capped so the
// grid size stays in range for any count.
inline unsigned grid_for(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = 65536;
  return unsigned(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace kvlens::cuda
