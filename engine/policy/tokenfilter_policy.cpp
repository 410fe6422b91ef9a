// tokenfilter (KV-similarity token filtering, POLICIES.md): an attention-skip policy. In the tail
// layers, a token whose key and value look like the recent ones (cosine to an EMA anchor) skips
// the layer's attention (its attention output is zero; the MLP still runs). It selects no tokens:
// each (step, layer) is Dense or Skipped. Per tail layer, all on the backend: anchors [G, D] F32
// for keys and values, the decision's state (variances, threshold, counts) and its gate.
//
// The rule, with every reading this file makes:
// - Tail. The last n_tail = round(tail_frac * N) layers (llround, half away from zero), minus any
//   below dense_layers; the other layers are dense. target = global_ratio * N / n_tail' with
//   n_tail' the tail layers that remain: POLICIES.md's global_ratio / tail_frac when
//   tail_frac * N is a whole number (the realised tail fraction otherwise, so that the overall
//   skip ratio is global_ratio); at most 1. global_ratio is the run's sparsity unless given.
// - Similarities. At step t, per KV head g: s_k[g] = cos(k_t, anchor_k), s_v[g] = cos(v_t,
//   anchor_v) against the anchors as left by the steps before, then anchor <- a * anchor +
//   (1 - a) * x (a = ema). Every token updates the anchors, skipped or not (its k/v are cached
//   either way). The first step a layer sees sets the anchors to k_t and v_t and does not skip
//   (in prefill + decode that is the first decoded token: the anchors start there).
//   s_k, s_v = the means over the KV heads.
// - Variances: Welford's running mean and M2 over every per-head similarity the layer has
//   produced (G values per step, the current step's included), keys and values apart; the
//   population variance M2 / n (n - 1 would scale both alike and cancel in alpha).
//   alpha = (1/var_v) / (1/var_k + 1/var_v) as POLICIES.md writes it, i.e. var_k / (var_k +
//   var_v): the similarity that varies more across tokens, the one that tells tokens apart,
//   weighs more. Until both variances are positive (the first steps; G = 1) alpha = 0.5.
//   S_kv = alpha * s_k + (1 - alpha) * s_v.
// - Decision: skip when S_kv > tau_l, never when the target is 0 (sparsity 0 with global_ratio
//   not given gives the dense logits bit for bit, whatever tau_l is).
// - Threshold: after each step of the layer (the first included), with skip_ratio_l = skips /
//   steps of the layer so far (this step counted), tau_l <- tau_l + eta * (skip_ratio_l -
//   target). The literal sign is the right one: a layer that skips more than its target raises
//   its threshold (fewer similarities exceed it), one that skips less lowers it. tau_l starts at
//   `tau`.
// - Scores: the layer's scores row gets S_kv at the current column for every head and 0 in the
//   other candidate columns (0 at a layer's first step, where there is no S_kv).
// - Backend work: anchor_cosine_update (cosines and the EMA step) for k and v, then
//   token_filter_step (the rule above in double arithmetic, policy_op_math.h) writes the scores
//   column and the layer's gate: the layer is Gated, its attention zeroed on the device where
//   the token skips, and the session reads the gates back once per step with the sparsity
//   counts. Nothing waits for the host. The budget knobs (sinks, window, budget_tokens,
//   granularity, ...) have no effect: nothing is selected.
// - Tensor parallelism: the means and variances read every KV head of the layer. A shard writes
//   its KV heads' similarities at their place in a zero-padded [2, G] row of the whole model's
//   heads (one of the ranks sharing a replicated KV head writes it: the first), and an all-reduce
//   (exact: one term and zeros) gives every rank all of them, so each takes the decision one GPU
//   takes (PolicyInfo::reduces_heads).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "engine/backend/policy_op_math.h"
#include "engine/backend/tensor_views.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/tokenfilter_ops.h"

