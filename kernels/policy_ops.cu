// Token-selection (policy) kernels of the core ops (see policy_ops.cuh; the policies' own ops are
// in kernels/policy/). The ranking key and the random values come from
// engine/backend/policy_op_math.h, the same code the CPU backend runs, so selections and random
// rows are bit-identical across backends; the other float ops differ only by rounding order.
#include <algorithm>

#include "engine/backend/policy_op_math.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/policy_ops.cuh"
#include "kernels/radix_select.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;  // element-wise kernels and select_top_k
constexpr int kLogitThreads = 128;
constexpr int kLogitWarps = kLogitThreads / 32;
// Keys per attention_logits chunk: 32, or one pass of every warp where that is more (a small
// head dimension scores 32 / key_lanes(D) keys a warp: 64 for the TokenButler predictor's 16,
// whose warps half idled on 32-key chunks).
__host__ __device__ constexpr int64_t logit_chunk_keys(int64_t D) {
  const int64_t one_pass = kLogitWarps * (32 / key_lanes(D));
  return one_pass > 32 ? one_pass : 32;
}
// attention_logits blocks a multiprocessor at most: 16 blocks of 4 warps fill it (a step's
// logits of every predicted layer, 480 rows of 4096 keys, read 126 MB: latency-bound at 8).
constexpr int64_t kLogitBlocksPerSm = 16;

// Grid-stride loop over the cells of a rows x cols region: f(r, j) for each.
template <typename F>
__device__ __forceinline__ void for_each_cell(int64_t rows, int64_t cols, F f) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x)
    f(i / cols, i % cols);
}

// Grid: (key chunks, KV heads). The group's query rows in shared memory; key_lanes(D) lanes per
// key, which they read once for every query head of its group (key_group_dots: the attention
// kernels' bits).
template <typename C, int kRuns>
__global__ void attention_logits_kernel(const __grid_constant__ RunBatch<LogitArgs, kRuns> batch) {
  begin_dependent_grid();
  const LogitArgs& a = batch_run(batch);
  extern __shared__ float q[];
  const int64_t D = a.head_dim;
  const int64_t group = a.heads / a.kv_heads;
  const int64_t g = blockIdx.y;
  for (int64_t i = threadIdx.x; i < group * D; i += blockDim.x) q[i] = a.q[g * group * D + i];
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int lanes = key_lanes(D);
  const int sub = lane % lanes;
  const int keys_per_warp = 32 / lanes;
  int64_t cols = a.cols, lo = a.lo;
  if (a.step_position != nullptr) {
    const int64_t position = *a.step_position;
    cols = position + 1;
    lo = a.window > 0 && position - a.window + 1 > 0 ? position - a.window + 1 : 0;
  }
  const C* keys = static_cast<const C*>(a.k_cache) + g * a.capacity * D;
  float* rows = a.logits.data + g * group * a.logits.stride;
  // Chunks of logit_chunk_keys(D) keys, grid-stride (the grid of a captured step covers any
  // context).
  const int64_t chunk_keys = logit_chunk_keys(D);
  for (int64_t begin = int64_t(blockIdx.x) * chunk_keys; begin < cols;
       begin += int64_t(gridDim.x) * chunk_keys) {
    const int64_t end = begin + chunk_keys < cols ? begin + chunk_keys : cols;
    // `first` is warp-uniform, so every lane reaches the shuffles of key_group_dots.
    for (int64_t first = begin + warp * keys_per_warp; first < end;
         first += kLogitWarps * keys_per_warp) {
      const int64_t j = first + lane / lanes;
      const bool in_range = j < end;
      const bool scored = in_range && j >= lo;
      if (in_range && !scored && sub == 0)
        for (int64_t h = 0; h < group; ++h) rows[h * a.logits.stride + j] = -INFINITY;
      key_group_dots(q, group, keys + (scored ? j : 0) * D, D, sub, lanes, scored,
                     [&](int64_t h, float dot) {
                       if (scored && sub == 0) rows[h * a.logits.stride + j] = dot * a.scale;
                     });
    }
  }
}

