// h2o (H2O, POLICIES.md): each head accumulates, per cached token, the softmax attention it
// received at every earlier step (as computed under that step's visible set). At step t the
// budget splits into a recent part (the most recent tokens) and a heavy part (heavy_frac): the
// highest accumulated scores among the rest. Dropped tokens never return and their scores are
// forgotten. score=current_logit ranks by this step's raw logit instead (the TokenButler code's
// baseline: greedy replacement, still permanent).
// State per layer: accumulated [H, stride] F32, kept [R, stride] U8 (R = selection rows).
#include <cmath>

#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class H2oPolicy final : public BudgetedPolicy {
 public:
  H2oPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs, double heavy_frac,
            bool current_logit)
      : BudgetedPolicy(shape, backend, knobs),
        heavy_frac_(heavy_frac),
        current_logit_(current_logit) {
    for (int64_t l = 0; l < shape.layers; ++l) {
      accumulated_.push_back(backend.alloc(DType::F32, {shape.heads, shape.stride}));
      kept_.push_back(backend.alloc(DType::U8, {selection_rows(), shape.stride}));
      backend.fill_columns(kept_.back(), 0, shape.stride, 1);
    }
  }

  // observe() ignores the dense layers (nothing is ever selected there).
  bool wants_probs(const LayerStep& step) const override {
    return !current_logit_ && !dense_layer(step);
  }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    for (DeviceTensor& sums : accumulated_) sums = widen_columns(backend_, sums, stride);
    for (DeviceTensor& kept : kept_) kept = widen_columns(backend_, kept, stride, 1);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + tensor_bytes(accumulated_) + tensor_bytes(kept_);
  }

  // Only score=current_logit ranks by this step's logits.
  bool reads_logits(const LayerStep& /*step*/) const override { return current_logit_; }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    const int64_t cols = step.cols();
    const DeviceTensor& ranked = current_logit_ ? *step.logits : accumulated_[l];
    backend_.axpby_rows(scores, 1.0f, ranked, 0.0f, cols);  // a copy of the candidates only
    const int64_t budget = knobs_.budget(step);
    const int64_t heavy = int64_t(std::floor(heavy_frac_ * double(budget)));
    select_budgeted(step, budget - heavy, at_selection_rows(scores, cols), &kept_[l], visible);
    // What is not visible now is evicted for good.
    evict_unselected(kept_[l], visible, cols);
    return LayerDecision::Masked;
  }

  void observe(const LayerStep& step, const DeviceTensor& probs) override {
    if (current_logit_ || dense_layer(step)) return;
    const size_t l = size_t(step.layer);
    // Evicted tokens' scores are forgotten (query-head rows match kept_; at KV-head granularity
    // kept_ has group rows, and evicted tokens can never be chosen again anyway).
    backend_.accumulate_rows(accumulated_[l], probs,
                             knobs_.kv_head_granularity ? nullptr : &kept_[l], step.cols());
  }

 private:
  double heavy_frac_;
  bool current_logit_;
  std::vector<DeviceTensor> accumulated_, kept_;
};

}  // namespace

PolicyInfo h2o_policy_info() {
  PolicyInfo info{
      "h2o", "eviction (H2O)",
      "Keeps the most recent tokens and the heavy hitters by accumulated attention; evicted "
      "tokens never return.",
      with_common_specs(
          {{"heavy_frac",
            ParamType::Float,
            "Fraction of the budget for heavy hitters",
            "0.5",
            0.0,
            1.0,
            {}},
           {"score",
            ParamType::Choice,
            "accumulated: sum of the attention received (H2O); current_logit: this step's "
            "raw logit, greedy replacement (the TokenButler code's baseline)",
            "accumulated",
            0,
            0,
            {"accumulated", "current_logit"}}})};
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_h2o_policy(const PolicyShape& shape, Backend& backend,
                                        const ParamValues& params, double sparsity) {
  return std::make_unique<H2oPolicy>(shape, backend, read_common_knobs(params, sparsity),
                                     params.get_float("heavy_frac"),
                                     params.get_choice("score") == "current_logit");
}

}  // namespace kvlens
