// The selection loki and doublesparsity share: approximate logits from keys projected on a fixed
// per-layer basis (ApproxLogitOps::project_keys, each key once, then projected_logits), the top
// B(t) by them, chosen afresh every step. Bases are [B, D, dims] per layer, B = KV heads (loki) or
// query heads (doublesparsity); the projected keys [B, stride, dims] per layer grow with the cache.
#pragma once

#include <memory>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens {

// `bases[l]`: layer l's basis as host values [rows, D, dims] (every layer, dense ones included;
// those are never read).
std::unique_ptr<Policy> make_projected_logit_policy(const PolicyShape& shape, Backend& backend,
                                                    CommonKnobs knobs,
                                                    const std::vector<std::vector<float>>& bases,
                                                    int64_t rows, int64_t dims);

}  // namespace kvlens