// One block per row. The candidates' keys (top_k_key) are distinct, so the k best are exactly
// those with key >= the k-th largest key, which radix_select_key finds. O(8 * cols / threads)
// (4 passes when the k-th score is not split by ties).
// With `forced` set, the row is first marked as mark_columns_kernel marks it (forced columns
// that are eligible), which then count as selected: mark_and_select_top_k in one launch.
__global__ void select_top_k_kernel(RowsRef<const float> scores, RowsRef<const uint8_t> eligible,
                                    RowsRef<uint8_t> selected, int64_t cols, int64_t k,
                                    ForcedMarks forced) {
  begin_dependent_grid();
  __shared__ unsigned scratch[32];
  const int64_t r = blockIdx.x;
  const float* score = scores.data + r * scores.stride;
  const uint8_t* allowed = eligible.data ? eligible.data + r * eligible.stride : nullptr;
  uint8_t* chosen = selected.data + r * selected.stride;
  // Each column is read and written by one thread only (every loop below strides the columns
  // the same way), so marking never races with the checks.
  if (forced.mark)
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      chosen[j] =
          uint8_t((j < forced.ones_end || forced.ones_begin <= j) && (!allowed || allowed[j] != 0));
  auto candidate = [&](int64_t j) { return chosen[j] == 0 && (!allowed || allowed[j] != 0); };

  unsigned count = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) count += candidate(j) ? 1u : 0u;
  count = block_reduce(count, SumOp{}, 0u, scratch);
  if (int64_t(count) <= k) {  // all of them
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
      if (candidate(j)) chosen[j] = 1;
    return;
  }

  // 0 < k < count <= 2^31
  const uint64_t prefix =
      radix_select_key<false>(cols, unsigned(k), [&](int64_t j, uint64_t& key, unsigned& weight) {
        weight = candidate(j) ? 1u : 0u;
        key = weight ? top_k_key(score[j], uint32_t(j)) : 0;
      });
  // The k best are exactly the candidates with a key >= `prefix` (the k-th largest key, or the
  // lowest key of its score when every candidate of that score is among the k).
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    if (candidate(j) && top_k_key(score[j], uint32_t(j)) >= prefix) chosen[j] = 1;
}

// select_top_k of one long row by many blocks: Ada-KV's pooled top-k lays a layer's heads end to
// end (32 heads x 4096 columns: 131k keys), which the one-block kernel reads eight times from one
// SM (about 3 ms a layer on an H200). The same radix select split into kernels: a count, then per
// digit every block's histogram into `state` and one warp's pick (radix_pick_digit), then the
// marks: the same keys and rule, so the same columns as select_top_k_kernel.
__device__ __forceinline__ bool long_row_candidate(const uint8_t* chosen, const uint8_t* allowed,
                                                   int64_t j) {
  return chosen[j] == 0 && (!allowed || allowed[j] != 0);
}

__global__ void long_row_count_kernel(const uint8_t* allowed, const uint8_t* chosen, int64_t cols,
                                      LongRowSelect* state) {
  begin_dependent_grid();
  __shared__ unsigned scratch[32];
  unsigned count = 0;
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < cols;
       j += int64_t(gridDim.x) * blockDim.x)
    count += long_row_candidate(chosen, allowed, j) ? 1u : 0u;
  count = block_reduce(count, SumOp{}, 0u, scratch);
  if (threadIdx.x == 0 && count > 0) atomicAdd(&state->count, count);
}

__global__ void long_row_histogram_kernel(const float* score, const uint8_t* allowed,
                                          const uint8_t* chosen, int64_t cols, int64_t k, int shift,
                                          LongRowSelect* state) {
  begin_dependent_grid();
  if (int64_t(state->count) <= k) return;  // every candidate is taken
  __shared__ unsigned histogram[256];
  for (int i = threadIdx.x; i < 256; i += blockDim.x) histogram[i] = 0;
  __syncthreads();
  const uint64_t prefix = state->prefix;
  const uint64_t fixed = shift == 56 ? 0 : ~uint64_t(0) << (shift + 8);
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < cols;
       j += int64_t(gridDim.x) * blockDim.x) {
    if (!long_row_candidate(chosen, allowed, j)) continue;
    const uint64_t key = top_k_key(score[j], uint32_t(j));
    if ((key & fixed) == prefix) atomicAdd(&histogram[unsigned(key >> shift) & 255u], 1u);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 256; i += blockDim.x)
    if (histogram[i] != 0) atomicAdd(&state->histogram[i], histogram[i]);
}

