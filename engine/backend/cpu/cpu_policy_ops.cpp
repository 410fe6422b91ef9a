// The CPU backend's token-selection (policy) ops other than the policy path's attention (that
// is cpu_attention_ops.cpp); contracts in backend.h. Row tensors are [rows, stride] with
// stride >= cols; each operand may have its own stride. The per-head ops run on the thread pool;
// the element-wise ones are single loops (a few KB per call).
#include "engine/backend/cpu/cpu_policy_ops.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/policy_op_math.h"

namespace kvlens::cpu_policy {

using namespace cpu_checks;  // require*, describe, cat, shape_string, row_shape, grain_for

void select_top_k(const Context& context, const DeviceTensor& scores, int64_t cols,
                  const DeviceTensor* eligible, int64_t k, DeviceTensor& selected) {
  const OpName op{"select_top_k"};
  require_cols(cols, op);
  const RowShape selected_shape = row_shape(selected, DType::U8, -1, cols, op + ": selected");
  const int64_t rows = selected_shape.rows;
  const RowShape score_shape = row_shape(scores, DType::F32, rows, cols, op + ": scores");
  RowShape eligible_shape;
  if (eligible) eligible_shape = row_shape(*eligible, DType::U8, rows, cols, op + ": eligible");
  if (k <= 0 || cols == 0 || rows == 0) return;

  const TopKRowFn top_k = context.kernels.top_k;
  context.pool.parallel_for(
      0, rows,
      [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          top_k(scores.as<const float>() + r * score_shape.stride,
                eligible ? eligible->as<const uint8_t>() + r * eligible_shape.stride : nullptr,
                cols, k, selected.as<uint8_t>() + r * selected_shape.stride);
        }
      },
      grain_for(cols * 8));
}

void fill_columns(DeviceTensor& mask, int64_t begin, int64_t end, uint8_t value) {
  const OpName op{"fill_columns"};
  const RowShape shape = row_shape(mask, DType::U8, -1, 0, op + ": mask");
  KVLENS_REQUIRE(begin >= 0 && end <= shape.stride, op + ": columns",
                 cat("a range inside [0, ", shape.stride, ")"), cat(begin, ":", end));
  if (end <= begin) return;
  for (int64_t r = 0; r < shape.rows; ++r)
    std::memset(mask.as<uint8_t>() + r * shape.stride + begin, value, size_t(end - begin));
}

// Counted where the mask lives: no copy of the rows (the lockstep counts every run's mask at
// every layer).
KVLENS_POLICY_CLONES void count_nonzero_rows(const DeviceTensor& mask, int64_t cols,
                                             std::span<int64_t> counts) {
  const OpName op{"count_nonzero_rows"};
  require_cols(cols, op);
  const RowShape shape = row_shape(mask, DType::U8, int64_t(counts.size()), cols, op + ": mask");
  for (int64_t r = 0; r < shape.rows; ++r)
    counts[size_t(r)] = count_nonzero(mask.as<const uint8_t>() + r * shape.stride, cols);
}

KVLENS_POLICY_CLONES void mask_and(DeviceTensor& mask, const DeviceTensor& other, int64_t cols) {
  const OpName op{"mask_and"};
  require_cols(cols, op);
  const RowShape shape = row_shape(mask, DType::U8, -1, cols, op + ": mask");
  const RowShape other_shape = row_shape(other, DType::U8, shape.rows, cols, op + ": other");
  for (int64_t r = 0; r < shape.rows; ++r) {
    uint8_t* m = mask.as<uint8_t>() + r * shape.stride;
    const uint8_t* o = other.as<const uint8_t>() + r * other_shape.stride;
    // Bitwise & of the two tests: no branch, so the loop vectorises.
    for (int64_t j = 0; j < cols; ++j) m[j] = uint8_t((m[j] != 0) & (o[j] != 0));
  }
}

