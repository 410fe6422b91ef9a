// Forced columns + top-k selection shared by the budgeted policies.
#include "engine/policy/budgeted_policy.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend/tensor_views.h"
#include "engine/common/error.h"

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
  return tensor_bytes({group_scores_, group_visible_, window_eligible_, model_head_rows_,
                       model_scores_, model_zeros_, model_blocked_sums_, model_blocked_});
}

DeviceTensor& BudgetedPolicy::model_head_rows(int64_t stride) {
  if (model_head_rows_.empty() || model_head_rows_.dim(1) != stride) {
    model_head_rows_ =
        backend_.alloc(DType::F32, {shape_.heads * backend_.tensor_parallel_ranks(), stride});
  }
  return model_head_rows_;
}

void BudgetedPolicy::keep_shard_rows(const DeviceTensor& model_rows, DeviceTensor& scores) {
  backend_.copy_rows(model_rows, backend_.tensor_parallel_rank() * shape_.heads, scores, 0,
                     shape_.heads, scores.dim(1));
}

DeviceTensor BudgetedPolicy::group_rows(DeviceTensor& buffer, DType dtype, int64_t head_rows) {
  const int64_t rows = head_rows / group();
  if (buffer.dim(0) < rows) buffer = backend_.alloc(dtype, {rows, shape_.stride});
  return tensor::row_range(buffer, 0, rows);
}

DeviceTensor BudgetedPolicy::at_selection_rows(const DeviceTensor& head_scores, int64_t cols) {
  if (!knobs_.kv_head_granularity) return head_scores;
  DeviceTensor group_sums = group_rows(group_scores_, DType::F32, head_scores.dim(0));
  backend_.sum_row_groups(head_scores, cols, group(), group_sums);
  return group_sums;
}

int64_t BudgetedPolicy::select_budgeted(const LayerStep& step, int64_t recent,
                                        const DeviceTensor& selection_scores,
                                        const DeviceTensor* eligible, DeviceTensor& visible) {
  const int64_t budget = layer_budget(step, recent);
  select_budgeted(step, recent, selection_scores, eligible, visible, budget);
  return budget;
}

int64_t BudgetedPolicy::layer_budget(const LayerStep& step, int64_t recent) {
  const int64_t budget = knobs_.budget(step);
  if (allocator_.kind != AllocatorKind::Pyramid || dense_layer(step)) return budget;
  const int64_t first_policy_layer = std::max<int64_t>(knobs_.dense_layers, 0);
  const int64_t layers = shape_.layers - first_policy_layer;
  const int64_t index = step.layer - first_policy_layer;
  if (layers <= 1 || index < 0 || index >= layers) return budget;
  // The forced part as select_into will force it (sinks before a window are not forced).
  const int64_t sinks = step.first_candidate >= knobs_.sinks ? 0 : knobs_.sinks;
  const int64_t forced =
      forced_columns(step.step, budget, sinks, std::max(recent, knobs_.window)).count(step.step);
  const int64_t extra = std::max<int64_t>(0, budget - forced);
  const int64_t capacity = std::max(extra, step.candidates() - forced);
  if (pyramid_step_.empty()) {
    pyramid_step_.assign(size_t(layers), -1);
    pyramid_budget_.assign(size_t(layers), 0);
  }
  // The room of each layer that chose a set at the previous step: its budget then, plus the new
  // token, less this step's forced part (a layer that was dense or has not chosen yet keeps all).
  // Taken once per step, before any layer of it records its own budget.
  if (pyramid_room_step_ != step.step) {
    pyramid_room_step_ = step.step;
    pyramid_room_.assign(size_t(layers), -1);
    for (size_t i = 0; i < pyramid_room_.size(); ++i)
      if (pyramid_step_[i] == step.step - 1) pyramid_room_[i] = pyramid_budget_[i] + 1;
  }
  std::vector<int64_t> room(size_t(layers), -1);
  for (size_t i = 0; i < room.size(); ++i)
    if (pyramid_room_[i] >= 0) room[i] = std::max<int64_t>(0, pyramid_room_[i] - forced);
  const int64_t share =
      pyramid_allocation(extra, capacity, room, allocator_.pyramid_beta)[size_t(index)];
  pyramid_step_[size_t(index)] = step.step;
  pyramid_budget_[size_t(index)] = forced + share;
  return forced + share;
}

