// duoattention (DuoAttention, Xiao et al. 2024; docs/policies/duoattention.md): every KV head is a
// retrieval head (its query heads see every cached token) or a streaming head (they see the first
// sink_tokens and the last recent_tokens only). Heads are ranked once by their gate
// (duo_gates.safetensors beside the model, [layers, kv_heads]) over all selecting layers; at step
// t the top R(t) are retrieval heads, R(t) from the budget rule (duo_retrieval_count: the total
// kept over all heads within what B(t) per head would keep) or fixed by retrieval_frac.
// One set per KV group, written on the backend with fill_columns. It ranks no tokens: each head's
// scores row holds its gate on every candidate (the heads grid shows it beside the retrieval mark).
// A tensor-parallel shard ranks every KV head of the whole model by the same gates (the ranking
// depends on the file and the step only) and marks its own heads (PolicyShape::first_kv_head):
// the heads one GPU would.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/backend/tensor_views.h"
#include "engine/common/error.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/duo_gates.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class DuoAttentionPolicy final : public BudgetedPolicy {
 public:
  DuoAttentionPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs,
                     int64_t sink_tokens, int64_t recent_tokens, double retrieval_frac)
      : BudgetedPolicy(shape, backend, knobs),
        sink_tokens_(sink_tokens),
        recent_tokens_(recent_tokens),
        retrieval_frac_(retrieval_frac),
        model_kv_heads_(shape.whole_kv_heads()),
        rank_(size_t(shape.layers * model_kv_heads_), -1),
        gates_(load_duo_gates(shape)) {
    const std::vector<float>& gates = gates_;
    ones_ = ones(shape.stride);
    // The selecting layers' heads of the whole model by gate, highest first; equal gates keep
    // (layer, head) order.
    std::vector<int64_t> order;
    for (int64_t i = knobs.dense_layers * model_kv_heads_; i < shape.layers * model_kv_heads_; ++i)
      order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return gates[size_t(a)] > gates[size_t(b)]; });
    for (size_t r = 0; r < order.size(); ++r) rank_[size_t(order[r])] = int64_t(r);
    ranked_heads_ = int64_t(order.size());
  }

  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    ones_ = ones(stride);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + tensor_bytes({ones_});
  }

  // R at step t (the same for every layer of the step).
  int64_t retrieval_heads(int64_t step) const {
    if (retrieval_frac_ >= 0.0)
      return std::clamp<int64_t>(int64_t(std::llround(retrieval_frac_ * double(ranked_heads_))), 0,
                                 ranked_heads_);
    const int64_t candidates = step + 1;
    return duo_retrieval_count(ranked_heads_, candidates, sink_tokens_ + recent_tokens_,
                               knobs_.budget(step));
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const int64_t cols = step.cols(), first = step.first_candidate;
    const int64_t retrieval = retrieval_heads(step.step);
    // A streaming head's columns: the sinks inside the layer's candidates, and the recent ones
    // (the current token included).
    const int64_t sink_begin = first, sink_end = std::clamp(sink_tokens_, first, cols);
    const int64_t recent_begin = std::max(first, cols - recent_tokens_);
    const bool streaming_sees_all = sink_end >= recent_begin;
    const int64_t group = shape_.heads / shape_.kv_heads;
    bool all_full = true;
    for (int64_t g = 0; g < shape_.kv_heads; ++g)
      all_full = all_full && (streaming_sees_all || is_retrieval(step.layer, g, retrieval));
    // Dense only when no head of the model streams at this step: a layer whose heads are all
    // retrieval heads while others stream is masked (every column visible) so that the trace
    // records its heads' gates and the heads grid marks them as retrieval heads.
    const bool nothing_streams = streaming_sees_all || retrieval >= ranked_heads_;
    if (all_full && first == 0 && nothing_streams) return LayerDecision::Dense;
    for (int64_t g = 0; g < shape_.kv_heads; ++g) {
      DeviceTensor rows = tensor::row_range(visible, g * group, group);
      // The rows arrive with the last step's set: mark_columns rewrites all of 0..t.
      if (streaming_sees_all || is_retrieval(step.layer, g, retrieval)) {
        backend_.mark_columns(rows, cols, 0, first, nullptr);
      } else if (first == 0) {
        backend_.mark_columns(rows, cols, sink_end, recent_begin, nullptr);
      } else {
        backend_.mark_columns(rows, cols, 0, recent_begin, nullptr);
        if (sink_end > sink_begin) backend_.fill_columns(rows, sink_begin, sink_end, 1);
      }
      DeviceTensor gate_rows = tensor::row_range(scores, g * group, group);
      backend_.axpby_rows(gate_rows, gates_[size_t(model_head(step.layer, g))], ones_, 0.0f, cols);
    }
    return LayerDecision::Masked;
  }

 private:
  // This policy's KV head `kv_head` of `layer` as an index of rank_ and gates_ (the whole
  // model's [layers, kv_heads]).
  int64_t model_head(int64_t layer, int64_t kv_head) const {
    return layer * model_kv_heads_ + shape_.first_kv_head + kv_head;
  }
  bool is_retrieval(int64_t layer, int64_t kv_head, int64_t retrieval) const {
    const int64_t rank = rank_[size_t(model_head(layer, kv_head))];
    return rank >= 0 && rank < retrieval;
  }

  // [group, stride] F32 of 1: scaled by a gate into a KV group's scores rows.
  DeviceTensor ones(int64_t stride) {
    const int64_t group = shape_.heads / shape_.kv_heads;
    DeviceTensor t = backend_.alloc(DType::F32, {group, stride});
    const std::vector<float> host(size_t(group * stride), 1.0f);
    backend_.from_host(t, host.data(), host.size() * sizeof(float));
    return t;
  }

  int64_t sink_tokens_, recent_tokens_;
  double retrieval_frac_;      // < 0: the budget rule
  int64_t model_kv_heads_;     // the whole model's KV heads (a shard's place: first_kv_head)
  std::vector<int64_t> rank_;  // [layers * model KV heads]: rank by gate (-1: dense layer)
  int64_t ranked_heads_ = 0;
  std::vector<float> gates_;  // [layers * model KV heads]
  DeviceTensor ones_;
};

}  // namespace

