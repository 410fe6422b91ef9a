// Weight-streaming decode products (see gemv.cuh). A block per few output features: its threads
// walk the weight rows in 16-byte vectors (8 BF16/F16 or 4 F32 values), each multiplied into all
// `rows` activation rows (read from L1/L2: they are a few KB), then warp and block sums. The
// weights are the only large traffic, and each is read once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdlib>
#include <type_traits>

#include "kernels/dependent_launch.cuh"
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

// Rows, weights and x 16-byte aligned with `in` a multiple of the vector width. One warp per
// F output features (of the products laid end to end): lane l takes the vectors v = l, l + 32, ...
// of the weight row, each widened and multiplied into all `rows` activation rows, summed in
// ascending v, then the butterfly. That order depends on `in` alone, not on R or on the other
// products, so a row's result has the same bits in a batch of any size and in any fused call.
// The activation rows are staged in shared memory: whole, once per block, when they fit, else
// `chunk` columns at a time (a multiple of 32 vectors, so every lane keeps its vectors and the
// order of its sums). With a norm weight (whole rows only) the block first applies
// rmsnorm_kernel's arithmetic to them (the bits of the rmsnorm op) and block 0 writes them to
// `normed`.
// Mode: Store y = sum; Accumulate y += sum (add_inplace's one addition); SiluPair the products
// are gate (0) and up (1), of one width, and y[0] receives silu(gate) * up as silu_mul does.
enum class GemvMode { Store, Accumulate, SiluPair };

// Output features a warp computes together. Each activation value read from shared memory then
// feeds F * P weight rows instead of P: with several rows (lockstep runs) the shared-memory reads,
// R per weight vector, would otherwise bound the kernel far below memory bandwidth (8 rows: about
// a sixth of it, measured on an H200). Each feature's sums keep their order, so the bits do not
// change with F.
template <int R, int P>
__host__ __device__ constexpr int features_per_warp() {
  return R >= 4 ? 4 / P : 1;
}

// The staged rows' layout, in float4s: per row, a vector's H = V / 4 quarters (one for F32
// weights, two for 16-bit ones) go to H planes of `vectors` float4s each. A warp's lanes read
// consecutive vectors, so one quarter-plane read of a warp is 512 contiguous bytes: without the
// planes (vectors side by side) the lanes would be 32 bytes apart, two wavefronts per read.
template <int V>
__device__ __forceinline__ int64_t staged_float4(int64_t r, int64_t v, int q, int64_t vectors) {
  return (r * (V / 4) + q) * vectors + v;
}

// rows x columns [c0, c0 + count) of x [rows, in] into shared memory (staged_float4's layout).
template <int V>
__device__ __forceinline__ void stage_columns(const float* __restrict__ x, int rows, int64_t in,
                                              int64_t c0, int64_t count, float4* staged) {
  const int64_t per_row = count / 4, vectors = count / V;
  for (int64_t i = threadIdx.x; i < rows * per_row; i += kThreads) {
    const int64_t r = i / per_row, k = i % per_row;
    staged[staged_float4<V>(r, k / (V / 4), int(k % (V / 4)), vectors)] =
        __ldg(reinterpret_cast<const float4*>(x + r * in + c0) + k);
  }
}

// 16-byte weight vectors a lane has in flight per batch (U * 512 bytes a warp). With three
// blocks an SM (the launch bound, 85 registers) U = 8 for one row; a product with at most two
// blocks an SM (few, long rows: o_proj, w_down) takes kDeepBatch and two. One vector at a time had
// left those at a third of the bandwidth (H200, w_down 21.5 -> 16.9 us).
template <int F, int P>
__host__ __device__ constexpr int vectors_in_flight() {
  return F * P == 1 ? 8 : (F * P == 2 ? 4 : 2);
}
constexpr int kDeepBatch = 16;

