// quest (Quest, POLICIES.md): page selection. The cache is cut into pages of page_size tokens
// (page p = columns [p * page_size, (p + 1) * page_size)); per page and KV head the channel-wise
// min and max of the keys bound every logit inside the page, and each step the pages with the
// highest bounds are visible. Per-layer state: page_min, page_max [G, P, D] F32 with
// P = ceil(stride / page_size); at kv_head granularity the selection is BudgetedPolicy's [G,
// stride] one.
//
// The rule, with every reading this file makes:
// - Bound. For query q of head h and the page summaries of its KV head,
//   U = sum_c max(q_c * min_c, q_c * max_c), Quest's upper bound of q . k over the page. Logits
//   are q . k / sqrt(D), so U is divided by sqrt(D) too (the attention op's F32 scale): the
//   bound is then on the logit scale, an upper bound of every true logit in the page, and the
//   "predicted vs true" view compares like with like. The division changes no ranking.
//   max_only = true ranks by the TokenButler code's simplified bound sum_c |q_c| * max_c (also
//   scaled), which is not a true bound (it ignores the sign of q_c against min_c).
// - Scores. The policy's per-token score scores[h, j] is the bound U of the page holding j, for
//   every candidate column: the same value across a page.
// - Page summaries are kept incrementally on the backend: each step recomputes only the pages
//   the cache gained columns in since the layer was last seen (the current token's page; at the
//   first policy step after a dense prefill, every prompt page), so a step costs one page of keys.
// - Budget. B(t) is a hard cap on the visible tokens of each head (POLICIES.md "Budget").
//   The always-visible tokens are, in POLICIES.md's priority order, the current token, the sinks
//   (the first `sinks` tokens, as tokens, not their page), then the most recent tokens: the
//   current page's tokens (the page holding t, partial: t % page_size + 1 tokens) or the last
//   `window` tokens, whichever reaches further back. So the page holding the current token is
//   always chosen, and if the budget cannot hold the sinks and that page, it is truncated to its
//   most recent tokens by the priority rule (the same forced_columns every policy uses). For
//   t < page_size there is one page: quest then equals streaming.
// - Pages. The remaining budget R = B(t) - forced goes to whole pages, best bound first (ties to
//   the more recent page). A page costs its tokens not yet visible: page_size for a full page,
//   fewer for a page holding sinks or window tokens. Pages are taken while the running cost
//   stays <= R; the first page that does not fit ends the choice, and the budget it leaves
//   (less than that page) stays unspent: visible sets are whole pages plus the forced tokens,
//   as Quest loads whole pages, and the effective sparsity reports the difference.
// - B(t) >= t + 1 (sparsity 0) leaves the layer dense: the dense logits bit for bit.
// - Layers < dense_layers are dense; quest's default is 2 (Quest's own setting), not the
//   common 1.
// - Granularity kv_head: U summed over the query heads of the group ranks the pages of the
//   group, one selection per KV head. Nothing is evicted: pages are chosen afresh every step.
// sinks = 0 reproduces Quest itself (which has no sinks); the default 4 matches the other
// policies.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/quest_ops.h"

namespace kvlens {
namespace {

class QuestPolicy final : public BudgetedPolicy {
 public:
  QuestPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs, int64_t page_size,
              bool max_only)
      : BudgetedPolicy(shape, backend, knobs),
        ops_(quest_ops(backend)),
        page_size_(page_size),
        max_only_(max_only),
        filled_(size_t(shape.layers), 0) {
    const int64_t pages = (shape.stride + page_size - 1) / page_size;
    for (int64_t l = 0; l < shape.layers; ++l) {
      // Dense layers never rank pages, so they keep no summaries.
      const bool ranked = l >= knobs_.dense_layers;
      page_min_.push_back(ranked
                              ? backend.alloc(DType::F32, {shape.kv_heads, pages, shape.head_dim})
                              : DeviceTensor{});
      page_max_.push_back(ranked
                              ? backend.alloc(DType::F32, {shape.kv_heads, pages, shape.head_dim})
                              : DeviceTensor{});
    }
  }

  // Chooses without this step's logits (see Policy::reads_logits).
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  // The page summaries [G, pages, D] gain the new pages (zeros until filled); each KV head's
  // pages are copied as they are.
  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    const int64_t pages = (stride + page_size_ - 1) / page_size_;
    for (std::vector<DeviceTensor>* summaries : {&page_min_, &page_max_})
      for (DeviceTensor& summary : *summaries) summary = widen_middle(backend_, summary, pages);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + tensor_bytes(page_min_) + tensor_bytes(page_max_);
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    const int64_t t = step.step, cols = step.cols();
    // Fold in the columns gained since this layer's last step (columns_to_refresh says which).
    const int64_t begin = columns_to_refresh(filled_[l], t, cols);
    ops_.page_minmax_update(*step.k_cache, begin, cols, page_size_, page_min_[l], page_max_[l]);
    ops_.page_bounds(*step.q, page_min_[l], page_max_[l], cols, page_size_, max_only_, scores);

    // On a sliding-window layer the budget is the window's, and Dense is the whole window.
    const int64_t budget = knobs_.budget(step);
    if (budget >= step.candidates()) return LayerDecision::Dense;
    const int64_t current_page = t % page_size_ + 1;  // tokens of the page holding t
    select_budgeted(step, current_page, at_selection_rows(scores, cols), nullptr, visible, budget,
                    page_size_);
    return LayerDecision::Masked;
  }

 private:
  QuestOps& ops_;  // the backend's quest extension (page summaries and bounds), fetched once
  int64_t page_size_;
  bool max_only_;
  std::vector<int64_t> filled_;  // per layer: the columns the summaries cover
  std::vector<DeviceTensor> page_min_, page_max_;
};

}  // namespace

PolicyInfo quest_policy_info() {
  std::vector<ParamSpec> specs = with_common_specs(
      {{"page_size", ParamType::Int, "Tokens per page", "16", 1, 1 << 20, {}},
       {"max_only",
        ParamType::Bool,
        "Rank pages by sum_c |q_c| * max_c (the TokenButler code's simplified bound) instead of "
        "Quest's sum_c max(q_c * min_c, q_c * max_c)",
        "false",
        0,
        0,
        {}}});
  // Quest leaves its first two layers dense. (Whole strings are moved in: assigning a literal
  // trips a GCC 12 -Wrestrict false positive at -O3.)
  for (ParamSpec& spec : specs) {
    if (spec.name == "dense_layers") {
      spec.default_value = std::string("2");
      spec.description = std::string("The first layers are left dense (Quest uses 2)");
    }
  }
  PolicyInfo info{
      "quest", "page selection (Quest)",
      "Pages of page_size tokens ranked by the upper bound of q.k from the per-page key "
      "min/max; the best pages fill the budget, the current page always visible.",
      specs};
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_quest_policy(const PolicyShape& shape, Backend& backend,
                                          const ParamValues& params, double sparsity) {
  return std::make_unique<QuestPolicy>(shape, backend, read_common_knobs(params, sparsity),
                                       params.get_int("page_size"), params.get_bool("max_only"));
}

}  // namespace kvlens