KVLENS_POLICY_CLONES void accumulate_rows(DeviceTensor& acc, const DeviceTensor& x,
                                          const DeviceTensor* keep, int64_t cols) {
  const OpName op{"accumulate_rows"};
  require_cols(cols, op);
  const RowShape shape = row_shape(acc, DType::F32, -1, cols, op + ": acc");
  const RowShape x_shape = row_shape(x, DType::F32, shape.rows, cols, op + ": x");
  RowShape keep_shape;
  if (keep) keep_shape = row_shape(*keep, DType::U8, shape.rows, cols, op + ": keep");
  for (int64_t r = 0; r < shape.rows; ++r) {
    float* a = acc.as<float>() + r * shape.stride;
    const float* add = x.as<const float>() + r * x_shape.stride;
    // acc * keep + x without the multiply: a dropped score is replaced even when it is inf/NaN.
    if (!keep) {
      for (int64_t j = 0; j < cols; ++j) a[j] += add[j];
      continue;
    }
    // A dropped score enters the sum as -0 (-0 + x is x, bit for bit), selected with integer
    // masks: a loop GCC vectorizes (a branch per column was scalar and mispredicted on eviction
    // patterns).
    float* __restrict to = a;
    const float* __restrict from = add;
    const uint8_t* __restrict kept = keep->as<const uint8_t>() + r * keep_shape.stride;
    for (int64_t j = 0; j < cols; ++j) {
      const uint32_t keep_bits = 0u - uint32_t(kept[j] != 0);
      const uint32_t bits =
          (std::bit_cast<uint32_t>(to[j]) & keep_bits) | (~keep_bits & 0x80000000u);
      to[j] = std::bit_cast<float>(bits) + from[j];
    }
  }
}

KVLENS_POLICY_CLONES void sum_row_groups(const DeviceTensor& x, int64_t cols, int64_t group,
                                         DeviceTensor& out) {
  const OpName op{"sum_row_groups"};
  require_cols(cols, op);
  const RowShape shape = row_shape(x, DType::F32, -1, cols, op + ": x");
  KVLENS_REQUIRE(group > 0 && shape.rows % group == 0, op + ": group",
                 cat("a positive divisor of the ", shape.rows, " rows"), std::to_string(group));
  const int64_t groups = shape.rows / group;
  const RowShape out_shape = row_shape(out, DType::F32, groups, cols, op + ": out");
  // Rows added in order to the first one (the CUDA kernel sums in the same order), a block of
  // columns at a time so that the partial sums stay in L1 while every row of the group passes.
  constexpr int64_t kBlockColumns = 256;
  for (int64_t g = 0; g < groups; ++g) {
    float* sum = out.as<float>() + g * out_shape.stride;
    const float* first = x.as<const float>() + g * group * shape.stride;
    for (int64_t j0 = 0; j0 < cols; j0 += kBlockColumns) {
      const int64_t j1 = std::min(cols, j0 + kBlockColumns);
      std::memmove(sum + j0, first + j0, size_t(j1 - j0) * sizeof(float));
      for (int64_t i = 1; i < group; ++i) {
        const float* row = first + i * shape.stride;
        for (int64_t j = j0; j < j1; ++j) sum[j] += row[j];
      }
    }
  }
}

KVLENS_POLICY_CLONES void expand_row_groups(const DeviceTensor& mask, int64_t cols, int64_t group,
                                            DeviceTensor& out) {
  const OpName op{"expand_row_groups"};
  require_cols(cols, op);
  KVLENS_REQUIRE(group > 0, op + ": group", "a positive group size", std::to_string(group));
  const RowShape shape = row_shape(mask, DType::U8, -1, cols, op + ": mask");
  const RowShape out_shape = row_shape(out, DType::U8, shape.rows * group, cols, op + ": out");
  for (int64_t r = 0; r < out_shape.rows; ++r)
    std::memmove(out.as<uint8_t>() + r * out_shape.stride,
                 mask.as<const uint8_t>() + (r / group) * shape.stride, size_t(cols));
}

KVLENS_POLICY_CLONES_V4 void random_rows(uint64_t seed, uint64_t stream, int64_t cols,
                                         DeviceTensor& out) {
  const OpName op{"random_rows"};
  require_cols(cols, op);
  const RowShape shape = row_shape(out, DType::F32, -1, cols, op + ": out");
  for (int64_t r = 0; r < shape.rows; ++r) {
    float* row = out.as<float>() + r * shape.stride;
    const uint64_t row_hash = random_row_hash(seed, stream, uint64_t(r));
    for (int64_t j = 0; j < cols; ++j) row[j] = random_unit_in_row(row_hash, uint64_t(j));
  }
}