template <typename W, typename NormW, int R, GemvMode Mode, int U>
__global__ void __launch_bounds__(kThreads, U >= kDeepBatch ? 2 : (R <= 2 ? 3 : 1))
    gemv_warp_kernel(const float* __restrict__ x, GemvProducts products, int rows, int64_t in,
                     int64_t chunk, const NormW* __restrict__ norm_weight, float eps,
                     float* __restrict__ normed, bool weights_uploaded) {
  constexpr int V = WeightVector<W>::kValues;
  extern __shared__ float4 staged[];
  __shared__ double scratch[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t total = Mode == GemvMode::SiluPair
                            ? products.out[0]
                            : products.out[0] + products.out[1] + products.out[2] + products.out[3];
  constexpr int P = Mode == GemvMode::SiluPair ? 2 : 1;  // weight rows per feature
  constexpr int F = features_per_warp<R, P>();
  const bool whole = chunk >= in;
  const int64_t vectors = in / V;
  const int64_t chunk_vectors = whole ? vectors : chunk / V;

  // The weight rows of the features first .. first + F - 1 (past the last feature: feature 0's
  // rows, read again and the sums dropped).
  int m[F];
  int64_t o[F];
  const uint4* weight_rows[F][P];
  auto locate = [&](int64_t first) {
#pragma unroll
    for (int f = 0; f < F; ++f) {
      o[f] = first + f < total ? first + f : 0, m[f] = 0;
      if constexpr (Mode != GemvMode::SiluPair) {
        while (o[f] >= products.out[m[f]]) o[f] -= products.out[m[f]++];
      }
#pragma unroll
      for (int p = 0; p < P; ++p)
        weight_rows[f][p] =
            reinterpret_cast<const uint4*>(static_cast<const W*>(products.w[m[f] + p]) + o[f] * in);
    }
  };
  // A batch: this lane's vectors v0, v0 + 32, .. (U of them, those below c1).
  uint4 raw[U][F][P];
  auto load_batch = [&](int64_t v0, int64_t c1) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (v0 + 32 * u >= c1) break;
#pragma unroll
      for (int f = 0; f < F; ++f)
#pragma unroll
        for (int p = 0; p < P; ++p) raw[u][f][p] = __ldg(weight_rows[f][p] + v0 + 32 * u);
    }
  };
  // No kernel writes uploaded weights: their first batch is requested before this grid waits
  // for the one before it and before the rows are staged, so its latency overlaps both.
  const int64_t block_first = int64_t(blockIdx.x) * kWarps * F;
  bool preloaded = false;
  if (weights_uploaded && whole && block_first + int64_t(warp) * F < total) {
    locate(block_first + int64_t(warp) * F);
    load_batch(lane, vectors);
    preloaded = true;
  }
  begin_dependent_grid();
  if (whole) {
    stage_columns<V>(x, rows, in, 0, in, staged);
    if (norm_weight != nullptr) {
      __syncthreads();
      float* staged_floats = reinterpret_cast<float*>(staged);
      // Element i of row r in the staged layout.
      auto at = [&](int r, int64_t i) -> float& {
        return staged_floats[4 * staged_float4<V>(r, i / V, int(i % V / 4), vectors) + i % 4];
      };
      for (int r = 0; r < rows; ++r) {
        double sum = 0.0;
        for (int64_t i = threadIdx.x; i < in; i += kThreads)
          sum += double(at(r, i)) * double(at(r, i));
        sum = block_reduce(sum, SumOp{}, 0.0, scratch);
        const float inv = float(1.0 / sqrt(sum / double(in) + double(eps)));
        for (int64_t i = threadIdx.x; i < in; i += kThreads) {
          float& value = at(r, i);
          value = (value * inv) * to_f32(norm_weight[i]);
          if (blockIdx.x == 0 && normed != nullptr) normed[r * in + i] = value;
        }
      }
    }
    __syncthreads();
  }
  // Block-uniform, so that every warp reaches the chunks' barriers.
  for (int64_t base = block_first; base < total; base += int64_t(gridDim.x) * kWarps * F) {
    const int64_t first = base + int64_t(warp) * F;
    if (!preloaded) locate(first);
    float acc[F][P][R];
#pragma unroll
    for (int f = 0; f < F; ++f)
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[f][p][r] = 0.0f;
    for (int64_t c0 = 0; c0 < vectors; c0 += chunk_vectors) {
      const int64_t c1 = c0 + chunk_vectors < vectors ? c0 + chunk_vectors : vectors;
      if (!whole) {
        __syncthreads();  // the previous chunk's readers are done
        stage_columns<V>(x, rows, in, c0 * V, (c1 - c0) * V, staged);
        __syncthreads();
      }
      if (first >= total) continue;
      for (int64_t v0 = c0 + lane; v0 < c1; v0 += 32 * U) {
        if (!preloaded) load_batch(v0, c1);
        preloaded = false;
        // The batch's vectors in ascending order: each sum keeps the order v = lane, lane + 32, ..
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t v = v0 + 32 * u;
          if (v >= c1) break;
          float weights[F][P][V];
#pragma unroll
          for (int f = 0; f < F; ++f)
#pragma unroll
            for (int p = 0; p < P; ++p) WeightVector<W>::widen(raw[u][f][p], weights[f][p]);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (r >= rows) break;
#pragma unroll
            for (int q = 0; q < V / 4; ++q) {
              const float4 xv = staged[staged_float4<V>(r, v - c0, q, c1 - c0)];
#pragma unroll
              for (int f = 0; f < F; ++f)
#pragma unroll
                for (int p = 0; p < P; ++p) {
                  float& a = acc[f][p][r];
                  a = fmaf(weights[f][p][4 * q], xv.x, a);
                  a = fmaf(weights[f][p][4 * q + 1], xv.y, a);
                  a = fmaf(weights[f][p][4 * q + 2], xv.z, a);
                  a = fmaf(weights[f][p][4 * q + 3], xv.w, a);
                }
            }
          }
        }
      }
    }
    // (a lane past the row's last vector took no batch: the next feature is located afresh)
    preloaded = false;
