// keydiff (KeyDiff, POLICIES.md): the score of cached token j is -cos(k_j, anchor), the anchor
// being the mean of the L2-normalised keys currently cached for the KV head: the tokens not
// evicted so far plus the current one (its key is appended before the step's eviction, as
// KeyDiff adds the new key, then evicts). The lowest scores (the keys most like the others) are
// evicted to fit B(t), for good; the current token, the sinks and `window` are forced, truncated
// to B(t) by POLICIES.md's priority. The anchor moves as tokens are evicted.
// Granularity: keys belong to KV heads, so the score depends on the KV head and the member set
// only. The query heads of a group start from the same kept set and get the same scores every
// step, so at query_head granularity their sets stay identical forever: the result equals kv_head
// granularity, where the per-head scores (equal within the group) are summed, which doubles them
// exactly and so ranks and ties the same. Both granularities therefore select once per KV group
// (the policy is built at kv_head granularity), which spares H/G - 1 of every group's anchors,
// scores and top-k selections. It never looks at attention, so it wants no probabilities.
// State per layer: kept [G, stride] U8, which key_anchor_scores (keydiff_ops.h) reads as the
// members of each of the group's query heads.
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/keydiff_ops.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class KeydiffPolicy final : public BudgetedPolicy {
 public:
  KeydiffPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs)
      : BudgetedPolicy(shape, backend, knobs), ops_(keydiff_ops(backend)) {
    for (int64_t l = 0; l < shape.layers; ++l) {
      kept_.push_back(backend.alloc(DType::U8, {selection_rows(), shape.stride}));
      backend.fill_columns(kept_.back(), 0, shape.stride, 1);
    }
  }

  // Chooses without this step's logits (see Policy::reads_logits).
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    for (DeviceTensor& kept : kept_) kept = widen_columns(backend_, kept, stride, 1);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + tensor_bytes(kept_);
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    const int64_t cols = step.cols();
    ops_.key_anchor_scores(*step.k_cache, cols, kept_[l], scores);
    select_budgeted(step, 1, at_selection_rows(scores, cols), &kept_[l], visible);
    evict_unselected(kept_[l], visible, cols);
    return LayerDecision::Masked;
  }

 private:
  KeyDiffOps& ops_;  // the backend's keydiff extension, fetched once
  std::vector<DeviceTensor> kept_;
};

}  // namespace

PolicyInfo keydiff_policy_info() {
  PolicyInfo info{"keydiff", "eviction (KeyDiff)",
                  "Evicts the keys most similar to the mean normalised cached key (score -cos(k, "
                  "anchor)); evicted tokens never return.",
                  with_common_specs({})};
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_keydiff_policy(const PolicyShape& shape, Backend& backend,
                                            const ParamValues& params, double sparsity) {
  CommonKnobs knobs = read_common_knobs(params, sparsity);
  knobs.kv_head_granularity = true;  // the same sets at query_head granularity (see above)
  return std::make_unique<KeydiffPolicy>(shape, backend, knobs);
}

}  // namespace kvlens
