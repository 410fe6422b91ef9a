// lazyllm (LazyLLM, decode form, POLICIES.md): layer l keeps the top keep(l) fraction of the
// candidates, ranked by the attention the current token paid them in layer l - 1 at this step
// (as computed under layer l - 1's visible set, so tokens pruned there rank lowest here), averaged
// over the heads. One set for every head of the layer (granularity changes nothing). Nothing is
// evicted: a token pruned at a layer may return at a later step.
//
// Budget of layer l at step t: B_l(t) = max(min_keep, ceil(keep(l) * (t + 1))) (with
// budget_tokens = K: max(1, ceil(keep(l) * K)) tokens), plus the sinks under
// budget_excludes_sinks, at most t + 1 (on a sliding-window layer t + 1 is the window's keys,
// docs/models.md); the current token, the sinks and `window` are forced and
// truncated to B_l(t) by POLICIES.md's priority, the rest is the top by the averaged attention.
//
// keep(l) (lazyllm_keep_schedule): layers l < max(1, dense_layers) are dense, keep 1 (layer 0 has
// no previous layer to rank by). The others follow the base schedule b(l) = 1.0, 0.7, 0.4, 0.1
// by quarter of depth (quarter floor(4 l / N)), scaled multiplicatively: keep(l) = min(1, c b(l))
// with c >= 0 chosen (bisection, to double precision) so that the mean of keep over all N layers,
// dense ones included, is 1 - s. At s = 0 that makes every keep 1 (dense logits). Clamping to 1
// never makes a target unreachable (c can grow until every layer keeps everything); the dense
// layers can: when 1 - s is below their share n_dense / N, c = 0 and every other layer keeps the
// fraction 0, i.e. min_keep tokens (the current token by default; B_l truncates the sinks), a
// mean of n_dense / N above the target. The effective sparsity the
// run reports shows what was achieved.
// State: the head-averaged probability row of the last observed layer [1, stride] F32; the set is
// chosen on that one row and given to every head.
#include <algorithm>
#include <cmath>

#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {

std::vector<double> lazyllm_keep_schedule(int64_t layers, int64_t dense_layers, double sparsity) {
  const int64_t fixed = std::min<int64_t>(layers, std::max<int64_t>(1, dense_layers));
  std::vector<double> base(size_t(layers), 1.0);
  for (int64_t l = fixed; l < layers; ++l) {
    static constexpr double kQuarters[4] = {1.0, 0.7, 0.4, 0.1};
    base[size_t(l)] = kQuarters[std::min<int64_t>(3, 4 * l / layers)];
  }
  auto keeps = [&](double c) {
    std::vector<double> keep(size_t(layers), 1.0);
    for (int64_t l = fixed; l < layers; ++l) keep[size_t(l)] = std::min(1.0, c * base[size_t(l)]);
    return keep;
  };
  auto mean = [](const std::vector<double>& keep) {
    double sum = 0.0;
    for (double k : keep) sum += k;
    return keep.empty() ? 1.0 : sum / double(keep.size());
  };
  const double target = 1.0 - sparsity;
  // Every base value is >= 0.1, so c = 10 keeps everything.
  double lo = 0.0, hi = 10.0;
  if (mean(keeps(hi)) <= target) return keeps(hi);
  if (mean(keeps(lo)) >= target) return keeps(lo);
  for (int i = 0; i < 200 && lo < hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    (mean(keeps(mid)) < target ? lo : hi) = mid;
  }
  return keeps(hi);
}

namespace {

class LazyllmPolicy final : public BudgetedPolicy {
 public:
  LazyllmPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs)
      : BudgetedPolicy(shape, backend, knobs),
        keep_(lazyllm_keep_schedule(shape.layers, knobs.dense_layers, knobs.sparsity)),
        head_sum_(backend.alloc(DType::F32, {1, shape.stride})),
        previous_(backend.alloc(DType::F32, {1, shape.stride})),
        chosen_(backend.alloc(DType::U8, {1, shape.stride})) {}

  // Layer l's probabilities rank layer l + 1's tokens: only where layer l + 1 is ranked (not
  // one of the dense layers, and not past the last layer).
  bool wants_probs(const LayerStep& step) const override {
    return step.layer + 1 < shape_.layers && step.layer + 1 >= knobs_.dense_layers;
  }

  // Chooses without this step's logits (see Policy::reads_logits).
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    head_sum_ = widen_columns(backend_, head_sum_, stride);
    previous_ = widen_columns(backend_, previous_, stride);
    chosen_ = widen_columns(backend_, chosen_, stride);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + tensor_bytes({head_sum_, previous_, chosen_});
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    const int64_t t = step.step, cols = step.cols();
    // Layer 0 (and the dense layers) have no ranking; nor has a layer whose predecessor was not
    // observed at this step (never in a session run).
    if (step.layer == 0 || dense_layer(step) || observed_step_ != t ||
        observed_layer_ != step.layer - 1)
      return LayerDecision::Dense;
    const int64_t budget = layer_budget(size_t(step.layer), step);
    // keep every candidate (a sliding-window layer's: its window): the dense arithmetic
    if (budget >= step.candidates()) return LayerDecision::Dense;
    backend_.axpby_rows(scores, 1.0f, previous_, 0.0f, cols);  // the same row for every head
    // Every head's set is the same: chosen once, on the one row, then given to every head.
    select_into(step, 1, previous_, nullptr, chosen_, budget);
    backend_.expand_row_groups(chosen_, cols, shape_.heads, visible);
    return LayerDecision::Masked;
  }

  void observe(const LayerStep& step, const DeviceTensor& probs) override {
    const int64_t cols = step.cols();
    backend_.sum_row_groups(probs, cols, shape_.heads, head_sum_);
    // A tensor-parallel shard holds heads / ranks of the layer's heads: the others' sums join.
    backend_.all_reduce_sum(head_sum_);
    const double heads = double(shape_.heads * backend_.tensor_parallel_ranks());
    backend_.axpby_rows(previous_, float(1.0 / heads), head_sum_, 0.0f, cols);
    observed_step_ = step.step;
    observed_layer_ = step.layer;
  }

 private:
  int64_t layer_budget(size_t layer, const LayerStep& step) const {
    CommonKnobs knobs = knobs_;
    const double keep = keep_[layer];
    if (knobs.budget_tokens > 0) {
      knobs.budget_tokens =
          std::max<int64_t>(1, int64_t(std::ceil(keep * double(knobs.budget_tokens) - 1e-9)));
    } else {
      knobs.sparsity = 1.0 - keep;
    }
    return knobs.budget(step);
  }

  std::vector<double> keep_;
  DeviceTensor head_sum_, previous_;  // [1, stride]
  DeviceTensor chosen_;               // [1, stride] U8: the layer's one set
  int64_t observed_step_ = -1, observed_layer_ = -1;
};

}  // namespace

PolicyInfo lazyllm_policy_info() {
  PolicyInfo info{
      "lazyllm", "progressive pruning (LazyLLM, decode form)",
      "Layer l keeps the top keep(l) fraction of tokens by the previous layer's head-averaged "
      "attention; keep falls with depth (1, 0.7, 0.4, 0.1 per quarter, scaled to mean 1 - s); "
      "pruned tokens may return.",
      with_common_specs({})};
  info.reduces_heads = true;
  return info;
}

std::unique_ptr<Policy> make_lazyllm_policy(const PolicyShape& shape, Backend& backend,
                                            const ParamValues& params, double sparsity) {
  return std::make_unique<LazyllmPolicy>(shape, backend, read_common_knobs(params, sparsity));
}

}  // namespace kvlens