#pragma unroll
    for (int f = 0; f < F; ++f) {
      if (first + f >= total) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        float sums[P];
#pragma unroll
        for (int p = 0; p < P; ++p) sums[p] = warp_reduce(acc[f][p][r], SumOp{});
        if (lane != 0) continue;
        float* y = products.y[m[f]] + r * products.out[m[f]] + o[f];
        if constexpr (Mode == GemvMode::Store) {
          *y = sums[0];
        } else if constexpr (Mode == GemvMode::Accumulate) {
          *y = *y + sums[0];
        } else {
          // silu_mul_kernel's expression, so the bits are those of the separate ops.
          const float g = sums[0];
          *y = g / (1.0f + expf(-g)) * sums[1];
        }
      }
    }
  }
}

// Any layout: one element at a time (odd widths, views at unaligned offsets).
template <typename W, int R, bool Accumulate>
__global__ void __launch_bounds__(kThreads)
    gemv_scalar_kernel(const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ y,
                       int rows, int64_t in, int64_t out) {
  begin_dependent_grid();
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

// Blocks per SM of the warp kernel ($KVLENS_GEMV_BLOCKS_PER_SM overrides it, for measurements).
int64_t blocks_per_sm() {
  static const int64_t value = [] {
    const char* text = std::getenv("KVLENS_GEMV_BLOCKS_PER_SM");
    const long parsed = text != nullptr ? std::strtol(text, nullptr, 10) : 0;
    return parsed > 0 ? int64_t(parsed)
                      : int64_t(3);  // the launch bound of the 1- and 2-row kernels
  }();
  return value;
}

// Shared memory for the staged rows: up to the opt-in limit set once per kernel instance.
constexpr int64_t kMaxStagedBytes = 96 * 1024;

// Columns staged at a time: every column when the rows fit, else the most whole 32-vector
// groups that do (at least one: 16 rows x 256 columns is 16 KiB).
int64_t staged_columns(int64_t rows, int64_t in, int64_t vector) {
  if (rows * in * int64_t(sizeof(float)) <= kMaxStagedBytes) return in;
  const int64_t group = 32 * vector;
  const int64_t groups = kMaxStagedBytes / (rows * int64_t(sizeof(float)) * group);
  return (groups > 1 ? groups : 1) * group;
}

template <typename W, typename NormW, int R, GemvMode Mode, int U>
void launch_warp_kernel(const GemvCall& call, const GemvProducts& products, unsigned blocks,
                        cudaStream_t stream) {
  auto kernel = gemv_warp_kernel<W, NormW, R, Mode, U>;
  const int rows = int(call.rows);
  const int64_t in = call.in;
  const int64_t chunk = staged_columns(rows, in, WeightVector<W>::kValues);
  const size_t shared_bytes = size_t(rows) * size_t(chunk < in ? chunk : in) * sizeof(float);
  if (shared_bytes > 48 * 1024) {
    // Once per instance (a thread-safe static: lanes of run_tasks launch from several threads).
    static const bool raised = [&] {
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(kMaxStagedBytes));
      return true;
    }();
    (void)raised;
  }
  launch_dependent(kernel, blocks, kThreads, shared_bytes, stream, call.x, products, rows, in,
                   chunk, static_cast<const NormW*>(call.norm_weight), call.eps, call.normed,
                   call.weights_uploaded);
}

// A warp per F features, eight per block, up to a few blocks per SM (then grid-stride). F stays
// 4 from 3 rows on even where that leaves SMs idle (q/k/v, o_proj): measured on an H200, fewer
// features per warp (more blocks) was slower at 8 rows, the shared-memory reads bound.
template <typename W, typename NormW, int R, GemvMode Mode>
void launch_products(const GemvCall& call, const GemvProducts& products, int64_t total,
                     int sm_count, cudaStream_t stream) {
  constexpr int kPairs = Mode == GemvMode::SiluPair ? 2 : 1;
  constexpr int F = features_per_warp<R, kPairs>();
  constexpr int64_t per_block = kWarps * F;
  const int64_t sms = sm_count > 0 ? sm_count : 132;
  const int64_t wanted = (total + per_block - 1) / per_block;
  const int64_t cap = sms * blocks_per_sm();
  const unsigned blocks = unsigned(wanted < cap ? wanted : cap);
  if constexpr (R == 1 && F * kPairs == 1) {
    if (wanted <= 2 * sms) {
      launch_warp_kernel<W, NormW, R, Mode, kDeepBatch>(call, products, blocks, stream);
      return;
    }
  }
  launch_warp_kernel<W, NormW, R, Mode, vectors_in_flight<F, kPairs>()>(call, products, blocks,
                                                                        stream);
}

