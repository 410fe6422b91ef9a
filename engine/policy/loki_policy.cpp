// loki (Loki, Singhania et al. 2024; docs/policies/loki.md): keys and queries projected on the
// first `dims` principal directions of the layer's keys (a calibration pass on corpus text,
// loki_pca.safetensors beside the model, tools/calibrate_channels.py) give an approximate logit of
// every cached token; the top B(t) by it are visible, chosen afresh every step.
//
// Rule at step t, layer l (not a dense layer): P_g = the first d principal directions [D, d] of KV
// head g's post-RoPE keys (as the cache holds them; the PCA is uncentred in use, as the authors'
// code projects raw keys). For query head h of group g and candidate j: s(h, j) = (q_h P_g) .
// (k_j P_g) / sqrt(D), the authors' scale, which is the true logit's (d = D gives the true logit up
// to rounding, P being orthonormal). s is the policy's scores (predicts_logits); the visible set
// is select_budgeted's (the current token, sinks, window, then the top of the rest by s). Each
// key is projected once (d numbers per key and KV head kept beside the cache); a step costs
// O(t d).
#include "engine/policy/approx_logit_common.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/channel_calibration.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/projected_logit_policy.h"

namespace kvlens {

PolicyInfo loki_policy_info() {
  PolicyInfo info{
      "loki",
      "approximate logits (Loki)",
      "Top-B(t) tokens per head by approximate logits from queries and keys projected on "
      "the keys' top principal directions (calibrated beside the model); chosen afresh every "
      "step.",
      with_common_specs({{"dims",
                          ParamType::Float,
                          "Principal directions kept: a fraction of head_dim below 1, else a "
                          "count (the paper's d_f = 0.25)",
                          "0.25",
                          0.0,
                          4096.0,
                          {}}}),
      /*reference=*/false,
      /*needs_predictor=*/false,
      /*predicts_logits=*/true};
  // Each query head ranks by its own KV head's basis (a shard reads its KV heads' rows).
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_loki_policy(const PolicyShape& shape, Backend& backend,
                                         const ParamValues& params, double sparsity) {
  const int64_t dims =
      channel_count(params.get_float("dims"), shape.head_dim, "policy loki", "dims");
  return make_projected_logit_policy(shape, backend, read_common_knobs(params, sparsity),
                                     loki_bases(shape, dims), shape.kv_heads, dims);
}

}  // namespace kvlens
