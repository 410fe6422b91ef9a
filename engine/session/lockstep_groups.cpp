// DecoderSession's lockstep groups: the order and the rows of the runs in a step, and the split
// of a step, once its rows differ, into groups of runs of about equal cost that each go through
// the layers left on one of the backend's threads. Rows: slot s of the scratch holds run
// run_of_slot_[s].
#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "engine/backend/tensor_views.h"
#include "engine/session/decoder_session.h"

namespace kvlens {

using tensor::timed_work;

void DecoderSession::order_runs_by_cost() {
  if (run_order_.size() != runs_.size()) {
    run_order_.resize(runs_.size());
    for (size_t r = 0; r < runs_.size(); ++r) run_order_[r] = int64_t(r);
    run_seconds_.assign(runs_.size(), 0.0);
  }
  // A stable sort: equal costs (the first step) keep the run order.
  std::stable_sort(run_order_.begin(), run_order_.end(), [&](int64_t a, int64_t b) {
    return run_seconds_[size_t(a)] > run_seconds_[size_t(b)];
  });
  last_run_seconds_ = run_seconds_;
  std::fill(run_seconds_.begin(), run_seconds_.end(), 0.0);
}

bool DecoderSession::splits_runs() const {
  return lockstep_groups_ > 1;
}

void DecoderSession::plan_groups() {
  const int64_t n = runs(), groups = lockstep_groups_;
  if (groups == 1) {
    // One group: every run in its own row, as laid out once.
    if (int64_t(run_of_slot_.size()) == n) return;
    run_of_slot_.resize(size_t(n));
    for (int64_t r = 0; r < n; ++r) run_of_slot_[size_t(r)] = r;
    slot_of_run_ = run_of_slot_;
    group_bounds_ = {0, n};
    rows_in_run_order_ = true;
    return;
  }
  // A run's cost: its row's share of the projections plus its own attention and policy work in
  // the last step (all alike before the first). The costliest go first, each to the group with
  // the least so far (longest processing time first: within a third of the best split).
  std::vector<double> costs(size_t(n), row_seconds_);
  for (size_t r = 0; r < costs.size() && r < last_run_seconds_.size(); ++r)
    costs[r] += last_run_seconds_[r];
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
  group_bounds_.assign(size_t(groups) + 1, 0);
  run_of_slot_.clear();
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = 0; r < n; ++r)
      if (group_of[size_t(r)] == g) run_of_slot_.push_back(r);
    group_bounds_[size_t(g) + 1] = int64_t(run_of_slot_.size());
  }
  slot_of_run_.resize(size_t(n));
  rows_in_run_order_ = true;
  for (int64_t slot = 0; slot < n; ++slot) {
    slot_of_run_[size_t(run_of_slot_[size_t(slot)])] = slot;
    rows_in_run_order_ = rows_in_run_order_ && run_of_slot_[size_t(slot)] == slot;
  }
}

void DecoderSession::split_runs(const std::function<void(int64_t group)>& work) {
  const int64_t n = runs(), groups = int64_t(group_bounds_.size()) - 1;
  logits_source_.resize(size_t(n));
  for (int64_t r = 0; r < n; ++r) logits_source_[size_t(r)] = r;  // nothing is shared now
  run_attention_.resize(size_t(n));
  logits_first_.resize(size_t(n));
  attention_batches_.resize(std::max(attention_batches_.size(), size_t(groups)));
  std::vector<double> group_seconds(size_t(groups), 0.0);
  double outside = 0.0;  // the runs' own work before the split is not the groups'
  for (int64_t r = 0; r < n; ++r) outside += run_seconds_[size_t(r)];
  backend_.run_tasks(groups, [&](int64_t g) {
    if (group_bounds_[size_t(g) + 1] > group_bounds_[size_t(g)])
      timed_work(group_seconds[size_t(g)], [&] { work(g); });
  });
  // The projections' cost per row: what the groups spent besides their runs' own work.
  for (int64_t g = 0; g < groups; ++g) outside += group_seconds[size_t(g)];
  for (int64_t r = 0; r < n; ++r) outside -= run_seconds_[size_t(r)];
  row_seconds_ = std::max(0.0, outside / double(n));
}

}  // namespace kvlens