void BudgetedPolicy::select_budgeted(const LayerStep& step, int64_t recent,
                                     const DeviceTensor& selection_scores,
                                     const DeviceTensor* eligible, DeviceTensor& visible,
                                     int64_t budget, int64_t page_size) {
  if (!knobs_.kv_head_granularity) {
    select_into(step, recent, selection_scores, eligible, visible, budget, page_size);
    return;
  }
  DeviceTensor target = group_rows(group_visible_, DType::U8, visible.dim(0));
  select_into(step, recent, selection_scores, eligible, target, budget, page_size);
  backend_.expand_row_groups(target, step.cols(), group(), visible);
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
  } else if (allocator_.kind == AllocatorKind::Adaptive && extra > 0 &&
             (backend_.tensor_parallel_ranks() > 1 ? model_selection_rows() : target.dim(0)) > 1) {
    select_adaptive(selection_scores, cols, eligible, forced, extra, target);
  } else {
    backend_.mark_and_select_top_k(selection_scores, cols, eligible, forced.sink_end,
                                   forced.recent_begin, extra, target);
  }
}

void BudgetedPolicy::select_adaptive(const DeviceTensor& scores, int64_t cols,
                                     const DeviceTensor* eligible, const ForcedColumns& forced,
                                     int64_t extra, DeviceTensor& target) {
  const int64_t rows = target.dim(0), stride = target.dim(1);
  if (scores.dim(1) != stride || (eligible != nullptr && eligible->dim(1) != stride))
    throw Error("adakv", "row stride", "scores, candidates and selection of one stride",
                std::to_string(scores.dim(1)) + " vs " + std::to_string(stride));
  const int64_t own = std::min(extra, adaptive_floor(extra, allocator_.floor_alpha));
  backend_.mark_and_select_top_k(scores, cols, eligible, forced.sink_end, forced.recent_begin, own,
                                 target);
  if (backend_.tensor_parallel_ranks() > 1) {
    // Every rank calls this at the same layer (extra and own are the step's counts): its
    // collectives pair up.
    const int64_t pooled = model_selection_rows() * (extra - own);
    if (pooled > 0) select_pooled_across_ranks(scores, cols, eligible, pooled, target);
    return;
  }
  const int64_t pooled = rows * (extra - own);
  if (pooled == 0) return;
  // One top-k over the rows laid end to end: the columns past the candidates count as chosen
  // meanwhile, so they are no candidates (ties go to the higher flat index: the later row).
  backend_.fill_columns(target, cols, stride, 1);
  DeviceTensor flat_target = tensor::view(target, {1, rows * stride});
  const DeviceTensor flat_scores =
      tensor::view(tensor::row_range(scores, 0, rows), {1, rows * stride});
  DeviceTensor flat_eligible;
  if (eligible != nullptr)
    flat_eligible = tensor::view(tensor::row_range(*eligible, 0, rows), {1, rows * stride});
  backend_.select_top_k(flat_scores, rows * stride, eligible ? &flat_eligible : nullptr, pooled,
                        flat_target);
  backend_.fill_columns(target, cols, stride, 0);
}

int64_t BudgetedPolicy::model_selection_rows() const {
  return knobs_.kv_head_granularity ? shape_.whole_kv_heads() : shape_.whole_heads();
}

int64_t BudgetedPolicy::first_model_selection_row() const {
  return knobs_.kv_head_granularity ? shape_.first_kv_head : shape_.first_head;
}