PolicyInfo duoattention_policy_info() {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<ParamSpec> specs = with_common_specs({
      {"sink_tokens",
       ParamType::Int,
       "First tokens a streaming head sees (the paper's 64, scaled to the demo model's context)",
       "4",
       0,
       inf,
       {}},
      {"recent_tokens",
       ParamType::Int,
       "Most recent tokens a streaming head sees, the current one included (the paper's 256, "
       "scaled)",
       "16",
       1,
       inf,
       {}},
      {"retrieval_frac",
       ParamType::Float,
       "Share of KV heads that are retrieval heads, fixed (the paper's knob; -1 = off: the "
       "number follows the budget). When set, the sparsity setting is not a budget and the "
       "effective sparsity is whatever the heads' split gives",
       "-1",
       -1,
       1,
       {}},
  });
  // The paper gates every layer; layer 0 is not left dense unless asked.
  for (ParamSpec& spec : specs)
    if (spec.name == "dense_layers") spec.default_value = std::string("0");
  PolicyInfo info{"duoattention", "static heads (DuoAttention)",
                  "Retrieval heads (the top heads by a gate optimised offline) see every token; "
                  "the others see the sinks and the recent tokens; as many retrieval heads as "
                  "the budget allows.",
                  std::move(specs)};
  // Each KV head's set follows from the gates file and the step alone.
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_duoattention_policy(const PolicyShape& shape, Backend& backend,
                                                 const ParamValues& params, double sparsity) {
  const double frac = params.get_float("retrieval_frac");
  if (frac < 0.0 && frac != -1.0)
    throw Error("policy duoattention", "retrieval_frac", "-1 (off) or a share in [0, 1]",
                std::to_string(frac));
  return std::make_unique<DuoAttentionPolicy>(shape, backend, read_common_knobs(params, sparsity),
                                              params.get_int("sink_tokens"),
                                              params.get_int("recent_tokens"), frac);
}

}  // namespace kvlens