void axpby_rows(const Context& context, DeviceTensor& y, float alpha, const DeviceTensor& x,
                float beta, int64_t cols) {
  const OpName op{"axpby_rows"};
  require_cols(cols, op);
  const RowShape shape = row_shape(y, DType::F32, -1, cols, op + ": y");
  const RowShape x_shape = row_shape(x, DType::F32, -1, cols, op + ": x");
  KVLENS_REQUIRE(x_shape.rows == shape.rows || x_shape.rows == 1, op + ": x",
                 cat("1 or ", shape.rows, " rows"), describe(x));
  const bool broadcast = x_shape.rows != shape.rows;
  for (int64_t r = 0; r < shape.rows; ++r) {
    float* out = y.as<float>() + r * shape.stride;
    const float* in = x.as<const float>() + (broadcast ? 0 : r) * x_shape.stride;
    // The CUDA kernel computes __fmaf_rn(alpha, x, __fmul_rn(beta, y)): the same two roundings.
    context.kernels.axpby(alpha, in, beta, out, cols);
  }
}

KVLENS_POLICY_CLONES void pool_rows(const DeviceTensor& x, int64_t cols, Backend::Pool pool,
                                    int64_t kernel, DeviceTensor& out) {
  const OpName op{"pool_rows"};
  require_cols(cols, op);
  KVLENS_REQUIRE(kernel >= 1 && kernel % 2 == 1 && kernel <= std::numeric_limits<int32_t>::max(),
                 op + ": kernel", "an odd kernel size >= 1", std::to_string(kernel));
  const RowShape shape = row_shape(x, DType::F32, -1, cols, op + ": x");
  const RowShape out_shape = row_shape(out, DType::F32, shape.rows, cols, op + ": out");
  KVLENS_REQUIRE(x.data != out.data || shape.rows * cols == 0, op + ": out",
                 "a tensor apart from x", "x itself");
  const int64_t half = kernel / 2;
  const float divisor = float(kernel);
  // Every output folds its in-range inputs from the lowest column up, from the first value (max)
  // or from +0 (average). Columns whose whole kernel is in range run kernel-offset by kernel
  // offset over all of them at once (a loop the compiler vectorises); the few at the edges, one
  // by one. Both give each output the same sequence of operations.
  const int64_t inner_begin = std::min(half, cols), inner_end = std::max(inner_begin, cols - half);
  for (int64_t r = 0; r < shape.rows; ++r) {
    const float* in = x.as<const float>() + r * shape.stride;
    float* o = out.as<float>() + r * out_shape.stride;
    auto one_column = [&](int64_t j) {
      const int64_t lo = std::max<int64_t>(0, j - half), hi = std::min(cols - 1, j + half);
      if (pool == Backend::Pool::Max) {
        float m = in[lo];
        for (int64_t i = lo + 1; i <= hi; ++i) m = fmax_inline(m, in[i]);
        o[j] = m;
      } else {
        float sum = 0.0f;
        for (int64_t i = lo; i <= hi; ++i) sum += in[i];
        o[j] = sum / divisor;
      }
    };
    for (int64_t j = 0; j < inner_begin; ++j) one_column(j);
    for (int64_t j = inner_end; j < cols; ++j) one_column(j);
    if (inner_end <= inner_begin) continue;
    // in[j - half + i] is input i of output j's kernel.
    const float* lowest = in + (inner_begin - half);
    float* inner = o + inner_begin;
    const int64_t count = inner_end - inner_begin;
    if (pool == Backend::Pool::Max) {
      for (int64_t j = 0; j < count; ++j) inner[j] = lowest[j];
      for (int64_t i = 1; i < kernel; ++i)
        for (int64_t j = 0; j < count; ++j) inner[j] = fmax_inline(inner[j], lowest[j + i]);
    } else {
      for (int64_t j = 0; j < count; ++j) inner[j] = 0.0f + lowest[j];
      for (int64_t i = 1; i < kernel; ++i)
        for (int64_t j = 0; j < count; ++j) inner[j] += lowest[j + i];
      for (int64_t j = 0; j < count; ++j) inner[j] /= divisor;
    }
  }
}

