// The approximate-logit ops (approx_logit_ops.h) on the CPU backend: approx_logit_math.h's
// arithmetic, heads (or basis rows) spread over the backend's thread pool. Shapes: q [1, H, D],
// k_cache [G, capacity, D], basis [B, D, dims], projected [B, capacity', dims], out [H, stride].
#include "engine/policy/approx_logit_ops.h"

#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/cpu/cpu_dot_kernels.h"
#include "engine/backend/cpu/cpu_policy_ops.h"
#include "engine/policy/approx_logit_math.h"

namespace kvlens {

namespace {

using namespace cpu_checks;  // require*, describe, cat, row_shape, grain_for
using cpu_policy::Context;

// q as [1, H, D] with H a multiple of `groups` and D = head_dim; returns H.
int64_t query_heads(const DeviceTensor& q, int64_t groups, int64_t head_dim, OpName op) {
  require_f32(q, op + ": q");
  KVLENS_REQUIRE(q.shape.size() == 3 && q.dim(0) == 1 && q.dim(2) == head_dim && groups > 0 &&
                     q.dim(1) % groups == 0,
                 op + ": q", cat("a [1, H, ", head_dim, "] tensor with H a multiple of ", groups),
                 describe(q));
  return q.dim(1);
}

void require_head_dim(int64_t head_dim, OpName op) {
  KVLENS_REQUIRE(head_dim >= 1 && head_dim <= kApproxMaxHeadDim, op + ": head_dim",
                 cat("a head dimension in [1, ", kApproxMaxHeadDim, "]"), std::to_string(head_dim));
}

// basis as [B, D, dims] F32 with B a multiple of `groups` (0: any B >= 1).
void require_basis(const DeviceTensor& basis, int64_t groups, int64_t head_dim, OpName op) {
  require_f32(basis, op + ": basis");
  KVLENS_REQUIRE(basis.shape.size() == 3 && basis.dim(0) >= 1 && basis.dim(1) == head_dim &&
                     basis.dim(2) >= 1 && basis.dim(2) <= head_dim &&
                     (groups == 0 || basis.dim(0) % groups == 0),
                 op + ": basis",
                 cat("a [B, ", head_dim, ", dims] tensor (1 <= dims <= ", head_dim,
                     groups ? cat(", B a multiple of ", groups) : std::string(), ")"),
                 describe(basis));
  require_data(basis, op + ": basis");
}

void require_projected(const DeviceTensor& projected, const DeviceTensor& basis, int64_t end,
                       OpName op) {
  require_f32(projected, op + ": projected");
  KVLENS_REQUIRE(projected.shape.size() == 3 && projected.dim(0) == basis.dim(0) &&
                     projected.dim(1) >= end && projected.dim(2) == basis.dim(2),
                 op + ": projected",
                 cat("a [", basis.dim(0), ", >= ", end, ", ", basis.dim(2), "] tensor"),
                 describe(projected));
}

void run_sparq_logits(const Context& context, const DeviceTensor& q, const DeviceTensor& k_cache,
                      int64_t cols, int64_t rank, DeviceTensor& out) {
  const OpName op{"sparq_logits"};
  require_cols(cols, op);
  const CacheShape cache = cache_shape(k_cache, cols, op, "k_cache");
  require_head_dim(cache.head_dim, op);
  const int64_t D = cache.head_dim;
  KVLENS_REQUIRE(rank >= 1 && rank <= D, op + ": rank", cat("a channel count in [1, ", D, "]"),
                 std::to_string(rank));
  const int64_t heads = query_heads(q, cache.groups, D, op);
  const RowShape shape = row_shape(out, DType::F32, heads, cols, op + ": out");
  if (heads == 0 || cols == 0) return;
  const int64_t group = heads / cache.groups;
  context.pool.parallel_for(
      0, heads,
      [&](int64_t begin, int64_t end) {
        std::vector<int32_t> channels(static_cast<size_t>(rank));
        std::vector<float> magnitudes(static_cast<size_t>(D));
        for (int64_t h = begin; h < end; ++h) {
          const int64_t g = h / group;
          const float* q_group = q.as<const float>() + g * group * D;
          const float* q_head = q.as<const float>() + h * D;
          for (int64_t c = 0; c < D; ++c)
            magnitudes[size_t(c)] = sparq_magnitude(q_group, group, D, c);
          sparq_pick(magnitudes.data(), D, rank, channels.data());
          const float scale = sparq_scale(q_head, D, channels.data(), rank);
          const float* keys = k_cache.as<const float>() + g * cache.capacity * D;
          float* row = out.as<float>() + h * shape.stride;
          for (int64_t j = 0; j < cols; ++j)
            row[j] = sparq_logit(
                q_head, [key = keys + j * D](int64_t c) { return key[c]; }, channels.data(), rank,
                scale);
        }
      },
      grain_for(cols * rank));
}

void run_project_keys(const Context& context, const DeviceTensor& k_cache, int64_t begin,
                      int64_t end, const DeviceTensor& basis, DeviceTensor& projected) {
  const OpName op{"project_keys"};
  const CacheShape cache = cache_shape(k_cache, 0, op, "k_cache");
  KVLENS_REQUIRE(begin >= 0 && begin <= end && end <= cache.capacity, op + ": columns",
                 cat("a range inside [0, ", cache.capacity, "]"), cat(begin, ":", end));
  require_basis(basis, cache.groups, cache.head_dim, op);
  require_projected(projected, basis, end, op);
  const int64_t rows = basis.dim(0), D = cache.head_dim, dims = basis.dim(2);
  const int64_t per_group = rows / cache.groups, width = projected.dim(1);
  if (begin == end) return;
  context.pool.parallel_for(
      0, rows,
      [&](int64_t first, int64_t last) {
        for (int64_t b = first; b < last; ++b) {
          const float* keys = k_cache.as<const float>() + (b / per_group) * cache.capacity * D;
          const float* row_basis = basis.as<const float>() + b * D * dims;
          float* out = projected.as<float>() + b * width * dims;
          for (int64_t j = begin; j < end; ++j)
            for (int64_t i = 0; i < dims; ++i)
              out[j * dims + i] = project_component(
                  [key = keys + j * D](int64_t c) { return key[c]; }, row_basis, D, dims, i);
        }
      },
      grain_for((end - begin) * D * dims));
}

void run_projected_logits(const Context& context, const DeviceTensor& q, const DeviceTensor& basis,
                          const DeviceTensor& projected, int64_t cols, DeviceTensor& out) {
  const OpName op{"projected_logits"};
  require_cols(cols, op);
  require_basis(basis, 0, basis.shape.size() == 3 ? basis.dim(1) : 0, op);
  const int64_t rows = basis.dim(0), D = basis.dim(1), dims = basis.dim(2);
  const int64_t heads = query_heads(q, rows, D, op);
  require_projected(projected, basis, cols, op);
  const RowShape shape = row_shape(out, DType::F32, heads, cols, op + ": out");
  if (heads == 0 || cols == 0) return;
  const int64_t per_row = heads / rows, width = projected.dim(1);
  const float scale = attention_scale(D);
  context.pool.parallel_for(
      0, heads,
      [&](int64_t begin, int64_t end) {
        std::vector<float> qp(static_cast<size_t>(dims));
        for (int64_t h = begin; h < end; ++h) {
          const int64_t b = h / per_row;
          const float* row_basis = basis.as<const float>() + b * D * dims;
          for (int64_t i = 0; i < dims; ++i)
            qp[size_t(i)] =
                project_component([row = q.as<const float>() + h * D](int64_t c) { return row[c]; },
                                  row_basis, D, dims, i);
          const float* keys = projected.as<const float>() + b * width * dims;
          float* row = out.as<float>() + h * shape.stride;
          for (int64_t j = 0; j < cols; ++j)
            row[j] = projected_logit(qp.data(), keys + j * dims, dims, scale);
        }
      },
      grain_for(cols * dims));
}

class CpuApproxLogitOps final : public ApproxLogitOps {
 public:
  explicit CpuApproxLogitOps(Backend& backend) : context_(cpu_policy::context_of(backend)) {}
  void sparq_logits(const DeviceTensor& q, const DeviceTensor& k_cache, int64_t cols, int64_t rank,
                    DeviceTensor& out) override {
    run_sparq_logits(context_, q, k_cache, cols, rank, out);
  }
  void project_keys(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                    const DeviceTensor& basis, DeviceTensor& projected) override {
    run_project_keys(context_, k_cache, begin, end, basis, projected);
  }
  void projected_logits(const DeviceTensor& q, const DeviceTensor& basis,
                        const DeviceTensor& projected, int64_t cols, DeviceTensor& out) override {
    run_projected_logits(context_, q, basis, projected, cols, out);
  }

 private:
  Context context_;
};

}  // namespace

ApproxLogitOps& approx_logit_ops(Backend& backend) {
  return extension_with_cpu<ApproxLogitOps, CpuApproxLogitOps>(backend);
}

}  // namespace kvlens
