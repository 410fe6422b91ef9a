// The policy list of eval, trace, bench and the app: --policies ID,ID,... x --sparsity X,X,...
// with --policy-arg [ID.]KEY=VALUE applied to the policies that declare KEY.
#include "app/session/policy_runs.h"

#include <cstdlib>

#include "app/session/model_input.h"
#include "engine/common/comma_list.h"
#include "engine/common/error.h"
#include "engine/policy/registry.h"

namespace kvlens::session {
namespace {

// Non-empty items of a comma-separated flag value.
std::vector<std::string> split_list(const std::string& text, const std::string& flag,
                                    const std::string& what) {
  std::vector<std::string> items = split_comma_list(text);
  for (const std::string& item : items) {
    if (item.empty()) {
      throw Error(flag, "list", "a comma-separated list of " + what, "'" + text + "'");
    }
  }
  return items;
}

double parse_sparsity(const std::string& item) {
  char* end = nullptr;
  const double value = std::strtod(item.c_str(), &end);
  if (end != item.c_str() + item.size() || !(value >= 0.0 && value < 1.0)) {
    throw Error("--sparsity", "sparsity", "a number in [0, 1)", "'" + item + "'");
  }
  return value;
}

// --policy-arg items that apply to `id`: "key=value" goes to every policy declaring the key,
// "id.key=value" to that policy only.
std::vector<std::string> args_for(const std::string& id,
                                  const std::vector<std::string>& policy_args) {
  std::vector<std::string> out;
  const PolicyInfo& info = policy_info(id);
  for (const std::string& item : policy_args) {
    const size_t eq = item.find('='), dot = item.find('.');
    std::string key = item.substr(0, eq);
    if (dot != std::string::npos && dot < eq) {
      if (item.substr(0, dot) != id) continue;
      out.push_back(item.substr(dot + 1));
      continue;
    }
    for (const ParamSpec& spec : info.params) {
      if (spec.name == key) out.push_back(item);
    }
  }
  return out;
}

}  // namespace

std::vector<PolicyConfig> resolve_policy_runs(const std::string& policies,
                                              const std::string& sparsities,
                                              const std::vector<std::string>& policy_args) {
  std::vector<double> sparsity_values;
  for (const std::string& item : split_list(sparsities, "--sparsity", "numbers in [0, 1)")) {
    sparsity_values.push_back(parse_sparsity(item));
  }
  const std::vector<std::string> ids = split_list(policies, "--policies", "policy ids");
  for (const std::string& id : ids) {
    try {
      policy_info(id);
    } catch (const Error& error) {
      throw Error("--policies", error.field(), error.expected(), error.found());
    }
  }
  for (const std::string& item : policy_args) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error("--policy-arg", "parameter", "key=value or policy.key=value", "'" + item + "'");
    }
    bool used = false;
    for (const std::string& id : ids) used = used || !args_for(id, {item}).empty();
    if (!used) {
      throw Error("--policy-arg", item.substr(0, eq), "a parameter of one of the policies run",
                  "'" + item + "'");
    }
  }
  std::vector<PolicyConfig> runs;
  for (const std::string& id : ids) {
    for (const double sparsity : sparsity_values) {
      const bool reference = is_reference_policy(id);
      PolicyOptions requested{id, reference ? 0.0 : sparsity, {}};
      try {
        requested.policy_args = args_for(id, policy_args);
        runs.push_back(resolve_policy(requested));
      } catch (const Error& error) {
        // The single-policy commands name --policy; here the list is --policies.
        if (error.file() != "--policy") throw;
        throw Error("--policies", error.field(), error.expected(), error.found());
      }
      if (reference) break;  // hides nothing: one run whatever the sparsities
    }
  }
  return runs;
}

}  // namespace kvlens::session