// One warp: the digit, then the histogram cleared for the next one.
__global__ void long_row_digit_kernel(int64_t k, int shift, LongRowSelect* state) {
  begin_dependent_grid();
  if (int64_t(state->count) <= k) return;
  const uint64_t prefix = shift == 56 ? 0 : state->prefix;
  const unsigned remaining = shift == 56 ? unsigned(k) : state->remaining;
  __syncwarp();
  radix_pick_digit<false>(state->histogram, shift, prefix, remaining, &state->prefix,
                          &state->remaining);
  __syncwarp();
  for (int i = threadIdx.x; i < 256; i += 32) state->histogram[i] = 0;
}

__global__ void long_row_mark_kernel(const float* score, const uint8_t* allowed, uint8_t* chosen,
                                     int64_t cols, int64_t k, const LongRowSelect* state) {
  begin_dependent_grid();
  const bool all = int64_t(state->count) <= k;
  const uint64_t kth = state->prefix;  // the k-th largest key itself
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < cols;
       j += int64_t(gridDim.x) * blockDim.x)
    if (long_row_candidate(chosen, allowed, j) && (all || top_k_key(score[j], uint32_t(j)) >= kth))
      chosen[j] = 1;
}

__global__ void fill_columns_kernel(RowsRef<uint8_t> mask, int64_t rows, int64_t begin,
                                    int64_t width, uint8_t value) {
  begin_dependent_grid();
  for_each_cell(rows, width,
                [&](int64_t r, int64_t j) { mask.data[r * mask.stride + begin + j] = value; });
}

// Grid: (rows of the tallest mask, 1, masks).
template <int kMasks>
__global__ void count_nonzero_kernel(const __grid_constant__ RunBatch<CountArgs, kMasks> batch) {
  begin_dependent_grid();
  __shared__ int64_t scratch[32];
  const CountArgs& a = batch_run(batch);
  if (int64_t(blockIdx.x) >= a.rows) return;
  const uint8_t* row = a.mask.data + int64_t(blockIdx.x) * a.mask.stride;
  int64_t count = 0;
  for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) count += row[j] != 0;
  count = block_reduce(count, SumOp{}, int64_t(0), scratch);
  if (threadIdx.x == 0) a.counts[blockIdx.x] = count;
}

__global__ void mask_and_kernel(RowsRef<uint8_t> mask, RowsRef<const uint8_t> other, int64_t rows,
                                int64_t cols) {
  begin_dependent_grid();
  for_each_cell(rows, cols, [&](int64_t r, int64_t j) {
    uint8_t& m = mask.data[r * mask.stride + j];
    m = uint8_t(m != 0 && other.data[r * other.stride + j] != 0);
  });
}

__global__ void mark_columns_kernel(RowsRef<uint8_t> mask, RowsRef<const uint8_t> keep,
                                    int64_t rows, int64_t cols, int64_t ones_end,
                                    int64_t ones_begin) {
  begin_dependent_grid();
  for_each_cell(rows, cols, [&](int64_t r, int64_t j) {
    const bool forced = j < ones_end || ones_begin <= j;
    mask.data[r * mask.stride + j] =
        uint8_t(forced && (keep.data == nullptr || keep.data[r * keep.stride + j] != 0));
  });
}

__global__ void keep_selected_kernel(RowsRef<uint8_t> kept, RowsRef<const uint8_t> selected,
                                     int64_t rows, int64_t cols, int64_t sinks) {
  begin_dependent_grid();
  for_each_cell(rows, cols, [&](int64_t r, int64_t j) {
    uint8_t& m = kept.data[r * kept.stride + j];
    m = uint8_t(j < sinks || (m != 0 && selected.data[r * selected.stride + j] != 0));
  });
}

