// Decode products of BF16 weights on the tensor cores (gemv_mma.cuh): y[n, out] = x[n, in] *
// w[out, in]^T for n <= 16 rows through mma.sync m16n8k16 with F32 accumulation; A is 16 feature
// rows x 16 columns of the weights, B 16 columns x 8 rows of x (rows past n are zeros; 9..16 rows
// take a second B tile). x is F32: each value is split exactly into three BF16 parts (hi + mid +
// lo == x) and the three products are accumulated in F32; BF16 x BF16 products are exact, so the
// result keeps F32 accuracy where BF16 x would lose 8 bits.
// Work: a tile is 16 features (with the SiLU pair, 16 gate rows and their 16 up rows), the
// columns go in k-blocks of 32. Lane (g = lane / 4, t = lane % 4) loads the 16-byte vector of
// columns 32 kb + 8t .. + 7 of feature rows g and g + 8, and the same columns of x row g: the
// tensor core sums its 16 columns in whatever order A and B agree on, so one vector feeds two
// k-steps without shuffles.
// A block per tile (grid-stride), its 8 warps each take every eighth k-block, then the block adds
// the 8 partial sums in warp order. (A warp per tile over every k-block, no barrier, was 6%
// slower on the lm_head and 2-4x slower on the smaller products: too few tiles for the warps.)
// A feature's sum order depends on `in` alone, never on the rows: a row's result has the same
// bits alone and in a batch (the tensor core computes each column of B apart).
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gemv_common.cuh"
#include "kernels/gemv_mma.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileFeatures = 16;  // the mma's M
constexpr int kBlockColumns = 32;  // a k-block: 4 lanes x 8 columns, two mma k-steps
constexpr int kDepth = 2;          // batches a lane has requested ahead of the one it multiplies
constexpr int kBatchVectors = 4;   // k-blocks a batch holds, over the P weight rows of a feature
constexpr int kBlocksPerSm = 2;    // the launch bound: 128 registers (a ring of 16 vectors a lane)
constexpr int kRowPad = 4;         // floats after each staged row: rows g and g + 1 on other banks

__device__ __forceinline__ uint32_t bf16_pair_bits(__nv_bfloat162 pair) {
  uint32_t bits;
  memcpy(&bits, &pair, sizeof(bits));
  return bits;
}

// Columns 8t .. 8t + 7 of one x row (first: 0..3, second: 4..7) as three BF16 parts, low part
// first, each as the four column pairs of the B fragments (low half: the lower column). Every
// subtraction is exact (the parts take 8 + 8 + 8 of the 24 significand bits), so lo + mid + hi
// is the value itself.
__device__ __forceinline__ void split_columns(const float4& first, const float4& second,
                                              uint32_t (&parts)[3][4]) {
  const float v[8] = {first.x, first.y, first.z, first.w, second.x, second.y, second.z, second.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float a = v[2 * i], b = v[2 * i + 1];
    const __nv_bfloat162 hi = __floats2bfloat162_rn(a, b);
    const float2 hi_f = __bfloat1622float2(hi);
    a -= hi_f.x, b -= hi_f.y;
    const __nv_bfloat162 mid = __floats2bfloat162_rn(a, b);
    const float2 mid_f = __bfloat1622float2(mid);
    a -= mid_f.x, b -= mid_f.y;
    parts[0][i] = bf16_pair_bits(__floats2bfloat162_rn(a, b));
    parts[1][i] = bf16_pair_bits(mid);
    parts[2][i] = bf16_pair_bits(hi);
  }
}

// c += A * B for one m16n8k16 step (A: 4 registers of BF16 pairs, B: 2, c: F32).
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// One k-block into c: rows g (w_low) and g + 8 (w_high) of a tile, 8 columns each; the vector's
// words 0-1 are k-step 0 (columns 8t..8t+3 standing for the mma's 2t, 2t+1, 2t+8, 2t+9), words
// 2-3 k-step 1. Each part has its own accumulator c[part] (k-step 0 then 1): one chain of
// dependent mma per part, a third as long as one chain through all three (an H200 stalled on
// that chain, ncu's "wait", more than on the weights).
__device__ __forceinline__ void multiply_block(float (&c)[3][4], const uint4& w_low,
                                               const uint4& w_high, const uint32_t (&parts)[3][4]) {
#pragma unroll
  for (int part = 0; part < 3; ++part)
    mma_bf16(c[part], w_low.x, w_high.x, w_low.y, w_high.y, parts[part][0], parts[part][1]);
#pragma unroll
  for (int part = 0; part < 3; ++part)
    mma_bf16(c[part], w_low.z, w_high.z, w_low.w, w_high.w, parts[part][2], parts[part][3]);
}

