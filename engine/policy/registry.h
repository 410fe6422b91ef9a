// The policy registry: every policy of POLICIES.md by id, with its typed parameters, so the CLI
// and the app list policies and build their controls from one description.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens {

// Every registered policy, in the order POLICIES.md lists them.
const std::vector<PolicyInfo>& policy_infos();
// Throws kvlens::Error naming the id and listing the known ones.
const PolicyInfo& policy_info(const std::string& id);

// Checks a config (id known, sparsity in [0, 1), every key=value valid) without building it.
void validate_policy_config(const PolicyConfig& config);

// A policy instance for one run over a model of `shape`, its buffers in `backend`.
std::unique_ptr<Policy> make_policy(const PolicyConfig& config, const PolicyShape& shape,
                                    Backend& backend);

}  // namespace kvlens
