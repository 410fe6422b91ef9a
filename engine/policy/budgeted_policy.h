// The machinery most policies share: the common knobs, dense layers, the always-visible columns,
// and "visible = forced columns + the top remaining-budget tokens by a score", at query-head or
// KV-head granularity, all through backend ops. Selection rows: R = H (query_head) or G (kv_head);
// per-layer state buffers are [R, stride] or [H, stride] as each policy documents. An allocator
// (allocator.h: PyramidKV, Ada-KV) shares the same total budget out over layers or heads.
#pragma once

#include <vector>

#include "engine/backend/tensor_views.h"
#include "engine/policy/allocator.h"
#include "engine/policy/policy.h"

namespace kvlens {

class BudgetedPolicy : public Policy {
 public:
  BudgetedPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs);

  // Widens the per-group scratch (a derived policy's own buffers: its override, which calls
  // this first and then reads the old stride nowhere: shape_.stride is the new one).
  void grow(int64_t stride) override;
  int64_t state_bytes() const override;

  // Shares the budget out by `knobs` from the next select on (the registry's SCORER+ALLOCATOR
  // composition). A policy whose state depends on it (tova: per-head sets under Ada-KV)
  // overrides it, calling this first.
  virtual void set_allocator(const AllocatorKnobs& knobs) { allocator_ = knobs; }
  const AllocatorKnobs& allocator() const { return allocator_; }

 protected:
  bool dense_layer(const LayerStep& step) const { return step.layer < knobs_.dense_layers; }
  int64_t selection_rows() const {
    return knobs_.kv_head_granularity ? shape_.kv_heads : shape_.heads;
  }
  int64_t group() const { return shape_.heads / shape_.kv_heads; }

  // A rule whose rows are numbered by the model's heads (random's draws, the predictor's rows)
  // on a tensor-parallel shard (Backend::tensor_parallel_ranks() > 1, H of the model's H * ranks
  // heads here): it fills every head's row of model_head_rows(stride) [H * ranks, stride], then
  // keep_shard_rows copies this shard's (rows rank * H ..) into scores [H, stride].
  DeviceTensor& model_head_rows(int64_t stride);
  void keep_shard_rows(const DeviceTensor& model_rows, DeviceTensor& scores);

  // Scores per query head [H, stride] seen at selection granularity: the input itself for
  // query_head, else its sum over each KV group (in a scratch buffer).
  DeviceTensor at_selection_rows(const DeviceTensor& head_scores, int64_t cols);

  // This layer's budget: B(t) (the common rule), or under PyramidKV the forced columns of a
  // selection with `recent` recent tokens plus the layer's share of the non-forced rest
  // (pyramid_schedule over the non-dense layers), so the layers' budgets sum to theirs under B(t).
  // A layer's share is held to what it can keep (pyramid_allocation: its budget at the step
  // before plus the new token), so the total is met (calls at step t layer by layer, as sessions
  // make them, after step t - 1's).
  int64_t layer_budget(const LayerStep& step, int64_t recent);

  // visible[H, stride] = forced columns (sinks, then `recent` most recent tokens including the
  // current one, truncated to B(t) by priority) + the top (B(t) - forced) columns by
  // `selection_scores` [R, stride] among `eligible` [R, stride] (null: all; when given, forced
  // columns that are not eligible stay hidden too). Returns B(t). On a sliding-window layer
  // (step.first_candidate > 0) only the window's columns are candidates, B counts the window's
  // tokens, and sinks before it are not forced. The budget is layer_budget's; under Ada-KV the
  // rows' budgets differ (select_into) and B(t) is their mean.
  int64_t select_budgeted(const LayerStep& step, int64_t recent,
                          const DeviceTensor& selection_scores, const DeviceTensor* eligible,
                          DeviceTensor& visible);
  // The same with a budget other than B(t) (lazyllm's per-layer budgets), in [1, t + 1]. With
  // page_size > 0 the rest of the budget buys whole pages (select_pages: quest) instead of tokens.
  void select_budgeted(const LayerStep& step, int64_t recent, const DeviceTensor& selection_scores,
                       const DeviceTensor* eligible, DeviceTensor& visible, int64_t budget,
                       int64_t page_size = 0);