// Mode as in gemv.cu (GemvCall): Store y = sum, Accumulate y += sum, SiluPair y[0] = silu(gate)
// * up. NT: B tiles (8 rows each). Staged: the rows are copied to shared memory first, as
// [rows][in + kRowPad] (always with a norm weight, whose arithmetic is rmsnorm's, and where they
// fit), else read from global memory (L2) where used.
template <typename NormW, GemvMode Mode, int NT, bool Staged>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    gemv_mma_kernel(const float* __restrict__ x, const __grid_constant__ GemvProducts products,
                    int rows, int in, int total, const NormW* __restrict__ norm_weight, float eps,
                    float* __restrict__ normed, bool weights_uploaded, bool norm_uploaded) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int P = Mode == GemvMode::SiluPair ? 2 : 1;  // weight rows per feature
  // k-blocks per batch (a SiLU pair of 9-16 rows takes one: two spilled; the batch size does not
  // change the sum order)
  constexpr int U = P == 2 && NT == 2 ? 1 : kBatchVectors / P;
  extern __shared__ float4 shared4[];
  float* const staged = reinterpret_cast<float*>(shared4);  // [rows][in + kRowPad] if Staged
  __shared__ double scratch[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row_stride = in + kRowPad;
  const int kblocks = (in + kBlockColumns - 1) / kBlockColumns;
  const int tiles = (total + kTileFeatures - 1) / kTileFeatures;
  // This warp's k-blocks kb = warp + 8j (the block's warps read each row's columns side by side;
  // contiguous eighths measured the same), every warp walking the same number of batches so
  // that the block's barriers line up.
  const int kb_share = (kblocks + kWarps - 1) / kWarps;
  const int batches = (kb_share + U - 1) / U;
  auto kblock = [&](int j) { return warp + kWarps * j; };
  auto kb_inside = [&](int j) { return kblock(j) < kblocks; };
  const int first_tile = int(blockIdx.x), tile_stride = int(gridDim.x);

  // Feature -> product m and its row o (a pair's rows are products 0 and 1 at o).
  auto locate = [&](int feature, int& m, int& o) {
    m = 0, o = feature;
    if constexpr (Mode != GemvMode::SiluPair) {
      while (o >= products.out[m]) o -= int(products.out[m++]);
    }
  };

  // The producer walks the consumer's sequence (tile, batch) kDepth batches ahead of it.
  int put_tile = first_tile, put_batch = 0;
  const uint4* put_rows[P][2];  // rows g and g + 8 of the tile, per weight row of a feature
  auto locate_rows = [&]() {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int feature = put_tile * kTileFeatures + g + 8 * h;
      if (feature >= total) feature = 0;  // read, its sums dropped
      int m = 0, o = 0;
      locate(feature, m, o);
#pragma unroll
      for (int p = 0; p < P; ++p)
        put_rows[p][h] = reinterpret_cast<const uint4*>(
            static_cast<const __nv_bfloat16*>(products.w[m + p]) + int64_t(o) * in);
    }
  };
  if (put_tile < tiles) locate_rows();
  uint4 ring[kDepth][U][P][2];
  auto request = [&](uint4(&into)[U][P][2]) {
    if (put_tile >= tiles) return;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = put_batch * U + u, kb = kblock(j);
      const bool inside = kb_inside(j) && kb * kBlockColumns + 8 * t < in;
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          into[u][p][h] =
              inside ? load_weight_vector(put_rows[p][h] + kb * 4 + t) : make_uint4(0u, 0u, 0u, 0u);
    }
    if (++put_batch < batches) return;
    put_batch = 0;
    put_tile += tile_stride;
    if (put_tile < tiles) locate_rows();
  };

  // No kernel writes uploaded weights: their first batches are requested before this grid waits
  // for the one before it, and the norm weight likewise (HeldNorm).
  HeldNorm<NormW, kThreads> held_norm;
  const bool normalise = Staged && norm_weight != nullptr;
  auto fill = [&]() {
#pragma unroll
    for (int s = 0; s < kDepth; ++s) request(ring[s]);
  };
  if (weights_uploaded) fill();
  if (normalise && norm_uploaded) held_norm.hold(norm_weight, in);
  begin_dependent_grid();
  if (!weights_uploaded) fill();
  if (normalise && !norm_uploaded) held_norm.hold(norm_weight, in);

  if constexpr (Staged) {
    const int per_row = in / 4;
#pragma unroll 4
    for (int i = threadIdx.x; i < rows * per_row; i += kThreads) {
      const int r = i / per_row, k = i % per_row;
      reinterpret_cast<float4*>(staged + r * row_stride)[k] =
          __ldg(reinterpret_cast<const float4*>(x + int64_t(r) * in) + k);
    }
    if (normalise) {
      // rmsnorm_kernel's arithmetic (the rmsnorm op's bits): squares summed in double over
      // i = thread, thread + 256, .., the block's sum, one F32 inverse, (x * inv) * weight.
      __syncthreads();
      for (int r = 0; r < rows; ++r) {
        float* const row = staged + r * row_stride;
        double sum = 0.0;
        for (int i = threadIdx.x; i < in; i += kThreads) sum += double(row[i]) * double(row[i]);
        sum = block_reduce(sum, SumOp{}, 0.0, scratch);
        const float inv = float(1.0 / sqrt(sum / double(in) + double(eps)));
        auto scale = [&](int i, float weight) {
          row[i] = (row[i] * inv) * weight;
          if (blockIdx.x == 0 && normed != nullptr) normed[int64_t(r) * in + i] = row[i];
        };
        held_norm.for_each(norm_weight, in, scale);
      }
    }
    __syncthreads();
  }
  // The warps' partial sums: [warp][P][NT][4 registers][32 lanes], after the staged rows.
  float* const partial = staged + (Staged ? rows * row_stride : 0);

  auto store = [&](int feature, int n, const float* sums) {
    int m = 0, o = 0;
    locate(feature, m, o);
    store_feature<Mode>(products.y[m] + int64_t(n) * products.out[m] + o, sums);
  };
  float acc[P][NT][3][4];  // [.][.][part][register]
  auto clear = [&]() {
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int part = 0; part < 3; ++part)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[p][nt][part][c] = 0.0f;
  };
  // A register's sum: the parts' chains, low to high.
  auto total_of = [&](int p, int nt, int c) {
    return (acc[p][nt][0][c] + acc[p][nt][1][c]) + acc[p][nt][2][c];
  };
  // The tile's sums to y: register c of lane (g, t) holds feature g + 8 (c / 2) and row
  // 2t + c % 2 of its B tile.
  auto finish = [&](int tile) {
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c)
          partial[(((warp * P + p) * NT + nt) * 4 + c) * 32 + lane] = total_of(p, nt, c);
    __syncthreads();
    for (int e = threadIdx.x; e < kTileFeatures * rows; e += kThreads) {
      const int local = e % kTileFeatures, n = e / kTileFeatures;
      const int feature = tile * kTileFeatures + local;
      if (feature >= total) continue;
      const int from_lane = (local % 8) * 4 + (n % 8) / 2, c = (local / 8) * 2 + n % 2;
      float sums[P];
#pragma unroll
      for (int p = 0; p < P; ++p) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float value = partial[(((w * P + p) * NT + n / 8) * 4 + c) * 32 + from_lane];
          sum = w == 0 ? value : sum + value;
        }
        sums[p] = sum;
      }
      store(feature, n, sums);
    }
    __syncthreads();  // the partial sums are read before the next tile's are written
  };

  clear();
  int tile = first_tile, batch = 0;
  while (tile < tiles) {  // block-uniform: every warp reaches the barriers of finish()
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      if (tile >= tiles) break;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int j = batch * U + u, kb = kblock(j);
        if (!kb_inside(j)) break;
        const int column = kb * kBlockColumns + 8 * t;
        uint32_t parts[NT][3][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int n = nt * 8 + g;
          float4 first = make_float4(0.f, 0.f, 0.f, 0.f), second = first;
          if (n < rows && column < in) {
            const float* from =
                Staged ? staged + n * row_stride + column : x + int64_t(n) * in + column;
            if constexpr (Staged) {
              first = reinterpret_cast<const float4*>(from)[0];
              second = reinterpret_cast<const float4*>(from)[1];
            } else {
              first = __ldg(reinterpret_cast<const float4*>(from));
              second = __ldg(reinterpret_cast<const float4*>(from) + 1);
            }
          }
          split_columns(first, second, parts[nt]);
        }
#pragma unroll
        for (int p = 0; p < P; ++p)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            multiply_block(acc[p][nt], ring[s][u][p][0], ring[s][u][p][1], parts[nt]);
      }
      request(ring[s]);  // the slot just read, refilled kDepth batches ahead
      if (++batch < batches) continue;
      finish(tile);
      clear();
      batch = 0;
      tile += tile_stride;
    }
  }
