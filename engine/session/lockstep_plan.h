// LockstepPlan: how a lockstep step lays its runs out, apart from the decode loop. The order in
// which the runs go to the backend's threads (costliest first, from each run's seconds in the last
// step), the rows of the scratch that hold them (slot s holds run run_of_slot[s]) and, where the
// backend splits a step into groups of runs (Backend::lockstep_groups above 1), which rows each
// group takes: groups of about equal cost, each group's runs in consecutive rows.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlens {

struct LockstepPlan {
  // `groups`: the backend's lockstep_groups for `runs` runs (1: the step is never split).
  void reset(int64_t runs, int64_t groups);
  // Sorts run_order by the runs' seconds in the last step (costliest first, stable), keeps
  // those seconds in last_run_seconds and zeroes run_seconds for the step about to run.
  void order_by_cost();
  // Whether a step, once its rows differ, goes on in groups (plan_groups, then the groups).
  bool splits() const { return groups > 1; }
  // The step's groups and their rows: each run costs its row's share of the projections
  // (row_seconds) plus its own work in the last step; the costliest go first, each to the group
  // with the least so far (longest processing time first: within a third of the best split).
  void plan_groups();
  // After a split step: the projections' seconds per row, from the groups' wall times less their
  // runs' own work (and the runs' work before the split), the estimate plan_groups uses next.
  void record_split(const std::vector<double>& group_seconds, double runs_seconds_before);

  int64_t runs = 0, groups = 1;
  std::vector<int64_t> run_order;  // the order the runs go to the backend's threads
  std::vector<double> run_seconds, last_run_seconds;  // each run's own work, this and the last step
  double row_seconds = 0.0;                           // a split step's projections per row
  std::vector<int64_t> run_of_slot, slot_of_run, group_bounds;  // rows, and each group's first row
  bool rows_in_run_order = true;                                // row r holds run r for every r
};

}  // namespace kvlens
