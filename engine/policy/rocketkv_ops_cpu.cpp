// RocketKV's stage-2 page estimate (rocketkv_ops.h) on the CPU backend: rocketkv_math.h's
// arithmetic, query heads spread over the backend's thread pool. Shapes: q [1, H, D], page_min and
// page_max [G, P, D], out [H, stride].
#include "engine/policy/rocketkv_ops.h"

#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/cpu/cpu_policy_ops.h"
#include "engine/policy/rocketkv_math.h"

namespace kvlens {

namespace {

using namespace cpu_checks;  // require*, describe, cat, row_shape, grain_for
using cpu_policy::Context;

void run_page_logits(const Context& context, const DeviceTensor& q, const DeviceTensor& page_min,
                     const DeviceTensor& page_max, int64_t cols, int64_t page_size, int64_t rank,
                     DeviceTensor& out) {
  const OpName op{"rocketkv page_logits"};
  require_cols(cols, op);
  KVLENS_REQUIRE(page_size >= 1, op + ": page_size", "a page size >= 1", std::to_string(page_size));
  require_f32(q, op + ": q");
  require_f32(page_min, op + ": page_min");
  require_f32(page_max, op + ": page_max");
  KVLENS_REQUIRE(q.shape.size() == 3 && q.dim(0) == 1 && q.dim(1) >= 1 && q.dim(2) >= 1 &&
                     q.dim(2) <= kApproxMaxHeadDim,
                 op + ": q", cat("a [1, H, D] tensor with 1 <= D <= ", kApproxMaxHeadDim),
                 describe(q));
  const int64_t heads = q.dim(1), D = q.dim(2);
  KVLENS_REQUIRE(page_min.shape.size() == 3 && page_min.dim(0) >= 1 &&
                     heads % page_min.dim(0) == 0 && page_min.dim(2) == D &&
                     page_min.dim(1) * page_size >= cols && page_max.shape == page_min.shape,
                 op + ": page_min, page_max",
                 cat("two F32 [G, >= ", (cols + page_size - 1) / page_size, ", ", D,
                     "] tensors with G dividing the ", heads, " heads"),
                 describe(page_min) + ", " + describe(page_max));
  KVLENS_REQUIRE(rank >= 1 && rank <= D, op + ": rank", cat("a channel count in [1, ", D, "]"),
                 std::to_string(rank));
  const RowShape shape = row_shape(out, DType::F32, heads, cols, op + ": out");
  if (cols == 0) return;
  const int64_t groups = page_min.dim(0), group = heads / groups, pages = page_min.dim(1);
  const int64_t used = (cols + page_size - 1) / page_size;
  context.pool.parallel_for(
      0, heads,
      [&](int64_t begin, int64_t end) {
        std::vector<float> magnitudes(static_cast<size_t>(D)), estimates(static_cast<size_t>(used));
        std::vector<int32_t> channels(static_cast<size_t>(rank));
        bool reads_max[kApproxMaxHeadDim];
        for (int64_t h = begin; h < end; ++h) {
          const int64_t g = h / group;
          const float* q_group = q.as<const float>() + g * group * D;
          const float* q_head = q.as<const float>() + h * D;
          for (int64_t c = 0; c < D; ++c)
            magnitudes[size_t(c)] = sparq_magnitude(q_group, group, D, c);
          sparq_pick(magnitudes.data(), D, rank, channels.data());
          for (int64_t i = 0; i < rank; ++i)
            reads_max[i] = rocket_reads_max(q_group, group, D, channels[size_t(i)]);
          const float scale = sparq_scale(q_head, D, channels.data(), rank);
          const float* lo = page_min.as<const float>() + g * pages * D;
          const float* hi = page_max.as<const float>() + g * pages * D;
          for (int64_t p = 0; p < used; ++p)
            estimates[size_t(p)] = rocket_page_logit(q_head, lo + p * D, hi + p * D,
                                                     channels.data(), reads_max, rank, scale);
          float* row = out.as<float>() + h * shape.stride;
          for (int64_t j = 0; j < cols; ++j) row[j] = estimates[size_t(j / page_size)];
        }
      },
      grain_for(used * rank + cols));
}

class CpuRocketkvOps final : public RocketkvOps {
 public:
  explicit CpuRocketkvOps(Backend& backend) : context_(cpu_policy::context_of(backend)) {}
  void page_logits(const DeviceTensor& q, const DeviceTensor& page_min,
                   const DeviceTensor& page_max, int64_t cols, int64_t page_size, int64_t rank,
                   DeviceTensor& out) override {
    run_page_logits(context_, q, page_min, page_max, cols, page_size, rank, out);
  }

 private:
  Context context_;
};

}  // namespace

RocketkvOps& rocketkv_ops(Backend& backend) {
  return extension_with_cpu<RocketkvOps, CpuRocketkvOps>(backend);
}

}  // namespace kvlens
