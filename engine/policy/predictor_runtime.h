// The TokenButler predictor on a backend: its weights uploaded once (BackendPredictor, shared by
// every run) and one run's incremental state (PredictorState): each token's predictor attention
// row and importance key are computed once and cached, so scoring the t + 1 candidates of a step
// costs O(t). Caches: attention keys/values [H, capacity, Er/H]; importance keys
// [(N-1)*H, capacity, d'] layer-major (layer l >= 1, head h at slot (l-1)*H + h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/predictor.h"

namespace kvlens {

struct BackendPredictor {
  std::shared_ptr<const Predictor> predictor;
  Backend* backend = nullptr;
  DeviceTensor input_proj, q_proj_attn, k_proj_attn, v_proj_attn;
  DeviceTensor norm1_weight, norm1_bias, ffn_in_weight, ffn_in_bias, ffn_out_weight, ffn_out_bias;
  DeviceTensor norm2_weight, norm2_bias, norm_importance_weight, norm_importance_bias;
  // The importance projections' first Linear as stored; the second with its rows reordered
  // layer-major ([N][H][d'] instead of the checkpoint's [H][N][d'] slots) and layer 0's rows
  // left out (layer 0 is never predicted): [(N-1)*H*d', m].
  DeviceTensor q_importance_in, q_importance_out, k_importance_in, k_importance_out;
  DeviceTensor attention_inv_freq, importance_inv_freq;  // F32 [Er/H/2], [d'/2]

  static std::shared_ptr<const BackendPredictor> upload(std::shared_ptr<const Predictor> predictor,
                                                        Backend& backend);
  const PredictorConfig& config() const { return predictor->config; }
};

class PredictorStepOps;

class PredictorState {
 public:
  // fused_decode: a decode token goes through the backend's PredictorStepOps where it has them
  // and they take this predictor (predictor_step_ops.h); false runs the reference ops always (for
  // comparing the two).
  explicit PredictorState(std::shared_ptr<const BackendPredictor> predictor,
                          bool fused_decode = true);

  // Feeds the layer-0 attention inputs x[n, E] (the hidden states after layer 0's input
  // RMSNorm) of the tokens at positions position() .. position() + n - 1.
  void append(const DeviceTensor& layer_input);
  // Tokens fed so far.
  int64_t position() const { return position_; }
  // Forgets every token (a new text).
  void reset() { position_ = 0; }
  // scores[h, j] (F32 [H, stride], j < position()) = the predicted logit of layer `layer`
  // (1 .. N-1), head h, for key j and the query of the last token fed:
  // q_imp . k_imp_j / sqrt(d'). Columns from position() on are left as they were.
  void predicted_logits(int64_t layer, DeviceTensor& scores) const;
  // The same for `layers` consecutive layers from first_layer at once: scores F32
  // [layers * H, stride], layer first_layer + i's rows at i * H (one backend call).
  void predicted_logits(int64_t first_layer, int64_t layers, DeviceTensor& scores) const;
  const BackendPredictor& predictor() const { return *predictor_; }
  // Decode tokens the backend's fused step took (the rest ran the reference ops).
  int64_t fused_steps() const { return fused_steps_; }

 private:
  void ensure_capacity(int64_t needed);
  void ensure_scratch(int64_t rows);
  // Queues this decode token's forward as the backend's fused step.
  void fused_step(const DeviceTensor& x);

  std::shared_ptr<const BackendPredictor> predictor_;
  Backend& backend_;
  int64_t position_ = 0;
  int64_t capacity_ = 0;
  DeviceTensor attention_keys_, attention_values_, importance_keys_;
  // Scratch for `rows` tokens at a time; query_ keeps the last token's importance query.
  int64_t scratch_rows_ = 0;
  // ffn_out_ holds the residual sum too (the importance projections' input).
  DeviceTensor reduced_, q_, k_, v_, attended_, normed_reduced_, ffn_hidden_, ffn_out_;
  DeviceTensor importance_hidden_, importance_queries_, importance_keys_new_, query_;
  DeviceTensor no_values_;  // empty: kv_append of keys alone
  std::vector<int64_t> positions_;
  PredictorStepOps* fused_ = nullptr;  // null: the reference ops for every token
  DeviceTensor fused_scratch_;
  int64_t fused_steps_ = 0;
};

}  // namespace kvlens
