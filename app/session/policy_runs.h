// The policy list of eval, trace, bench and the app: every (policy, sparsity) pair of --policies
// x --sparsity, with the --policy-arg items that apply to each, checked against the registry.
#pragma once

#include <string>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens::session {

// Dense is the reference: one run at sparsity 0 whatever the sparsity list says. A
// --policy-arg "key=value" goes to every listed policy declaring the key, "id.key=value" to that
// policy only; an item no listed policy takes is an error. Throws kvlens::Error naming the flag.
std::vector<PolicyConfig> resolve_policy_runs(const std::string& policies,
                                              const std::string& sparsities,
                                              const std::vector<std::string>& policy_args);

}  // namespace kvlens::session
