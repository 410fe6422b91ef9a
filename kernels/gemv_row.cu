// One activation row x[in] times the decode products (gemv_row.cuh). A warp per output feature
// (grid-stride over the features laid end to end); lane l multiplies the 16-byte weight vectors
// v = l, l + 32, .. of the feature's row into x, in ascending v, then the warp's butterfly: the
// general kernel's order, so the same bits. Each lane holds its next two batches of weight vectors
// in registers, the first two requested before the grid waits for the kernel ahead of it; x is
// staged once per block in shared memory, as [V / 4 planes][vectors] float4s. The general
// kernel's ring (per-lane cp.async slots, chunked rows, several rows and features a warp) cost it
// 1.5-2x the instructions at one row; against it on an H200 (1B shape, each kernel alone under
// ncu): q/k/v + norm 12.7-12.9 -> 9.0 us, o_proj 8.5-9.9 -> 6.1-6.8, gate/up 26.2-26.5
// -> 21.8-22.2, down 14.8 -> 13.0-13.6; the dense step at 512 tokens 1.20-1.25 -> 1.02-1.06 ms.
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/gemv_common.cuh"
#include "kernels/gemv_row.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// The launch bound: a one-wave grid for the 1B shape's q/k/v (384 blocks), with the two batches
// of the ring in registers (80 a thread). Measured on an H200 (1B shape, dense step at 512 /
// 4096 / 16384 tokens): a ring of three or four batches (105-120 registers, two blocks an SM)
// 1.028-1.053 / 1.101-1.120 / 1.391-1.407 ms against 1.038-1.057 / 1.102-1.131 / 1.388-1.400
// with two; a block per eight features in place of the grid-stride loop 1.09-1.11 / 1.16-1.17 /
// 1.43-1.44 ms.
constexpr int kBlocksPerSm = 3;
constexpr int kDepth = 2;         // batches a lane has requested ahead of the one it multiplies
constexpr int kBatchVectors = 4;  // 16-byte vectors a lane loads per batch, over its P rows

