// The CUDA backend's token-selection (policy) ops (engine/backend/backend.h, "token-selection
// ops"): argument checks, then the launchers of kernels/policy_ops.cu and the attention kernels.
// Row tensors are [rows, stride]; only the first `cols` columns are read or written.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/policy_op_math.h"
#include "engine/common/error.h"
#include "kernels/cuda_backend_impl.h"
#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {

cuda::LogitArgs CudaBackend::logit_args(const DeviceTensor& q, const DeviceTensor& k_cache,
                                        int64_t position, int64_t window,
                                        DeviceTensor& logits) const {
  const std::string op = "attention_logits";
  require(q, DType::F32, op, "q");
  const CacheShape cache = cache_shape(k_cache, op, "k_cache");
  if (q.shape.size() != 3 || q.dim(0) != 1 || q.dim(2) != cache.head_dim || cache.kv_heads == 0 ||
      q.dim(1) % cache.kv_heads != 0)
    bad_argument(op + ": q",
                 cat({"[1, H, ", std::to_string(cache.head_dim), "] with H a multiple of ",
                      std::to_string(cache.kv_heads), " KV heads"}),
                 describe(q));
  if (position < 0 || position >= cache.capacity)
    bad_argument(op + ": position",
                 cat({"a position below the capacity ", std::to_string(cache.capacity)}),
                 std::to_string(position));
  const int64_t cols = position + 1;
  require_cols(cols, op);
  const int64_t heads = q.dim(1);
  const RowShape shape = row_shape(logits, DType::F32, heads, cols, op, "logits");
  cuda::LogitArgs args;
  if (heads == 0) return args;
  args.q = q.as<float>();
  args.k_cache = k_cache.data;
  args.cache_dtype = k_cache.dtype;
  args.logits = rows_ref<float>(logits, shape);
  args.heads = heads;
  args.kv_heads = cache.kv_heads;
  args.head_dim = cache.head_dim;
  args.capacity = cache.capacity;
  args.cols = cols;
  args.lo = window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
  args.window = window;
  args.step_position = step_position(position, op);
  args.scale = attention_scale(cache.head_dim);
  return args;
}

void CudaBackend::attention_logits(const DeviceTensor& q, const DeviceTensor& k_cache,
                                   int64_t position, int64_t window, DeviceTensor& logits) {
  const cuda::LogitArgs args = logit_args(q, k_cache, position, window, logits);
  if (args.heads == 0) return;
  activate();
  cuda::launch_attention_logits({&args, 1}, sm_count_, stream());
  check_launch("attention_logits");
}

// Every run checked first, then batched launches (launch_attention_logits). `shared` is not
// used: each run's cache is read whole (the rows it shares with the others are in its own copy).
// The argument lists are per thread and reused: these run in every layer of a lockstep step.
void CudaBackend::attention_logits_runs(std::span<const RunAttention> runs, int64_t /*shared*/,
                                        int64_t position, int64_t window) {
  thread_local std::vector<cuda::LogitArgs> args;
  args.clear();
  for (const RunAttention& run : runs) {
    cuda::LogitArgs one = logit_args(*run.q, *run.k_cache, position, window, *run.logits);
    if (one.heads > 0) args.push_back(one);
  }
  if (args.empty()) return;
  activate();
  cuda::launch_attention_logits(args, sm_count_, stream());
  check_launch("attention_logits");
}

