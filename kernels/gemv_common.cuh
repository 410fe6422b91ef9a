// What the decode products' kernels share (gemv.cu, the general one; gemv_row.cu, the one-row
// one): 16 bytes of weights widened to F32, the epilogue modes, and the host's questions about
// how many of their blocks an SM holds. Included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <type_traits>
#include <utility>

#include "kernels/device_common.cuh"
#include "kernels/gemv.cuh"

namespace kvlens::cuda {

// 16 bytes of weights widened to F32.
template <typename W>
struct WeightVector;
template <>
struct WeightVector<float> {
  static constexpr int kValues = 4;
  __device__ static void widen(const uint4& raw, float* out) {
    out[0] = __uint_as_float(raw.x), out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z), out[3] = __uint_as_float(raw.w);
  }
};
// Eight 16-bit values as four pairs, each widened by the pair intrinsic of its type.
__device__ __forceinline__ float2 pair_to_float2(__nv_bfloat162 pair) {
  return __bfloat1622float2(pair);
}
__device__ __forceinline__ float2 pair_to_float2(__half2 pair) {
  return __half22float2(pair);
}
template <typename Pair>
struct HalfWidthVector {
  static constexpr int kValues = 8;
  __device__ static void widen(const uint4& raw, float* out) {
    const auto* pairs = reinterpret_cast<const Pair*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = pair_to_float2(pairs[i]);
      out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
  }
};
template <>
struct WeightVector<__nv_bfloat16> : HalfWidthVector<__nv_bfloat162> {};
template <>
struct WeightVector<__half> : HalfWidthVector<__half2> {};

// A weight vector no kernel writes, read once: not kept in L1.
__device__ __forceinline__ uint4 load_weight_vector(const uint4* address) {
  uint4 v;
  // volatile: issued where written, so the first batches stay ahead of the grid's wait.
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(address));
  return v;
}

// Mode: Store y = sum; Accumulate y += sum (add_inplace's one addition); SiluPair the products
// are gate (0) and up (1), of one width, and y[0] receives silu(gate) * up as silu_mul does.
enum class GemvMode { Store, Accumulate, SiluPair };

// One feature's warp sums into y (lane 0): Store y = sums[0]; Accumulate y += sums[0]
// (add_inplace's one addition); SiluPair y = silu(gate) * up with silu_mul_kernel's expression, so
// the bits are those of the separate ops.
template <GemvMode Mode>
__device__ __forceinline__ void store_feature(float* y, const float* sums) {
  if constexpr (Mode == GemvMode::Store) {
    *y = sums[0];
  } else if constexpr (Mode == GemvMode::Accumulate) {
    *y = *y + sums[0];
  } else {
    const float g = sums[0];
    *y = g / (1.0f + expf(-g)) * sums[1];
  }
}

// The fused RMSNorm's weight: a thread's first kNormHeld values (i = thread, thread + kThreads,
// ..: all of a width up to 4096) held in registers as stored, so they can be read before the grid
// waits (no kernel writes an uploaded weight) and widened where used (widened at once, the warps
// waited for them there: a fifth of gate/up's stall samples on an H100). Index: the kernel's
// index type.
constexpr int kNormHeld = 16;
template <typename NormW, int kThreads>
struct HeldNorm {
  NormW values[kNormHeld];
  template <typename Index>
  __device__ __forceinline__ void hold(const NormW* weight, Index in) {
#pragma unroll
    for (int k = 0; k < kNormHeld; ++k) {
      const Index i = Index(threadIdx.x) + Index(k) * kThreads;
      if (i < in) values[k] = weight[i];
    }
  }
  // scale(i, weight i as F32) for every i of this thread, ascending.
  template <typename Index, typename Scale>
  __device__ __forceinline__ void for_each(const NormW* weight, Index in, Scale&& scale) const {
#pragma unroll
    for (int k = 0; k < kNormHeld; ++k) {
      const Index i = Index(threadIdx.x) + Index(k) * kThreads;
      if (i < in) scale(i, to_f32(values[k]));
    }
    for (Index i = Index(threadIdx.x) + Index(kNormHeld) * kThreads; i < in; i += kThreads)
      scale(i, to_f32(weight[i]));
  }
};

// At most this many blocks per SM of the warp kernel ($KVLENS_GEMV_BLOCKS_PER_SM, for measuring);
// fewer where its shared memory or registers do not fit more.
inline int64_t gemv_blocks_per_sm_cap() {
  static const int64_t value = [] {
    const char* text = std::getenv("KVLENS_GEMV_BLOCKS_PER_SM");
    const long parsed = text != nullptr ? std::strtol(text, nullptr, 10) : 0;
    return parsed > 0 ? int64_t(parsed) : int64_t(3);  // the 1- and 2-row kernels' launch bound
  }();
  return value;
}

// Blocks of `kernel` one SM holds with `shared_bytes` of dynamic shared memory, asked once per
// (kernel, size) and launching thread: the lanes of run_tasks launch from threads of their own,
// and a shared cache would put a lock on every product's launch.
inline int64_t resident_blocks(const void* kernel, size_t shared_bytes, int threads) {
  thread_local std::map<std::pair<const void*, size_t>, int64_t> known;
  const auto key = std::make_pair(kernel, shared_bytes);
  auto it = known.find(key);
  if (it == known.end()) {
    int blocks = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, shared_bytes) !=
        cudaSuccess)
      blocks = 1;
    it = known.emplace(key, blocks > 0 ? blocks : 1).first;
  }
  return it->second;
}

// Calls f(W{}, NormW{}, std::integral_constant<GemvMode, mode>{}) with W the weights' device type,
// NormW the norm weight's (F32, or the weights' own: GemvCall::norm_dtype; F32 without a norm,
// so as few kernels are built as needed) and the call's epilogue.
template <typename F>
void dispatch_products(const GemvCall& call, F&& f) {
  dispatch_weight(call.w_dtype, [&](auto zero) {
    using W = decltype(zero);
    auto with_norm = [&](auto norm_zero) {
      using N = decltype(norm_zero);
      if (call.silu_pair)
        f(W{}, N{}, std::integral_constant<GemvMode, GemvMode::SiluPair>{});
      else if (call.accumulate)
        f(W{}, N{}, std::integral_constant<GemvMode, GemvMode::Accumulate>{});
      else
        f(W{}, N{}, std::integral_constant<GemvMode, GemvMode::Store>{});
    };
    if (call.norm_weight == nullptr || call.norm_dtype == DType::F32)
      with_norm(float{});
    else
      with_norm(W{});
  });
}

}  // namespace kvlens::cuda
