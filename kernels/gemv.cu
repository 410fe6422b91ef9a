// Weight-streaming decode products (see gemv.cuh). A block per few output features: its threads
// walk the weight rows in 16-byte vectors (8 BF16/F16 or 4 F32 values), each multiplied into all
// `rows` activation rows (read from L1/L2: they are a few KB), then warp and block sums. The
// weights are the only large traffic, and each is read once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/device_common.cuh"
#include "kernels/gemv.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

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

// Rows, weights and x 16-byte aligned with `in` a multiple of the vector width. A block computes
// O output features at a time: lane l of warp w takes the vectors v = 32 w + l + 256 i, so each
// pass of the block reads 256 consecutive vectors of the O weight rows (the whole row of a
// 2048-wide BF16 matrix), and each activation vector it loads serves O weight vectors. Per
// feature: each lane sums its vectors in ascending order, the warp's lanes by the butterfly, then
// the warps' sums in warp order. That order depends on `in` alone, not on R or O, so a row's
// result has the same bits in a batch of any size.
template <typename W, int R, int O, bool Accumulate>
__global__ void __launch_bounds__(kThreads)
    gemv_vector_kernel(const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ y,
                       int rows, int64_t in, int64_t out) {
  constexpr int V = WeightVector<W>::kValues;
  __shared__ float warp_sums[kWarps][R][O];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t vectors = in / V;
  for (int64_t o0 = int64_t(blockIdx.x) * O; o0 < out; o0 += int64_t(gridDim.x) * O) {
    const uint4* weight_rows[O];
#pragma unroll
    for (int o = 0; o < O; ++o)
      weight_rows[o] = reinterpret_cast<const uint4*>(w + (o0 + o < out ? o0 + o : o0) * in);
    float acc[R][O];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int o = 0; o < O; ++o) acc[r][o] = 0.0f;
    for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
      uint4 raw[O];
#pragma unroll
      for (int o = 0; o < O; ++o) raw[o] = __ldg(weight_rows[o] + v);
      float weights[O][V];
#pragma unroll
      for (int o = 0; o < O; ++o) WeightVector<W>::widen(raw[o], weights[o]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        const float4* xr = reinterpret_cast<const float4*>(x + r * in + v * V);
#pragma unroll
        for (int q = 0; q < V / 4; ++q) {
          const float4 xv = __ldg(xr + q);
#pragma unroll
          for (int o = 0; o < O; ++o) {
            acc[r][o] = fmaf(weights[o][4 * q], xv.x, acc[r][o]);
            acc[r][o] = fmaf(weights[o][4 * q + 1], xv.y, acc[r][o]);
            acc[r][o] = fmaf(weights[o][4 * q + 2], xv.z, acc[r][o]);
            acc[r][o] = fmaf(weights[o][4 * q + 3], xv.w, acc[r][o]);
          }
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows) break;
#pragma unroll
      for (int o = 0; o < O; ++o) {
        const float sum = warp_reduce(acc[r][o], SumOp{});
        if (lane == 0) warp_sums[warp][r][o] = sum;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows * O; i += kThreads) {
      const int r = i / O, o = i % O;
      if (o0 + o >= out) continue;
      float total = 0.0f;
#pragma unroll
      for (int k = 0; k < kWarps; ++k) total += warp_sums[k][r][o];
      // Accumulate: the residual add as add_inplace does it, one addition.
      y[r * out + o0 + o] = Accumulate ? y[r * out + o0 + o] + total : total;
    }
    __syncthreads();  // warp_sums is rewritten by the next features
  }
}

// Any layout: one element at a time (odd widths, views at unaligned offsets).
template <typename W, int R, bool Accumulate>
__global__ void __launch_bounds__(kThreads)
    gemv_scalar_kernel(const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ y,
                       int rows, int64_t in, int64_t out) {
  const int lane = threadIdx.x & 31;
  const int64_t first_warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (int64_t(gridDim.x) * blockDim.x) >> 5;
  for (int64_t o = first_warp; o < out; o += warps) {
    const W* row = w + o * in;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    for (int64_t k = lane; k < in; k += 32) {
      const float weight = to_f32(row[k]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        acc[r] = fmaf(weight, x[r * in + k], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rows) break;
      const float sum = warp_reduce(acc[r], SumOp{});
      if (lane == 0) y[r * out + o] = Accumulate ? y[r * out + o] + sum : sum;
    }
  }
}

template <typename W, int R, bool Accumulate>
void launch_rows(const float* x, const W* w, float* y, int rows, int64_t in, int64_t out,
                 unsigned blocks, int sm_count, cudaStream_t stream) {
  constexpr int V = WeightVector<W>::kValues;
  const bool aligned = in % V == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(x) % 16 == 0;
  // One block per O features (grid-stride beyond a few blocks per SM); O = 4 serves several
  // rows (activation loads shared by four weight rows) and large single-row products (fewer,
  // longer blocks), O = 1 a single row of a small matrix (more blocks in flight).
  if (aligned) {
    constexpr int kMaxO = R >= 16 ? 2 : 4;
    const int64_t cap = int64_t(sm_count > 0 ? sm_count : 132) * 32;
    auto launch = [&](auto o_tag) {
      constexpr int O = decltype(o_tag)::value;
      const int64_t groups = (out + O - 1) / O;
      gemv_vector_kernel<W, R, O, Accumulate>
          <<<unsigned(groups < cap ? groups : cap), kThreads, 0, stream>>>(x, w, y, rows, in, out);
    };
    if (R > 1 || out >= 16384)
      launch(std::integral_constant<int, kMaxO>{});
    else
      launch(std::integral_constant<int, 1>{});
  } else
    gemv_scalar_kernel<W, R, Accumulate><<<blocks, kThreads, 0, stream>>>(x, w, y, rows, in, out);
}

}  // namespace

void launch_gemv(const float* x, const GemvProducts& products, DType w_dtype, int64_t rows,
                 int64_t in, bool accumulate, int sm_count, cudaStream_t stream) {
  if (rows <= 0) return;
  const int n = int(rows);
  for (int m = 0; m < products.count; ++m) {
    const int64_t out = products.out[m];
    if (out <= 0) continue;
    // The scalar kernel's grid: a warp per output feature, capped at enough blocks to fill every
    // SM a few times over (the warps then stride over the features).
    const int64_t wanted = (out + kWarps - 1) / kWarps;
    const int64_t cap = int64_t(sm_count > 0 ? sm_count : 132) * 16;
    const unsigned blocks = unsigned(wanted < cap ? wanted : cap);
    float* y = products.y[m];
    dispatch_weight(w_dtype, [&](auto zero) {
      using W = decltype(zero);
      const W* weights = static_cast<const W*>(products.w[m]);
      auto launch = [&](auto accumulate_tag) {
        constexpr bool A = decltype(accumulate_tag)::value;
        if (n <= 1)
          launch_rows<W, 1, A>(x, weights, y, n, in, out, blocks, sm_count, stream);
        else if (n <= 2)
          launch_rows<W, 2, A>(x, weights, y, n, in, out, blocks, sm_count, stream);
        else if (n <= 4)
          launch_rows<W, 4, A>(x, weights, y, n, in, out, blocks, sm_count, stream);
        else if (n <= 8)
          launch_rows<W, 8, A>(x, weights, y, n, in, out, blocks, sm_count, stream);
        else
          launch_rows<W, 16, A>(x, weights, y, n, in, out, blocks, sm_count, stream);
      };
      if (accumulate)
        launch(std::true_type{});
      else
        launch(std::false_type{});
    });
  }
}

}  // namespace kvlens::cuda
