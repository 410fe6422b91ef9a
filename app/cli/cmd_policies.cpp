// kvlens-cli policies: the policy registry (ids, families, rules and typed parameters), as text
// or, with --json, as the description the app builds its controls from.
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/cli/cli_common.h"
#include "engine/policy/registry.h"

namespace kvlens::cli {
namespace {

nlohmann::json describe(const ParamSpec& spec) {
  nlohmann::json out = {{"name", spec.name},
                        {"type", param_type_name(spec.type)},
                        {"default", spec.default_value},
                        {"description", spec.description}};
  if (spec.type == ParamType::Int || spec.type == ParamType::Float) {
    out["min"] = std::isfinite(spec.min) ? nlohmann::json(spec.min) : nlohmann::json();
    out["max"] = std::isfinite(spec.max) ? nlohmann::json(spec.max) : nlohmann::json();
  }
  if (spec.type == ParamType::Choice) out["choices"] = spec.choices;
  return out;
}

}  // namespace

void add_policies_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command = app.add_subcommand("policies", "List the token-selection policies");
  static bool json = false;
  add_plugin_option(*command, common);
  command->add_flag("--json", json, "Print the registry as JSON");
  command->callback([&run] {
    run = [] {
      if (json) {
        nlohmann::json out = nlohmann::json::array();
        const auto add = [&out](const PolicyInfo& info, bool composed) {
          nlohmann::json params = nlohmann::json::array();
          for (const ParamSpec& spec : info.params) params.push_back(describe(spec));
          const std::string source = policy_source(info.id);
          out.push_back({{"id", info.id},
                         {"family", info.family},
                         {"description", info.description},
                         {"params", params},
                         {"reference", info.reference},
                         {"needs_predictor", info.needs_predictor},
                         {"predicts_logits", info.predicts_logits},
                         {"composed", composed},
                         {"plugin", source.empty() ? nlohmann::json() : nlohmann::json(source)}});
        };
        for (const PolicyInfo& info : policy_infos()) add(info, false);
        // SCORER+ALLOCATOR ids run wherever an id does, so a script reading this list sees them
        // (with the scorer's and the allocator's parameters), marked as composed.
        for (const std::string& id : composed_policy_ids()) add(*find_policy_info(id), true);
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
      }
      for (const PolicyInfo& info : policy_infos()) {
        const std::string source = policy_source(info.id);
        std::printf("%-12s %s%s\n%12s %s\n", info.id.c_str(), info.family.c_str(),
                    source.empty() ? "" : ("  [plug-in " + source + "]").c_str(), "",
                    info.description.c_str());
        for (const ParamSpec& spec : info.params) {
          std::printf("%14s%s=%s (%s) %s\n", "", spec.name.c_str(), spec.default_value.c_str(),
                      param_type_name(spec.type), spec.description.c_str());
        }
      }
      // The allocators compose with scorers under ids of their own (not listed above).
      std::string composed;
      for (const std::string& id : composed_policy_ids()) composed += " " + id;
      std::printf(
          "\n%s.\nComposed ids:%s (each takes the scorer's parameters and the "
          "allocator's)\n",
          policy_composition_rule().c_str(), composed.c_str());
      return 0;
    };
  });
}

}  // namespace kvlens::cli
