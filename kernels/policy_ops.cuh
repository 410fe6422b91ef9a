// Token-selection (policy) kernels of the CUDA backend's core ops; the contracts are those of
// backend.h. The policies' own ops (op extensions) are in kernels/policy/.
// Row buffers are [rows, stride] row-major and only columns j < cols are touched; every operand
// has its own stride. KV caches are read in their own dtype (F32, BF16 or F16), widened exactly.
// Launchers only enqueue on `stream`; the backend checks the arguments first and the launch
// afterwards.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

template <typename T>
struct RowsRef {
  T* data = nullptr;  // null for an absent optional operand
  int64_t stride = 0;
};

// logits[h, j] = q[h, :] . k_cache[h / (H / G), j, :] * scale for lo <= j < cols, -inf for
// j < lo. One warp per key, with the attention kernel's dot (bit-identical logits). With
// step_position set (a captured step), the position comes from device memory: cols = *p + 1 and
// lo from `window`.
struct LogitArgs {
  const float* q = nullptr;       // [heads, head_dim]
  const void* k_cache = nullptr;  // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;
  RowsRef<float> logits;  // [heads, stride]
  int64_t heads = 0, kv_heads = 0, head_dim = 0, capacity = 0;
  int64_t cols = 0, lo = 0, window = 0;
  const int64_t* step_position = nullptr;
  float scale = 1.0f;
};
// One launch for up to kBatchRuns runs (device_common.cuh) of one layer at one position: a
// lockstep step's. Runs that differ in head counts, head dimension or cache dtype go one at a
// time.
void launch_attention_logits(std::span<const LogitArgs> runs, int sm_count, cudaStream_t stream);

// Softmax of each logits row over its visible columns, the weighted sum of value rows, and the
// probabilities (0 where hidden), split over slices of the context (visible_attention.cu).
struct VisibleAttentionArgs {
  RowsRef<const float> logits;     // [heads, stride]
  RowsRef<const uint8_t> visible;  // optional [heads, stride]
  const void* v_cache = nullptr;   // [kv_heads, capacity, head_dim] of cache_dtype
  DType cache_dtype = DType::F32;
  float* out = nullptr;  // [heads, head_dim]; null: probabilities only
  RowsRef<float> probs;  // optional [heads, stride]
  int64_t heads = 0, kv_heads = 0, head_dim = 0, capacity = 0, cols = 0;
  const int64_t* step_position = nullptr;  // set: cols = *step_position + 1 (a captured step)
};
// Floats of scratch launch_attention_visible needs for `args` on a GPU of sm_count SMs.
int64_t visible_attention_scratch_floats(const VisibleAttentionArgs& args, int sm_count);
// Each run takes the path it would take alone (its capacity decides): the one-kernel runs (at
// most 1024 positions) in one launch where they share head count, head dimension and cache dtype
// (a lockstep step's do), the others one after another over the same scratch (sized for the
// largest run).
void launch_attention_visible(std::span<const VisibleAttentionArgs> runs, float* scratch,
                              int sm_count, cudaStream_t stream);

// Per row: marks the k best unselected eligible columns under top_k_key's order (a radix select
// of the k-th key, one block per row).
// launch_select_top_k_long_row: the same for one row by many blocks (a row too long for one
// block: Ada-KV's heads laid end to end), with `state` (device memory) for the passes between
// kernels; the same columns.
struct LongRowSelect {
  unsigned histogram[256];
  uint64_t prefix;
  unsigned remaining;
  unsigned count;
};
void launch_select_top_k_long_row(const float* scores, const uint8_t* eligible, uint8_t* selected,
                                  int64_t cols, int64_t k, LongRowSelect* state, int sm_count,
                                  cudaStream_t stream);
// With forced.mark, each row is first marked as launch_mark_columns marks it (keep = eligible),
// in the same launch; k <= 0 then marks only.
struct ForcedMarks {
  bool mark = false;
  int64_t ones_end = 0, ones_begin = 0;
};
void launch_select_top_k(RowsRef<const float> scores, RowsRef<const uint8_t> eligible,
                         RowsRef<uint8_t> selected, int64_t rows, int64_t cols, int64_t k,
                         cudaStream_t stream, ForcedMarks forced = {});
