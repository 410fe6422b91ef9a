// twilight (Twilight, Lin et al. 2025; docs/policies/twilight.md): "select then prune". A base
// selector (quest or doublesparsity) picks at most B(t) candidates per head from its own
// estimated logits, then top-p over the softmax of those estimates keeps, per query head, the
// smallest set of its candidates whose estimated attention mass reaches top_p: each head's k
// differs per step and never exceeds B(t). Per-layer state is the base's; the pruning is
// TopPOps::top_p_prune (top_p_ops.h) on visible [H, stride] with the base's scores [H, stride].
//
// The rule at step t, layer l (not a dense layer):
// - Base. The base policy runs as itself with the same knobs (B(t), sinks, window, dense
//   layers, granularity, page_size / channels) and writes its visible set and its scores: quest's
//   page upper bounds or doublesparsity's label-channel logits, both on the true logits' scale.
// - Estimate. w_j = exp(s_j - max) over the base's visible columns j of the head (the softmax of
//   the base's scores restricted to its candidates). Twilight's own code estimates with q against
//   INT4-quantised keys; kvlens reuses the base's estimate (the docs page says why).
// - Prune. The candidates, best estimate first (ties to the more recent token), are kept until
//   their weights reach top_p of the head's total; the rest of the candidates are hidden, except
//   the base's forced columns (sinks, the current token, the window; quest: the current page),
//   which stay. Per query head, also at kv_head granularity (the authors repeat keys per head).
// - A layer the base leaves dense (a dense layer, or B(t) covering every candidate) stays dense.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/top_p_ops.h"

namespace kvlens {
namespace {

class TwilightPolicy final : public Policy {
 public:
  // page_size: the base's page (quest), whose current page is forced; 0 for a token-level base.
  TwilightPolicy(std::unique_ptr<Policy> base, Backend& backend, CommonKnobs knobs, float top_p,
                 int64_t page_size)
      : base_(std::move(base)),
        ops_(top_p_ops(backend)),
        knobs_(knobs),
        top_p_(top_p),
        page_size_(page_size) {}

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    const LayerDecision decision = base_->select(step, visible, scores);
    if (decision != LayerDecision::Masked) return decision;
    // B(t) covering every candidate (sparsity 0) is dense, as for every policy: the base (which
    // may mask every candidate rather than say Dense) has still kept its state up to date.
    if (knobs_.budget(step) >= step.candidates()) return LayerDecision::Dense;
    // The base's forced columns, as BudgetedPolicy::select_into forced them.
    const int64_t t = step.step;
    const int64_t recent = page_size_ > 0 ? t % page_size_ + 1 : 1;
    const int64_t sinks = step.first_candidate >= knobs_.sinks ? 0 : knobs_.sinks;
    const ForcedColumns forced =
        forced_columns(t, knobs_.budget(step), sinks, std::max(recent, knobs_.window));
    ops_.top_p_prune(scores, step.cols(), top_p_, forced.sink_end, forced.recent_begin, visible);
    return LayerDecision::Masked;
  }

  bool reads_logits(const LayerStep& step) const override { return base_->reads_logits(step); }
  void grow(int64_t stride) override { base_->grow(stride); }
  int64_t state_bytes() const override { return base_->state_bytes(); }

 private:
  std::unique_ptr<Policy> base_;
  TopPOps& ops_;
  CommonKnobs knobs_;
  float top_p_;
  int64_t page_size_;
};

// The base's own parameters, by name, and which base has them.
bool quest_only(const std::string& name) {
  return name == "page_size" || name == "max_only";
}
bool doublesparsity_only(const std::string& name) {
  return name == "channels";
}

}  // namespace

PolicyInfo twilight_policy_info() {
  std::vector<ParamSpec> specs = with_common_specs(
      {{"base",
        ParamType::Choice,
        "The selector whose candidates (at most B(t)) and estimates top-p prunes",
        "quest",
        0,
        0,
        {"quest", "doublesparsity"}},
       {"top_p",
        ParamType::Float,
        "Estimated attention mass each head keeps of its candidates (the authors use 0.85)",
        "0.85",
        0.001,
        1.0,
        {}}});
  // The bases' own knobs, with their defaults; each applies to its base only.
  for (const PolicyInfo& base : {quest_policy_info(), doublesparsity_policy_info()}) {
    for (const ParamSpec& spec : base.params) {
      if (!quest_only(spec.name) && !doublesparsity_only(spec.name)) continue;
      ParamSpec own = spec;
      own.description = spec.description + " (base " + base.id + " only)";
      specs.push_back(std::move(own));
    }
  }
  // Twilight leaves its first two layers dense, as Quest and the authors' configs do.
  for (ParamSpec& spec : specs) {
    if (spec.name == "dense_layers") {
      spec.default_value = std::string("2");
      spec.description = std::string("The first layers are left dense (Twilight uses 2)");
    }
  }
  PolicyInfo info{
      "twilight",
      "adaptive top-p (Twilight)",
      "The base selector (quest or doublesparsity) picks at most B(t) candidates; each head "
      "keeps the fewest of them whose softmax over the base's estimates reaches top_p.",
      specs,
      /*reference=*/false,
      /*needs_predictor=*/false,
      /*predicts_logits=*/true};
  // Both bases are per head (quest, doublesparsity) and top-p prunes each head's own candidates.
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_twilight_policy(const PolicyShape& shape, Backend& backend,
                                             const ParamValues& params, double sparsity) {
  const std::string& base = params.get_choice("base");
  const PolicyInfo base_info = base == "quest" ? quest_policy_info() : doublesparsity_policy_info();
  // The base gets every knob it has, at twilight's values.
  std::vector<std::string> base_args;
  for (const std::string& item : params.describe()) {
    const std::string name = item.substr(0, item.find('='));
    for (const ParamSpec& spec : base_info.params)
      if (spec.name == name) base_args.push_back(item);
  }
  const ParamValues base_params = resolve_params(base_info.params, base_args, "policy twilight");
  std::unique_ptr<Policy> base_policy =
      base == "quest" ? make_quest_policy(shape, backend, base_params, sparsity)
                      : make_doublesparsity_policy(shape, backend, base_params, sparsity);
  const int64_t page_size = base == "quest" ? params.get_int("page_size") : 0;
  return std::make_unique<TwilightPolicy>(std::move(base_policy), backend,
                                          read_common_knobs(params, sparsity),
                                          float(params.get_float("top_p")), page_size);
}

}  // namespace kvlens
