// The sidebar's list of runs to record, one row per run with its own policy, budget and knobs,
// as run specs (ID[@SPARSITY][:KEY=VALUE...], session/policy_runs.h) go in and out of it; and
// RunKey, what identifies a recorded run across re-recordings (to keep the compare picks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/trace/trace.h"

namespace kvlens::app {

struct RunRow {
  std::string policy;
  float sparsity = 0.5f;
  std::string knobs;  // "recent=16:sinks=4" (empty: the policy's defaults)
  friend bool operator==(const RunRow&, const RunRow&) = default;
};

class RunRows {
 public:
  // From run specs; a plain id takes each sparsity of `sparsities` (the reference policy one row).
  // Items it cannot read keep their text (the recording reports them).
  static RunRows parse(const std::string& policies, const std::string& sparsities);
  // The rows as run specs: "dense,h2o@0.3,h2o@0.7:recent=16".
  std::string spec() const;
  std::vector<RunRow>& rows() { return rows_; }
  const std::vector<RunRow>& rows() const { return rows_; }

 private:
  std::vector<RunRow> rows_;
};

// A run's policy, budget and every resolved parameter.
struct RunKey {
  std::string policy;
  double sparsity = 0;
  std::vector<std::string> params;
  friend bool operator==(const RunKey&, const RunKey&) = default;
};
RunKey run_key(const Trace& trace, int64_t run);
// The runs of `trace` with the keys of `keys`, in their order (keys it lacks are skipped).
std::vector<int64_t> runs_with_keys(const Trace& trace, const std::vector<RunKey>& keys);

}  // namespace kvlens::app