template <typename W, int R, bool Accumulate>
void launch_scalar(const float* x, const W* w, float* y, int rows, int64_t in, int64_t out,
                   int sm_count, cudaStream_t stream) {
  // A warp per output feature, capped at enough blocks to fill every SM a few times over.
  const int64_t wanted = (out + kWarps - 1) / kWarps;
  const int64_t cap = int64_t(sm_count > 0 ? sm_count : 132) * 16;
  launch_dependent(gemv_scalar_kernel<W, R, Accumulate>, unsigned(wanted < cap ? wanted : cap),
                   kThreads, 0, stream, x, w, y, rows, in, out);
}

// Calls f(std::integral_constant<int, R>) with R the smallest supported batch >= rows.
template <typename F>
void dispatch_rows(int rows, F&& f) {
  if (rows <= 1)
    f(std::integral_constant<int, 1>{});
  else if (rows <= 2)
    f(std::integral_constant<int, 2>{});
  else if (rows <= 4)
    f(std::integral_constant<int, 4>{});
  else if (rows <= 8)
    f(std::integral_constant<int, 8>{});
  else
    f(std::integral_constant<int, 16>{});
}

}  // namespace

bool gemv_fusable(const float* x, const GemvProducts& products, DType w_dtype, int64_t rows,
                  int64_t in) {
  const int64_t V = w_dtype == DType::F32 ? 4 : 8;
  if (rows < 1 || rows > kMaxGemvRows || in % V != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return false;
  for (int m = 0; m < products.count; ++m)
    if (reinterpret_cast<uintptr_t>(products.w[m]) % 16 != 0) return false;
  return true;
}

bool gemv_stages_rows(int64_t rows, int64_t in) {
  return rows * in * int64_t(sizeof(float)) <= kMaxStagedBytes;
}

void launch_gemv(const GemvCall& call, int sm_count, cudaStream_t stream) {
  const int n = int(call.rows);
  if (n <= 0) return;
  GemvProducts products = call.products;
  int64_t total = 0;
  for (int m = 0; m < products.count; ++m) total += products.out[m];
  if (total <= 0) return;
  if (!gemv_fusable(call.x, products, call.w_dtype, call.rows, call.in)) {
    // Odd widths or unaligned views: a scalar kernel per product (no fusion is asked of it).
    for (int m = 0; m < products.count; ++m) {
      dispatch_weight(call.w_dtype, [&](auto zero) {
        using W = decltype(zero);
        dispatch_rows(n, [&](auto rows_tag) {
          constexpr int R = decltype(rows_tag)::value;
          const W* w = static_cast<const W*>(products.w[m]);
          if (call.accumulate)
            launch_scalar<W, R, true>(call.x, w, products.y[m], n, call.in, products.out[m],
                                      sm_count, stream);
          else
            launch_scalar<W, R, false>(call.x, w, products.y[m], n, call.in, products.out[m],
                                       sm_count, stream);
        });
      });
    }
    return;
  }
  for (int m = products.count; m < kMaxGemvProducts; ++m) products.out[m] = 0;
  const bool silu = call.silu_pair;
  if (silu) total = products.out[0];
  dispatch_weight(call.w_dtype, [&](auto zero) {
    using W = decltype(zero);
    dispatch_rows(n, [&](auto rows_tag) {
      constexpr int R = decltype(rows_tag)::value;
      auto with_norm = [&](auto norm_zero) {
        using N = decltype(norm_zero);
        auto go = [&](auto mode_tag) {
          launch_products<W, N, R, decltype(mode_tag)::value>(call, products, total, sm_count,
                                                              stream);
        };
        if (silu)
          go(std::integral_constant<GemvMode, GemvMode::SiluPair>{});
        else if (call.accumulate)
          go(std::integral_constant<GemvMode, GemvMode::Accumulate>{});
        else
          go(std::integral_constant<GemvMode, GemvMode::Store>{});
      };
      // The norm weight's type (only read with a norm; F32 otherwise, one instance): F32 or
      // the weights' own (GemvCall::norm_dtype), so as few kernels are built as needed.
      if (call.norm_weight == nullptr || call.norm_dtype == DType::F32)
        with_norm(float{});
      else
        with_norm(W{});
    });
  });
}

}  // namespace kvlens::cuda