cuda::VisibleAttentionArgs CudaBackend::visible_args(const DeviceTensor& logits, int64_t cols,
                                                     const DeviceTensor* visible,
                                                     const DeviceTensor& v_cache, DeviceTensor& out,
                                                     DeviceTensor* probs) const {
  const std::string op = "attention_visible";
  require_cols(cols, op);
  const CacheShape cache = cache_shape(v_cache, op, "v_cache", cols);
  const RowShape logit_shape = row_shape(logits, DType::F32, -1, cols, op, "logits");
  const int64_t heads = logit_shape.rows;
  if (cache.kv_heads == 0 || heads % cache.kv_heads != 0)
    bad_argument(
        op + ": logits",
        cat({"a row count divisible by the ", std::to_string(cache.kv_heads), " KV heads"}),
        describe(logits));
  cuda::VisibleAttentionArgs args;
  args.logits = rows_ref<const float>(logits, logit_shape);
  if (visible)
    args.visible = rows_ref<const uint8_t>(
        *visible, row_shape(*visible, DType::U8, heads, cols, op, "visible"));
  if (probs)
    args.probs = rows_ref<float>(*probs, row_shape(*probs, DType::F32, heads, cols, op, "probs"));
  const bool want_out = !out.empty();
  if (!want_out && !probs) bad_argument(op + ": out", "an output tensor or probs", "neither");
  if (want_out) {
    require(out, DType::F32, op, "out");
    require_elements(out, heads * cache.head_dim, op, "out");
  }
  if (heads == 0) return args;
  args.v_cache = v_cache.data;
  args.cache_dtype = v_cache.dtype;
  args.out = want_out ? out.as<float>() : nullptr;
  args.heads = heads;
  args.kv_heads = cache.kv_heads;
  args.head_dim = cache.head_dim;
  args.capacity = cache.capacity;
  args.cols = cols;
  args.step_position = capture_.active ? step_position(cols - 1, op) : nullptr;
  return args;
}

// The split kernels' scratch is sized for the largest run (runs that take them go one at a time).
void CudaBackend::launch_visible(std::span<const cuda::VisibleAttentionArgs> runs) {
  int64_t floats = 0;
  for (const cuda::VisibleAttentionArgs& run : runs)
    floats = std::max(floats, cuda::visible_attention_scratch_floats(run, sm_count_));
  float* parts =
      static_cast<float*>(lane().attention_parts.get(device_, size_t(floats) * sizeof(float)));
  cuda::launch_attention_visible(runs, parts, sm_count_, stream());
  check_launch("attention_visible");
}

void CudaBackend::attention_visible(const DeviceTensor& logits, int64_t cols,
                                    const DeviceTensor* visible, const DeviceTensor& v_cache,
                                    DeviceTensor& out, DeviceTensor* probs) {
  const cuda::VisibleAttentionArgs args = visible_args(logits, cols, visible, v_cache, out, probs);
  if (args.heads == 0) return;
  activate();
  launch_visible({&args, 1});
}

void CudaBackend::attention_visible_runs(std::span<const RunAttention> runs, int64_t /*shared*/,
                                         int64_t cols) {
  thread_local std::vector<cuda::VisibleAttentionArgs> args;
  args.clear();
  for (const RunAttention& run : runs) {
    const cuda::VisibleAttentionArgs one =
        visible_args(*run.logits, cols, run.visible, *run.v_cache, *run.out, run.probs);
    if (one.heads > 0) args.push_back(one);
  }
  if (args.empty()) return;
  activate();
  launch_visible(args);
}

void CudaBackend::select_top_k(const DeviceTensor& scores, int64_t cols,
                               const DeviceTensor* eligible, int64_t k, DeviceTensor& selected) {
  const std::string op = "select_top_k";
  require_cols(cols, op);
  const RowShape shape = row_shape(selected, DType::U8, -1, cols, op, "selected");
  const RowShape score_shape = row_shape(scores, DType::F32, shape.rows, cols, op, "scores");
  const cuda::RowsRef<const uint8_t> allowed =
      optional_mask_ref(eligible, shape.rows, cols, op, "eligible");
  if (k <= 0 || cols == 0 || shape.rows == 0) return;
  activate();
  // One long row (Ada-KV's pooled top-k over a layer's heads) is split over many blocks; one
  // block per row is faster below a few blocks' worth of columns.
  constexpr int64_t kLongRow = 16384;
  if (shape.rows == 1 && cols >= kLongRow) {
    auto* state = static_cast<cuda::LongRowSelect*>(
        lane().select_state.get(device_, sizeof(cuda::LongRowSelect)));
    cuda::launch_select_top_k_long_row(rows_ref<const float>(scores, score_shape).data,
                                       allowed.data, rows_ref<uint8_t>(selected, shape).data, cols,
                                       k, state, sm_count_, stream());
  } else {
    cuda::launch_select_top_k(rows_ref<const float>(scores, score_shape), allowed,
                              rows_ref<uint8_t>(selected, shape), shape.rows, cols, k, stream());
  }
  check_launch("select_top_k");
}

