// The TokenButler predictor's decode forward in six kernels (predictor_step_kernels.cuh), each
// launched dependent on the one before: (1) input_proj; (2) per head and key split: q/k/v of the
// head, RoPE, the cache append (split 0) and a partial softmax over the split's keys; (3) the
// splits merged, norm1, ffn_in + bias + GELU; (4) ffn_out + bias + the residual; (5) [hf: norm2,
// norm_importance] the importance projections' first Linears + SiLU; (6) their second Linears,
// RoPE at d' and the stores (the query row, the key appended). Blocks that need a whole vector
// (the merged attention, a norm's statistics) compute it themselves instead of waiting for one
// more launch. Products: warp per row over 8-value chunks (key_dot's chunking), F32 sums.
#include "kernels/policy/predictor_step_kernels.cuh"

#include <algorithm>
#include <cmath>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Offsets of the scratch vectors: reduced [Er], ffn [2Er], hidden [E], importance hidden [2m],
// then the partial sums [H, kPredictorMaxSplits, hd + 2] (max, sum, hd weighted values).
struct ScratchLayout {
  int64_t reduced, ffn, hidden, importance, partials, total;
};
__host__ __device__ inline ScratchLayout scratch_layout(int64_t E, int64_t Er, int64_t H,
                                                        int64_t hd, int64_t m) {
  ScratchLayout s{};
  s.reduced = 0;
  s.ffn = s.reduced + Er;
  s.hidden = s.ffn + 2 * Er;
  s.importance = s.hidden + E;
  s.partials = s.importance + 2 * m;
  s.total = s.partials + H * kPredictorMaxSplits * (hd + 2);
  return s;
}
__device__ inline ScratchLayout layout_of(const PredictorStepArgs& a) {
  return scratch_layout(a.hidden, a.reduced, a.heads, a.head_dim, a.intermediate);
}

// Adds to dots[i] the chunks first, first + step, ... of rows[i] (i < kRows) times x, kBatch
// chunks of each row loaded before any is summed: kRows * kBatch loads in flight a lane (a loop
// that sums each chunk as it comes waits a memory latency per chunk).
template <typename T, int kRows, int kBatch>
__device__ __forceinline__ void dot_batches(const T* const (&rows)[kRows], int64_t in,
                                            const float* x, int64_t first, int64_t step,
                                            float (&dots)[kRows]) {
  const int64_t chunks = in / kKeyChunk;
  for (int64_t c0 = first; c0 < chunks; c0 += kBatch * step) {
    float values[kRows][kBatch][kKeyChunk];
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        load_chunk<T>(rows[i], in, (c0 + b * step) * kKeyChunk, values[i][b]);  // 0 past the row
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {
        const int64_t c = c0 + b * step;
        if (c < chunks) dots[i] += full_chunk_dot(x + c * kKeyChunk, values[i][b]);
      }
  }
}

// out[i] = row_of(i) . x for i < count (rows of `in` values, a multiple of 8, 16-byte aligned;
// x F32 [in] in shared memory), into shared memory. With count >= kWarps a warp takes every
// kWarps-th row, two at a time; with fewer rows each row's chunks are split over kWarps / count
// warps, whose sums are then added in warp order. `partial`: shared memory for kWarps floats.
// Ends with a barrier.
template <typename T, typename RowOf>
__device__ void block_row_dots(RowOf row_of, int64_t in, const float* x, int count, float* out,
                               float* partial) {
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const int per_row = count >= kWarps ? 1 : kWarps / count;
  const int at_once = kWarps / per_row;
  for (int r = warp / per_row; r < count && warp < per_row * at_once; r += 2 * at_once) {
    const int part = warp % per_row;
    const int64_t first = part * 32 + lane, step = per_row * 32;
    const bool pair = r + at_once < count;  // only where per_row == 1
    float dots[2] = {0.0f, 0.0f};
    if (pair) {
      const T* const rows[2] = {row_of(r), row_of(r + at_once)};
      dot_batches<T, 2, 2>(rows, in, x, first, step, dots);
    } else {
      const T* const rows[1] = {row_of(r)};
      float one[1] = {0.0f};
      dot_batches<T, 1, 4>(rows, in, x, first, step, one);
      dots[0] = one[0];
    }
    for (int i = 0; i < (pair ? 2 : 1); ++i) {
      const float dot = warp_reduce(dots[i], SumOp{});
      if (lane == 0) (per_row == 1 ? out[r + i * at_once] : partial[warp]) = dot;
    }
  }
  __syncthreads();
  if (per_row > 1 && int(threadIdx.x) < count) {
    float sum = 0.0f;
    for (int p = 0; p < per_row; ++p) sum += partial[int(threadIdx.x) * per_row + p];
    out[threadIdx.x] = sum;
  }
  __syncthreads();
}

