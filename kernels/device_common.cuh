// Device-side helpers shared by the kernel files of the CUDA backend: reading weights stored as
// F32 / BF16 / F16, warp and block reductions, and the grid size for grid-stride loops.
// Included by .cu files only (it needs nvcc).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <span>

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

// q . v over D elements by one warp (every lane gets the result): lane l sums the fused products
// d = l, l + 32, ... in order, then the butterfly reduction. For the policies' cosines and norms;
// attention logits use key_dot below.
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

// The arithmetic of every attention logit (decode, prefill, the attention_logits op), so that
// their logits agree bit for bit. A key of D elements is scored by key_lanes(D) consecutive,
// aligned lanes of a warp (so a warp scores 32 / key_lanes(D) keys at once and each lane reads
// 16 contiguous bytes of a BF16 key): lane `sub` sums the fused products of its chunks
// d = 8 sub .. 8 sub + 7, then 8 (sub + lanes) .., in order, then a butterfly over the lanes.
// The key may be stored as F32, BF16 or F16; widening is exact, so a narrow cache gives the bits
// of an F32 cache holding the same values.
constexpr int kKeyChunk = 8;
constexpr int64_t kMaxKeyChunkDim = 256;  // one chunk per lane up to this head dimension
__host__ __device__ constexpr int key_lanes(int64_t D) {
  int lanes = 1;
  while (lanes < 32 && int64_t(kKeyChunk) * lanes < D) lanes *= 2;
  return lanes;
}

// Elements of T in one 16-byte load.
template <typename T>
constexpr int kPerWord = int(16 / sizeof(T));

// 16-byte words per 8-element chunk of T, and their widening to F32 (exact).
template <typename K>
constexpr int kChunkWords = kKeyChunk / kPerWord<K>;
template <typename K>
__device__ __forceinline__ void widen_chunk(const uint4 (&raw)[kChunkWords<K>],
                                            float (&out)[kKeyChunk]) {
  constexpr int kPer = kPerWord<K>;
#pragma unroll
  for (int part = 0; part < kChunkWords<K>; ++part) {
    const K* elements = reinterpret_cast<const K*>(&raw[part]);
#pragma unroll
    for (int i = 0; i < kPer; ++i) out[part * kPer + i] = to_f32(elements[i]);
  }
}

// Elements d0 .. d0 + 7 of a row of D (zeros past D), widened to F32. When D is a multiple of 8
// the row start must be 16-byte aligned (cache rows and cudaMalloc'd buffers are).
template <typename K>
__device__ __forceinline__ void load_chunk(const K* row, int64_t D, int64_t d0,
                                           float (&out)[kKeyChunk]) {
  if (D % kKeyChunk == 0) {
    if (d0 >= D) {
#pragma unroll
      for (int i = 0; i < kKeyChunk; ++i) out[i] = 0.0f;
      return;
    }
    uint4 raw[kChunkWords<K>];
#pragma unroll
    for (int part = 0; part < kChunkWords<K>; ++part)
      raw[part] = *reinterpret_cast<const uint4*>(row + d0 + part * kPerWord<K>);
    widen_chunk<K>(raw, out);
  } else {
#pragma unroll
    for (int i = 0; i < kKeyChunk; ++i) out[i] = d0 + i < D ? to_f32(row[d0 + i]) : 0.0f;
  }
}

// One lane's part of q . key for the chunk at d0 (q: F32, in shared memory or registers).
__device__ __forceinline__ float chunk_dot(const float* q, int64_t D, int64_t d0,
                                           const float (&key)[kKeyChunk], float dot) {
#pragma unroll
  for (int i = 0; i < kKeyChunk; ++i)
    if (d0 + i < D) dot = fmaf(q[d0 + i], key[i], dot);
  return dot;
}

// chunk_dot of a chunk that lies wholly inside the row (q points at its first element): the
// same fused products in the same order, without the bounds tests.
__device__ __forceinline__ float full_chunk_dot(const float* q, const float (&key)[kKeyChunk]) {
  float dot = 0.0f;
#pragma unroll
  for (int i = 0; i < kKeyChunk; ++i) dot = fmaf(q[i], key[i], dot);
  return dot;
}