void BudgetedPolicy::select_pooled_across_ranks(const DeviceTensor& scores, int64_t cols,
                                                const DeviceTensor* eligible, int64_t pooled,
                                                DeviceTensor& target) {
  const int64_t rows = target.dim(0), stride = target.dim(1);
  // Ada-KV composes with per-head selections only (not lazyllm's one shared row, nor several
  // layers' rows at once): the target is this shard's selection rows.
  if (rows != selection_rows())
    throw Error("adakv", "tensor parallel", std::to_string(selection_rows()) + " selection rows",
                std::to_string(rows));
  const int64_t model_rows = model_selection_rows(), first_row = first_model_selection_row();
  if (model_scores_.empty() || model_scores_.dim(1) != stride) {
    model_scores_ = backend_.alloc(DType::F32, {model_rows, stride});
    model_zeros_ = backend_.alloc(DType::F32, {model_rows, stride});
    model_blocked_sums_ = backend_.alloc(DType::F32, {model_rows, stride});
    model_blocked_ = backend_.alloc(DType::U8, {model_rows, stride});
  }
  // Every head's scores: this shard's rows at their place, zeros in the others' (summed over the
  // ranks, each element has one nonzero term: exact).
  backend_.copy_rows(model_zeros_, 0, model_scores_, 0, model_rows, stride);
  backend_.copy_rows(scores, 0, model_scores_, first_row, rows, stride);
  backend_.all_reduce_sum(model_scores_);

  // Which columns of this shard's rows are no candidates of the pooled top-k (chosen already,
  // not eligible, past the candidates: what select_adaptive's target and eligible say), as 0/1
  // in the whole model's rows, then the same for every rank's rows.
  const size_t shard_elements = size_t(rows * stride);
  std::vector<uint8_t> chosen(shard_elements), allowed;
  backend_.to_host(target, chosen.data(), shard_elements);
  if (eligible != nullptr) {
    allowed.resize(shard_elements);
    backend_.to_host(tensor::row_range(*eligible, 0, rows), allowed.data(), shard_elements);
  }
  std::vector<float> blocked(size_t(model_rows * stride), 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < stride; ++j) {
      const size_t at = size_t(r * stride + j);
      const bool candidate = j < cols && chosen[at] == 0 && (eligible == nullptr || allowed[at]);
      blocked[size_t((first_row + r) * stride + j)] = candidate ? 0.0f : 1.0f;
    }
  }
  backend_.from_host(model_blocked_sums_, blocked.data(), blocked.size() * sizeof(float));
  backend_.all_reduce_sum(model_blocked_sums_);
  backend_.to_host(model_blocked_sums_, blocked.data(), blocked.size() * sizeof(float));
  std::vector<uint8_t> flags(blocked.size());
  for (size_t i = 0; i < blocked.size(); ++i) flags[i] = blocked[i] != 0.0f ? 1 : 0;
  backend_.from_host(model_blocked_, flags.data(), flags.size());

  // One GPU's top-k over every head's row laid end to end (ties to the higher flat index, the
  // later row: the same order as there), then this shard's rows: what it had, what it gained,
  // and the flags of the columns that were not eligible or past the candidates, which go.
  const int64_t flat = model_rows * stride;
  DeviceTensor flat_blocked = tensor::view(model_blocked_, {1, flat});
  backend_.select_top_k(tensor::view(model_scores_, {1, flat}), flat, nullptr, pooled,
                        flat_blocked);
  backend_.copy_rows(model_blocked_, first_row, target, 0, rows, stride);
  if (eligible != nullptr) backend_.mask_and(target, tensor::row_range(*eligible, 0, rows), cols);
  backend_.fill_columns(target, cols, stride, 0);
}

void BudgetedPolicy::evict_unselected(DeviceTensor& kept, const DeviceTensor& visible,
                                      int64_t cols) {
  backend_.keep_selected(kept, selection(visible), cols, knobs_.sinks);
}

}  // namespace kvlens