// block_row_dots over rows row0 .. row0 + count - 1 of one matrix w [rows, in].
template <typename T>
__device__ void block_row_dots(const T* w, int64_t in, const float* x, int64_t row0, int count,
                               float* out, float* partial) {
  block_row_dots<T>([&](int r) { return w + (row0 + r) * in; }, in, x, count, out, partial);
}

// to[i] = from[i] for i < count (widened to F32) by the block, eight independent loads a thread
// in flight at once (a plain loop waits for each load before the next). No barrier.
template <typename T>
__device__ inline void copy_widened(const T* from, int64_t count, float* to) {
  constexpr int kBatch = 8;
  for (int64_t base = threadIdx.x; base < count; base += kBatch * int64_t(blockDim.x)) {
    float values[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t i = base + k * int64_t(blockDim.x);
      values[k] = i < count ? to_f32(from[i]) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int64_t i = base + k * int64_t(blockDim.x);
      if (i < count) to[i] = values[k];
    }
  }
}

// copy_widened, then a barrier: a vector the block's products read.
__device__ inline void stage(const float* from, int64_t count, float* to) {
  copy_widened(from, count, to);
  __syncthreads();
}

// Asks L2 for the block's weight rows [row0, row0 + count) of w [rows, in] (contiguous), a
// 128-byte line a thread at a time: issued before the kernel waits for the one ahead of it
// (weights are written by no kernel), the rows arrive while that one finishes.
template <typename T>
__device__ inline void prefetch_rows(const T* w, int64_t in, int64_t row0, int64_t count) {
  const char* begin = reinterpret_cast<const char*>(w + row0 * in);
  const int64_t bytes = count * in * int64_t(sizeof(T));
  for (int64_t offset = int64_t(threadIdx.x) * 128; offset < bytes;
       offset += int64_t(blockDim.x) * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(begin + offset));
}

// The block's rows of this launch: [blockIdx.x * rows_per_block, ...) of `rows`.
struct BlockRows {
  int64_t first;
  int count;
};
__device__ inline BlockRows block_rows(int64_t rows, int rows_per_block) {
  const int64_t first = int64_t(blockIdx.x) * rows_per_block;
  return {first, int(rows - first < rows_per_block ? rows - first : rows_per_block)};
}

// (1) reduced = input_proj . x. Shared: x [E], out [rows_per_block], partial [kWarps].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    predictor_input_proj_kernel(const __grid_constant__ PredictorStepArgs a, int rows_per_block) {
  extern __shared__ float shared[];
  float* x = shared;
  float* out = x + a.hidden;
  float* partial = out + rows_per_block;
  const BlockRows rows = block_rows(a.reduced, rows_per_block);
  const T* w = static_cast<const T*>(a.input_proj);
  prefetch_rows(w, a.hidden, rows.first, rows.count);
  begin_dependent_grid();
  stage(a.x, a.hidden, x);
  block_row_dots(w, a.hidden, x, rows.first, rows.count, out, partial);
  float* reduced = a.scratch + layout_of(a).reduced;
  for (int i = int(threadIdx.x); i < rows.count; i += blockDim.x) reduced[rows.first + i] = out[i];
}

// Online-softmax state of one thread (or a merged group) over some keys: the running max, the sum
// of exp(logit - max), and the exp-weighted values.
template <int kHd>
struct SoftmaxPart {
  float max = -INFINITY, sum = 0.0f;
  float acc[kHd] = {};

  __device__ void add_key(float logit, const float (&value)[kHd]) {
    if (logit > max) {
      const float shrink = expf(max - logit);  // 0 for the first key (max = -inf)
      sum *= shrink;
#pragma unroll
      for (int d = 0; d < kHd; ++d) acc[d] *= shrink;
      max = logit;
    }
    const float p = expf(logit - max);
    sum += p;
#pragma unroll
    for (int d = 0; d < kHd; ++d) acc[d] = fmaf(p, value[d], acc[d]);
  }
  __device__ void merge(float other_max, float other_sum, const float (&other_acc)[kHd]) {
    const float top = fmaxf(max, other_max);
    if (top == -INFINITY) return;  // neither has a key
    const float mine = expf(max - top), theirs = expf(other_max - top);
    sum = sum * mine + other_sum * theirs;
#pragma unroll
    for (int d = 0; d < kHd; ++d) acc[d] = acc[d] * mine + other_acc[d] * theirs;
    max = top;
  }
};

