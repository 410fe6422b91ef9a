// choose_policies and predictor_summary (policy_defaults.h).
#include "app/gui/policy_defaults.h"

#include <cstdio>
#include <vector>

#include "engine/common/comma_list.h"
#include "engine/policy/registry.h"

namespace kvlens::app {

std::string default_policies() {
  return default_comparison_policies();
}

PolicyChoice choose_policies(const std::string& policies, bool asked, const Model& model) {
  PolicyChoice choice{policies, {}};
  if (asked) return choice;
  choice.policies.clear();
  for (const std::string& item : split_comma_list(policies)) {
    // (a run spec, "h2o@0.3:recent=16", names its policy first)
    const std::string id = item.substr(0, item.find_first_of("@:"));
    const PolicyInfo* info = find_policy_info(id);
    std::string why;
    if (!info) {
      why = id + " left out: this build has no " + id + " policy";
    } else if (info->needs_predictor && !model.predictor.predictor) {
      why = id + " left out: " + model.dir + " has no predictor (--predictor FILE names one)";
    }
    if (why.empty()) {
      choice.policies += (choice.policies.empty() ? "" : ",") + item;
    } else {
      choice.note += (choice.note.empty() ? "" : "; ") + why;
    }
  }
  return choice;
}

std::string predictor_summary(const Model& model) {
  const auto& predictor = model.predictor.predictor;
  if (!predictor) return "no predictor";
  const double parameters = double(predictor->config.parameter_count());
  char size[48];
  if (parameters >= 1e6) {
    std::snprintf(size, sizeof size, "%.2fM parameters", parameters / 1e6);
  } else if (parameters >= 1e3) {
    std::snprintf(size, sizeof size, "%.1fk parameters", parameters / 1e3);
  } else {
    std::snprintf(size, sizeof size, "%.0f parameters", parameters);
  }
  return predictor->path + " (variant " + PredictorConfig::variant_name(predictor->config.variant) +
         ", " + size + ")";
}

}  // namespace kvlens::app