// Butterfly sum over aligned groups of `lanes` lanes; every lane of the warp must call it.
__device__ __forceinline__ float lanes_sum(float v, int lanes) {
  for (int offset = lanes / 2; offset > 0; offset >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Butterfly sums of `Values` values at once over the lanes that differ in bits kFirstOffset,
// then kFirstOffset / 2 (kDown) or x 2, for kSteps offsets (Values a power of two). At each offset
// a lane keeps half of the values it holds and sends the other half to its partner, so the sums
// take about Values shuffles where summing each value alone takes Values x kSteps. The tree is the
// same (each pair of lanes adds its two parts at the first offset, then the next), so every sum
// has the bits of lanes_sum over the same offsets. Returns the index of the first value the lane
// holds: it holds spread_sum_held(Values, kSteps) of them in v[0..]; where Values < 2^kSteps, the
// lanes that differ only in the last offsets' bits hold the same sums.
template <int Values, int kFirstOffset, int kSteps, bool kDown>
__device__ __forceinline__ int spread_sum(float (&v)[Values], int lane) {
  int first = 0;
#pragma unroll
  for (int step = 0, held = Values; step < kSteps; ++step) {
    const int offset = kDown ? kFirstOffset >> step : kFirstOffset << step;
    if (held > 1) {
      const bool upper = (lane & offset) != 0;
      held /= 2;
#pragma unroll
      for (int i = 0; i < Values / 2; ++i) {
        if (i < held) {
          const float send = upper ? v[i] : v[i + held];
          const float keep = upper ? v[i + held] : v[i];
          v[i] = keep + __shfl_xor_sync(0xffffffffu, send, offset);
        }
      }
      if (upper) first += held;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], offset);
    }
  }
  return first;
}

// How many sums spread_sum leaves a lane of `values` over `steps` offsets.
__host__ __device__ constexpr int spread_sum_held(int values, int steps) {
  return (values >> steps) > 0 ? values >> steps : 1;
}

// log2 of a power of two, for spread_sum's step counts.
__host__ __device__ constexpr int log2_exact(int n) {
  return n > 1 ? 1 + log2_exact(n / 2) : 0;
}

// q . key by the `lanes` lanes of a key (sub = lane % lanes); every lane of the warp must call it
// (uniform control flow); a lane whose key is not `valid` reads nothing and contributes zero.
template <typename K>
__device__ __forceinline__ float key_dot(const float* q, const K* key, int64_t D, int sub,
                                         int lanes, bool valid) {
  float dot = 0.0f;
  if (valid) {
    for (int64_t d0 = int64_t(sub) * kKeyChunk; d0 < D; d0 += int64_t(lanes) * kKeyChunk) {
      float chunk[kKeyChunk];
      load_chunk(key, D, d0, chunk);
      dot = chunk_dot(q, D, d0, chunk, dot);
    }
  }
  return lanes_sum(dot, lanes);
}

