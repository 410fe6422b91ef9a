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

#undef KVLENS_DECLARE_POLICY

// The common knobs followed by a policy's own parameters.
std::vector<ParamSpec> with_common_specs(std::vector<ParamSpec> own);

}  // namespace kvlens