#endif
}

template <typename NormW, GemvMode Mode, int NT, bool Staged>
void launch_shape(const GemvCall& call, const GemvProducts& products, int total, int sm_count,
                  cudaStream_t stream) {
  constexpr int P = Mode == GemvMode::SiluPair ? 2 : 1;
  auto kernel = gemv_mma_kernel<NormW, Mode, NT, Staged>;
  const int rows = int(call.rows), in = int(call.in);
  const size_t staged_bytes = Staged ? size_t(rows) * size_t(in + kRowPad) * sizeof(float) : 0;
  const size_t partial_bytes = size_t(kWarps) * P * NT * 4 * 32 * sizeof(float);
  const size_t shared_bytes = staged_bytes + partial_bytes;
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
  const int64_t resident =
      resident_blocks(reinterpret_cast<const void*>(kernel), shared_bytes, kThreads);
  const int64_t sms = sm_count > 0 ? sm_count : 132;
  const int64_t tiles = (total + kTileFeatures - 1) / kTileFeatures;
  const int64_t cap = sms * std::min<int64_t>(resident, kBlocksPerSm);
  launch_dependent(kernel, unsigned(std::min(tiles, cap)), kThreads, shared_bytes, stream, call.x,
                   products, rows, in, total, static_cast<const NormW*>(call.norm_weight), call.eps,
                   call.normed, call.weights_uploaded, call.norm_uploaded);
}

}  // namespace