template <int kHd>
__device__ inline void load_row(const float* row, float (&out)[kHd]) {
  if constexpr (kHd % 4 == 0) {
#pragma unroll
    for (int d = 0; d < kHd; d += 4) {
      const float4 v = *reinterpret_cast<const float4*>(row + d);
      out[d] = v.x;
      out[d + 1] = v.y;
      out[d + 2] = v.z;
      out[d + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int d = 0; d < kHd; ++d) out[d] = row[d];
  }
}

// (2) Block (head h, split s): the head's q, k, v from `reduced`, rotated; split 0 appends k and
// v at the position; then the softmax part of the split's keys (the new key read from shared
// memory, where the cache write of split 0 may not have landed). Shared: reduced [Er],
// qkv [3 hd], partial [kWarps], parts [kWarps, hd + 2].
template <typename T, int kHd>
__global__ void __launch_bounds__(kThreads)
    predictor_attention_kernel(const __grid_constant__ PredictorStepArgs a) {
  extern __shared__ float shared[];
  const int64_t Er = a.reduced;
  float* reduced = shared;
  float* qkv = reduced + Er;
  float* partial = qkv + 3 * kHd;
  float* parts = partial + kWarps;
  const int64_t h = blockIdx.x / a.splits, split = blockIdx.x % a.splits;
  const ScratchLayout layout = layout_of(a);
  for (const void* w : {a.q_attn, a.k_attn, a.v_attn})
    prefetch_rows(static_cast<const T*>(w), Er, h * kHd, kHd);
  begin_dependent_grid();
  stage(a.scratch + layout.reduced, Er, reduced);
  // The head's q, k and v rows in one pass: row r of 3 hd is row h hd + r % hd of q, k or v.
  // (Selected, not indexed from an array: a runtime index would put the array in local memory.)
  const T* const q_rows = static_cast<const T*>(a.q_attn);
  const T* const k_rows = static_cast<const T*>(a.k_attn);
  const T* const v_rows = static_cast<const T*>(a.v_attn);
  block_row_dots<T>(
      [&](int r) {
        return (r < kHd ? q_rows : r < 2 * kHd ? k_rows : v_rows) + (h * kHd + r % kHd) * Er;
      },
      Er, reduced, 3 * kHd, qkv, partial);
  constexpr int kHalf = kHd / 2;
  if (threadIdx.x < kHalf) {
    const int i = int(threadIdx.x);
    const float position = float(a.position), inv_freq = a.attention_inv_freq[i];
    rotate_pair(qkv[i], qkv[i + kHalf], position, inv_freq, 1.0f);
    rotate_pair(qkv[kHd + i], qkv[kHd + i + kHalf], position, inv_freq, 1.0f);
  }
  __syncthreads();
  const int64_t new_row = (h * a.capacity + a.position) * kHd;
  if (split == 0 && threadIdx.x < kHd) {
    a.attention_keys[new_row + threadIdx.x] = qkv[kHd + threadIdx.x];
    a.attention_values[new_row + threadIdx.x] = qkv[2 * kHd + threadIdx.x];
  }
  float q[kHd];
#pragma unroll
  for (int d = 0; d < kHd; ++d) q[d] = qkv[d];
  const int64_t keys = a.position + 1, per_split = (keys + a.splits - 1) / a.splits;
  const int64_t begin = split * per_split;
  const int64_t end = begin + per_split < keys ? begin + per_split : keys;
  SoftmaxPart<kHd> part;
  for (int64_t j = begin + threadIdx.x; j < end; j += kThreads) {
    float key[kHd], value[kHd];
    if (j == a.position) {
#pragma unroll
      for (int d = 0; d < kHd; ++d) {
        key[d] = qkv[kHd + d];
        value[d] = qkv[2 * kHd + d];
      }
    } else {
      load_row<kHd>(a.attention_keys + (h * a.capacity + j) * kHd, key);
      load_row<kHd>(a.attention_values + (h * a.capacity + j) * kHd, value);
    }
    float dot = 0.0f;
#pragma unroll
    for (int d = 0; d < kHd; ++d) dot = fmaf(q[d], key[d], dot);
    part.add_key(dot * a.attention_scale, value);
  }
  // The threads' parts merged: a butterfly within each warp, then the warps in order.
  for (int offset = 16; offset > 0; offset >>= 1) {
    float other_acc[kHd];
#pragma unroll
    for (int d = 0; d < kHd; ++d) other_acc[d] = __shfl_xor_sync(0xffffffffu, part.acc[d], offset);
    const float other_max = __shfl_xor_sync(0xffffffffu, part.max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, part.sum, offset);
    part.merge(other_max, other_sum, other_acc);
  }
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  constexpr int kPart = kHd + 2;
  if (lane == 0) {
    parts[warp * kPart] = part.max;
    parts[warp * kPart + 1] = part.sum;
#pragma unroll
    for (int d = 0; d < kHd; ++d) parts[warp * kPart + 2 + d] = part.acc[d];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    SoftmaxPart<kHd> block;
    for (int w = 0; w < kWarps; ++w) {
      float other_acc[kHd];
#pragma unroll
      for (int d = 0; d < kHd; ++d) other_acc[d] = parts[w * kPart + 2 + d];
      block.merge(parts[w * kPart], parts[w * kPart + 1], other_acc);
    }
    float* out = a.scratch + layout.partials + (h * a.splits + split) * kPart;
    out[0] = block.max;
    out[1] = block.sum;
#pragma unroll
    for (int d = 0; d < kHd; ++d) out[2 + d] = block.acc[d];
  }
}

// (3) Every block merges the splits of every head into the attended row, applies norm1, then its
// rows of ffn_in + bias + GELU. Shared: attended [Er], norm1's weight and bias [2 Er], the
// partial sums [H * splits * (hd + 2)], out [rows_per_block], partial [kWarps].
template <typename T, int kHd>
__global__ void __launch_bounds__(kThreads)
    predictor_ffn_in_kernel(const __grid_constant__ PredictorStepArgs a, int rows_per_block) {
  extern __shared__ float shared[];
  __shared__ double statistics[32];
  constexpr int kPart = kHd + 2;
  const int64_t Er = a.reduced, part_floats = a.heads * a.splits * kPart;
  float* attended = shared;
  float* norm = attended + Er;
  float* parts = norm + 2 * Er;
  float* out = parts + part_floats;
  float* partial = out + rows_per_block;
  const ScratchLayout layout = layout_of(a);
  const BlockRows rows = block_rows(2 * Er, rows_per_block);
  const T* w = static_cast<const T*>(a.ffn_in_weight);
  prefetch_rows(w, Er, rows.first, rows.count);
  copy_widened(static_cast<const T*>(a.norm1_weight), Er, norm);
  copy_widened(static_cast<const T*>(a.norm1_bias), Er, norm + Er);
  begin_dependent_grid();
  stage(a.scratch + layout.partials, part_floats, parts);
  for (int64_t i = threadIdx.x; i < Er; i += blockDim.x) {
    const float* head = parts + (i / kHd) * a.splits * kPart;
    float top = -INFINITY;
    for (int64_t s = 0; s < a.splits; ++s) top = fmaxf(top, head[s * kPart]);
    float sum = 0.0f, weighted = 0.0f;
    for (int64_t s = 0; s < a.splits; ++s) {
      if (head[s * kPart + 1] == 0.0f) continue;  // a split without keys
      const float scale = expf(head[s * kPart] - top);
      sum = fmaf(head[s * kPart + 1], scale, sum);
      weighted = fmaf(head[s * kPart + 2 + i % kHd], scale, weighted);
    }
    attended[i] = weighted / sum;
  }
  __syncthreads();
  block_layer_norm(attended, attended, Er, norm, norm + Er, a.eps, statistics);
  __syncthreads();
  block_row_dots(w, Er, attended, rows.first, rows.count, out, partial);
  const T* bias = static_cast<const T*>(a.ffn_in_bias);
  float* ffn = a.scratch + layout.ffn;
  for (int i = int(threadIdx.x); i < rows.count; i += blockDim.x)
    ffn[rows.first + i] = activation_in_double(out[i] + to_f32(bias[rows.first + i]), 1);
}

// (4) hidden = ffn_out . ffn + bias + x. Shared: ffn [2Er], out, partial.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    predictor_ffn_out_kernel(const __grid_constant__ PredictorStepArgs a, int rows_per_block) {
  extern __shared__ float shared[];
  const int64_t width = 2 * a.reduced;
  float* ffn = shared;
  float* out = ffn + width;
  float* partial = out + rows_per_block;
  const ScratchLayout layout = layout_of(a);
  const BlockRows rows = block_rows(a.hidden, rows_per_block);
  const T* w = static_cast<const T*>(a.ffn_out_weight);
  prefetch_rows(w, width, rows.first, rows.count);
  begin_dependent_grid();
  stage(a.scratch + layout.ffn, width, ffn);
  block_row_dots(w, width, ffn, rows.first, rows.count, out, partial);
  const T* bias = static_cast<const T*>(a.ffn_out_bias);
  float* hidden = a.scratch + layout.hidden;
  for (int i = int(threadIdx.x); i < rows.count; i += blockDim.x) {
    const int64_t r = rows.first + i;
    hidden[r] = (out[i] + to_f32(bias[r])) + a.x[r];  // bias_activation, then add_inplace
  }
}

