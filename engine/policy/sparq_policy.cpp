// sparq (SparQ Attention, Ribar et al. 2024; docs/policies/sparq.md): per KV group, the `channels`
// channels where the group's queries are largest in magnitude give an approximate logit of every
// cached token from those channels of its key alone; the top B(t) tokens by it are visible, chosen
// afresh every step (nothing is evicted). Then the attention over them is exact.
//
// Rule at step t, layer l (not a dense layer): I_g = the r channels of largest sum over the query
// heads of KV group g of |q_c| (ties to the lower channel); for each query head h of group g and
// candidate j, s(h, j) = q_h[I_g] . k_j[I_g] / sqrt(D * l1(q_h[I_g]) / l1(q_h)), the authors'
// temperature for a partial dot product, which keeps s on the true logits' scale (r = D gives the
// true logit z(l, h, t, j) exactly, up to rounding). s is the policy's scores, so the
// predicted-vs-true view and the hit rate compare it with the true logits. The visible set is
// select_budgeted's: the current token, the sinks and `window`, then the top of the rest by s, at
// either granularity (kv_head sums s over the group, as the authors do). Each step costs O(t r)
// reads of the keys. The authors' mean-value reallocation changes the output, not the visible
// set, and is left out (the docs page says why).
#include "engine/policy/approx_logit_common.h"
#include "engine/policy/approx_logit_ops.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class SparqPolicy final : public BudgetedPolicy {
 public:
  SparqPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs, int64_t channels)
      : BudgetedPolicy(shape, backend, knobs),
        ops_(approx_logit_ops(backend)),
        channels_(channels) {}

  // Chooses by its own approximation, never this step's logits.
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    ops_.sparq_logits(*step.q, *step.k_cache, step.cols(), channels_, scores);
    select_budgeted(step, 1, at_selection_rows(scores, step.cols()), nullptr, visible);
    return LayerDecision::Masked;
  }

 private:
  ApproxLogitOps& ops_;
  int64_t channels_;  // r: the query channels each KV group keeps
};

}  // namespace

PolicyInfo sparq_policy_info() {
  PolicyInfo info{
      "sparq",
      "approximate logits (SparQ)",
      "Top-B(t) tokens per head by approximate logits from the query's largest-magnitude "
      "channels (per KV group) and those channels of the keys; chosen afresh every step.",
      with_common_specs({{"channels",
                          ParamType::Float,
                          "Query channels kept: a fraction of head_dim below 1, else a count "
                          "(the authors' 16 of 128 is 0.125)",
                          "0.125",
                          0.0,
                          4096.0,
                          {}}}),
      /*reference=*/false,
      /*needs_predictor=*/false,
      /*predicts_logits=*/true};
  info.per_head_rule = true;
  info.reads_kv_groups = true;
  return info;
}

std::unique_ptr<Policy> make_sparq_policy(const PolicyShape& shape, Backend& backend,
                                          const ParamValues& params, double sparsity) {
  const int64_t channels =
      channel_count(params.get_float("channels"), shape.head_dim, "policy sparq", "channels");
  return std::make_unique<SparqPolicy>(shape, backend, read_common_knobs(params, sparsity),
                                       channels);
}

}  // namespace kvlens
