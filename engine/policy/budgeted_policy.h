// The machinery most policies share: the common knobs, dense layers, the always-visible columns,
// and "visible = forced columns + the top remaining-budget tokens by a score", at query-head or
// KV-head granularity, all through backend ops. Selection rows: R = H (query_head) or G (kv_head);
// per-layer state buffers are [R, stride] or [H, stride] as each policy documents.
#pragma once

#include <vector>

#include "engine/policy/policy.h"

namespace kvlens {

class BudgetedPolicy : public Policy {
 public:
  BudgetedPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs);

  // Widens the per-group scratch (a derived policy's own buffers: its override, which calls
  // this first and then reads the old stride nowhere: shape_.stride is the new one).
  void grow(int64_t stride) override;
  int64_t state_bytes() const override;

 protected:
  bool dense_layer(const LayerStep& step) const { return step.layer < knobs_.dense_layers; }
  int64_t selection_rows() const {
    return knobs_.kv_head_granularity ? shape_.kv_heads : shape_.heads;
  }
  int64_t group() const { return shape_.heads / shape_.kv_heads; }

  // Scores per query head [H, stride] seen at selection granularity: the input itself for
  // query_head, else its sum over each KV group (in a scratch buffer).
  const DeviceTensor& at_selection_rows(const DeviceTensor& head_scores, int64_t cols);

  // visible[H, stride] = forced columns (sinks, then `recent` most recent tokens including the
  // current one, truncated to B(t) by priority) + the top (B(t) - forced) columns by
  // `selection_scores` [R, stride] among `eligible` [R, stride] (null: all; when given, forced
  // columns that are not eligible stay hidden too). Returns B(t). On a sliding-window layer
  // (step.first_candidate > 0) only the window's columns are candidates, B counts the window's
  // tokens, and sinks before it are not forced.
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
  // one set (lazyllm), which selects on one row and expands it.
  void select_into(const LayerStep& step, int64_t recent, const DeviceTensor& selection_scores,
                   const DeviceTensor* eligible, DeviceTensor& target, int64_t budget,
                   int64_t page_size = 0);

  // Eviction: what select_budgeted did not choose leaves `kept` [R, stride] for good, except the
  // sinks. A budget below the sinks (early steps of a fractional budget) hides some of them for a
  // step; that is the budget's priority rule, not the policy dropping them.
  void evict_unselected(DeviceTensor& kept, const DeviceTensor& visible, int64_t cols);

  // The rows select_budgeted last chose: `visible` itself, or the per-group rows [G, stride].
  const DeviceTensor& selection(const DeviceTensor& visible) const {
    return knobs_.kv_head_granularity ? group_visible_ : visible;
  }

  PolicyShape shape_;
  Backend& backend_;
  CommonKnobs knobs_;

 private:
  DeviceTensor group_scores_;   // [G, stride] F32
  DeviceTensor group_visible_;  // [G, stride] U8
  // A sliding-window layer's candidates (LayerStep::first_candidate), [H, stride] U8, made on
  // the first such step; selections of R' rows use its first R' rows.
  DeviceTensor window_eligible_;
};

}  // namespace kvlens
