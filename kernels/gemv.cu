// Weight-streaming decode products (see gemv.cuh). A warp per few output features: its lanes
// walk the weight rows in 16-byte vectors (8 BF16/F16 or 4 F32 values), streamed through a
// per-lane cp.async ring in shared memory, each multiplied into all `rows` activation rows
// (staged in shared memory: a few KB), then a warp sum. The weights are the only large traffic,
// and each is read once. Shared memory per block: staged rows | ring [stages][batch][threads].
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gemv.cuh"
#include "kernels/gemv_common.cuh"
#include "kernels/gemv_mma.cuh"
#include "kernels/gemv_row.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

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

// Output features a warp computes together. Each activation value read from shared memory then
// feeds F * P weight rows instead of P: with several rows (lockstep runs) the shared-memory reads,
// R per weight vector, bound the kernel below memory bandwidth. Each feature's sums keep their
// order, so the bits do not change with F. From 4 rows: two features a warp (one gate/up pair),
// which with a two-stage ring lets two blocks share an SM. Measured on an H100 (1B shape, 8 rows,
// kvlens-kernel-bench), against four features (two pairs), one block an SM and four stages: a
// layer's products 167 -> 140 us, the lm_head 328 -> 256 us; one feature was slower (o_proj and
// w_down left SMs idle before, one feature a warp starves the shared-memory reads).
template <int R, int P>
__host__ __device__ constexpr int features_per_warp() {
  return R >= 4 && P == 1 ? 2 : 1;
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
// Each thread requests kStageBatch float4s before storing any: the rows come from L2 (another
// kernel just wrote them), and one load at a time put a round trip per 4 KiB in every block's
// path (w_down's 32 KiB row: eight of them; 1-3% of the step). Eight at once spilled.
constexpr int kStageBatch = 4;
template <int V>
__device__ __forceinline__ void stage_columns(const float* __restrict__ x, int rows, int64_t in,
                                              int64_t c0, int64_t count, float4* staged) {
  // At most kMaxStagedBytes: int indices.
  const int per_row = int(count / 4), vectors = int(count / V), total = rows * per_row;
  for (int i0 = threadIdx.x; i0 < total; i0 += kThreads * kStageBatch) {
    float4 loaded[kStageBatch];
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int i = i0 + b * kThreads;
      if (i < total) {
        const int r = i / per_row, k = i % per_row;
        loaded[b] = __ldg(reinterpret_cast<const float4*>(x + r * in + c0) + k);
      }
    }
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
      const int i = i0 + b * kThreads;
      if (i < total) {
        const int r = i / per_row, k = i % per_row;
        staged[staged_float4<V>(r, k / (V / 4), k % (V / 4), vectors)] = loaded[b];
      }
    }
  }
}

// The weights stream through a ring in shared memory: each lane requests its own 16-byte
// vectors with cp.async, kStages<R> - 1 batches ahead of the batch it multiplies, across feature
// and chunk boundaries, so the loads stay in flight without holding registers. A lane reads back
// only the slots it filled, so the ring needs no barrier. Loads into registers, a batch at a time,
// had the warps waiting for their batch three quarters of the time; with the ring (H100, 1B
// shape, ncu): lm_head 210 -> 195 us (78% -> 84% of the DRAM peak), w_down 23.1 -> 19.0 us,
// gate/up 34.6 -> 32.4 us, the step at 512 tokens 1.60 -> 1.51 ms. For one row, two or three
// stages were slower than four, five to eight no faster; batches of 4 vectors leave room for three
// blocks an SM beside the rows (three blocks with three stages, for the 8B shape's wider rows, were
// slower). From 4 rows the ring has two stages, so that two blocks fit an SM beside their staged
// rows (see features_per_warp).
template <int R>
constexpr int kStages = R >= 4 ? 2 : 4;
constexpr int kBatchVectors = 4;  // 16-byte vectors a lane requests per batch
template <int R>
constexpr int64_t kRingBytes = int64_t(kStages<R>) * kBatchVectors * 16 * kThreads;
template <int R>
constexpr int kBlocksPerSm = R <= 2 ? 3 : 2;  // the launch bound

// Weight rows' vectors per batch (F features x P rows each take U vectors).
template <int F, int P>
__host__ __device__ constexpr int vectors_per_row() {
  return kBatchVectors / (F * P) >= 1 ? kBatchVectors / (F * P) : 1;
}

