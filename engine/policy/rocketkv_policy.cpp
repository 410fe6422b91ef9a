// rocketkv (RocketKV, Behnam et al. 2025; docs/policies/rocketkv.md): two stages at every step
// and layer. Stage 1 is snapkv's permanent eviction (snapkv_policy.cpp, run as an inner policy)
// down to a capacity C(t) larger than the budget; stage 2 ranks the tokens stage 1 keeps by a
// hybrid page estimate (SparQ's top-r query channels against Quest-style per-page key minima and
// maxima, the minimum or maximum chosen per channel by the sign of the KV group's summed query)
// and shows the exact top B(t) of them. The page estimate is the policy's scores, on the logit
// scale (SparQ's temperature), so the predicted-vs-true view compares it with the true logits.
//
// The split of the nominal budget follows the authors' get_params_for_token_budget with the
// compression ratio rho = 1 / (1 - s) of the nominal sparsity s (a ratio, so the same at every
// step): alpha = min(0.2 + 0.06 log2 rho, 0.8); stage 1 keeps C(t) = ceil(rho^-alpha (t + 1))
// (snapkv at sparsity 1 - rho^-alpha); with rho2 = max(1, rho^(1 - alpha)) (= C / B), the page
// size is min(floor(rho2), ceil(sqrt(rho2))) and r = min(D, max(1, round(D * page / rho2))).
// page_size and channels override the last two. Pages are over original positions, so an evicted
// token's key stays in its page's summary (docs page: differences).
// State per layer: the inner snapkv's, page_min, page_max [G, P, D] F32 (P = ceil(stride /
// page)); scratch: stage 1's mask [H, stride] U8 and scores [H, stride] F32, its per-group rows
// [G, stride] U8 at kv_head granularity.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "engine/common/error.h"
#include "engine/policy/approx_logit_common.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/quest_ops.h"
#include "engine/policy/rocketkv_ops.h"

namespace kvlens {

RocketkvSplit rocketkv_split(double sparsity, int64_t head_dim) {
  RocketkvSplit split;
  const double rho = 1.0 / std::max(1.0 - sparsity, 1e-12);
  const double alpha = std::min(0.2 + std::log2(rho) * 0.06, 0.8);
  split.stage1_sparsity = std::max(0.0, 1.0 - std::pow(rho, -alpha));
  const double rho2 = std::max(1.0, std::pow(rho, 1.0 - alpha));
  split.page_size = std::max<int64_t>(
      1, std::min(int64_t(std::floor(rho2)), int64_t(std::ceil(std::sqrt(rho2)))));
  split.channels = std::min<int64_t>(
      head_dim, std::max<int64_t>(1, std::llround(double(head_dim * split.page_size) / rho2)));
  return split;
}

namespace {

class RocketkvPolicy final : public BudgetedPolicy {
 public:
  RocketkvPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs,
                 std::unique_ptr<Policy> stage1, int64_t page_size, int64_t channels)
      : BudgetedPolicy(shape, backend, knobs),
        quest_(quest_ops(backend)),
        ops_(rocketkv_ops(backend)),
        stage1_(std::move(stage1)),
        page_size_(page_size),
        channels_(channels),
        filled_(size_t(shape.layers), 0) {
    stage1_visible_ = backend.alloc(DType::U8, {shape.heads, shape.stride});
    stage1_scores_ = backend.alloc(DType::F32, {shape.heads, shape.stride});
    if (knobs_.kv_head_granularity)
      eligible_ = backend.alloc(DType::U8, {shape.kv_heads, shape.stride});
    const int64_t pages = (shape.stride + page_size - 1) / page_size;
    for (int64_t l = 0; l < shape.layers; ++l) {
      const bool ranked = l >= knobs_.dense_layers;
      for (std::vector<DeviceTensor>* summaries : {&page_min_, &page_max_})
        summaries->push_back(
            ranked ? backend.alloc(DType::F32, {shape.kv_heads, pages, shape.head_dim})
                   : DeviceTensor{});
    }
  }

  bool wants_probs(const LayerStep& step) const override { return stage1_->wants_probs(step); }
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    stage1_->grow(stride);
    stage1_visible_ = widen_columns(backend_, stage1_visible_, stride);
    stage1_scores_ = widen_columns(backend_, stage1_scores_, stride);
    if (!eligible_.empty()) eligible_ = widen_columns(backend_, eligible_, stride);
    const int64_t pages = (stride + page_size_ - 1) / page_size_;
    for (std::vector<DeviceTensor>* summaries : {&page_min_, &page_max_})
      for (DeviceTensor& summary : *summaries) summary = widen_middle(backend_, summary, pages);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + stage1_->state_bytes() +
           tensor_bytes({stage1_visible_, stage1_scores_, eligible_}) + tensor_bytes(page_min_) +
           tensor_bytes(page_max_);
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    const int64_t t = step.step, cols = step.cols();
    // Stage 1: snapkv keeps C(t) for good (its mask arrives zeroed, as a session's would).
    backend_.fill_columns(stage1_visible_, 0, cols, 0);
    stage1_->select(step, stage1_visible_, stage1_scores_);

