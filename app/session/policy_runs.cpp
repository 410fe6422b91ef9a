// The policy list of eval, trace, bench and the app: --policies items (plain ids or run specs
// ID@SPARSITY[:KEY=VALUE...]) x --sparsity X,X,... with --policy-arg [ID.]KEY=VALUE applied to
// the policies that declare KEY, and run_spec, the canonical text of one resolved run.
#include "app/session/policy_runs.h"

#include <charconv>
#include <cstdlib>
#include <map>

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

// A number in [0, 1) or nothing.
std::optional<double> read_sparsity(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(value >= 0.0 && value < 1.0)) {
    return std::nullopt;
  }
  return value;
}

double parse_sparsity(const std::string& item) {
  const std::optional<double> value = read_sparsity(item);
  if (!value) throw Error("--sparsity", "sparsity", "a number in [0, 1)", "'" + item + "'");
  return *value;
}

// The shortest text that reads back as the same double ("0.3", not "0.29999999999999999").
std::string number_text(double value) {
  char text[32];
  const auto result = std::to_chars(text, text + sizeof text, value);
  return std::string(text, result.ptr);
}

std::string key_of(const std::string& key_value) {
  return key_value.substr(0, key_value.find('='));
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

// The registry's message about `item` (an id, a sparsity or a knob of it), under `flag`.
Error item_error(const Error& error, const std::string& flag, const std::string& item) {
  const std::string found = error.found().empty() ? "" : error.found() + " ";
  return Error(flag, error.field(), error.expected(), found + "in '" + item + "'");
}

}  // namespace

RunSpec parse_run_spec(const std::string& item, const std::string& flag) {
  const std::string expected_form = "ID[@SPARSITY][:KEY=VALUE...], e.g. h2o@0.3:window=16";
  RunSpec spec;
  const size_t colon = item.find(':');
  const std::string head = item.substr(0, colon);
  const size_t at = head.find('@');
  spec.id = head.substr(0, at);
  if (spec.id.empty()) throw Error(flag, "run", expected_form, "'" + item + "'");
  if (at != std::string::npos) {
    spec.sparsity = read_sparsity(head.substr(at + 1));
    if (!spec.sparsity) {
      throw Error(flag, "sparsity", "a number in [0, 1) after @",
                  "'" + head.substr(at + 1) + "' in '" + item + "'");
    }
  }
  for (size_t begin = colon; begin != std::string::npos;) {
    const size_t end = item.find(':', begin + 1);
    const std::string knob =
        item.substr(begin + 1, end == std::string::npos ? end : end - begin - 1);
    const size_t eq = knob.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error(flag, "knob", "KEY=VALUE after ':' (" + expected_form + ")",
                  "'" + knob + "' in '" + item + "'");
    }
    spec.knobs.push_back(knob);
    begin = end;
  }
  return spec;
}

std::string run_spec(const PolicyConfig& config) {
  if (is_reference_policy(config.id)) return config.id;
  std::string text = config.id + "@" + number_text(config.sparsity);
  const PolicyInfo* info = find_policy_info(config.id);
  std::vector<std::string> knobs = config.args;
  if (info) {
    try {
      const std::string owner = "policy " + config.id;
      const std::vector<std::string> values =
          resolve_params(info->params, config.args, owner).describe();
      const std::vector<std::string> defaults = resolve_params(info->params, {}, owner).describe();
      knobs.clear();
      for (size_t i = 0; i < values.size(); ++i) {
        if (i < defaults.size() && values[i] == defaults[i]) continue;
        // A float's canonical text has 17 digits; a label wants the shortest that reads back.
        const ParamSpec& spec = info->params[i];
        const std::string value = values[i].substr(values[i].find('=') + 1);
        knobs.push_back(spec.type == ParamType::Float
                            ? spec.name + "=" + number_text(std::stod(value))
                            : values[i]);
      }
    } catch (const Error&) {
      // Arguments this version of the policy does not take (a trace from another build): they
      // are kept as given, so the label still says what the run was.
    }
  }
  for (const std::string& knob : knobs) text += ":" + knob;
  return text;
}

std::vector<PolicyConfig> resolve_policy_runs(const std::string& policies,
                                              const std::string& sparsities,
                                              const std::vector<std::string>& policy_args) {
  std::vector<double> sparsity_values;
  for (const std::string& item : split_list(sparsities, "--sparsity", "numbers in [0, 1)")) {
    sparsity_values.push_back(parse_sparsity(item));
  }
  const std::vector<std::string> items =
      split_list(policies, "--policies", "policy ids or run specs");
  std::vector<RunSpec> specs;
  for (const std::string& item : items) {
    specs.push_back(parse_run_spec(item, "--policies"));
    const RunSpec& spec = specs.back();
    try {
      const PolicyInfo& info = policy_info(spec.id);
      // The knobs alone, so that a bad one is blamed on this item, not on --policy-arg.
      resolve_params(info.params, spec.knobs, "policy " + spec.id);
    } catch (const Error& error) {
      throw item_error(error, "--policies", item);
    }
    if (spec.sparsity && *spec.sparsity != 0.0 && is_reference_policy(spec.id)) {
      throw Error("--policies", "sparsity", "0 for policy " + spec.id + " (it hides no tokens)",
                  "'" + item + "'");
    }
  }
  for (const std::string& item : policy_args) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error("--policy-arg", "parameter", "key=value or policy.key=value", "'" + item + "'");
    }
    bool used = false;
    for (const RunSpec& spec : specs) used = used || !args_for(spec.id, {item}).empty();
    if (!used) {
      throw Error("--policy-arg", item.substr(0, eq), "a parameter of one of the policies run",
                  "'" + item + "'");
    }
  }
  std::vector<PolicyConfig> runs;
  std::map<std::string, std::string> item_of_run;  // canonical spec -> the item that made it
  for (size_t i = 0; i < specs.size(); ++i) {
    const RunSpec& spec = specs[i];
    const bool reference = is_reference_policy(spec.id);
    const std::vector<double> run_sparsities =
        spec.sparsity ? std::vector<double>{*spec.sparsity}
                      : (reference ? std::vector<double>{0.0} : sparsity_values);
    // The item's own knobs are the more specific: they replace a --policy-arg of the same key.
    std::vector<std::string> args;
    for (const std::string& arg : args_for(spec.id, policy_args)) {
      bool overridden = false;
      for (const std::string& knob : spec.knobs)
        overridden = overridden || key_of(knob) == key_of(arg);
      if (!overridden) args.push_back(arg);
    }
    args.insert(args.end(), spec.knobs.begin(), spec.knobs.end());
    for (const double sparsity : run_sparsities) {
      PolicyOptions requested{spec.id, reference ? 0.0 : sparsity, args};
      try {
        runs.push_back(resolve_policy(requested));
      } catch (const Error& error) {
        // The single-policy commands name --policy; here the list is --policies.
        if (error.file() != "--policy") throw;
        throw item_error(error, "--policies", items[i]);
      }
      const std::string canonical = run_spec(runs.back());
      const auto [it, added] = item_of_run.emplace(canonical, items[i]);
      if (!added) {
        throw Error(
            "--policies", "run", "each run listed once",
            "'" + items[i] + "' runs " + canonical + " again, as '" + it->second + "' does");
      }
      if (reference) break;  // hides nothing: one run whatever the sparsities
    }
  }
  return runs;
}

}  // namespace kvlens::session
