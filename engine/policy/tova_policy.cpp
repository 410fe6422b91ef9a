// tova (TOVA, Oren et al. 2024, "Transformers are Multi-State RNNs"; docs/policies/tova.md): once
// a layer's cache is over the budget, the tokens the current query attends to least, averaged over
// every query head of the layer, are evicted for good; every head of a layer keeps the same tokens.
//
// Rule at step t, layer l (not a dense layer): the candidates are the tokens still kept and the
// current token t. Token t is forced (as in TOVA, whose query always attends to the token it just
// appended); the sinks and `window` as every budgeted policy. The rest of B(t) (the common rule,
// B of the window's keys on a sliding-window layer) is the top of the kept tokens by p(t - 1, j):
// the attention query t - 1 paid token j at this layer, averaged over the H query heads (as
// computed under step t - 1's visible set). What is not chosen is evicted. This is TOVA's order:
// the authors' cache evicts right after step t - 1's attention, by that attention, and step t then
// attends to what is left plus token t. The granularity knob changes nothing (one set per layer,
// as TOVA's average over all query heads with GQA's KV heads repeated).
// A step whose previous step was not observed at this layer (step 0; the first step after a dense
// prompt) has nothing to rank by: it is dense and evicts nothing, and its attention ranks the next
// step (TOVA reduces the prompt by the last prompt token's attention instead: one step earlier).
// State per layer: the head-averaged attention of the last observed step [1, stride] F32, the
// layer's kept tokens [1, stride] U8. Under PyramidKV the layer's budget is its share
// (BudgetedPolicy::layer_budget); under Ada-KV the sets are per head (set_allocator).
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class TovaPolicy final : public BudgetedPolicy {
 public:
  TovaPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs)
      : BudgetedPolicy(shape, backend, knobs),
        head_sum_(backend.alloc(DType::F32, {1, shape.stride})),
        chosen_(backend.alloc(DType::U8, {1, shape.stride})),
        observed_step_(size_t(shape.layers), -1) {
    for (int64_t l = 0; l < shape.layers; ++l) {
      head_mean_.push_back(backend.alloc(DType::F32, {1, shape.stride}));
      kept_.push_back(backend.alloc(DType::U8, {1, shape.stride}));
      backend.fill_columns(kept_.back(), 0, shape.stride, 1);
    }
  }

  bool wants_probs(const LayerStep& step) const override { return !dense_layer(step); }

  // Ranks by the previous step's attention, never this step's logits.
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  // Under Ada-KV each head (each KV group at kv_head granularity) keeps a set of its own, ranked
  // by its own attention of the previous step (the per-head form the TOVA paper compares with its
  // head average): the layer's state becomes [H, stride] attention and [R, stride] kept rows.
  void set_allocator(const AllocatorKnobs& knobs) override {
    BudgetedPolicy::set_allocator(knobs);
    per_head_ = knobs.kind == AllocatorKind::Adaptive;
    const int64_t rows = per_head_ ? shape_.heads : 1, kept_rows = per_head_ ? selection_rows() : 1;
    for (int64_t l = 0; l < shape_.layers; ++l) {
      head_mean_[size_t(l)] = backend_.alloc(DType::F32, {rows, shape_.stride});
      kept_[size_t(l)] = backend_.alloc(DType::U8, {kept_rows, shape_.stride});
      backend_.fill_columns(kept_[size_t(l)], 0, shape_.stride, 1);
    }
  }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    head_sum_ = widen_columns(backend_, head_sum_, stride);
    chosen_ = widen_columns(backend_, chosen_, stride);
    for (DeviceTensor& mean : head_mean_) mean = widen_columns(backend_, mean, stride);
    for (DeviceTensor& kept : kept_) kept = widen_columns(backend_, kept, stride, 1);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + tensor_bytes({head_sum_, chosen_}) +
           tensor_bytes(head_mean_) + tensor_bytes(kept_);
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    if (step.step == 0 || observed_step_[l] != step.step - 1) return LayerDecision::Dense;
    const int64_t cols = step.cols();
    // The current token was never attended to: its 0 does not matter, it is forced.
    if (per_head_) {
      // Ada-KV: each head ranks by its own attention, one top-k over the layer's heads.
      backend_.axpby_rows(scores, 1.0f, head_mean_[l], 0.0f, cols);
      select_budgeted(step, 1, at_selection_rows(scores, cols), &kept_[l], visible);
      evict_unselected(kept_[l], visible, cols);
      return LayerDecision::Masked;
    }
    backend_.axpby_rows(scores, 1.0f, head_mean_[l], 0.0f, cols);  // one row for every head
    select_into(step, 1, head_mean_[l], &kept_[l], chosen_, layer_budget(step, 1));
    backend_.keep_selected(kept_[l], chosen_, cols, knobs_.sinks);
    backend_.expand_row_groups(chosen_, cols, shape_.heads, visible);
    return LayerDecision::Masked;
  }

  void observe(const LayerStep& step, const DeviceTensor& probs) override {
    if (dense_layer(step)) return;
    const size_t l = size_t(step.layer);
    const int64_t cols = step.cols();
    if (per_head_) {
      backend_.axpby_rows(head_mean_[l], 1.0f, probs, 0.0f, cols);
      observed_step_[l] = step.step;
      return;
    }
    backend_.sum_row_groups(probs, cols, shape_.heads, head_sum_);
    // A tensor-parallel shard holds heads / ranks of the layer's heads: the others' sums join.
    backend_.all_reduce_sum(head_sum_);
    const double heads = double(shape_.heads * backend_.tensor_parallel_ranks());
    backend_.axpby_rows(head_mean_[l], float(1.0 / heads), head_sum_, 0.0f, cols);
    observed_step_[l] = step.step;
  }

 private:
  DeviceTensor head_sum_;                // [1, stride] F32 scratch
  DeviceTensor chosen_;                  // [1, stride] U8: the layer's one set this step
  std::vector<DeviceTensor> head_mean_;  // per layer [1, stride] F32 ([H, stride] per head)
  std::vector<DeviceTensor> kept_;       // per layer [1, stride] U8 ([R, stride] per head)
  bool per_head_ = false;                // Ada-KV: per-head sets (set_allocator)
  std::vector<int64_t> observed_step_;   // per layer: the step head_mean_ holds (-1: none)
};

}  // namespace

PolicyInfo tova_policy_info() {
  PolicyInfo info{
      "tova", "eviction (TOVA)",
      "Once over the budget, evicts the tokens the current query attends to least, averaged "
      "over the layer's heads (one set per layer); evicted tokens never return.",
      with_common_specs({})};
  info.reduces_heads = true;
  return info;
}

std::unique_ptr<Policy> make_tova_policy(const PolicyShape& shape, Backend& backend,
                                         const ParamValues& params, double sparsity) {
  return std::make_unique<TovaPolicy>(shape, backend, read_common_knobs(params, sparsity));
}

}  // namespace kvlens