// (5) [hf: norm2 then norm_importance of hidden, by every block] blockIdx.y = 0: the queries'
// first Linear, 1: the keys'; + SiLU. Shared: hidden [E], out, partial, [hf: the two norms'
// weights and biases, 4 E].
template <typename T>
__global__ void __launch_bounds__(kThreads)
    predictor_importance_in_kernel(const __grid_constant__ PredictorStepArgs a,
                                   int rows_per_block) {
  extern __shared__ float shared[];
  __shared__ double statistics[32];
  const int64_t E = a.hidden;
  float* hidden = shared;
  float* out = hidden + E;
  float* partial = out + rows_per_block;
  float* norms = partial + kWarps;
  const ScratchLayout layout = layout_of(a);
  const bool keys = blockIdx.y == 1;
  const BlockRows rows = block_rows(a.intermediate, rows_per_block);
  const T* w = static_cast<const T*>(keys ? a.k_importance_in : a.q_importance_in);
  prefetch_rows(w, E, rows.first, rows.count);
  if (a.importance_norms) {
    const void* params[] = {a.norm2_weight, a.norm2_bias, a.norm_importance_weight,
                            a.norm_importance_bias};
    for (int k = 0; k < 4; ++k) copy_widened(static_cast<const T*>(params[k]), E, norms + k * E);
  }
  begin_dependent_grid();
  stage(a.scratch + layout.hidden, E, hidden);
  if (a.importance_norms) {
    block_layer_norm(hidden, hidden, E, norms, norms + E, a.eps, statistics);
    __syncthreads();
    block_layer_norm(hidden, hidden, E, norms + 2 * E, norms + 3 * E, a.eps, statistics);
    __syncthreads();
  }
  block_row_dots(w, E, hidden, rows.first, rows.count, out, partial);
  float* result = a.scratch + layout.importance + (keys ? a.intermediate : 0);
  for (int i = int(threadIdx.x); i < rows.count; i += blockDim.x)
    result[rows.first + i] = activation_in_double(out[i] + 0.0f, 2);
}

