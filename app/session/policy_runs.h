// The policy list of eval, trace, bench and the app: --policies items, each a plain policy id
// (one run per --sparsity value) or a run spec ID@SPARSITY[:KEY=VALUE...] (exactly one run), with
// the --policy-arg items that apply to each, checked against the registry (docs/policy_specs.md).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens::session {

// One item of --policies: ID[@SPARSITY][:KEY=VALUE...], e.g. "h2o", "h2o@0.3",
// "quest@0.9:page_size=8". Knobs are kept as typed; resolve_policy_runs checks them.
struct RunSpec {
  std::string id;
  std::optional<double> sparsity;  // absent: every value of --sparsity
  std::vector<std::string> knobs;  // "key=value", for this run only
};

// Parses the syntax only (not the registry). Throws kvlens::Error naming `flag` and the item for
// an empty id, a sparsity that is not a number in [0, 1), or a knob that is not KEY=VALUE.
RunSpec parse_run_spec(const std::string& item, const std::string& flag = "--policies");

// Every run of --policies x --sparsity. A plain id takes every sparsity of the list, a spec with
// @ takes its own; dense (the reference) is one run at sparsity 0 whatever the list says (dense@S
// with S != 0 is an error). A --policy-arg "key=value" goes to every listed policy declaring the
// key, "id.key=value" to that policy only; an item no listed policy takes is an error. A spec's
// own knobs apply to that run only and win over a --policy-arg of the same key. The same policy
// may be listed several times (h2o@0.3,h2o@0.7); two runs that resolve to the same canonical spec
// are an error. Throws kvlens::Error naming the flag and the item.
std::vector<PolicyConfig> resolve_policy_runs(const std::string& policies,
                                              const std::string& sparsities,
                                              const std::vector<std::string>& policy_args);

// The canonical spec of a resolved run, which resolve_policy_runs turns back into the same run
// whatever --sparsity says: "dense", "h2o@0.3", "h2o@0.7:window=16" (only the knobs whose value
// differs from the policy's default, in the policy's parameter order; the shortest sparsity text
// that reads back as the same number). Also takes a trace run's full parameter list
// (PolicyConfig{run.policy, run.sparsity, run.params}). A policy no longer registered keeps every
// argument as given.
std::string run_spec(const PolicyConfig& config);

}  // namespace kvlens::session