void CudaBackend::fill_columns(DeviceTensor& mask, int64_t begin, int64_t end, uint8_t value) {
  const std::string op = "fill_columns";
  const RowShape shape = row_shape(mask, DType::U8, -1, 0, op, "mask");
  if (begin < 0 || end > shape.stride)
    bad_argument(op + ": columns", cat({"a range inside [0, ", std::to_string(shape.stride), ")"}),
                 cat({std::to_string(begin), ":", std::to_string(end)}));
  if (end <= begin || shape.rows == 0) return;
  activate();
  cuda::launch_fill_columns(rows_ref<uint8_t>(mask, shape), shape.rows, begin, end, value,
                            stream());
  check_launch("fill_columns");
}

// Counted where the mask lives: only the counts cross to the host (the default would copy the
// whole [rows, stride] mask, megabytes per layer for a long-context model).
void CudaBackend::count_nonzero_rows(const DeviceTensor& mask, int64_t cols,
                                     std::span<int64_t> counts) {
  const RowShape shape = counted_rows(mask, cols, counts);
  if (shape.rows == 0) return;
  auto* device_counts =
      static_cast<int64_t*>(lane().results.get(device_, size_t(shape.rows) * sizeof(int64_t)));
  const cuda::CountArgs args{rows_ref<const uint8_t>(mask, shape), shape.rows, cols, device_counts};
  cuda::launch_count_nonzero_rows({&args, 1}, stream());
  check_launch("count_nonzero_rows");
  copy_results(device_counts, counts.data(), size_t(shape.rows) * sizeof(int64_t));
}

void CudaBackend::mask_and(DeviceTensor& mask, const DeviceTensor& other, int64_t cols) {
  const std::string op = "mask_and";
  require_cols(cols, op);
  const RowShape shape = row_shape(mask, DType::U8, -1, cols, op, "mask");
  const RowShape other_shape = row_shape(other, DType::U8, shape.rows, cols, op, "other");
  if (shape.rows * cols == 0) return;
  activate();
  cuda::launch_mask_and(rows_ref<uint8_t>(mask, shape), rows_ref<const uint8_t>(other, other_shape),
                        shape.rows, cols, stream());
  check_launch("mask_and");
}

// mark_and_select_top_k with k = 0 (its checks are mark_columns'; scores are not read).
void CudaBackend::mark_columns(DeviceTensor& mask, int64_t cols, int64_t ones_end,
                               int64_t ones_begin, const DeviceTensor* keep) {
  mark_and_select_top_k(mask, cols, keep, ones_end, ones_begin, 0, mask);
}

void CudaBackend::mark_and_select_top_k(const DeviceTensor& scores, int64_t cols,
                                        const DeviceTensor* eligible, int64_t ones_end,
                                        int64_t ones_begin, int64_t k, DeviceTensor& selected) {
  // The checks of mark_columns, then select_top_k's (the same messages).
  const std::string mark_op = "mark_columns", select_op = "select_top_k";
  require_cols(cols, mark_op);
  const RowShape shape = row_shape(selected, DType::U8, -1, cols, mark_op, "mask");
  if (ones_end < 0 || ones_end > cols || ones_begin < 0 || ones_begin > cols)
    bad_argument(mark_op + ": columns", cat({"bounds inside [0, ", std::to_string(cols), "]"}),
                 cat({std::to_string(ones_end), ", ", std::to_string(ones_begin)}));
  const cuda::RowsRef<const uint8_t> allowed =
      optional_mask_ref(eligible, shape.rows, cols, mark_op, "keep");
  cuda::RowsRef<const float> score_rows;
  if (k > 0)
    score_rows = rows_ref<const float>(
        scores, row_shape(scores, DType::F32, shape.rows, cols, select_op, "scores"));
  if (shape.rows * cols == 0) return;
  activate();
  cuda::launch_select_top_k(score_rows, allowed, rows_ref<uint8_t>(selected, shape), shape.rows,
                            cols, k, stream(), {true, ones_end, ones_begin});
  check_launch(k > 0 ? "mark_and_select_top_k" : "mark_columns");
}