namespace kvlens {
namespace {

struct TokenfilterSettings {
  int64_t dense_layers = 1;
  double tail_frac = 0.5, ema = 0.9, tau = 0.5, eta = 0.01, global_ratio = 0.0;
};

// The tail of a model of `layers` layers and each tail layer's skip target (the file comment's
// rule); `wanted` is the target before it is capped at 1.
struct TokenfilterTail {
  int64_t first = 0, count = 0;
  double wanted = 0.0, target = 0.0;
};
TokenfilterTail tokenfilter_tail(const TokenfilterSettings& settings, int64_t layers) {
  TokenfilterTail tail;
  const int64_t n = layers;
  tail.first =
      std::max(n - int64_t(std::llround(settings.tail_frac * double(n))), settings.dense_layers);
  tail.count = std::max<int64_t>(0, n - tail.first);
  tail.wanted = tail.count > 0 ? settings.global_ratio * double(n) / double(tail.count) : 0.0;
  tail.target = std::min(1.0, tail.wanted);
  return tail;
}

TokenfilterSettings tokenfilter_settings(const ParamValues& params, double sparsity) {
  const CommonKnobs knobs = read_common_knobs(params, sparsity);  // validates the sparsity
  TokenfilterSettings settings;
  settings.dense_layers = knobs.dense_layers;
  settings.tail_frac = params.get_float("tail_frac");
  settings.ema = params.get_float("ema");
  settings.tau = params.get_float("tau");
  settings.eta = params.get_float("eta");
  const double given = params.get_float("global_ratio");
  settings.global_ratio = given < 0.0 ? sparsity : given;
  return settings;
}

class TokenfilterPolicy final : public Policy {
 public:
  TokenfilterPolicy(const PolicyShape& shape, Backend& backend, const TokenfilterSettings& settings)
      : shape_(shape),
        backend_(backend),
        ops_(tokenfilter_ops(backend)),
        settings_(settings),
        similarities_(backend.alloc(DType::F32, {2, shape.kv_heads})),
        zeros_(backend.alloc(DType::F32, {1, shape.stride})) {
    if (backend.tensor_parallel_ranks() > 1) {
      const int64_t model_kv_heads = shape.whole_kv_heads();
      model_partial_ = backend.alloc(DType::F32, {1, 2 * model_kv_heads});
      model_similarities_ = backend.alloc(DType::F32, {2 * model_kv_heads});
      // Where KV heads are replicated, the first rank of those holding one writes it.
      const int64_t group = shape.whole_heads() / model_kv_heads;
      writes_model_row_ = shape.first_head % group == 0;
    }
    const int64_t n = shape.layers;
    const TokenfilterTail tail = tokenfilter_tail(settings, n);
    first_tail_ = tail.first;
    target_ = tail.target;
    layers_.resize(size_t(n));
    double initial[kTokenFilterState] = {};
    initial[kTfTau] = settings.tau;
    for (int64_t l = first_tail_; l < n; ++l) {
      Layer& layer = layers_[size_t(l)];
      layer.anchor_k = backend.alloc(DType::F32, {shape.kv_heads, shape.head_dim});
      layer.anchor_v = backend.alloc(DType::F32, {shape.kv_heads, shape.head_dim});
      layer.state = backend.alloc(DType::U8, {int64_t(sizeof initial)});
      backend.from_host(layer.state, initial, sizeof initial);
      layer.gate = backend.alloc(DType::U8, {1, 1});
    }
  }

  // Chooses without this step's logits (see Policy::reads_logits).
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    shape_.stride = stride;
    zeros_ = widen_columns(backend_, zeros_, stride);
  }
  int64_t state_bytes() const override {
    int64_t bytes = tensor_bytes({similarities_, zeros_, model_partial_, model_similarities_});
    for (const Layer& layer : layers_)
      bytes += tensor_bytes({layer.anchor_k, layer.anchor_v, layer.state, layer.gate});
    return bytes;
  }
  const DeviceTensor* gate(int64_t layer) const override {
    return layer >= first_tail_ && layer < int64_t(layers_.size()) ? &layers_[size_t(layer)].gate
                                                                   : nullptr;
  }

  LayerDecision select(const LayerStep& step, DeviceTensor&, DeviceTensor& scores) override {
    if (step.layer < first_tail_) return LayerDecision::Dense;
    Layer& layer = layers_[size_t(step.layer)];
    const int64_t t = step.step, cols = step.cols();
    const bool split = !model_partial_.empty();
    DeviceTensor sim_k = similarity_row(0), sim_v = similarity_row(1);
    if (split && writes_model_row_) {
      // This shard's KV heads at their place among the whole model's (the rest stays 0).
      sim_k = model_partial_row(0);
      sim_v = model_partial_row(1);
    }
    backend_.axpby_rows(scores, 1.0f, zeros_, 0.0f, cols);  // 0 but the current column
    // decay 0 at the layer's first step: the anchors become this token's k and v.
    const bool first = !layer.started;
    const float decay = first ? 0.0f : float(settings_.ema);
    ops_.anchor_cosine_update(*step.k_cache, t, decay, layer.anchor_k, sim_k);
    ops_.anchor_cosine_update(*step.v_cache, t, decay, layer.anchor_v, sim_v);
    layer.started = true;
    const DeviceTensor* similarities = first ? nullptr : &similarities_;
    if (split && !first) {
      // Every rank gets every KV head's similarities (the same step, layer and order on each).
      DeviceTensor sums = tensor::view(model_similarities_, {1, model_partial_.dim(1)});
      backend_.axpby_rows(sums, 1.0f, model_partial_, 0.0f, model_partial_.dim(1));
      backend_.all_reduce_sum(model_similarities_);
      similarities = &model_similarities_;
    }
    // The decision and the threshold's update stay on the backend (the gate): no read-back.
    ops_.token_filter_step(similarities, settings_.eta, target_, t, layer.state, scores,
                           layer.gate);
    // Target 0 never skips: the plain dense layer, bit for bit.
    return first || target_ <= 0.0 ? LayerDecision::Dense : LayerDecision::Gated;
  }