// key_dot of one key with each of `group` query rows q[h * D ..] (a GQA group), the key read
// once: emit(h, dot) on every lane. Same bits as key_dot.
template <typename K, typename Emit>
__device__ __forceinline__ void key_group_dots(const float* q, int64_t group, const K* key,
                                               int64_t D, int sub, int lanes, bool valid,
                                               Emit&& emit) {
  if (D > int64_t(lanes) * kKeyChunk) {  // more than one chunk per lane: reread per head
    for (int64_t h = 0; h < group; ++h) emit(h, key_dot(q + h * D, key, D, sub, lanes, valid));
    return;
  }
  const int64_t d0 = int64_t(sub) * kKeyChunk;
  float chunk[kKeyChunk];
  if (valid) load_chunk(key, D, d0, chunk);
  for (int64_t h = 0; h < group; ++h) {
    const float dot = valid ? chunk_dot(q + h * D, D, d0, chunk, 0.0f) : 0.0f;
    emit(h, lanes_sum(dot, lanes));
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

// The rotate-half RoPE of one channel pair (a, b) at `position` with one inverse frequency, cos
// and sin scaled by `scale`: the arithmetic of every rotation of the backend (rope.cu and the
// predictor's step). The angle is the F32 product of F32 position and inverse frequency, as
// Hugging Face computes it (inv_freq.float() @ position_ids.float()); at large positions the F32
// rounding of the angle is visible in the output, so matching it matters more than a more exact
// angle. cos/sin of that F32 angle in double, rounded once to F32 (as the CPU reference does),
// then scaled in F32 as transformers does (emb.cos() * attention_scaling).
__device__ __forceinline__ void rotate_pair(float& a, float& b, float position, float inv_freq,
                                            float scale) {
  const float angle = position * inv_freq;
  double sd, cd;
  sincos(double(angle), &sd, &cd);
  const float s = __fmul_rn(float(sd), scale);
  const float c = __fmul_rn(float(cd), scale);
  const float rotated_a = a * c - b * s;
  const float rotated_b = b * c + a * s;
  a = rotated_a;
  b = rotated_b;
}

// The activations of bias_activation on a value already summed in F32, in double and rounded
// once (the CPU reference's steps): 0 none, 1 GELU (erf), 2 SiLU.
__device__ __forceinline__ float activation_in_double(float sum, int act) {
  const double value = double(sum);
  double result = value;
  if (act == 1) result = 0.5 * value * (1.0 + erf(value * 0.70710678118654752440));
  if (act == 2) result = value / (1.0 + exp(-value));
  return float(result);
}

// LayerNorm of one row by the whole block: y = (x - mean) * inv * weight + bias, the statistics
// in double (mean first, then the squares around it) and the inverse deviation rounded once to
// F32, as the CPU reference. y may be x. `scratch`: shared memory for 32 doubles.
template <typename T>
__device__ void block_layer_norm(const float* x, float* y, int64_t width, const T* weight,
                                 const T* bias, float eps, double* scratch) {
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += double(x[i]);
  const double mean = block_reduce(sum, SumOp{}, 0.0, scratch) / double(width);
  double squares = 0.0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
    squares += (double(x[i]) - mean) * (double(x[i]) - mean);
  squares = block_reduce(squares, SumOp{}, 0.0, scratch);
  const float inv = float(1.0 / sqrt(squares / double(width) + double(eps)));
  const float mean_f = float(mean);
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
    y[i] = (x[i] - mean_f) * inv * to_f32(weight[i]) + to_f32(bias[i]);
}

// The merge step of the split attention kernels: out[d] = inv * sum over slices s < used of
// add(acc, s, d) folded from 0, for d < D, by the whole block. Threads form blockDim.x / D groups
// of D (one group striding over D when D is wider); group k folds slices k, k + groups, ... (all
// slices' loads in flight at once), then the groups' sums are added in group order. `sums` is
// shared memory for max(blockDim.x / D, 1) * D floats.
template <typename Add>
__device__ void merge_slices(int64_t used, int64_t D, float inv, float* sums, float* out, Add add) {
  const int64_t groups = D >= int64_t(blockDim.x) ? 1 : int64_t(blockDim.x) / D;
  const int64_t group = threadIdx.x / D;
  if (group < groups) {
    for (int64_t d = threadIdx.x % D; d < D; d += blockDim.x) {
      float acc = 0.0f;
#pragma unroll 4
      for (int64_t s = group; s < used; s += groups) acc = add(acc, s, d);
      sums[group * D + d] = acc;
    }
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t g = 0; g < groups; ++g) acc += sums[g * D + d];
    out[d] = acc * inv;
  }
}

// The arguments of up to kRuns runs for one launch (a lockstep step's runs of one layer, each with
// its own cache and rows): blockIdx.z picks the run. Kernels take it as a __grid_constant__
// parameter, so a run's arguments are read where the launch put them instead of copied to local
// memory; kRuns = 1 is the single-run launch, whose parameters stay as small as before.
// kBatchRuns: 16 argument structs of about 120 bytes stay inside the 4 KiB parameter limit.
constexpr int kBatchRuns = 16;
template <typename Args, int kRuns>
struct RunBatch {
  Args run[kRuns];
};
template <typename Args, int kRuns>
__device__ __forceinline__ const Args& batch_run(const RunBatch<Args, kRuns>& batch) {
  return batch.run[kRuns == 1 ? 0 : blockIdx.z];
}

// Launches `launch(batch, count)` over `runs` in batches of at most kMost (one batch of one
// for a single run, so its launch keeps the single-run kernel's parameters).
template <typename Args, int kMost = kBatchRuns, typename Launch>
void for_run_batches(std::span<const Args> runs, Launch&& launch) {
  if (runs.size() == 1) {
    RunBatch<Args, 1> one{{runs[0]}};
    launch(one, 1);
    return;
  }
  for (size_t first = 0; first < runs.size(); first += kMost) {
    RunBatch<Args, kMost> batch{};
    const size_t count = std::min<size_t>(kMost, runs.size() - first);
    for (size_t i = 0; i < count; ++i) batch.run[i] = runs[first + i];
    launch(batch, int(count));
  }
}

// Blocks for a grid-stride loop over `count` elements: enough to fill the GPU, capped so the
// grid size stays in range for any count.
inline unsigned grid_for(int64_t count, int threads) {
  const int64_t blocks = (count + threads - 1) / threads;
  constexpr int64_t kMaxBlocks = 65536;
  return unsigned(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace kvlens::cuda
