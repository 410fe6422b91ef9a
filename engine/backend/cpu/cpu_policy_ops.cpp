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

void require_page_size(int64_t page_size, OpName op) {
  KVLENS_REQUIRE(page_size >= 1, op + ": page_size", "a page size >= 1", std::to_string(page_size));
}

}  // namespace

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

void zero_unless(DeviceTensor& rows, const DeviceTensor& keep) {
  const OpName op{"zero_unless"};
  require_f32(rows, op + ": rows");
  KVLENS_REQUIRE(keep.dtype == DType::U8 && keep.numel() >= 1 && !keep.empty(), op + ": keep",
                 "a U8 tensor of at least one element", describe(keep));
  if (keep.as<const uint8_t>()[0] == 0) std::fill_n(rows.as<float>(), rows.numel(), 0.0f);
}

}  // namespace kvlens::cpu_policy