// kept[r, j] = j < sinks || (kept[r, j] && selected[r, j]), j < cols.
void launch_keep_selected(RowsRef<uint8_t> kept, RowsRef<const uint8_t> selected, int64_t rows,
                          int64_t cols, int64_t sinks, cudaStream_t stream);

// mask[r, begin:end] = value (begin < end).
void launch_fill_columns(RowsRef<uint8_t> mask, int64_t rows, int64_t begin, int64_t end,
                         uint8_t value, cudaStream_t stream);
// counts[r] = the nonzero bytes of mask[r, 0:cols] for r < rows (one block per row; counts in
// device memory), for up to kCountMasks masks a launch (a step's masks of every run and layer).
struct CountArgs {
  RowsRef<const uint8_t> mask;
  int64_t rows = 0, cols = 0;
  int64_t* counts = nullptr;
};
constexpr int kCountMasks = 64;  // 64 x 40 bytes of arguments: within the 4 KiB limit
void launch_count_nonzero_rows(std::span<const CountArgs> masks, cudaStream_t stream);
// mask[r, j] = mask[r, j] && other[r, j] (0/1).
void launch_mask_and(RowsRef<uint8_t> mask, RowsRef<const uint8_t> other, int64_t rows,
                     int64_t cols, cudaStream_t stream);
// mask[r, j] = (j < ones_end || ones_begin <= j) && (keep[r, j] != 0) (keep optional), j < cols.
void launch_mark_columns(RowsRef<uint8_t> mask, RowsRef<const uint8_t> keep, int64_t rows,
                         int64_t cols, int64_t ones_end, int64_t ones_begin, cudaStream_t stream);
// acc[r, j] = keep[r, j] ? acc[r, j] + x[r, j] : x[r, j] (keep optional).
void launch_accumulate_rows(RowsRef<float> acc, RowsRef<const float> x, RowsRef<const uint8_t> keep,
                            int64_t rows, int64_t cols, cudaStream_t stream);
// out[g, j] = x[g * group, j] + x[g * group + 1, j] + ... in that order.
void launch_sum_row_groups(RowsRef<const float> x, int64_t groups, int64_t group, int64_t cols,
                           RowsRef<float> out, cudaStream_t stream);
// out[r, j] = mask[r / group, j] for r < rows.
void launch_expand_row_groups(RowsRef<const uint8_t> mask, int64_t rows, int64_t group,
                              int64_t cols, RowsRef<uint8_t> out, cudaStream_t stream);
// out[r, j] = random_unit(seed, stream_id, r, j) (engine/backend/policy_op_math.h).
void launch_random_rows(uint64_t seed, uint64_t stream_id, int64_t rows, int64_t cols,
                        RowsRef<float> out, cudaStream_t stream);

// y[r, j] = beta == 0 ? alpha * x[r', j] : fma(alpha, x[r', j], beta * y[r, j]), r' = r or 0
// (x_rows == 1: broadcast).
void launch_axpby_rows(RowsRef<float> y, float alpha, RowsRef<const float> x, float beta,
                       int64_t rows, bool broadcast, int64_t cols, cudaStream_t stream);
// out[r, j] = max (fmaxf) or sum-then-divide-by-kernel of x[r, j - kernel/2 .. j + kernel/2]
// clipped to [0, cols), in increasing column order (odd kernel).
void launch_pool_rows(RowsRef<const float> x, int64_t rows, int64_t cols, bool average,
                      int64_t kernel, RowsRef<float> out, cudaStream_t stream);
// Per row: whole pages best first (top_k_key of the page's fmax score, page index) while their
// unselected columns fit in k; a cost-weighted radix select of the first page that does not
// fit, one block per row.
void launch_select_pages(RowsRef<const float> scores, RowsRef<uint8_t> selected, int64_t rows,
                         int64_t cols, int64_t page_size, int64_t k, cudaStream_t stream);

// Backend::zero_unless: rows[0 .. count) = 0 where keep[0] == 0.
void launch_zero_unless(float* rows, int64_t count, const uint8_t* keep, cudaStream_t stream);

}  // namespace kvlens::cuda