namespace {

// A KV head's scratch for key_anchor_group, kept by the task between its groups.
struct AnchorScratch {
  std::vector<float> key_norms, inverse, anchors, anchor_norms;
  std::vector<uint8_t> same_as_previous;
  std::vector<int32_t> member_columns;
};

// key_anchor_scores of one KV head: keys [cols, head_dim], its rows_per_group member rows and
// output rows. AVX2 where the CPU has it: the loops are element-wise or keep their own lane
// order, and AVX2 without FMA contracts nothing, so both clones give the same bits.
KVLENS_POLICY_CLONES void key_anchor_group(const DotKernels& kernels, const float* keys,
                                           int64_t cols, int64_t head_dim, const uint8_t* members,
                                           int64_t member_stride, int64_t rows_per_group, float* o,
                                           int64_t out_stride, AnchorScratch& scratch) {
  static constexpr float kTiny = 1e-12f;
  scratch.key_norms.resize(size_t(cols));
  scratch.inverse.resize(size_t(cols));
  scratch.anchors.resize(size_t(rows_per_group * head_dim));
  scratch.anchor_norms.resize(size_t(rows_per_group));
  scratch.same_as_previous.resize(size_t(rows_per_group));
  scratch.member_columns.resize(size_t(cols));
  float* const key_norms = scratch.key_norms.data();
  float* const inverse = scratch.inverse.data();
  float* const anchors = scratch.anchors.data();
  int32_t* const member_columns = scratch.member_columns.data();
  // Squared lengths in 8 lanes (d mod 8) and one fixed fold (cpu_row_kernels.h).
  kernels.squared_norms(keys, cols, head_dim, key_norms);
  // Separate loops so that the square roots and divisions vectorise (correctly rounded either
  // way); the inverse is computed once for all rows of the group.
  for (int64_t j = 0; j < cols; ++j) key_norms[j] = std::max(std::sqrt(key_norms[j]), kTiny);
  for (int64_t j = 0; j < cols; ++j) inverse[j] = 1.0f / key_norms[j];
  // Rows of the group with the same members as the row before them (keydiff's query heads at
  // query_head granularity always are) share its anchor and its scores.
  int64_t distinct = 0;
  for (int64_t i = 0; i < rows_per_group; ++i) {
    const uint8_t* member = members + i * member_stride;
    if (i > 0 && std::memcmp(member, member - member_stride, size_t(cols)) == 0) {
      scratch.same_as_previous[size_t(i)] = 1;
      continue;
    }
    scratch.same_as_previous[size_t(i)] = 0;
    float* anchor = anchors + distinct * head_dim;
    // The member columns first (no branch per key: about half are members), then each anchor
    // element's sum over them in ascending j, 16 elements held in registers.
    int64_t count = 0;
    for (int64_t j = 0; j < cols; ++j) {
      member_columns[count] = int32_t(j);
      count += member[j] != 0;
    }
    constexpr int64_t kChunk = 16;
    int64_t d0 = 0;
    for (; d0 + kChunk <= head_dim; d0 += kChunk) {
      float sums[kChunk] = {};
      for (int64_t m = 0; m < count; ++m) {
        const int64_t j = member_columns[m];
        const float* k = keys + j * head_dim + d0;
        const float inv = inverse[j];
        for (int64_t d = 0; d < kChunk; ++d) sums[d] += k[d] * inv;
      }
      std::copy(sums, sums + kChunk, anchor + d0);
    }
    for (int64_t d = d0; d < head_dim; ++d) {
      float sum = 0.0f;
      for (int64_t m = 0; m < count; ++m) {
        const int64_t j = member_columns[m];
        sum += keys[j * head_dim + d] * inverse[j];
      }
      anchor[d] = sum;
    }
    if (count > 0)
      for (int64_t d = 0; d < head_dim; ++d) anchor[d] /= float(count);
    float anchor_squared = 0.0f;
    kernels.squared_norms(anchor, 1, head_dim, &anchor_squared);
    scratch.anchor_norms[size_t(distinct)] = std::max(std::sqrt(anchor_squared), kTiny);
    ++distinct;
  }
  // The distinct rows' scores go to the first `distinct` rows of the group, then move to their
  // own rows (last first: a row only moves down) and the repeated rows copy them.
  kernels.attention_logits(anchors, head_dim, int(distinct), keys, head_dim, 0, cols - 1, 1.0f, o,
                           out_stride);
  for (int64_t i = 0; i < distinct; ++i) {
    float* row = o + i * out_stride;
    const float anchor_norm = scratch.anchor_norms[size_t(i)];
    for (int64_t j = 0; j < cols; ++j) row[j] = -row[j] / (key_norms[j] * anchor_norm);
  }
  int64_t source = distinct;
  for (int64_t i = rows_per_group - 1; i >= 0; --i) {
    if (scratch.same_as_previous[size_t(i)]) continue;
    --source;
    if (source != i) std::memcpy(o + i * out_stride, o + source * out_stride, size_t(cols) * 4);
  }
  for (int64_t i = 1; i < rows_per_group; ++i) {
    if (scratch.same_as_previous[size_t(i)])
      std::memcpy(o + i * out_stride, o + (i - 1) * out_stride, size_t(cols) * 4);
  }
}

}  // namespace