// Mode and the norm as in gemv.cu's warp kernel (GemvCall): Store y = sum, Accumulate y += sum,
// SiluPair y[0] = silu(gate) * up; with a norm weight the staged row gets rmsnorm's arithmetic
// first (block 0 writes it to `normed`).
template <typename W, typename NormW, GemvMode Mode>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    gemv_row_kernel(const float* __restrict__ x, const __grid_constant__ GemvProducts products,
                    int in, int total, const NormW* __restrict__ norm_weight, float eps,
                    float* __restrict__ normed, bool weights_uploaded, bool norm_uploaded) {
  constexpr int V = WeightVector<W>::kValues;
  constexpr int Q = V / 4;                               // float4 quarters of a vector
  constexpr int P = Mode == GemvMode::SiluPair ? 2 : 1;  // weight rows per feature
  constexpr int B = kBatchVectors / P;                   // vectors per row per batch
  extern __shared__ float4 staged[];                     // x: [Q][vectors]
  __shared__ double scratch[32];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int vectors = in / V;
  const int batches = (vectors + 32 * B - 1) / (32 * B);  // per feature
  const int stride = int(gridDim.x) * kWarps;

  // Feature -> product m and its row o (a pair's rows are products 0 and 1 at o).
  auto locate = [&](int feature, int& m, int& o) {
    m = 0, o = feature;
    if constexpr (Mode != GemvMode::SiluPair) {
      while (o >= products.out[m]) o -= int(products.out[m++]);
    }
  };

  // The producer walks the consumer's sequence (feature, batch) two batches ahead of it.
  int put_feature = int(blockIdx.x) * kWarps + warp, put_batch = 0;
  const uint4* put_rows[P];
  auto locate_rows = [&]() {
    int m = 0, o = 0;
    locate(put_feature, m, o);
#pragma unroll
    for (int p = 0; p < P; ++p)
      put_rows[p] = reinterpret_cast<const uint4*>(static_cast<const W*>(products.w[m + p]) +
                                                   int64_t(o) * in);
  };
  if (put_feature < total) locate_rows();
  uint4 ring[kDepth][B][P];
  auto request = [&](uint4(&into)[B][P]) {
    if (put_feature >= total) return;
    const int v0 = lane + 32 * B * put_batch;
#pragma unroll
    for (int u = 0; u < B; ++u) {
      if (v0 + 32 * u >= vectors) break;
#pragma unroll
      for (int p = 0; p < P; ++p) into[u][p] = load_weight_vector(put_rows[p] + v0 + 32 * u);
    }
    if (++put_batch < batches) return;
    put_batch = 0;
    put_feature += stride;
    if (put_feature < total) locate_rows();
  };

  HeldNorm<NormW, kThreads> held_norm;  // (read before the grid waits where uploaded)
  auto hold_norm = [&]() { held_norm.hold(norm_weight, in); };
  const bool normalise = norm_weight != nullptr;
  auto fill = [&]() {
#pragma unroll
    for (int s = 0; s < kDepth; ++s) request(ring[s]);
  };
  if (weights_uploaded) fill();
  if (normalise && norm_uploaded) hold_norm();
  begin_dependent_grid();
  if (!weights_uploaded) fill();
  if (normalise && !norm_uploaded) hold_norm();

  float* const staged_floats = reinterpret_cast<float*>(staged);
  auto at = [&](int i) -> float& {
    return staged_floats[4 * ((i / 4 % Q) * vectors + i / V) + i % 4];
  };
  if (normalise) {
    // rmsnorm_kernel's arithmetic (the rmsnorm op's bits): squares summed in double over
    // i = thread, thread + 256, .., the block's sum, one F32 inverse, (x * inv) * weight.
    double sum = 0.0;
#pragma unroll 4
    for (int i = threadIdx.x; i < in; i += kThreads) {
      const float value = x[i];
      at(i) = value;
      sum += double(value) * double(value);
    }
    sum = block_reduce(sum, SumOp{}, 0.0, scratch);
    const float inv = float(1.0 / sqrt(sum / double(in) + double(eps)));
    auto scale = [&](int i, float weight) {
      float& value = at(i);
      value = (value * inv) * weight;
      if (blockIdx.x == 0 && normed != nullptr) normed[i] = value;
    };
    held_norm.for_each(norm_weight, in, scale);
  } else {
    const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 4
    for (int k = threadIdx.x; k < in / 4; k += kThreads) staged[(k % Q) * vectors + k / Q] = x4[k];
  }
  __syncthreads();

  float acc[P];
#pragma unroll
  for (int p = 0; p < P; ++p) acc[p] = 0.0f;
  int feature = int(blockIdx.x) * kWarps + warp, batch = 0;
  while (feature < total) {  // warp-uniform: no barrier below
#pragma unroll
    for (int s = 0; s < kDepth; ++s) {
      if (feature >= total) break;
      const int v0 = lane + 32 * B * batch;
#pragma unroll
      for (int u = 0; u < B; ++u) {
        const int v = v0 + 32 * u;
        if (v >= vectors) break;
        float weights[P][V];
#pragma unroll
        for (int p = 0; p < P; ++p) WeightVector<W>::widen(ring[s][u][p], weights[p]);
#pragma unroll
        for (int q = 0; q < Q; ++q) {
          const float4 xv = staged[q * vectors + v];
#pragma unroll
          for (int p = 0; p < P; ++p) {
            acc[p] = fmaf(weights[p][4 * q], xv.x, acc[p]);
            acc[p] = fmaf(weights[p][4 * q + 1], xv.y, acc[p]);
            acc[p] = fmaf(weights[p][4 * q + 2], xv.z, acc[p]);
            acc[p] = fmaf(weights[p][4 * q + 3], xv.w, acc[p]);
          }
        }
      }
      request(ring[s]);  // the slot just read, refilled kDepth batches ahead
      if (++batch < batches) continue;
      float sums[P];
#pragma unroll
      for (int p = 0; p < P; ++p) sums[p] = warp_reduce(acc[p], SumOp{}), acc[p] = 0.0f;
      if (lane == 0) {
        int m = 0, o = 0;
        locate(feature, m, o);
        store_feature<Mode>(products.y[m] + o, sums);
      }
      batch = 0;
      feature += stride;
    }
  }
}

}  // namespace

bool gemv_row_takes(const GemvCall& call, int64_t total) {
  static const bool enabled = [] {
    const char* text = std::getenv("KVLENS_GEMV_ROW_KERNEL");
    return text == nullptr || std::strcmp(text, "0") != 0;
  }();
  // (int indices: a staged row is at most 24K floats; feature + grid stride stays below 2^31)
  return enabled && call.rows == 1 && gemv_stages_rows(1, call.in) && total <= INT_MAX / 2;
}

void launch_gemv_row(const GemvCall& call, const GemvProducts& products, int64_t total,
                     int sm_count, cudaStream_t stream) {
  dispatch_products(call, [&](auto zero, auto norm_zero, auto mode_tag) {
    using W = decltype(zero);
    using NormW = decltype(norm_zero);
    auto kernel = gemv_row_kernel<W, NormW, decltype(mode_tag)::value>;
    const size_t shared_bytes = size_t(call.in) * sizeof(float);
    allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
    const int64_t resident =
        resident_blocks(reinterpret_cast<const void*>(kernel), shared_bytes, kThreads);
    const int64_t sms = sm_count > 0 ? sm_count : 132;
    const int64_t wanted = (total + kWarps - 1) / kWarps;
    const int64_t cap = sms * std::min(resident, gemv_blocks_per_sm_cap());
    launch_dependent(kernel, unsigned(std::min(wanted, cap)), kThreads, shared_bytes, stream,
                     call.x, products, int(call.in), int(total),
                     static_cast<const NormW*>(call.norm_weight), call.eps, call.normed,
                     call.weights_uploaded, call.norm_uploaded);
  });
}

}  // namespace kvlens::cuda
