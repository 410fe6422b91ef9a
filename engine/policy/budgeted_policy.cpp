// Forced columns + top-k selection shared by the budgeted policies.
#include "engine/policy/budgeted_policy.h"

#include <algorithm>

#include "engine/backend/tensor_views.h"

namespace kvlens {

BudgetedPolicy::BudgetedPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs)
    : shape_(shape), backend_(backend), knobs_(knobs) {
  if (knobs_.kv_head_granularity) {
    group_scores_ = backend_.alloc(DType::F32, {shape_.kv_heads, shape_.stride});
    group_visible_ = backend_.alloc(DType::U8, {shape_.kv_heads, shape_.stride});
  }
}

void BudgetedPolicy::grow(int64_t stride) {
  if (stride <= shape_.stride) return;
  shape_.stride = stride;
  group_scores_ = widen_columns(backend_, group_scores_, stride);
  group_visible_ = widen_columns(backend_, group_visible_, stride);
  if (!window_eligible_.empty())
    window_eligible_ = widen_columns(backend_, window_eligible_, stride);
}

int64_t BudgetedPolicy::state_bytes() const {
  return tensor_bytes({group_scores_, group_visible_, window_eligible_});
}

const DeviceTensor& BudgetedPolicy::at_selection_rows(const DeviceTensor& head_scores,
                                                      int64_t cols) {
  if (!knobs_.kv_head_granularity) return head_scores;
  backend_.sum_row_groups(head_scores, cols, group(), group_scores_);
  return group_scores_;
}

int64_t BudgetedPolicy::select_budgeted(const LayerStep& step, int64_t recent,
                                        const DeviceTensor& selection_scores,
                                        const DeviceTensor* eligible, DeviceTensor& visible) {
  const int64_t budget = knobs_.budget(step);
  select_budgeted(step, recent, selection_scores, eligible, visible, budget);
  return budget;
}

void BudgetedPolicy::select_budgeted(const LayerStep& step, int64_t recent,
                                     const DeviceTensor& selection_scores,
                                     const DeviceTensor* eligible, DeviceTensor& visible,
                                     int64_t budget, int64_t page_size) {
  DeviceTensor& target = knobs_.kv_head_granularity ? group_visible_ : visible;
  select_into(step, recent, selection_scores, eligible, target, budget, page_size);
  if (knobs_.kv_head_granularity)
    backend_.expand_row_groups(group_visible_, step.cols(), group(), visible);
}

void BudgetedPolicy::select_into(const LayerStep& step, int64_t recent,
                                 const DeviceTensor& selection_scores, const DeviceTensor* eligible,
                                 DeviceTensor& target, int64_t budget, int64_t page_size) {
  const int64_t t = step.step, cols = step.cols();
  const int64_t first = step.first_candidate;
  DeviceTensor window;
  if (first > 0) {
    // A sliding window: the candidates are its columns, and the policy's own eligible ones.
    if (window_eligible_.empty())
      window_eligible_ = backend_.alloc(DType::U8, {shape_.heads, shape_.stride});
    window = tensor::row_range(window_eligible_, 0, target.dim(0));
    backend_.fill_columns(window, 0, first, 0);
    backend_.fill_columns(window, first, cols, 1);
    if (eligible != nullptr) backend_.mask_and(window, *eligible, cols);
    eligible = &window;
  }
  // Sinks before a window are no candidates: not forced (they would take budget and stay hidden).
  const int64_t sinks = first >= knobs_.sinks ? 0 : knobs_.sinks;
  const ForcedColumns forced = forced_columns(t, budget, sinks, std::max(recent, knobs_.window));
  // An evicted token stays out even where it would be forced (a growing budget widens the recent
  // part over a token dropped earlier): the set then keeps fewer than B(t), never a returnee.
  const int64_t extra = budget - forced.count(t);
  if (page_size > 0) {
    backend_.mark_columns(target, cols, forced.sink_end, forced.recent_begin, eligible);
    if (extra > 0) {
      // A page costs its columns not chosen yet: the columns before a window count as chosen
      // while the pages are bought, so a page straddling its start costs (and buys) only its
      // columns inside, and a page wholly before it is no candidate.
      if (first > 0) backend_.fill_columns(target, 0, first, 1);
      backend_.select_pages(selection_scores, cols, page_size, extra, target);
      if (first > 0) backend_.fill_columns(target, 0, first, 0);
    }
  } else {
    backend_.mark_and_select_top_k(selection_scores, cols, eligible, forced.sink_end,
                                   forced.recent_begin, extra, target);
  }
}

void BudgetedPolicy::evict_unselected(DeviceTensor& kept, const DeviceTensor& visible,
                                      int64_t cols) {
  backend_.keep_selected(kept, selection(visible), cols, knobs_.sinks);
}

}  // namespace kvlens
