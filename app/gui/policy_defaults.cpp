// choose_policies and predictor_summary (policy_defaults.h).
#include "app/gui/policy_defaults.h"

#include <cstdio>
#include <vector>

#include "engine/common/comma_list.h"
#include "engine/policy/registry.h"

namespace kvlens::app {

PolicyChoice choose_policies(const std::string& policies, bool asked, const Model& model) {
  PolicyChoice choice{policies, {}};
  if (asked) return choice;
  const std::vector<std::string> ids = split_comma_list(policies);
  bool listed = false;
  for (const std::string& id : ids) listed = listed || id == kPredictorPolicy;
  if (!listed) return choice;
  bool registered = false;
  for (const PolicyInfo& info : policy_infos())
    registered = registered || info.id == kPredictorPolicy;
  if (registered && model.predictor.predictor) return choice;
  choice.policies.clear();
  for (const std::string& id : ids)
    if (id != kPredictorPolicy) choice.policies += (choice.policies.empty() ? "" : ",") + id;
  if (!registered) {
    choice.note = std::string(kPredictorPolicy) + " left out: this build has no " +
                  kPredictorPolicy + " policy";
  } else {
    choice.note = std::string(kPredictorPolicy) + " left out: " + model.dir +
                  " has no predictor (--predictor FILE names one)";
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