 private:
  struct Layer {
    DeviceTensor anchor_k, anchor_v;  // [G, D]
    DeviceTensor state;               // token_filter_step's doubles
    DeviceTensor gate;                // U8 [1, 1]: 0 when this step's token skipped the layer
    bool started = false;
  };

  // Row r of similarities_ ([2, G]) as a G-element tensor of its own.
  DeviceTensor similarity_row(int64_t r) const {
    DeviceTensor row = similarities_;
    row.data = similarities_.as<float>() + r * shape_.kv_heads;
    row.shape = {shape_.kv_heads};
    return row;
  }
  // This shard's G elements of row r of model_partial_ ([2, whole model's G]).
  DeviceTensor model_partial_row(int64_t r) const {
    DeviceTensor row = model_partial_;
    row.data = model_partial_.as<float>() + r * shape_.whole_kv_heads() + shape_.first_kv_head;
    row.shape = {shape_.kv_heads};
    return row;
  }

  PolicyShape shape_;
  Backend& backend_;
  TokenFilterOps& ops_;  // the backend's tokenfilter extension, fetched once
  TokenfilterSettings settings_;
  int64_t first_tail_ = 0;
  double target_ = 0.0;
  std::vector<Layer> layers_;
  DeviceTensor similarities_;  // [2, G]: key then value similarities of the current layer
  DeviceTensor zeros_;         // [1, stride]
  // On a tensor-parallel shard (empty otherwise): [1, 2 * the whole model's G], this shard's
  // similarities at their heads' place and 0 elsewhere, and its sum over the ranks [2 * G].
  DeviceTensor model_partial_, model_similarities_;
  bool writes_model_row_ = false;  // this shard writes its KV heads into model_partial_
};

}  // namespace

PolicyInfo tokenfilter_policy_info() {
  const double inf = std::numeric_limits<double>::infinity();
  PolicyInfo info{
      "tokenfilter", "attention skip (KV-similarity Token Filtering)",
      "In the tail layers, skips a token's attention when its key/value similarity to EMA "
      "anchors exceeds an adaptive per-layer threshold; skips whole attention computations, "
      "not tokens.",
      with_common_specs(
          {{"tail_frac",
            ParamType::Float,
            "Fraction of the layers, the last ones, where attention may be skipped",
            "0.5",
            0.0,
            1.0,
            {}},
           {"ema",
            ParamType::Float,
            "Anchor decay a: anchor <- a*anchor + (1-a)*x",
            "0.9",
            0.0,
            1.0,
            {}},
           {"tau",
            ParamType::Float,
            "Initial skip threshold of each tail layer",
            "0.5",
            -inf,
            inf,
            {}},
           {"eta",
            ParamType::Float,
            "Threshold step: tau += eta * (skip ratio - target)",
            "0.01",
            0.0,
            inf,
            {}},
           {"global_ratio",
            ParamType::Float,
            "Fraction of all attention computations to skip (negative: the run's sparsity)",
            "-1",
            -1.0,
            1.0,
            {}}})};
  // Its means and variances read every KV head of a layer: a shard all-reduces them.
  info.reduces_heads = true;
  return info;
}

std::unique_ptr<Policy> make_tokenfilter_policy(const PolicyShape& shape, Backend& backend,
                                                const ParamValues& params, double sparsity) {
  return std::make_unique<TokenfilterPolicy>(shape, backend,
                                             tokenfilter_settings(params, sparsity));
}

std::string tokenfilter_nominal_budget_note(const ParamValues& params, double sparsity,
                                            int64_t layers) {
  const TokenfilterSettings settings = tokenfilter_settings(params, sparsity);
  const TokenfilterTail tail = tokenfilter_tail(settings, layers);
  const auto text = [](double value) {
    char out[32];
    std::snprintf(out, sizeof out, "%.3g", value);
    return std::string(out);
  };
  std::string note = "its budget is a share of attention computations skipped in layers " +
                     std::to_string(tail.first) + ".." + std::to_string(layers - 1) +
                     ", not of tokens (a skipped attention counts as its whole row hidden)";
  if (tail.count == 0) {
    note += "; no layer can skip (tail_frac " + text(settings.tail_frac) + "): nothing is removed";
  } else if (tail.wanted > 1.0) {
    note += "; capped: every attention of those layers is skipped from nominal " +
            text(double(tail.count) / double(layers)) + " on (at most " +
            text(double(tail.count) / double(layers)) +
            " of all attention; a larger tail_frac "
            "reaches further)";
  }
  return note;
}

}  // namespace kvlens