namespace {
std::atomic<int> scope_set{-1};  // a GemvMmaScope once set, -1 before
}  // namespace

GemvMmaScope gemv_mma_scope() {
  static const GemvMmaScope from_environment = [] {
    const char* text = std::getenv("KVLENS_GEMV_MMA");
    const bool on =
        text != nullptr && (std::strcmp(text, "1") == 0 || std::strcmp(text, "all") == 0);
    return on ? GemvMmaScope::All : GemvMmaScope::None;
  }();
  const int set = scope_set.load(std::memory_order_relaxed);
  return set < 0 ? from_environment : GemvMmaScope(set);
}

void set_gemv_mma_scope(GemvMmaScope scope) {
  scope_set.store(int(scope), std::memory_order_relaxed);
}

bool gemv_mma_takes(const GemvCall& call) {
  if (gemv_mma_scope() != GemvMmaScope::All || call.w_dtype != DType::BF16) return false;
  // (int indices: 16 rows of `in` floats stay far below 2^31)
  return call.in <= INT_MAX / 64 && device_compute_major() >= 8;  // BF16 mma from sm_80
}

void launch_gemv_mma(const GemvCall& call, const GemvProducts& products, int64_t total,
                     int sm_count, cudaStream_t stream) {
  dispatch_products(call, [&](auto zero, auto norm_zero, auto mode_tag) {
    using W = decltype(zero);
    using NormW = decltype(norm_zero);
    constexpr GemvMode Mode = decltype(mode_tag)::value;
    if constexpr (std::is_same_v<W, __nv_bfloat16>) {
      // A norm weight needs the rows staged (the backend fuses a norm only where they fit).
      const bool staged = call.norm_weight != nullptr || gemv_stages_rows(call.rows, call.in);
      auto with_tiles = [&](auto nt_tag) {
        constexpr int NT = decltype(nt_tag)::value;
        if (staged)
          launch_shape<NormW, Mode, NT, true>(call, products, int(total), sm_count, stream);
        else if constexpr (std::is_same_v<NormW, float>)
          launch_shape<NormW, Mode, NT, false>(call, products, int(total), sm_count, stream);
      };
      if (call.rows <= 8)
        with_tiles(std::integral_constant<int, 1>{});
      else
        with_tiles(std::integral_constant<int, 2>{});
    }
  });
}

}  // namespace kvlens::cuda
