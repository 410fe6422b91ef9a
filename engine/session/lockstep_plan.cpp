// LockstepPlan (lockstep_plan.h): the order, the rows and the groups of a lockstep step's runs.
#include "engine/session/lockstep_plan.h"

#include <algorithm>
#include <utility>

namespace kvlens {

void LockstepPlan::reset(int64_t run_count, int64_t group_count) {
  *this = LockstepPlan{};
  runs = run_count;
  groups = group_count;
}

void LockstepPlan::order_by_cost() {
  if (int64_t(run_order.size()) != runs) {
    run_order.resize(size_t(runs));
    for (int64_t r = 0; r < runs; ++r) run_order[size_t(r)] = r;
    run_seconds.assign(size_t(runs), 0.0);
  }
  // A stable sort: equal costs (the first step) keep the run order.
  std::stable_sort(run_order.begin(), run_order.end(), [&](int64_t a, int64_t b) {
    return run_seconds[size_t(a)] > run_seconds[size_t(b)];
  });
  last_run_seconds = run_seconds;
  std::fill(run_seconds.begin(), run_seconds.end(), 0.0);
}

void LockstepPlan::plan_groups() {
  const int64_t n = runs;
  if (groups == 1) {
    // One group: every run in its own row, as laid out once.
    if (int64_t(run_of_slot.size()) == n) return;
    run_of_slot.resize(size_t(n));
    for (int64_t r = 0; r < n; ++r) run_of_slot[size_t(r)] = r;
    slot_of_run = run_of_slot;
    group_bounds = {0, n};
    rows_in_run_order = true;
    return;
  }
  // (all alike before the first step)
  std::vector<double> costs(size_t(n), row_seconds);
  for (size_t r = 0; r < costs.size() && r < last_run_seconds.size(); ++r)
    costs[r] += last_run_seconds[r];
  std::vector<int64_t> by_cost(static_cast<size_t>(n));
  for (int64_t r = 0; r < n; ++r) by_cost[size_t(r)] = r;
  std::stable_sort(by_cost.begin(), by_cost.end(),
                   [&](int64_t a, int64_t b) { return costs[size_t(a)] > costs[size_t(b)]; });
  // Per group: its cost so far, then its run count (equal costs, as at the first step, still
  // spread the runs).
  std::vector<std::pair<double, int64_t>> load(size_t(groups), {0.0, 0});
  std::vector<int64_t> group_of(static_cast<size_t>(n));
  for (const int64_t r : by_cost) {
    const size_t g = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    group_of[size_t(r)] = int64_t(g);
    load[g].first += costs[size_t(r)];
    ++load[g].second;
  }
  // Rows group by group, each group's runs in run order.
  group_bounds.assign(size_t(groups) + 1, 0);
  run_of_slot.clear();
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < n; ++r)
      if (group_of[size_t(r)] == g) run_of_slot.push_back(r);
    group_bounds[size_t(g) + 1] = int64_t(run_of_slot.size());
  }
  slot_of_run.resize(size_t(n));
  rows_in_run_order = true;
  for (int64_t slot = 0; slot < n; ++slot) {
    slot_of_run[size_t(run_of_slot[size_t(slot)])] = slot;
    rows_in_run_order = rows_in_run_order && run_of_slot[size_t(slot)] == slot;
  }
}

void LockstepPlan::record_split(const std::vector<double>& group_seconds,
                                double runs_seconds_before) {
  // The projections' cost per row: what the groups spent besides their runs' own work.
  double outside = runs_seconds_before;
  for (const double seconds : group_seconds) outside += seconds;
  for (const double seconds : run_seconds) outside -= seconds;
  row_seconds = std::max(0.0, outside / double(runs));
}

}  // namespace kvlens
