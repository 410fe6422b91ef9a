// DecoderSession's split of a lockstep step, once its rows differ, into the groups of runs
// LockstepPlan planned, each going through the layers left on one of the backend's threads.
#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "engine/backend/tensor_views.h"
#include "engine/session/decoder_session.h"

namespace kvlens {

using tensor::timed_work;

void DecoderSession::split_runs(const std::function<void(int64_t group)>& work) {
  const int64_t n = runs(), groups = int64_t(plan_.group_bounds.size()) - 1;
  logits_source_.resize(size_t(n));
  for (int64_t r = 0; r < n; ++r) logits_source_[size_t(r)] = r;  // nothing is shared now
  run_attention_.resize(size_t(n));
  logits_first_.resize(size_t(n));
  attention_batches_.resize(std::max(attention_batches_.size(), size_t(groups)));
  std::vector<double> group_seconds(size_t(groups), 0.0);
  double before = 0.0;  // the runs' own work before the split is not the groups'
  for (int64_t r = 0; r < n; ++r) before += plan_.run_seconds[size_t(r)];
  backend_.run_tasks(groups, [&](int64_t g) {
    if (plan_.group_bounds[size_t(g) + 1] > plan_.group_bounds[size_t(g)])
      timed_work(group_seconds[size_t(g)], [&] { work(g); });
  });
  plan_.record_split(group_seconds, before);
}

}  // namespace kvlens