void CudaBackend::keep_selected(DeviceTensor& kept, const DeviceTensor& selected, int64_t cols,
                                int64_t sinks) {
  const std::string op = "keep_selected";
  require_cols(cols, op);
  const RowShape shape = row_shape(kept, DType::U8, -1, cols, op, "kept");
  const RowShape selected_shape = row_shape(selected, DType::U8, shape.rows, cols, op, "selected");
  if (shape.rows * cols == 0) return;
  activate();
  cuda::launch_keep_selected(rows_ref<uint8_t>(kept, shape),
                             rows_ref<const uint8_t>(selected, selected_shape), shape.rows, cols,
                             sinks, stream());
  check_launch("keep_selected");
}

void CudaBackend::accumulate_rows(DeviceTensor& acc, const DeviceTensor& x,
                                  const DeviceTensor* keep, int64_t cols) {
  const std::string op = "accumulate_rows";
  require_cols(cols, op);
  const RowShape shape = row_shape(acc, DType::F32, -1, cols, op, "acc");
  const RowShape x_shape = row_shape(x, DType::F32, shape.rows, cols, op, "x");
  const cuda::RowsRef<const uint8_t> kept = optional_mask_ref(keep, shape.rows, cols, op, "keep");
  if (shape.rows * cols == 0) return;
  activate();
  cuda::launch_accumulate_rows(rows_ref<float>(acc, shape), rows_ref<const float>(x, x_shape), kept,
                               shape.rows, cols, stream());
  check_launch("accumulate_rows");
}

void CudaBackend::sum_row_groups(const DeviceTensor& x, int64_t cols, int64_t group,
                                 DeviceTensor& out) {
  const std::string op = "sum_row_groups";
  require_cols(cols, op);
  const RowShape shape = row_shape(x, DType::F32, -1, cols, op, "x");
  if (group <= 0 || shape.rows % group != 0)
    bad_argument(op + ": group",
                 cat({"a positive divisor of the ", std::to_string(shape.rows), " rows"}),
                 std::to_string(group));
  const int64_t groups = shape.rows / group;
  const RowShape out_shape = row_shape(out, DType::F32, groups, cols, op, "out");
  if (groups * cols == 0) return;
  activate();
  cuda::launch_sum_row_groups(rows_ref<const float>(x, shape), groups, group, cols,
                              rows_ref<float>(out, out_shape), stream());
  check_launch("sum_row_groups");
}

void CudaBackend::expand_row_groups(const DeviceTensor& mask, int64_t cols, int64_t group,
                                    DeviceTensor& out) {
  const std::string op = "expand_row_groups";
  require_cols(cols, op);
  if (group <= 0) bad_argument(op + ": group", "a positive group size", std::to_string(group));
  const RowShape shape = row_shape(mask, DType::U8, -1, cols, op, "mask");
  const RowShape out_shape = row_shape(out, DType::U8, shape.rows * group, cols, op, "out");
  if (out_shape.rows * cols == 0) return;
  activate();
  cuda::launch_expand_row_groups(rows_ref<const uint8_t>(mask, shape), out_shape.rows, group, cols,
                                 rows_ref<uint8_t>(out, out_shape), stream());
  check_launch("expand_row_groups");
}

void CudaBackend::random_rows(uint64_t seed, uint64_t stream_id, int64_t cols, DeviceTensor& out) {
  const std::string op = "random_rows";
  require_cols(cols, op);
  const RowShape shape = row_shape(out, DType::F32, -1, cols, op, "out");
  if (shape.rows * cols == 0) return;
  activate();
  cuda::launch_random_rows(seed, stream_id, shape.rows, cols, rows_ref<float>(out, shape),
                           stream());
  check_launch("random_rows");
}

void CudaBackend::axpby_rows(DeviceTensor& y, float alpha, const DeviceTensor& x, float beta,
                             int64_t cols) {
  const std::string op = "axpby_rows";
  require_cols(cols, op);
  const RowShape shape = row_shape(y, DType::F32, -1, cols, op, "y");
  const RowShape x_shape = row_shape(x, DType::F32, -1, cols, op, "x");
  if (x_shape.rows != shape.rows && x_shape.rows != 1)
    bad_argument(op + ": x", cat({"1 or ", std::to_string(shape.rows), " rows"}), describe(x));
  if (shape.rows * cols == 0) return;
  activate();
  cuda::launch_axpby_rows(rows_ref<float>(y, shape), alpha, rows_ref<const float>(x, x_shape), beta,
                          shape.rows, x_shape.rows != shape.rows, cols, stream());
  check_launch("axpby_rows");
}