__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(address), "l"(global)
               : "memory");
}
__device__ __forceinline__ void commit_async() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Every group of this thread but the newest `pending` is complete (and visible to it).
template <int pending>
__device__ __forceinline__ void wait_async() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}
template <typename W, typename NormW, int R, GemvMode Mode>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm<R>)
    gemv_warp_kernel(const float* __restrict__ x, GemvProducts products, int rows, int64_t in,
                     int64_t chunk, const NormW* __restrict__ norm_weight, float eps,
                     float* __restrict__ normed, bool weights_uploaded, bool norm_uploaded) {
  constexpr int V = WeightVector<W>::kValues;
  constexpr int P = Mode == GemvMode::SiluPair ? 2 : 1;  // weight rows per feature
  constexpr int F = features_per_warp<R, P>();
  constexpr int U = vectors_per_row<F, P>();
  extern __shared__ float4 staged[];
  __shared__ double scratch[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int64_t total = Mode == GemvMode::SiluPair
                            ? products.out[0]
                            : products.out[0] + products.out[1] + products.out[2] + products.out[3];
  const bool whole = chunk >= in;
  const int64_t vectors = in / V;
  const int64_t chunk_vectors = whole ? vectors : chunk / V;
  // This thread's ring slots follow the staged rows (launch_products sizes both).
  uint4* const ring =
      reinterpret_cast<uint4*>(staged + int64_t(rows) * (whole ? in : chunk) / 4) + threadIdx.x;
  auto slot = [&](int stage, int u, int f, int p) -> uint4& {
    return ring[int64_t((stage * U + u) * F + f) * P * kThreads + int64_t(p) * kThreads];
  };
  const int64_t stride = int64_t(gridDim.x) * kWarps * F;
  const int64_t block_first = int64_t(blockIdx.x) * kWarps * F;
  // The end of the chunk that starts at vector c0, and its batches (the same for every lane of
  // the block).
  auto chunk_end = [&](int64_t c0) {
    return c0 + chunk_vectors < vectors ? c0 + chunk_vectors : vectors;
  };
  auto batches_in = [&](int64_t c0) { return int((chunk_end(c0) - c0 + 32 * U - 1) / (32 * U)); };

  // The features first .. first + F - 1 (past the last feature: feature 0, read again and the
  // sums dropped): their products m and rows o.
  auto locate = [&](int64_t first, int* m, int64_t* o) {
#pragma unroll
    for (int f = 0; f < F; ++f) {
      o[f] = first + f < total ? first + f : 0, m[f] = 0;
      if constexpr (Mode != GemvMode::SiluPair) {
        while (o[f] >= products.out[m[f]]) o[f] -= products.out[m[f]++];
      }
    }
  };

  // The producer: the next batch to request (base: the block's features, c0: the chunk, batch:
  // within the chunk), walking the consumer's sequence kStages<R> - 1 batches ahead of it.
  int64_t put_base = block_first, put_c0 = 0;
  int put_batch = 0, put_stage = 0;
  const uint4* put_rows[F][P];
  auto locate_rows = [&]() {
    int m[F];
    int64_t o[F];
    locate(put_base + int64_t(warp) * F, m, o);
#pragma unroll
    for (int f = 0; f < F; ++f)
#pragma unroll
      for (int p = 0; p < P; ++p)
        put_rows[f][p] =
            reinterpret_cast<const uint4*>(static_cast<const W*>(products.w[m[f] + p]) + o[f] * in);
  };
  if (put_base < total) locate_rows();
  auto request = [&]() {
    if (put_base < total && put_base + int64_t(warp) * F < total) {
      const int64_t c1 = chunk_end(put_c0);
      const int64_t v0 = put_c0 + lane + int64_t(32) * U * put_batch;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (v0 + 32 * u >= c1) break;
#pragma unroll
        for (int f = 0; f < F; ++f)
#pragma unroll
          for (int p = 0; p < P; ++p)
            copy_async_16(&slot(put_stage, u, f, p), put_rows[f][p] + v0 + 32 * u);
      }
    }
    commit_async();  // (empty past the end: every batch is one group)
    put_stage = put_stage + 1 == kStages<R> ? 0 : put_stage + 1;
    if (put_base >= total) return;
    if (++put_batch < batches_in(put_c0)) return;
    put_batch = 0;
    put_c0 += chunk_vectors;
    if (put_c0 < vectors) return;
    put_c0 = 0;
    put_base += stride;
    if (put_base < total) locate_rows();
  };

  // No kernel writes uploaded weights: their first batches are requested before this grid
  // waits for the one before it and before the rows are staged, so their latency overlaps both.
  // The norm weight likewise (HeldNorm).
  HeldNorm<NormW, kThreads> held_norm;
  auto hold_norm = [&]() { held_norm.hold(norm_weight, in); };
  const bool normalise = whole && norm_weight != nullptr;
  if (weights_uploaded) {
    for (int s = 0; s + 1 < kStages<R>; ++s) request();
  }
  if (normalise && norm_uploaded) hold_norm();
  begin_dependent_grid();
  if (!weights_uploaded) {
    for (int s = 0; s + 1 < kStages<R>; ++s) request();
  }
  if (normalise && !norm_uploaded) hold_norm();
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
        auto scale = [&](int64_t i, float weight) {
          float& value = at(r, i);
          value = (value * inv) * weight;
          if (blockIdx.x == 0 && normed != nullptr) normed[r * in + i] = value;
        };
        held_norm.for_each(norm_weight, in, scale);
      }
    }
    __syncthreads();
  }
  int take_stage = 0;
  // Block-uniform, so that every warp reaches the chunks' barriers.
  for (int64_t base = block_first; base < total; base += stride) {
    const int64_t first = base + int64_t(warp) * F;
    int m[F];
    int64_t o[F];
    locate(first, m, o);
    float acc[F][P][R];
#pragma unroll
    for (int f = 0; f < F; ++f)
#pragma unroll
      for (int p = 0; p < P; ++p)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[f][p][r] = 0.0f;
    for (int64_t c0 = 0; c0 < vectors; c0 += chunk_vectors) {
      const int64_t c1 = chunk_end(c0);
      if (!whole) {
        __syncthreads();  // the previous chunk's readers are done
        stage_columns<V>(x, rows, in, c0 * V, (c1 - c0) * V, staged);
        __syncthreads();
      }
      const int batches = batches_in(c0);
      for (int batch = 0; batch < batches; ++batch) {
        // The slot refilled now was read in the previous batch, whose products have issued.
        request();
        wait_async<kStages<R> - 1>();
        const int stage = take_stage;
        take_stage = take_stage + 1 == kStages<R> ? 0 : take_stage + 1;
        if (first >= total) continue;
        const int64_t v0 = c0 + lane + int64_t(32) * U * batch;
        // The batch's vectors in ascending order: each sum keeps the order v = lane, lane + 32, ..
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int64_t v = v0 + 32 * u;
          if (v >= c1) break;
          float weights[F][P][V];
#pragma unroll
          for (int f = 0; f < F; ++f)
#pragma unroll
            for (int p = 0; p < P; ++p) WeightVector<W>::widen(slot(stage, u, f, p), weights[f][p]);
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
#pragma unroll
    for (int f = 0; f < F; ++f) {
      if (first + f >= total) break;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r >= rows) break;
        float sums[P];
#pragma unroll
        for (int p = 0; p < P; ++p) sums[p] = warp_reduce(acc[f][p][r], SumOp{});
        if (lane == 0) store_feature<Mode>(products.y[m[f]] + r * products.out[m[f]] + o[f], sums);
      }
    }
  }
  wait_async<0>();  // nothing in flight into shared memory when the block exits
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

