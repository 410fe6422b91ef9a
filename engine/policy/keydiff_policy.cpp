// keydiff (KeyDiff, POLICIES.md): the score of cached token j is -cos(k_j, anchor), the anchor
// being the mean of the L2-normalised keys currently cached for the KV head: the tokens not
// evicted so far plus the current one (its key is appended before the step's eviction, as
// KeyDiff adds the new key, then evicts). The lowest scores (the keys most like the others) are
// evicted to fit B(t), for good; the current token, the sinks and `window` are forced, truncated
// to B(t) by POLICIES.md's priority. The anchor moves as tokens are evicted.
// Granularity: keys belong to KV heads, so the score depends on the KV head and the member set
// only. At query_head granularity every query head still keeps its own kept set (and its own
// anchor over it), but the query heads of a group start from the same set and get the same scores
// every step, so their sets stay identical: the result equals kv_head granularity, only computed
// H/G times. At kv_head granularity the per-head scores (equal within the group) are summed, which
// ranks the same. It never looks at attention, so it wants no probabilities.
// State per layer: kept [R, stride] U8 (R = selection rows); a [H, stride] scratch mask at kv_head
// granularity (the group's kept set seen by each query head).
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class KeydiffPolicy final : public BudgetedPolicy {
 public:
  KeydiffPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs)
      : BudgetedPolicy(shape, backend, knobs) {
    for (int64_t l = 0; l < shape.layers; ++l) {
      kept_.push_back(backend.alloc(DType::U8, {selection_rows(), shape.stride}));
      backend.fill_columns(kept_.back(), 0, shape.stride, 1);
    }
    if (knobs_.kv_head_granularity)
      members_ = backend.alloc(DType::U8, {shape.heads, shape.stride});
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    const int64_t cols = step.cols();
    const DeviceTensor* members = &kept_[l];
    if (knobs_.kv_head_granularity) {
      backend_.expand_row_groups(kept_[l], cols, group(), members_);
      members = &members_;
    }
    backend_.key_anchor_scores(*step.k_cache, cols, *members, scores);
    select_budgeted(step, 1, at_selection_rows(scores, cols), &kept_[l], visible);
    evict_unselected(kept_[l], visible, cols);
    return LayerDecision::Masked;
  }

 private:
  std::vector<DeviceTensor> kept_;
  DeviceTensor members_;
};

}  // namespace

PolicyInfo keydiff_policy_info() {
  return {"keydiff", "eviction (KeyDiff)",
          "Evicts the keys most similar to the mean normalised cached key (score -cos(k, "
          "anchor)); evicted tokens never return.",
          with_common_specs({})};
}

std::unique_ptr<Policy> make_keydiff_policy(const PolicyShape& shape, Backend& backend,
                                            const ParamValues& params, double sparsity) {
  return std::make_unique<KeydiffPolicy>(shape, backend, read_common_knobs(params, sparsity));
}

}  // namespace kvlens