  // select_budgeted's choice written straight into `target` [R', stride] from
  // `selection_scores` [R', stride], whatever the granularity: for a policy whose heads all share
  // one set (lazyllm), which selects on one row and expands it. Under Ada-KV (page_size 0) each
  // row takes its forced columns and the top floor(floor_alpha * extra) of its own, then one
  // top-k over all R' rows' remaining candidates takes R' * (extra - that floor) more, extra =
  // budget - forced: the rows' counts differ, their total is R' * budget. On a tensor-parallel
  // shard that top-k runs over the selection rows of the whole model's heads, gathered from every
  // rank (select_pooled_across_ranks), so each rank keeps what one GPU would.
  void select_into(const LayerStep& step, int64_t recent, const DeviceTensor& selection_scores,
                   const DeviceTensor* eligible, DeviceTensor& target, int64_t budget,
                   int64_t page_size = 0);

  // Eviction: what select_budgeted did not choose leaves `kept` [R, stride] for good, except the
  // sinks. A budget below the sinks (early steps of a fractional budget) hides some of them for a
  // step; that is the budget's priority rule, not the policy dropping them.
  void evict_unselected(DeviceTensor& kept, const DeviceTensor& visible, int64_t cols);

  // The rows select_budgeted last chose: `visible` itself, or the per-group rows [G, stride].
  DeviceTensor selection(const DeviceTensor& visible) const {
    return knobs_.kv_head_granularity ? tensor::row_range(group_visible_, 0, shape_.kv_heads)
                                      : visible;
  }

  PolicyShape shape_;
  Backend& backend_;
  CommonKnobs knobs_;
  AllocatorKnobs allocator_;

 private:
  // Ada-KV's part of select_into (its comment): `forced` as select_into computed it.
  void select_adaptive(const DeviceTensor& scores, int64_t cols, const DeviceTensor* eligible,
                       const ForcedColumns& forced, int64_t extra, DeviceTensor& target);
  // The whole model's selection rows (H or G) on a tensor-parallel shard and the first of this
  // shard's among them; this policy's own rows when the model is not split.
  int64_t model_selection_rows() const;
  int64_t first_model_selection_row() const;
  // Ada-KV's pooled top-k of `pooled` columns on a tensor-parallel shard: every rank's selection
  // rows (scores, and which columns are no candidates: chosen already, not eligible, past
  // `cols`) are gathered into the whole model's by all-reduces of zero-padded rows (exact: one
  // term and zeros), every rank runs one GPU's top-k over them, then keeps its own rows. U8 has
  // no all-reduce, so the candidate flags pass through the host as F32 (a read-back per layer:
  // the price of Ada-KV over several GPUs).
  void select_pooled_across_ranks(const DeviceTensor& scores, int64_t cols,
                                  const DeviceTensor* eligible, int64_t pooled,
                                  DeviceTensor& target);

  // PyramidKV: each layer's last budget and the step it was given at (-1: none yet).
  std::vector<int64_t> pyramid_budget_, pyramid_step_;
  // The layers' candidates at pyramid_room_step_ (their budgets then + 1; -1: not limited).
  std::vector<int64_t> pyramid_room_;
  int64_t pyramid_room_step_ = -1;

  // The first rows of group_scores_ or group_visible_ for `head_rows` rows of query heads (one
  // layer's H, or several layers' at once: tokenbutler), the buffer widened to them if needed.
  DeviceTensor group_rows(DeviceTensor& buffer, DType dtype, int64_t head_rows);

  // Per KV group: [G, stride], or more rows where several layers are selected at once.
  DeviceTensor group_scores_;     // [G, stride] F32
  DeviceTensor model_head_rows_;  // [H * ranks, stride] F32 on a tensor-parallel shard
  DeviceTensor group_visible_;    // [G, stride] U8
  // Ada-KV on a tensor-parallel shard: the whole model's selection rows [R, stride] of scores
  // (F32), of zeros (F32, to clear them), and of the no-candidate flags (F32 summed, U8 used).
  DeviceTensor model_scores_, model_zeros_, model_blocked_sums_, model_blocked_;
  // A sliding-window layer's candidates (LayerStep::first_candidate), [H, stride] U8, made on
  // the first such step; selections of R' rows use its first R' rows.
  DeviceTensor window_eligible_;
};

}  // namespace kvlens