void key_anchor_scores(const Context& context, const DeviceTensor& k_cache, int64_t cols,
                       const DeviceTensor& members, DeviceTensor& out) {
  const OpName op{"key_anchor_scores"};
  require_cols(cols, op);
  const CacheShape cache_dims = cache_shape(k_cache, cols, op, "k_cache");
  const int64_t groups = cache_dims.groups, capacity = cache_dims.capacity,
                head_dim = cache_dims.head_dim;
  const RowShape shape = row_shape(out, DType::F32, -1, cols, op + ": out");
  const int64_t rows = shape.rows;
  KVLENS_REQUIRE(groups > 0 && rows % groups == 0, op + ": out",
                 cat("a row count that is a multiple of the ", groups, " KV heads"), describe(out));
  // Members per row, or one row per KV head: that row then serves each of the head's rows (a
  // stride of 0; equal rows share one anchor below).
  const bool per_group = members.shape.size() == 2 && members.dim(0) == groups && groups != rows;
  const RowShape member_shape =
      row_shape(members, DType::U8, per_group ? groups : rows, cols, op + ": members");
  if (rows == 0 || cols == 0) return;
  const int64_t rows_per_group = rows / groups;
  const int64_t member_rows_per_group = per_group ? 1 : rows_per_group;
  const int64_t member_stride = per_group ? 0 : member_shape.stride;
  // One task per KV head: its keys' lengths are computed once for all of its rows, and the
  // dots of every key with the rows' anchors are one pass of the attention logits kernel.
  context.pool.parallel_for(
      0, groups,
      [&](int64_t begin, int64_t end) {
        thread_local AnchorScratch scratch;
        for (int64_t g = begin; g < end; ++g) {
          key_anchor_group(
              context.kernels, k_cache.as<const float>() + g * capacity * head_dim, cols, head_dim,
              members.as<const uint8_t>() + g * member_rows_per_group * member_shape.stride,
              member_stride, rows_per_group, out.as<float>() + g * rows_per_group * shape.stride,
              shape.stride, scratch);
        }
      },
      grain_for(rows_per_group * cols * head_dim * 2));
}

