// Each policy file's two entry points, listed once for the registry (registry.cpp): its info
// (id, family, rule, parameters) and a factory for a run's instance.
#pragma once

#include <memory>

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
KVLENS_DECLARE_POLICY(seerattention)

#undef KVLENS_DECLARE_POLICY

// The common knobs followed by a policy's own parameters.
std::vector<ParamSpec> with_common_specs(std::vector<ParamSpec> own);

// lazyllm's keep(l) per layer for a model of `layers` layers (lazyllm_policy.cpp documents the
// rule): layers < max(1, dense_layers) keep 1, the mean over all layers is 1 - sparsity where
// reachable.
std::vector<double> lazyllm_keep_schedule(int64_t layers, int64_t dense_layers, double sparsity);

}  // namespace kvlens
