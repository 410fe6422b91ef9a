// The policy registry: every policy of POLICIES.md by id, with its typed parameters, so the CLI
// and the app list policies and build their controls from one description.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens {

// Every registered policy: the built-ins in the order POLICIES.md lists them, then the plug-ins
// in the order they were registered. A registration may move the vector: keep ids, not
// references, across one.
const std::vector<PolicyInfo>& policy_infos();

// Makes a run's instance from the resolved parameters and the sparsity.
using PolicyFactory = std::function<std::unique_ptr<Policy>(const PolicyShape&, Backend&,
                                                            const ParamValues&, double)>;
// Adds a policy (a plug-in's: engine/policy/plugin_policy.h) under info.id, its parameters
// being info.params (the common knobs included). `source` names where it comes from in messages
// and in `policy_source`. An id already taken is an error naming both sources, unless the same
// source registers it again (then a no-op returning the existing info).
const PolicyInfo& register_policy(PolicyInfo info, PolicyFactory make, const std::string& source);
// Where a registered policy comes from: "" for a built-in, a plug-in's file or class otherwise.
std::string policy_source(const std::string& id);
// Throws kvlens::Error naming the id and listing the known ones.
const PolicyInfo& policy_info(const std::string& id);

// Checks a config (id known, sparsity in [0, 1), every key=value valid) without building it.
void validate_policy_config(const PolicyConfig& config);

// A policy instance for one run over a model of `shape`, its buffers in `backend`.
std::unique_ptr<Policy> make_policy(const PolicyConfig& config, const PolicyShape& shape,
                                    Backend& backend);
// make_policy for a session's run: null for the reference policy, which a session runs as its
// plain attention path (DecoderSession::set_policy is then not called).
std::unique_ptr<Policy> make_run_policy(const PolicyConfig& config, const PolicyShape& shape,
                                        Backend& backend);

// The reference policy (PolicyInfo::reference: dense), and whether `id` names it. Front ends
// and sessions ask these instead of naming it.
const PolicyInfo& reference_policy();
bool is_reference_policy(const std::string& id);
// The registered policy `id`, or null (an id no policy has now: a trace recorded with a plug-in
// that is not loaded).
const PolicyInfo* find_policy_info(const std::string& id);
// The SCORER+ALLOCATOR ids (snapkv+adakv, h2o+pyramidkv, ...: every scorer with every
// allocator), which work wherever an id does but are not in policy_infos(), and one line saying
// how they compose (for `kvlens-cli policies` and the app's picker).
std::vector<std::string> composed_policy_ids();
std::string policy_composition_rule();
// The comparison a front end opens on when the user names none: the reference, the learned
// predictor and two baselines (an eviction and a page method), comma separated.
std::string default_comparison_policies();

}  // namespace kvlens