    // Stage 2: page summaries of the columns gained since this layer's last step
    // (columns_to_refresh), then the estimate.
    const int64_t begin = columns_to_refresh(filled_[l], t, cols);
    quest_.page_minmax_update(*step.k_cache, begin, cols, page_size_, page_min_[l], page_max_[l]);
    ops_.page_logits(*step.q, page_min_[l], page_max_[l], cols, page_size_, channels_, scores);

    const DeviceTensor* eligible = &stage1_visible_;
    if (knobs_.kv_head_granularity) {
      // Stage 1 chose one set per KV group, expanded over its query heads: take each group's first.
      for (int64_t g = 0; g < shape_.kv_heads; ++g)
        backend_.copy_rows(stage1_visible_, g * group(), eligible_, g, 1, eligible_.dim(1));
      eligible = &eligible_;
    }
    select_budgeted(step, 1, at_selection_rows(scores, cols), eligible, visible);
    return LayerDecision::Masked;
  }

  void observe(const LayerStep& step, const DeviceTensor& probs) override {
    stage1_->observe(step, probs);
  }

 private:
  QuestOps& quest_;   // page summaries
  RocketkvOps& ops_;  // the stage-2 estimate
  std::unique_ptr<Policy> stage1_;
  int64_t page_size_, channels_;
  std::vector<int64_t> filled_;  // per layer: the columns the summaries cover
  std::vector<DeviceTensor> page_min_, page_max_;
  DeviceTensor stage1_visible_, stage1_scores_, eligible_;
};

// The snapkv parameters among rocketkv's, as "key=value" items.
std::vector<std::string> snapkv_args(const ParamValues& params) {
  std::vector<std::string> names;
  for (const ParamSpec& spec : snapkv_policy_info().params) names.push_back(spec.name);
  std::vector<std::string> args;
  for (const std::string& item : params.describe()) {
    const std::string key = item.substr(0, item.find('='));
    if (std::find(names.begin(), names.end(), key) != names.end()) args.push_back(item);
  }
  return args;
}

}  // namespace

PolicyInfo rocketkv_policy_info() {
  std::vector<ParamSpec> own = snapkv_policy_info().params;
  own.erase(own.begin(), own.begin() + std::ptrdiff_t(common_param_specs().size()));
  own.push_back({"page_size",
                 ParamType::Int,
                 "Stage 2's page (the authors' chunk) in tokens (0 = from the budget, "
                 "get_params_for_token_budget)",
                 "0",
                 0,
                 1 << 20,
                 {}});
  own.push_back({"channels",
                 ParamType::Float,
                 "Stage 2's query channels r: a fraction of head_dim below 1, else a count (0 = "
                 "from the budget)",
                 "0",
                 0.0,
                 4096.0,
                 {}});
  PolicyInfo info{
      "rocketkv",
      "eviction + approximate logits (RocketKV)",
      "SnapKV's permanent eviction down to a capacity above the budget, then among the kept "
      "tokens the exact top-B(t) by a page estimate (top-r query channels against page key "
      "minima or maxima, by sign).",
      with_common_specs(std::move(own)),
      /*reference=*/false,
      /*needs_predictor=*/false,
      /*predicts_logits=*/true};
  info.per_head_rule = true;
  info.reads_kv_groups = true;
  return info;
}

std::unique_ptr<Policy> make_rocketkv_policy(const PolicyShape& shape, Backend& backend,
                                             const ParamValues& params, double sparsity) {
  if (params.get_int("budget_tokens") > 0)
    throw Error("policy rocketkv", "budget_tokens",
                "0 (rocketkv splits the budget by the ratio of a sparsity fraction)",
                std::to_string(params.get_int("budget_tokens")));
  const RocketkvSplit split = rocketkv_split(sparsity, shape.head_dim);
  const int64_t page_size =
      params.get_int("page_size") > 0 ? params.get_int("page_size") : split.page_size;
  const int64_t channels = params.get_float("channels") > 0.0
                               ? channel_count(params.get_float("channels"), shape.head_dim,
                                               "policy rocketkv", "channels")
                               : split.channels;
  const ParamValues inner =
      resolve_params(snapkv_policy_info().params, snapkv_args(params), "policy rocketkv");
  return std::make_unique<RocketkvPolicy>(
      shape, backend, read_common_knobs(params, sparsity),
      make_snapkv_policy(shape, backend, inner, split.stage1_sparsity), page_size, channels);
}

}  // namespace kvlens