// (6) Block (slot, blockIdx.y = queries or keys): the slot's d' rows of the second Linear,
// rotated at the position, stored as the query row or appended to the slot's importance keys.
// Shared: importance hidden [m], out [d'], partial.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    predictor_importance_out_kernel(const __grid_constant__ PredictorStepArgs a) {
  extern __shared__ float shared[];
  const int64_t m = a.intermediate, d = a.importance_dim;
  float* hidden = shared;
  float* out = hidden + m;
  float* partial = out + d;
  const bool keys = blockIdx.y == 1;
  const int64_t slot = blockIdx.x;
  const T* w = static_cast<const T*>(keys ? a.k_importance_out : a.q_importance_out);
  prefetch_rows(w, m, slot * d, d);
  begin_dependent_grid();
  stage(a.scratch + layout_of(a).importance + (keys ? m : 0), m, hidden);
  block_row_dots(w, m, hidden, slot * d, int(d), out, partial);
  const int64_t half = d / 2;
  if (int64_t(threadIdx.x) < half) {
    const int64_t i = threadIdx.x;
    float first = out[i], second = out[i + half];
    rotate_pair(first, second, float(a.position), a.importance_inv_freq[i], 1.0f);
    float* row =
        keys ? a.importance_keys + (slot * a.capacity + a.position) * d : a.query + slot * d;
    row[i] = first;
    row[i + half] = second;
  }
}