namespace {

// Quest's page summaries page_min / page_max: two F32 [G, P, D] tensors of one shape matching
// the cache's G and D.
int64_t page_summary_pages(const DeviceTensor& page_min, const DeviceTensor& page_max,
                           int64_t groups, int64_t head_dim, OpName op) {
  require_f32(page_min, op + ": page_min");
  require_f32(page_max, op + ": page_max");
  KVLENS_REQUIRE(
      page_min.shape.size() == 3 && page_min.dim(0) == groups && page_min.dim(2) == head_dim &&
          page_min.dim(1) >= 0 && page_max.shape == page_min.shape,
      op + ": page_min, page_max", cat("two F32 [", groups, ", pages, ", head_dim, "] tensors"),
      describe(page_min) + ", " + describe(page_max));
  return page_min.dim(1);
}

void require_page_size(int64_t page_size, OpName op) {
  KVLENS_REQUIRE(page_size >= 1, op + ": page_size", "a page size >= 1", std::to_string(page_size));
}

}  // namespace

KVLENS_POLICY_CLONES void page_minmax_update(const DeviceTensor& k_cache, int64_t begin,
                                             int64_t end, int64_t page_size, DeviceTensor& page_min,
                                             DeviceTensor& page_max) {
  const OpName op{"page_minmax_update"};
  require_page_size(page_size, op);
  const CacheShape cache_dims = cache_shape(k_cache, 0, op, "k_cache");
  const int64_t groups = cache_dims.groups, capacity = cache_dims.capacity,
                head_dim = cache_dims.head_dim;
  KVLENS_REQUIRE(begin >= 0 && begin <= end && end <= capacity, op + ": columns",
                 cat("a range inside [0, ", capacity, "]"), cat(begin, ":", end));
  const int64_t pages = page_summary_pages(page_min, page_max, groups, head_dim, op);
  KVLENS_REQUIRE(pages * page_size >= end, op + ": page_min",
                 cat("at least ", (end + page_size - 1) / page_size, " pages"), describe(page_min));
  if (begin == end) return;
  const int64_t first = begin / page_size, last = (end - 1) / page_size;
  for (int64_t g = 0; g < groups; ++g) {
    const float* keys = k_cache.as<const float>() + g * capacity * head_dim;
    for (int64_t p = first; p <= last; ++p) {
      float* lo = page_min.as<float>() + (g * pages + p) * head_dim;
      float* hi = page_max.as<float>() + (g * pages + p) * head_dim;
      const int64_t j0 = p * page_size, j1 = std::min(j0 + page_size, end);
      std::memcpy(lo, keys + j0 * head_dim, size_t(head_dim) * sizeof(float));
      std::memcpy(hi, keys + j0 * head_dim, size_t(head_dim) * sizeof(float));
      // The CUDA kernel runs the same comparisons in the same column order.
      for (int64_t j = j0 + 1; j < j1; ++j) {
        const float* k = keys + j * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) {
          lo[d] = k[d] < lo[d] ? k[d] : lo[d];
          hi[d] = hi[d] < k[d] ? k[d] : hi[d];
        }
      }
    }
  }
}

void page_bounds(const Context& context, const DeviceTensor& q, const DeviceTensor& page_min,
                 const DeviceTensor& page_max, int64_t cols, int64_t page_size, bool max_only,
                 DeviceTensor& out) {
  const OpName op{"page_bounds"};
  require_cols(cols, op);
  require_page_size(page_size, op);
  require_f32(q, op + ": q");
  KVLENS_REQUIRE(q.shape.size() == 3 && q.dim(0) == 1 && q.dim(1) >= 0 && q.dim(2) >= 0, op + ": q",
                 "a [1, H, D] tensor", describe(q));
  const int64_t heads = q.dim(1), head_dim = q.dim(2);
  KVLENS_REQUIRE(page_min.shape.size() == 3 && page_min.dim(0) > 0 && heads % page_min.dim(0) == 0,
                 op + ": page_min",
                 cat("[G, pages, ", head_dim, "] with G dividing the ", heads, " heads"),
                 describe(page_min));
  const int64_t groups = page_min.dim(0);
  const int64_t pages = page_summary_pages(page_min, page_max, groups, head_dim, op);
  KVLENS_REQUIRE(pages * page_size >= cols, op + ": page_min",
                 cat("at least ", (cols + page_size - 1) / page_size, " pages"),
                 describe(page_min));
  const RowShape shape = row_shape(out, DType::F32, heads, cols, op + ": out");
  if (heads == 0 || cols == 0) return;

  const int64_t heads_per_group = heads / groups;
  const int64_t used = (cols + page_size - 1) / page_size;
  const float scale = attention_scale(head_dim);
  const PageBoundsFn bounds_of = context.kernels.page_bounds;
  context.pool.parallel_for(
      0, heads,
      [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> bounds;
        bounds.resize(size_t(used));
        for (int64_t h = begin; h < end; ++h) {
          const int64_t base = (h / heads_per_group) * pages * head_dim;
          bounds_of(q.as<const float>() + h * head_dim, page_min.as<const float>() + base,
                    page_max.as<const float>() + base, used, head_dim, max_only, scale,
                    bounds.data());
          float* row = out.as<float>() + h * shape.stride;
          for (int64_t p = 0; p < used; ++p) {
            const int64_t j1 = std::min((p + 1) * page_size, cols);
            std::fill(row + p * page_size, row + j1, bounds[size_t(p)]);
          }
        }
      },
      grain_for(used * head_dim));
}