__global__ void accumulate_rows_kernel(RowsRef<float> acc, RowsRef<const float> x,
                                       RowsRef<const uint8_t> keep, int64_t rows, int64_t cols) {
  begin_dependent_grid();
  for_each_cell(rows, cols, [&](int64_t r, int64_t j) {
    float& a = acc.data[r * acc.stride + j];
    const float add = x.data[r * x.stride + j];
    a = (keep.data && keep.data[r * keep.stride + j] == 0) ? add : a + add;
  });
}

__global__ void sum_row_groups_kernel(RowsRef<const float> x, int64_t groups, int64_t group,
                                      int64_t cols, RowsRef<float> out) {
  begin_dependent_grid();
  for_each_cell(groups, cols, [&](int64_t g, int64_t j) {
    const float* first = x.data + g * group * x.stride + j;
    float sum = first[0];
    for (int64_t i = 1; i < group; ++i) sum += first[i * x.stride];
    out.data[g * out.stride + j] = sum;
  });
}

__global__ void expand_row_groups_kernel(RowsRef<const uint8_t> mask, int64_t rows, int64_t group,
                                         int64_t cols, RowsRef<uint8_t> out) {
  begin_dependent_grid();
  for_each_cell(rows, cols, [&](int64_t r, int64_t j) {
    out.data[r * out.stride + j] = mask.data[(r / group) * mask.stride + j];
  });
}

__global__ void random_rows_kernel(uint64_t seed, uint64_t stream_id, int64_t rows, int64_t cols,
                                   RowsRef<float> out) {
  begin_dependent_grid();
  for_each_cell(rows, cols, [&](int64_t r, int64_t j) {
    out.data[r * out.stride + j] = random_unit(seed, stream_id, uint64_t(r), uint64_t(j));
  });
}

__global__ void axpby_rows_kernel(RowsRef<float> y, float alpha, RowsRef<const float> x, float beta,
                                  int64_t rows, bool broadcast, int64_t cols) {
  begin_dependent_grid();
  for_each_cell(rows, cols, [&](int64_t r, int64_t j) {
    float& out = y.data[r * y.stride + j];
    const float in = x.data[(broadcast ? 0 : r) * x.stride + j];
    // Explicit roundings (no contraction by nvcc): the CPU's alpha * x and fma(alpha, x, beta * y).
    out = beta == 0.0f ? __fmul_rn(alpha, in) : __fmaf_rn(alpha, in, __fmul_rn(beta, out));
  });
}

__global__ void pool_rows_kernel(RowsRef<const float> x, int64_t rows, int64_t cols, bool average,
                                 int64_t kernel, RowsRef<float> out) {
  begin_dependent_grid();
  const int64_t half = kernel / 2;
  for_each_cell(rows, cols, [&](int64_t r, int64_t j) {
    const float* in = x.data + r * x.stride;
    const int64_t lo = j - half > 0 ? j - half : 0;
    const int64_t hi = j + half < cols - 1 ? j + half : cols - 1;
    float value;
    if (average) {
      value = 0.0f;
      for (int64_t i = lo; i <= hi; ++i) value = __fadd_rn(value, in[i]);
      value = __fdiv_rn(value, float(kernel));
    } else {
      value = in[lo];
      for (int64_t i = lo + 1; i <= hi; ++i) value = fmaxf(value, in[i]);
    }
    out.data[r * out.stride + j] = value;
  });
}

// Page p's ranking key (top_k_key of its fmax score, the page index as tie-break) and cost (its
// unselected columns), as the CPU computes them.
__device__ __forceinline__ void page_key_cost(const float* score, const uint8_t* chosen, int64_t p,
                                              int64_t page_size, int64_t cols, uint64_t& key,
                                              unsigned& cost) {
  const int64_t j0 = p * page_size;
  const int64_t j1 = j0 + page_size < cols ? j0 + page_size : cols;
  float best = score[j0];
  unsigned c = chosen[j0] == 0 ? 1u : 0u;
  for (int64_t j = j0 + 1; j < j1; ++j) {
    best = fmaxf(best, score[j]);
    c += chosen[j] == 0 ? 1u : 0u;
  }
  key = top_k_key(best, uint32_t(p));
  cost = c;
}

