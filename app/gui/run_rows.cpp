// RunRows and RunKey.
#include "app/gui/run_rows.h"

#include <cstdio>
#include <cstdlib>

#include "engine/common/comma_list.h"
#include "engine/policy/registry.h"

namespace kvlens::app {

RunRows RunRows::parse(const std::string& policies, const std::string& sparsities) {
  RunRows result;
  const std::vector<std::string> budgets = split_comma_list(sparsities);
  for (const std::string& item : split_comma_list(policies)) {
    const size_t at = item.find('@'), colon = item.find(':');
    RunRow row;
    row.policy = item.substr(0, std::min(at, colon));
    if (colon != std::string::npos) row.knobs = item.substr(colon + 1);
    if (at != std::string::npos && at < colon) {
      row.sparsity = float(std::atof(item.substr(at + 1, colon - at - 1).c_str()));
      result.rows_.push_back(row);
    } else if (is_reference_policy(row.policy) || budgets.empty()) {
      row.sparsity = is_reference_policy(row.policy) ? 0.0f : 0.5f;
      result.rows_.push_back(row);
    } else {
      for (const std::string& budget : budgets) {
        row.sparsity = float(std::atof(budget.c_str()));
        result.rows_.push_back(row);
      }
    }
  }
  return result;
}

std::string RunRows::spec() const {
  std::string spec;
  for (const RunRow& row : rows_) {
    if (row.policy.empty()) continue;
    spec += spec.empty() ? "" : ",";
    spec += row.policy;
    if (!is_reference_policy(row.policy)) {
      char budget[32];
      std::snprintf(budget, sizeof budget, "@%.3g", double(row.sparsity));
      spec += budget;
    }
    if (!row.knobs.empty()) spec += ":" + row.knobs;
  }
  return spec;
}

RunKey run_key(const Trace& trace, int64_t run) {
  const TraceRun& r = trace.runs[size_t(run)];
  return {r.policy, r.sparsity, r.params};
}

std::vector<int64_t> runs_with_keys(const Trace& trace, const std::vector<RunKey>& keys) {
  std::vector<int64_t> runs;
  for (const RunKey& key : keys)
    for (int64_t r = 0; r < int64_t(trace.runs.size()); ++r)
      if (run_key(trace, r) == key) {
        runs.push_back(r);
        break;
      }
  return runs;
}

}  // namespace kvlens::app
