// doublesparsity (Double Sparsity, Yang et al. 2024; docs/policies/doublesparsity.md): each query
// head's `channels` most important channels (its "label" channels, found offline by a calibration
// pass: doublesparsity_channels.safetensors beside the model, tools/calibrate_channels.py) give
// an approximate logit of every cached token from those channels of its key alone; the top B(t)
// by it are visible, chosen afresh every step.
//
// Rule at step t, layer l (not a dense layer): S_h = query head h's first r channels by the
// calibration's mean |q_c k_c| over corpus tokens (post-RoPE, keys repeated to the query heads, as
// the authors' "qk" outliers). For candidate j: s(h, j) = sum_{c in S_h} q_h,c k_j,c / sqrt(D).
// The authors divide by sqrt(r); dividing by sqrt(D) keeps s on the true logits' scale, so the
// predicted-vs-true view and the hit rate compare it with them directly, and ranks the same. s is
// the policy's scores (predicts_logits); the visible set is select_budgeted's. The label cache
// (the r channels of every key, per query head) is kept beside the cache and filled once per key
// (as keys projected on a basis of unit vectors, exactly those channels); a step costs O(t r).
#include "engine/policy/approx_logit_common.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/channel_calibration.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/projected_logit_policy.h"

namespace kvlens {

PolicyInfo doublesparsity_policy_info() {
  PolicyInfo info{
      "doublesparsity",
      "approximate logits (DoubleSparsity)",
      "Top-B(t) tokens per head by approximate logits from each head's offline-calibrated "
      "label channels of the query and keys; chosen afresh every step.",
      with_common_specs({{"channels",
                          ParamType::Float,
                          "Label channels per head: a fraction of head_dim below 1, else a "
                          "count (the authors' group_factor 8 is 0.125)",
                          "0.125",
                          0.0,
                          4096.0,
                          {}}}),
      /*reference=*/false,
      /*needs_predictor=*/false,
      /*predicts_logits=*/true};
  // Each query head ranks by its own label channels (a shard reads its heads' rows).
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_doublesparsity_policy(const PolicyShape& shape, Backend& backend,
                                                   const ParamValues& params, double sparsity) {
  const int64_t channels = channel_count(params.get_float("channels"), shape.head_dim,
                                         "policy doublesparsity", "channels");
  return make_projected_logit_policy(shape, backend, read_common_knobs(params, sparsity),
                                     doublesparsity_bases(shape, channels), shape.heads, channels);
}

}  // namespace kvlens