// One block per row. The pages taken are those before the first page whose running cost (pages
// in descending key order) exceeds k: the "boundary" page, whose key radix_select_key finds with
// each page weighted by its cost. Pages with a key above it are then marked. Up to
// kStagedPages pages, each page's key and cost are computed once into shared memory for the
// eight radix passes and the marks (computed again from the row by every pass, the passes'
// reads of the scores and marks were 15 us a call at 512 tokens on an H200).
constexpr int64_t kStagedPages = 2048;
__global__ void select_pages_kernel(RowsRef<const float> scores, RowsRef<uint8_t> selected,
                                    int64_t cols, int64_t page_size, int64_t k) {
  begin_dependent_grid();
  __shared__ unsigned scratch[32];
  __shared__ uint64_t staged_keys[kStagedPages];
  __shared__ unsigned staged_costs[kStagedPages];
  const int64_t r = blockIdx.x;
  const float* score = scores.data + r * scores.stride;
  uint8_t* chosen = selected.data + r * selected.stride;
  const int64_t pages = (cols + page_size - 1) / page_size;
  const bool staged = pages <= kStagedPages;
  auto page = [&](int64_t p, uint64_t& key, unsigned& cost) {
    if (staged) {
      key = staged_keys[p];
      cost = staged_costs[p];
    } else {
      page_key_cost(score, chosen, p, page_size, cols, key, cost);
    }
  };

  unsigned total = 0;
  for (int64_t p = threadIdx.x; p < pages; p += blockDim.x) {
    uint64_t key;
    unsigned cost;
    page_key_cost(score, chosen, p, page_size, cols, key, cost);
    if (staged) staged_keys[p] = key, staged_costs[p] = cost;
    total += cost;
  }
  total = block_reduce(total, SumOp{}, 0u, scratch);  // ends with a barrier: reads are done
  if (int64_t(total) <= k) {  // every page fits (pages costing 0 are fully selected already)
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) chosen[j] = 1;
    return;
  }

  // 0 < k < total <= 2^31
  const uint64_t prefix = radix_select_key<true>(pages, unsigned(k), page);
  // `prefix` is the boundary page's key. A page's columns are read and written by its one thread.
  for (int64_t p = threadIdx.x; p < pages; p += blockDim.x) {
    uint64_t key;
    unsigned cost;
    page(p, key, cost);
    if (cost == 0 || key <= prefix) continue;
    const int64_t j0 = p * page_size;
    const int64_t j1 = j0 + page_size < cols ? j0 + page_size : cols;
    for (int64_t j = j0; j < j1; ++j) chosen[j] = 1;
  }
}

}  // namespace

void launch_attention_logits(std::span<const LogitArgs> runs, int sm_count, cudaStream_t stream) {
  if (runs.empty()) return;
  const LogitArgs& first = runs[0];
  const auto alike = [&](const LogitArgs& run) {
    return run.heads == first.heads && run.kv_heads == first.kv_heads &&
           run.head_dim == first.head_dim && run.cache_dtype == first.cache_dtype;
  };
  if (runs.size() > 1 && !std::all_of(runs.begin(), runs.end(), alike)) {
    for (const LogitArgs& run : runs) launch_attention_logits({&run, 1}, sm_count, stream);
    return;
  }
  if (first.heads <= 0) return;
  // Enough key chunks to fill the GPU, strided beyond that; a captured step's grid is sized for
  // the whole cache (its context is known only on the device).
  int64_t keys = 0;
  for (const LogitArgs& run : runs)
    keys = std::max(keys, run.step_position != nullptr ? run.capacity : run.cols);
  if (keys <= 0) return;
  const int64_t chunk_keys = logit_chunk_keys(first.head_dim);
  const int64_t chunks = (keys + chunk_keys - 1) / chunk_keys;
  const int64_t most =
      (kLogitBlocksPerSm * int64_t(sm_count > 0 ? sm_count : 132) + first.kv_heads - 1) /
      first.kv_heads;
  const size_t shared_bytes = size_t(first.heads / first.kv_heads * first.head_dim) * sizeof(float);
  dispatch_weight(first.cache_dtype, [&](auto tag) {
    using C = decltype(tag);
    for_run_batches(runs, [&]<int kRuns>(const RunBatch<LogitArgs, kRuns>& batch, int count) {
      const dim3 grid(unsigned(chunks < most ? chunks : most), unsigned(first.kv_heads),
                      unsigned(count));
      launch_dependent(attention_logits_kernel<C, kRuns>, grid, kLogitThreads, shared_bytes, stream,
                       batch);
    });
  });
}

