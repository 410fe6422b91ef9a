// oracle (POLICIES.md): the top-B(t) tokens by true attention probability softmax(z) of this
// step, per head (or per KV group, probabilities summed), chosen afresh every step. It needs a
// full attention pass for the probabilities: an upper bound, not a method.
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class OraclePolicy final : public BudgetedPolicy {
 public:
  OraclePolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs)
      : BudgetedPolicy(shape, backend, knobs) {}

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    // Probabilities rank like logits within a head; they are computed because kv_head
    // granularity sums them over the group, where logits would not add meaningfully. No output
    // is wanted: the value pass is skipped.
    DeviceTensor no_output;
    backend_.attention_visible(*step.logits, step.cols(), nullptr, *step.v_cache, no_output,
                               &scores);
    select_budgeted(step, 1, at_selection_rows(scores, step.cols()), nullptr, visible);
    return LayerDecision::Masked;
  }
};

}  // namespace

PolicyInfo oracle_policy_info() {
  PolicyInfo info{
      "oracle", "upper bound",
      "Top-B(t) tokens by this step's true attention probability, chosen afresh every step.",
      with_common_specs({})};
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_oracle_policy(const PolicyShape& shape, Backend& backend,
                                           const ParamValues& params, double sparsity) {
  return std::make_unique<OraclePolicy>(shape, backend, read_common_knobs(params, sparsity));
}

}  // namespace kvlens