namespace {

// The order of `count` distinct keys, largest first: order[place] = index. Up to kCountedPages
// keys, each key's place is the count of larger ones (compares without a branch, in vectors): a
// sort of a few dozen keys mispredicts about every other comparison. More keys are sorted.
constexpr int64_t kCountedPages = 128;
KVLENS_POLICY_CLONES void order_by_key(const uint64_t* keys, int64_t count, int32_t* order) {
  if (count > kCountedPages) {
    for (int64_t i = 0; i < count; ++i) order[i] = int32_t(i);
    std::sort(order, order + count, [keys](int32_t a, int32_t b) { return keys[a] > keys[b]; });
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    int64_t place = 0;
    for (int64_t m = 0; m < count; ++m) place += keys[m] > keys[i];
    order[place] = int32_t(i);
  }
}

}  // namespace

void select_pages(const Context& context, const DeviceTensor& scores, int64_t cols,
                  int64_t page_size, int64_t k, DeviceTensor& selected) {
  const OpName op{"select_pages"};
  require_cols(cols, op);
  require_page_size(page_size, op);
  const RowShape selected_shape = row_shape(selected, DType::U8, -1, cols, op + ": selected");
  const int64_t rows = selected_shape.rows;
  const RowShape score_shape = row_shape(scores, DType::F32, rows, cols, op + ": scores");
  if (k <= 0 || cols == 0 || rows == 0) return;

  const int64_t pages = (cols + page_size - 1) / page_size;
  const PageBestFn page_best = context.kernels.page_best;
  context.pool.parallel_for(
      0, rows,
      [&](int64_t begin, int64_t end) {
        thread_local std::vector<uint64_t> keys;
        thread_local std::vector<int32_t> candidate_cost, order;
        thread_local std::vector<float> best;
        thread_local std::vector<int32_t> cost;
        best.resize(size_t(pages));
        cost.resize(size_t(pages));
        for (int64_t r = begin; r < end; ++r) {
          uint8_t* chosen = selected.as<uint8_t>() + r * selected_shape.stride;
          // Each page ranks by its best score (top_k_key: -0 ranks as +0, so the sign of a zero
          // maximum does not matter) and costs its columns not chosen yet.
          page_best(scores.as<const float>() + r * score_shape.stride, chosen, cols, page_size,
                    best.data(), cost.data());
          keys.clear();
          candidate_cost.clear();
          for (int64_t p = 0; p < pages; ++p) {
            if (cost[size_t(p)] > 0) {
              keys.push_back(top_k_key(best[size_t(p)], uint32_t(p)));
              candidate_cost.push_back(cost[size_t(p)]);
            }
          }
          // Keys are distinct (the page index is in the low bits): one well-defined order.
          order.resize(keys.size());
          order_by_key(keys.data(), int64_t(keys.size()), order.data());
          int64_t remaining = k;
          for (const int32_t candidate : order) {
            const int64_t page_cost = candidate_cost[size_t(candidate)];
            if (page_cost > remaining) break;  // the first page that does not fit ends the choice
            remaining -= page_cost;
            const int64_t j0 = int64_t(uint32_t(keys[size_t(candidate)])) * page_size;
            std::fill(chosen + j0, chosen + std::min(j0 + page_size, cols), uint8_t(1));
          }
        }
      },
      grain_for(cols * 4));
}