void launch_count_nonzero_rows(std::span<const CountArgs> masks, cudaStream_t stream) {
  int64_t rows = 0;
  for (const CountArgs& mask : masks) rows = std::max(rows, mask.rows);
  if (rows <= 0) return;
  for_run_batches<CountArgs, kCountMasks>(
      masks, [&]<int kMasks>(const RunBatch<CountArgs, kMasks>& batch, int count) {
        launch_dependent(count_nonzero_kernel<kMasks>, dim3(unsigned(rows), 1, unsigned(count)),
                         kThreads, 0, stream, batch);
      });
}

void launch_select_top_k(RowsRef<const float> scores, RowsRef<const uint8_t> eligible,
                         RowsRef<uint8_t> selected, int64_t rows, int64_t cols, int64_t k,
                         cudaStream_t stream, ForcedMarks forced) {
  if (rows <= 0 || cols <= 0) return;
  if (k <= 0) {
    if (forced.mark)
      launch_mark_columns(selected, eligible, rows, cols, forced.ones_end, forced.ones_begin,
                          stream);
    return;
  }
  // One block a row: a wider block for a longer row, whose passes are each a few loads a thread
  // (H200, 32 rows of 4096 columns: 13-50 us a call with 256 threads and plain atomics, 17-23 us
  // now; the rows staged in shared memory first changed nothing measurable, so they are not).
  // Many rows at once (tokenbutler's every layer, 15 x 32 rows for the 1B shape) fill the GPU
  // with narrow blocks instead: eight a multiprocessor, all resident in one wave (H200, 480 rows
  // of 4100 columns: 65 us; the same with 512 or 1024 threads; the rows staged in shared memory
  // 57 us against 59 us, a bisection over the ordered scores held in registers 170 us, one warp
  // a row bisecting its row staged in shared memory 134 us, so none of them is kept).
  const int threads = rows >= 256 ? kThreads : cols >= 4096 ? 1024 : cols >= 1024 ? 512 : kThreads;
  launch_dependent(select_top_k_kernel, unsigned(rows), threads, 0, stream, scores, eligible,
                   selected, cols, k, forced);
}

void launch_select_top_k_long_row(const float* scores, const uint8_t* eligible, uint8_t* selected,
                                  int64_t cols, int64_t k, LongRowSelect* state, int sm_count,
                                  cudaStream_t stream) {
  if (cols <= 0 || k <= 0) return;
  // Two blocks an SM: each reads its share of the row once per digit.
  const unsigned blocks = std::min(grid_for(cols, kThreads), unsigned(std::max(1, 2 * sm_count)));
  cudaMemsetAsync(state, 0, sizeof(LongRowSelect), stream);
  launch_dependent(long_row_count_kernel, blocks, kThreads, 0, stream, eligible, selected, cols,
                   state);
  for (int shift = 56; shift >= 0; shift -= 8) {
    launch_dependent(long_row_histogram_kernel, blocks, kThreads, 0, stream, scores, eligible,
                     selected, cols, k, shift, state);
    launch_dependent(long_row_digit_kernel, 1u, 32u, 0, stream, k, shift, state);
  }
  launch_dependent(long_row_mark_kernel, blocks, kThreads, 0, stream, scores, eligible, selected,
                   cols, k, state);
}

void launch_keep_selected(RowsRef<uint8_t> kept, RowsRef<const uint8_t> selected, int64_t rows,
                          int64_t cols, int64_t sinks, cudaStream_t stream) {
  if (rows * cols <= 0) return;
  launch_dependent(keep_selected_kernel, grid_for(rows * cols, kThreads), kThreads, 0, stream, kept,
                   selected, rows, cols, sinks);
}

void launch_fill_columns(RowsRef<uint8_t> mask, int64_t rows, int64_t begin, int64_t end,
                         uint8_t value, cudaStream_t stream) {
  const int64_t count = rows * (end - begin);
  if (count <= 0) return;
  launch_dependent(fill_columns_kernel, grid_for(count, kThreads), kThreads, 0, stream, mask, rows,
                   begin, end - begin, value);
}

