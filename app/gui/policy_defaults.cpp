// choose_policies and predictor_summary (policy_defaults.h).
#include "app/gui/policy_defaults.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/common/comma_list.h"
#include "engine/policy/registry.h"
#include "engine/trace/trace_queries.h"
#include "viz/views.h"

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

HeadChoice typical_predicted_head(const Trace& trace, int64_t step) {
  HeadChoice choice;
  if (step < 0 || step >= trace.step_count()) return choice;
  for (int64_t run = 0; run < int64_t(trace.runs.size()); ++run) {
    if (!viz::run_predicts_logits(trace, run)) continue;
    const std::vector<double> rates = head_accuracy_grid(trace, run, step);
    std::vector<std::pair<double, int64_t>> scored;  // (hit rate, layer * heads + head)
    for (size_t i = 0; i < rates.size(); ++i)
      if (std::isfinite(rates[i])) scored.emplace_back(rates[i], int64_t(i));
    if (scored.empty()) continue;
    std::sort(scored.begin(), scored.end());
    const auto& [rate, index] = scored[(scored.size() - 1) / 2];
    choice.layer = index / trace.model.heads;
    choice.head = index % trace.model.heads;
    choice.found = true;
    char why[200];
    std::snprintf(why, sizeof why,
                  "head %lld.%lld: %s's median head by top-50%% hit rate, %.2f (heads range "
                  "%.2f-%.2f)",
                  (long long)choice.layer, (long long)choice.head,
                  viz::run_title(trace, run).c_str(), rate, scored.front().first,
                  scored.back().first);
    choice.why = why;
    return choice;
  }
  return choice;
}

}  // namespace kvlens::app