// Rows a block takes: few enough warps per row that each lane has a chunk of the row, and few
// enough blocks that they fit in about two waves of the GPU.
int rows_per_block(int64_t rows, int64_t in, int sm_count) {
  const int64_t lanes_of_chunks = std::max<int64_t>(1, in / kKeyChunk / 32);
  int per_block = int(std::clamp<int64_t>(kWarps / lanes_of_chunks, 1, kWarps));
  while (per_block < 64 && (rows + per_block - 1) / per_block > 2 * int64_t(sm_count))
    per_block *= 2;
  return per_block;
}

template <typename T, int kHd>
void launch_with(const PredictorStepArgs& a, int sm_count, cudaStream_t stream) {
  const size_t f = sizeof(float);
  const int64_t E = a.hidden, Er = a.reduced, m = a.intermediate;
  const int reduce_rows = rows_per_block(Er, E, sm_count);
  launch_dependent(predictor_input_proj_kernel<T>, unsigned((Er + reduce_rows - 1) / reduce_rows),
                   kThreads, size_t(E + reduce_rows + kWarps) * f, stream, a, reduce_rows);
  launch_dependent(predictor_attention_kernel<T, kHd>, unsigned(a.heads * a.splits), kThreads,
                   size_t(Er + 3 * kHd + kWarps + kWarps * (kHd + 2)) * f, stream, a);
  const int ffn_rows = rows_per_block(2 * Er, Er, sm_count);
  const int64_t part_floats = a.heads * a.splits * (kHd + 2);
  launch_dependent(predictor_ffn_in_kernel<T, kHd>, unsigned((2 * Er + ffn_rows - 1) / ffn_rows),
                   kThreads, size_t(3 * Er + part_floats + ffn_rows + kWarps) * f, stream, a,
                   ffn_rows);
  const int out_rows = rows_per_block(E, 2 * Er, sm_count);
  launch_dependent(predictor_ffn_out_kernel<T>, unsigned((E + out_rows - 1) / out_rows), kThreads,
                   size_t(2 * Er + out_rows + kWarps) * f, stream, a, out_rows);
  const int in_rows = rows_per_block(2 * m, E, sm_count);
  const int64_t norm_floats = a.importance_norms ? 4 * E : 0;
  launch_dependent(predictor_importance_in_kernel<T>,
                   dim3(unsigned((m + in_rows - 1) / in_rows), 2), kThreads,
                   size_t(E + in_rows + kWarps + norm_floats) * f, stream, a, in_rows);
  launch_dependent(predictor_importance_out_kernel<T>, dim3(unsigned(a.slots), 2), kThreads,
                   size_t(m + a.importance_dim + kWarps) * f, stream, a);
}

}  // namespace

bool predictor_step_fusable(const PredictorStepArgs& a) {
  const int64_t hd = a.head_dim, d = a.importance_dim;
  const bool head_dim_taken = hd == 2 || hd == 4 || hd == 8 || hd == 16 || hd == 32;
  return head_dim_taken && d >= 2 && d % 2 == 0 && d <= kPredictorMaxHeadDim && a.hidden > 0 &&
         a.hidden % kKeyChunk == 0 && a.reduced % kKeyChunk == 0 &&
         a.intermediate % kKeyChunk == 0 && a.reduced == a.heads * hd && a.slots > 0 &&
         (a.w_dtype == DType::F32 || a.w_dtype == DType::BF16 || a.w_dtype == DType::F16);
}

int64_t predictor_step_scratch_floats(int64_t hidden, int64_t reduced, int64_t heads,
                                      int64_t head_dim, int64_t intermediate) {
  return scratch_layout(hidden, reduced, heads, head_dim, intermediate).total;
}

void launch_predictor_step(PredictorStepArgs args, int sm_count, cudaStream_t stream) {
  // Splits per head: about two blocks per multiprocessor over all heads, at least 64 keys each.
  const int64_t keys = args.position + 1;
  const int64_t wanted = (2 * int64_t(sm_count) + args.heads - 1) / args.heads;
  args.splits = std::clamp<int64_t>(std::min(wanted, (keys + 63) / 64), 1, kPredictorMaxSplits);
  dispatch_weight(args.w_dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (args.head_dim) {
      case 2:
        launch_with<T, 2>(args, sm_count, stream);
        break;
      case 4:
        launch_with<T, 4>(args, sm_count, stream);
        break;
      case 8:
        launch_with<T, 8>(args, sm_count, stream);
        break;
      case 16:
        launch_with<T, 16>(args, sm_count, stream);
        break;
      default:
        launch_with<T, 32>(args, sm_count, stream);
        break;
    }
  });
}

}  // namespace kvlens::cuda
