// Token filtering's op extension on the CPU backend (tokenfilter_ops.h): the code the CPU
// backend ran as Backend::anchor_cosine_update and Backend::token_filter_step.
#include "engine/policy/tokenfilter_ops.h"

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

void run_anchor_cosine_update(const DeviceTensor& cache, int64_t column, float decay,
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

void run_token_filter_step(const DeviceTensor* similarity, double eta, double target,
                           int64_t column, DeviceTensor& state, DeviceTensor& scores,
                           DeviceTensor& keep) {
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

class CpuTokenFilterOps final : public TokenFilterOps {
 public:
  explicit CpuTokenFilterOps(Backend& backend) : context_(cpu_policy::context_of(backend)) {}
  void anchor_cosine_update(const DeviceTensor& cache, int64_t column, float decay,
                            DeviceTensor& anchor, DeviceTensor& similarity) override {
    run_anchor_cosine_update(cache, column, decay, anchor, similarity);
  }
  void token_filter_step(const DeviceTensor* similarity, double eta, double target, int64_t column,
                         DeviceTensor& state, DeviceTensor& scores, DeviceTensor& keep) override {
    run_token_filter_step(similarity, eta, target, column, state, scores, keep);
  }

 private:
  Context context_;
};

}  // namespace

TokenFilterOps& tokenfilter_ops(Backend& backend) {
  return extension_with_cpu<TokenFilterOps, CpuTokenFilterOps>(backend);
}

}  // namespace kvlens