void CudaBackend::pool_rows(const DeviceTensor& x, int64_t cols, Pool pool, int64_t kernel,
                            DeviceTensor& out) {
  const std::string op = "pool_rows";
  require_cols(cols, op);
  if (kernel < 1 || kernel % 2 == 0 || kernel > INT32_MAX)
    bad_argument(op + ": kernel", "an odd kernel size >= 1", std::to_string(kernel));
  const RowShape shape = row_shape(x, DType::F32, -1, cols, op, "x");
  const RowShape out_shape = row_shape(out, DType::F32, shape.rows, cols, op, "out");
  if (shape.rows * cols == 0) return;
  if (x.data == out.data) bad_argument(op + ": out", "a tensor apart from x", "x itself");
  activate();
  cuda::launch_pool_rows(rows_ref<const float>(x, shape), shape.rows, cols, pool == Pool::Average,
                         kernel, rows_ref<float>(out, out_shape), stream());
  check_launch("pool_rows");
}

void CudaBackend::select_pages(const DeviceTensor& scores, int64_t cols, int64_t page_size,
                               int64_t k, DeviceTensor& selected) {
  const std::string op = "select_pages";
  require_cols(cols, op);
  require_page_size(page_size, op);
  const RowShape shape = row_shape(selected, DType::U8, -1, cols, op, "selected");
  const RowShape score_shape = row_shape(scores, DType::F32, shape.rows, cols, op, "scores");
  if (k <= 0 || cols == 0 || shape.rows == 0) return;
  activate();
  cuda::launch_select_pages(rows_ref<const float>(scores, score_shape),
                            rows_ref<uint8_t>(selected, shape), shape.rows, cols, page_size, k,
                            stream());
  check_launch("select_pages");
}

void CudaBackend::zero_unless(DeviceTensor& rows, const DeviceTensor& keep) {
  const std::string op = "zero_unless";
  require(rows, DType::F32, op, "rows");
  require(keep, DType::U8, op, "keep");
  if (elements(keep) < 1) bad_argument(op + ": keep", "at least one element", describe(keep));
  activate();
  cuda::launch_zero_unless(rows.as<float>(), elements(rows), keep.as<uint8_t>(), stream());
  check_launch(op.c_str());
}

// One cache [G, capacity, D] of F32, BF16 or F16 (a KV cache in the model's dtype); with
// cols >= 0 it must hold that many positions.
CudaBackend::CacheShape CudaBackend::cache_shape(const DeviceTensor& cache, const std::string& op,
                                                 const char* name, int64_t cols) {
  require_weight(cache, op, name);
  if (cache.shape.size() != 3) bad_argument(op + ": " + name, "[G, capacity, D]", describe(cache));
  const CacheShape shape{cache.dim(0), cache.dim(1), cache.dim(2)};
  if (cols > shape.capacity)
    bad_argument(op + ": cols", cat({"at most the capacity ", std::to_string(shape.capacity)}),
                 std::to_string(cols));
  return shape;
}

void CudaBackend::require_page_size(int64_t page_size, const std::string& op) {
  if (page_size < 1)
    bad_argument(op + ": page_size", "a page size >= 1", std::to_string(page_size));
}

CudaBackend::CacheShape CudaBackend::cache_shape(const DeviceTensor& k_cache,
                                                 const DeviceTensor& v_cache,
                                                 const std::string& op) {
  cache_shape(k_cache, op, "k_cache");
  if (v_cache.shape != k_cache.shape || v_cache.dtype != k_cache.dtype)
    bad_argument(op + ": v_cache",
                 "the dtype and shape of k_cache " + std::string(dtype_name(k_cache.dtype)) +
                     shape_string(k_cache.shape),
                 describe(v_cache));
  return {k_cache.dim(0), k_cache.dim(1), k_cache.dim(2)};
}

}  // namespace kvlens::cuda