void launch_mask_and(RowsRef<uint8_t> mask, RowsRef<const uint8_t> other, int64_t rows,
                     int64_t cols, cudaStream_t stream) {
  if (rows * cols <= 0) return;
  launch_dependent(mask_and_kernel, grid_for(rows * cols, kThreads), kThreads, 0, stream, mask,
                   other, rows, cols);
}

void launch_mark_columns(RowsRef<uint8_t> mask, RowsRef<const uint8_t> keep, int64_t rows,
                         int64_t cols, int64_t ones_end, int64_t ones_begin, cudaStream_t stream) {
  if (rows * cols <= 0) return;
  launch_dependent(mark_columns_kernel, grid_for(rows * cols, kThreads), kThreads, 0, stream, mask,
                   keep, rows, cols, ones_end, ones_begin);
}

void launch_accumulate_rows(RowsRef<float> acc, RowsRef<const float> x, RowsRef<const uint8_t> keep,
                            int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols <= 0) return;
  launch_dependent(accumulate_rows_kernel, grid_for(rows * cols, kThreads), kThreads, 0, stream,
                   acc, x, keep, rows, cols);
}

void launch_sum_row_groups(RowsRef<const float> x, int64_t groups, int64_t group, int64_t cols,
                           RowsRef<float> out, cudaStream_t stream) {
  if (groups * cols <= 0) return;
  launch_dependent(sum_row_groups_kernel, grid_for(groups * cols, kThreads), kThreads, 0, stream, x,
                   groups, group, cols, out);
}

void launch_expand_row_groups(RowsRef<const uint8_t> mask, int64_t rows, int64_t group,
                              int64_t cols, RowsRef<uint8_t> out, cudaStream_t stream) {
  if (rows * cols <= 0) return;
  launch_dependent(expand_row_groups_kernel, grid_for(rows * cols, kThreads), kThreads, 0, stream,
                   mask, rows, group, cols, out);
}

void launch_random_rows(uint64_t seed, uint64_t stream_id, int64_t rows, int64_t cols,
                        RowsRef<float> out, cudaStream_t stream) {
  if (rows * cols <= 0) return;
  launch_dependent(random_rows_kernel, grid_for(rows * cols, kThreads), kThreads, 0, stream, seed,
                   stream_id, rows, cols, out);
}

void launch_axpby_rows(RowsRef<float> y, float alpha, RowsRef<const float> x, float beta,
                       int64_t rows, bool broadcast, int64_t cols, cudaStream_t stream) {
  if (rows * cols <= 0) return;
  launch_dependent(axpby_rows_kernel, grid_for(rows * cols, kThreads), kThreads, 0, stream, y,
                   alpha, x, beta, rows, broadcast, cols);
}

void launch_pool_rows(RowsRef<const float> x, int64_t rows, int64_t cols, bool average,
                      int64_t kernel, RowsRef<float> out, cudaStream_t stream) {
  if (rows * cols <= 0) return;
  launch_dependent(pool_rows_kernel, grid_for(rows * cols, kThreads), kThreads, 0, stream, x, rows,
                   cols, average, kernel, out);
}

void launch_select_pages(RowsRef<const float> scores, RowsRef<uint8_t> selected, int64_t rows,
                         int64_t cols, int64_t page_size, int64_t k, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || k <= 0) return;
  launch_dependent(select_pages_kernel, unsigned(rows), kThreads, 0, stream, scores, selected, cols,
                   page_size, k);
}

namespace {

__global__ void zero_unless_kernel(float* rows, int64_t count, const uint8_t* keep) {
  begin_dependent_grid();
  if (keep[0] != 0) return;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x)
    rows[i] = 0.0f;
}

}  // namespace

void launch_zero_unless(float* rows, int64_t count, const uint8_t* keep, cudaStream_t stream) {
  if (count <= 0) return;
  launch_dependent(zero_unless_kernel, grid_for(count, kThreads), kThreads, 0, stream, rows, count,
                   keep);
}

}  // namespace kvlens::cuda