// Shared memory for the staged rows: up to this, the rest of the opt-in limit holds the ring.
constexpr int64_t kMaxStagedBytes = 96 * 1024;

// Columns staged at a time: every column when the rows fit, else the most whole 32-vector
// groups that do (at least one: 16 rows x 256 columns is 16 KiB).
int64_t staged_columns(int64_t rows, int64_t in, int64_t vector) {
  if (rows * in * int64_t(sizeof(float)) <= kMaxStagedBytes) return in;
  const int64_t group = 32 * vector;
  const int64_t groups = kMaxStagedBytes / (rows * int64_t(sizeof(float)) * group);
  return (groups > 1 ? groups : 1) * group;
}

// A warp per F features, eight per block, as many blocks as the SMs hold at once up to the cap
// (then grid-stride).
template <typename W, typename NormW, int R, GemvMode Mode>
void launch_products(const GemvCall& call, const GemvProducts& products, int64_t total,
                     int sm_count, cudaStream_t stream) {
  constexpr int kPairs = Mode == GemvMode::SiluPair ? 2 : 1;
  constexpr int64_t per_block = kWarps * features_per_warp<R, kPairs>();
  auto kernel = gemv_warp_kernel<W, NormW, R, Mode>;
  const int rows = int(call.rows);
  const int64_t in = call.in;
  const int64_t chunk = staged_columns(rows, in, WeightVector<W>::kValues);
  const size_t shared_bytes =
      size_t(rows) * size_t(chunk < in ? chunk : in) * sizeof(float) + size_t(kRingBytes<R>);
  const int64_t sms = sm_count > 0 ? sm_count : 132;
  // Raised before the occupancy question, whose answer assumes the launch is allowed.
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
  const int64_t resident =
      resident_blocks(reinterpret_cast<const void*>(kernel), shared_bytes, kThreads);
  const int64_t wanted = (total + per_block - 1) / per_block;
  const int64_t cap = sms * std::min(resident, gemv_blocks_per_sm_cap());
  const unsigned blocks = unsigned(wanted < cap ? wanted : cap);
  launch_dependent(kernel, blocks, kThreads, shared_bytes, stream, call.x, products, rows, in,
                   chunk, static_cast<const NormW*>(call.norm_weight), call.eps, call.normed,
                   call.weights_uploaded, call.norm_uploaded);
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
  if (gemv_mma_takes(call) && total <= INT_MAX / 2) {
    launch_gemv_mma(call, products, total, sm_count, stream);
    return;
  }
  if (gemv_row_takes(call, total)) {
    launch_gemv_row(call, products, total, sm_count, stream);
    return;
  }
  dispatch_products(call, [&](auto zero, auto norm_zero, auto mode_tag) {
    dispatch_rows(n, [&](auto rows_tag) {
      launch_products<decltype(zero), decltype(norm_zero), decltype(rows_tag)::value,
                      decltype(mode_tag)::value>(call, products, total, sm_count, stream);
    });
  });
}

}  // namespace kvlens::cuda
