// Each policy file's two entry points, listed once for the registry (registry.cpp): its info
// (id, family, rule, parameters) and a factory for a run's instance.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens {

#define KVLENS_DECLARE_POLICY(name)                                                        \
  PolicyInfo name##_policy_info();                                                         \
  std::unique_ptr<Policy> make_##name##_policy(const PolicyShape& shape, Backend& backend, \
                                               const ParamValues& params, double sparsity);

KVLENS_DECLARE_POLICY(dense)
KVLENS_DECLARE_POLICY(oracle)
KVLENS_DECLARE_POLICY(random)
KVLENS_DECLARE_POLICY(streaming)
KVLENS_DECLARE_POLICY(h2o)
KVLENS_DECLARE_POLICY(snapkv)
KVLENS_DECLARE_POLICY(quest)
KVLENS_DECLARE_POLICY(keydiff)
KVLENS_DECLARE_POLICY(tokenfilter)
KVLENS_DECLARE_POLICY(lazyllm)
KVLENS_DECLARE_POLICY(tokenbutler)
KVLENS_DECLARE_POLICY(tova)
KVLENS_DECLARE_POLICY(pyramidkv)
KVLENS_DECLARE_POLICY(adakv)
KVLENS_DECLARE_POLICY(sparq)
KVLENS_DECLARE_POLICY(loki)
KVLENS_DECLARE_POLICY(doublesparsity)
KVLENS_DECLARE_POLICY(duoattention)
KVLENS_DECLARE_POLICY(seerattention)
KVLENS_DECLARE_POLICY(rocketkv)
KVLENS_DECLARE_POLICY(twilight)
KVLENS_DECLARE_POLICY(magicpig)

#undef KVLENS_DECLARE_POLICY

// SCORER+ALLOCATOR (allocator_policies.cpp): a budgeted scorer (composable_scorers()) with
// PyramidKV's or Ada-KV's budgets; its info (the scorer's parameters, then the allocator's) and
// instance. A malformed or unsupported id is a kvlens::Error naming what composes.
std::string composable_scorers();
std::vector<std::string> composed_policy_examples();
PolicyInfo composed_policy_info(const std::string& id);
std::unique_ptr<Policy> make_composed_policy(const std::string& id, const PolicyShape& shape,
                                             Backend& backend, const ParamValues& params,
                                             double sparsity);

// The common knobs followed by a policy's own parameters.
std::vector<ParamSpec> with_common_specs(std::vector<ParamSpec> own);

// lazyllm's keep(l) per layer for a model of `layers` layers (lazyllm_policy.cpp documents the
// rule): layers < max(1, dense_layers) keep 1, the mean over all layers is 1 - sparsity where
// reachable.
std::vector<double> lazyllm_keep_schedule(int64_t layers, int64_t dense_layers, double sparsity);

// What tokenfilter's nominal sparsity means on a model of `layers` layers (a share of attention
// computations in its tail layers, not of tokens), and whether it is capped there: one sentence
// for the warnings of evaluations and front ends (engine/eval/sparsity_match.h).
std::string tokenfilter_nominal_budget_note(const ParamValues& params, double sparsity,
                                            int64_t layers);

// RocketKV's split of a nominal sparsity (rocketkv_policy.cpp documents the formulas, after the
// authors' get_params_for_token_budget): stage 1's sparsity (snapkv keeps the other share, C(t)),
// stage 2's page size and query channels r for heads of head_dim channels.
struct RocketkvSplit {
  double stage1_sparsity = 0.0;
  int64_t page_size = 1, channels = 1;
};
RocketkvSplit rocketkv_split(double sparsity, int64_t head_dim);

// MagicPIG's bits per table K for a nominal sparsity with `tables` tables (magicpig_policy.cpp:
// the K in 1..20 whose sampling probability at u = 1/2 is nearest 1 - sparsity), and that
// probability for given K and L: the expected sampled share of keys orthogonal to the query.
int64_t magicpig_bits_for(double sparsity, int64_t tables);
double magicpig_expected_share(int64_t bits, int64_t tables);

}  // namespace kvlens