void anchor_cosine_update(const DeviceTensor& cache, int64_t column, float decay,
                          DeviceTensor& anchor, DeviceTensor& similarity) {
  const OpName op{"anchor_cosine_update"};
  const CacheShape cache_dims = cache_shape(cache, 0, op, "cache");
  const int64_t groups = cache_dims.groups, capacity = cache_dims.capacity,
                head_dim = cache_dims.head_dim;
  KVLENS_REQUIRE(column >= 0 && column < capacity, op + ": column",
                 cat("a column below the capacity ", capacity), std::to_string(column));
  require_f32(anchor, op + ": anchor");
  KVLENS_REQUIRE((anchor.shape == std::vector<int64_t>{groups, head_dim}), op + ": anchor",
                 shape_string({groups, head_dim}), describe(anchor));
  require_f32(similarity, op + ": similarity");
  KVLENS_REQUIRE(similarity.numel() == groups, op + ": similarity", cat(groups, " elements"),
                 describe(similarity));
  const float keep = decay, take = 1.0f - decay;
  for (int64_t g = 0; g < groups; ++g) {
    const float* x = cache.as<const float>() + (g * capacity + column) * head_dim;
    float* a = anchor.as<float>() + g * head_dim;
    similarity.as<float>()[g] = cosine_similarity(x, a, head_dim);
    // The CUDA kernel rounds the same way: both products, then the sum.
    for (int64_t d = 0; d < head_dim; ++d) a[d] = add_rn(mul_rn(keep, a[d]), mul_rn(take, x[d]));
  }
}

void token_filter_step(const DeviceTensor* similarity, double eta, double target, int64_t column,
                       DeviceTensor& state, DeviceTensor& scores, DeviceTensor& keep) {
  const OpName op{"token_filter_step"};
  KVLENS_REQUIRE(
      state.dtype == DType::U8 && state.numel() == 8 * kTokenFilterState && !state.empty(),
      op + ": state", cat("U8 [", 8 * kTokenFilterState, "]"), describe(state));
  KVLENS_REQUIRE(keep.dtype == DType::U8 && keep.numel() >= 1 && !keep.empty(), op + ": keep",
                 "a U8 tensor of at least one element", describe(keep));
  require_f32(scores, op + ": scores");
  KVLENS_REQUIRE(scores.shape.size() == 2 && column >= 0 && column < scores.dim(1), op + ": scores",
                 cat("[rows, stride] with column ", column, " < stride"), describe(scores));
  if (similarity != nullptr) {
    require_f32(*similarity, op + ": similarity");
    KVLENS_REQUIRE(similarity->numel() >= 2 && similarity->numel() % 2 == 0, op + ": similarity",
                   "2 * G elements (keys, then values)", describe(*similarity));
  }
  double values[kTokenFilterState];
  std::memcpy(values, state.data, sizeof values);
  double s_kv = 0.0;
  const bool skip = kvlens::token_filter_step(similarity ? similarity->as<const float>() : nullptr,
                                              similarity ? similarity->numel() / 2 : 0, eta, target,
                                              values, &s_kv);
  std::memcpy(state.data, values, sizeof values);
  if (similarity != nullptr) {
    for (int64_t r = 0; r < scores.dim(0); ++r)
      scores.as<float>()[r * scores.dim(1) + column] = float(s_kv);
  }
  keep.as<uint8_t>()[0] = skip ? 0 : 1;
}

void zero_unless(DeviceTensor& rows, const DeviceTensor& keep) {
  const OpName op{"zero_unless"};
  require_f32(rows, op + ": rows");
  KVLENS_REQUIRE(keep.dtype == DType::U8 && keep.numel() >= 1 && !keep.empty(), op + ": keep",
                 "a U8 tensor of at least one element", describe(keep));
  if (keep.as<const uint8_t>()[0] == 0) std::fill_n(rows.as<float>(), rows.numel(), 0.0f);
}

}  // namespace kvlens::cpu_policy
