// random (POLICIES.md): B(t) tokens drawn uniformly from the candidates (seeded), plus the sinks
// and the window: uniform random scores per (step, layer, head, token) and a top-k over them.
#include <limits>

#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class RandomPolicy final : public BudgetedPolicy {
 public:
  RandomPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs, uint64_t seed)
      : BudgetedPolicy(shape, backend, knobs), seed_(seed) {}

  // Chooses without this step's logits (see Policy::reads_logits).
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    // One stream per (step, layer): draws never depend on what other layers or runs did.
    const uint64_t stream = uint64_t(step.step) * uint64_t(shape_.layers) + uint64_t(step.layer);
    draw_scores(stream, step.cols(), scores);
    select_budgeted(step, 1, at_selection_rows(scores, step.cols()), nullptr, visible);
    return LayerDecision::Masked;
  }

 private:
  // scores[h, j] for this shard's heads: a draw is numbered by the model's head, so a
  // tensor-parallel shard draws every head's row and keeps its own, the rows one GPU draws.
  void draw_scores(uint64_t stream, int64_t cols, DeviceTensor& scores) {
    if (backend_.tensor_parallel_ranks() == 1) {
      backend_.random_rows(seed_, stream, cols, scores);
      return;
    }
    DeviceTensor& all_heads = model_head_rows(scores.dim(1));
    backend_.random_rows(seed_, stream, cols, all_heads);
    keep_shard_rows(all_heads, scores);
  }

  uint64_t seed_;
};

}  // namespace

PolicyInfo random_policy_info() {
  PolicyInfo info{
      "random", "floor",
      "B(t) tokens drawn uniformly (seeded) from the candidates, plus sinks and window.",
      with_common_specs({{"seed",
                          ParamType::Int,
                          "Seed of the draws",
                          "0",
                          0,
                          std::numeric_limits<double>::infinity(),
                          {}}})};
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_random_policy(const PolicyShape& shape, Backend& backend,
                                           const ParamValues& params, double sparsity) {
  return std::make_unique<RandomPolicy>(shape, backend, read_common_knobs(params, sparsity),
                                        uint64_t(params.get_int("seed")));
}

}  // namespace kvlens
