// tokenbutler (POLICIES.md, "The TokenButler predictor"): per (layer, head), the top B(t)
// candidates by the learned predictor's logits for this step, chosen afresh every step; nothing
// is evicted. The predictor reads the layer-0 attention input of each token once (at layer 0 of
// its step, or through observe_inputs for a dense prompt) and caches its state, so each step
// costs O(t). Layer 0 is never predicted and stays dense whatever dense_layers says (the
// predictor sits on its input). The scores it writes are the predicted logits, so the trace
// holds them for the "predicted vs true" view. It never reads the true logits.
#include "engine/backend/tensor_views.h"
#include "engine/common/error.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/predictor_runtime.h"

namespace kvlens {
namespace {

class TokenButlerPolicy final : public BudgetedPolicy {
 public:
  TokenButlerPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs)
      : BudgetedPolicy(shape, backend, knobs), predictor_(shape.predictor) {}

  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  void observe_inputs(const DeviceTensor& layer_input, int64_t first_position) override {
    feed(layer_input, first_position);
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (step.layer == 0) {
      feed(*step.layer_input, step.step);
      return LayerDecision::Dense;
    }
    if (predictor_.position() != step.step + 1) {
      throw Error("policy tokenbutler", "step",
                  "layer 0 of step " + std::to_string(step.step) + " before its later layers",
                  "the predictor at position " + std::to_string(predictor_.position()));
    }
    if (dense_layer(step)) return LayerDecision::Dense;
    if (selects_every_layer(step)) {
      // The first selected layer of the step chooses for every later one (their rows are the
      // same predicted logits and the same budget rule, each row on its own), so the logits and
      // the top-k are one launch each for the step instead of one per layer.
      if (selected_step_ != step.step) select_every_layer(step);
      return LayerDecision::Masked;
    }
    if (backend_.tensor_parallel_ranks() == 1) {
      predictor_.predicted_logits(step.layer, scores);
    } else {
      // A tensor-parallel shard: the predictor scores every head of the model (its input, the
      // layer-0 residual row, is the same on every rank); this shard's heads are kept.
      DeviceTensor& all_heads = model_head_rows(scores.dim(1));
      predictor_.predicted_logits(step.layer, all_heads);
      keep_shard_rows(all_heads, scores);
    }
    select_budgeted(step, 1, at_selection_rows(scores, step.cols()), nullptr, visible);
    return LayerDecision::Masked;
  }

 private:
  // Feeds the predictor the tokens at first_position.. (a new text starts over at 0).
  void feed(const DeviceTensor& layer_input, int64_t first_position) {
    if (first_position == 0) {
      predictor_.reset();
      selected_step_ = -1;  // a new text numbers its steps from 0 again
    }
    if (first_position != predictor_.position()) {
      throw Error("policy tokenbutler", "position",
                  "the next token " + std::to_string(predictor_.position()) +
                      " (every token's layer-0 input, in order)",
                  std::to_string(first_position));
    }
    predictor_.append(layer_input);
  }

  // Whether this step's layers can be chosen together: the session hands over every layer's
  // rows (no sliding window now), one GPU holds every head, and every layer has the same budget
  // (no allocator shares it out).
  bool selects_every_layer(const LayerStep& step) const {
    return step.every_layer_scores != nullptr && backend_.tensor_parallel_ranks() == 1 &&
           allocator().kind == AllocatorKind::Uniform;
  }

  // Layers step.layer .. L - 1 (all selected: dense layers come first) chosen at once.
  void select_every_layer(const LayerStep& step) {
    const int64_t H = shape_.heads, layers = shape_.layers - step.layer;
    DeviceTensor scores = tensor::row_range(*step.every_layer_scores, step.layer * H, layers * H);
    DeviceTensor visible = tensor::row_range(*step.every_layer_visible, step.layer * H, layers * H);
    predictor_.predicted_logits(step.layer, layers, scores);
    select_budgeted(step, 1, at_selection_rows(scores, step.cols()), nullptr, visible);
    selected_step_ = step.step;
  }

  PredictorState predictor_;
  // The step whose layers select_every_layer chose (-1: none yet).
  int64_t selected_step_ = -1;
};

std::string searched_text(const std::vector<std::string>& searched) {
  std::string text;
  for (const std::string& place : searched) text += (text.empty() ? "" : "; ") + place;
  return text.empty() ? "no predictor given" : "looked at " + text;
}

}  // namespace

PolicyInfo tokenbutler_policy_info() {
  PolicyInfo info{
      "tokenbutler",
      "learned predictor (TokenButler)",
      "Top-B(t) tokens per (layer, head) by the TokenButler predictor's logits for this "
      "step, chosen afresh every step; nothing evicted.",
      with_common_specs({}),
      /*reference=*/false,
      /*needs_predictor=*/true,
      /*predicts_logits=*/true};
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_tokenbutler_policy(const PolicyShape& shape, Backend& backend,
                                                const ParamValues& params, double sparsity) {
  if (!shape.predictor) {
    throw Error("policy tokenbutler", "predictor",
                "a TokenButler predictor: predictor.safetensors + predictor.json in the model "
                "folder, a llama_butler checkpoint, or --predictor FILE",
                "none (" + searched_text(shape.predictor_searched) + ")");
  }
  const PredictorConfig& c = shape.predictor->config();
  // A tensor-parallel shard holds heads / ranks of the model's heads; the predictor scores all.
  const int64_t model_heads = shape.heads * backend.tensor_parallel_ranks();
  if (c.layers != shape.layers || c.heads != model_heads) {
    throw Error(c.source, "layers, heads",
                "the model's " + std::to_string(shape.layers) + " layers and " +
                    std::to_string(model_heads) + " heads",
                std::to_string(c.layers) + " and " + std::to_string(c.heads));
  }
  return std::make_unique<TokenButlerPolicy>(shape, backend, read_common_knobs(params, sparsity));
}

}  // namespace kvlens
