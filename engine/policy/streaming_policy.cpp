// streaming (StreamingLLM, POLICIES.md): the sinks plus the most recent B(t) - sinks tokens, the
// same set for every head. It ranks by position, so it writes no scores.
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class StreamingPolicy final : public BudgetedPolicy {
 public:
  using BudgetedPolicy::BudgetedPolicy;

  // Chooses without this step's logits (see Policy::reads_logits).
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible, DeviceTensor&) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    // The recent part is the whole budget: forced_columns trims it to B(t) - sinks.
    const DeviceTensor* no_scores = step.logits;  // never read: nothing is left to choose
    select_budgeted(step, step.cols(), *no_scores, nullptr, visible);
    return LayerDecision::Masked;
  }
};

}  // namespace

PolicyInfo streaming_policy_info() {
  PolicyInfo info{"streaming", "static (StreamingLLM)",
                  "Sinks plus the most recent B(t) - sinks tokens; the same set for all heads.",
                  with_common_specs({})};
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_streaming_policy(const PolicyShape& shape, Backend& backend,
                                              const ParamValues& params, double sparsity) {
  return std::make_unique<StreamingPolicy>(shape, backend, read_common_knobs(params, sparsity));
}

}  // namespace kvlens
