// KeyDiff's op extension on the CPU backend (keydiff_ops.h): the code the CPU backend ran as
// Backend::key_anchor_scores, on the backend's thread pool and kernel set (cpu_policy::Context).
#include "engine/policy/keydiff_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/cpu/cpu_policy_ops.h"
#include "engine/backend/policy_op_math.h"

namespace kvlens {

namespace {

using namespace cpu_checks;  // require*, describe, cat, shape_string, row_shape, grain_for
using cpu_policy::Context;

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

void run_key_anchor_scores(const Context& context, const DeviceTensor& k_cache, int64_t cols,
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

class CpuKeyDiffOps final : public KeyDiffOps {
 public:
  explicit CpuKeyDiffOps(Backend& backend) : context_(cpu_policy::context_of(backend)) {}
  void key_anchor_scores(const DeviceTensor& k_cache, int64_t cols, const DeviceTensor& members,
                         DeviceTensor& out) override {
    run_key_anchor_scores(context_, k_cache, cols, members, out);
  }

 private:
  Context context_;
};

}  // namespace

KeyDiffOps& keydiff_ops(Backend& backend) {
  return extension_with_cpu<KeyDiffOps, CpuKeyDiffOps>(backend);
}

}  // namespace kvlens
