// DecoderSession: a Llama forward pass over a backend with a KV cache that advances as tokens
// are fed (one token per step in decode, or a chunk in prefill). Per-layer pre-softmax
// attention logits of the last forward can be recorded for inspection and tests.
// KV cache per layer: [G, capacity, D] F32. Logits: [n, vocab] F32.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model/model.h"
#include "engine/runtime/backend.h"

namespace kvlens {

// The model's weights resident in one backend (shared by all sessions on that backend).
struct BackendModel {
  std::shared_ptr<const Model> model;
  Backend* backend = nullptr;
  struct Layer {
    DeviceTensor attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
  };
  DeviceTensor embed, final_norm, lm_head, inv_freq;
  std::vector<Layer> layers;

  static std::shared_ptr<const BackendModel> upload(std::shared_ptr<const Model> model,
                                                    Backend& backend);
  const ModelConfig& config() const { return model->config; }
};

struct SessionOptions {
  int64_t capacity = 0;  // hard cap on cached positions; 0 = max_position_embeddings
  bool record_attention_logits = false;  // keep [n, H, context] per layer of the last forward
};

class DecoderSession {
 public:
  DecoderSession(std::shared_ptr<const BackendModel> model, SessionOptions options = {});

  // Feeds tokens at positions position() .. position() + n - 1 and returns logits [n, vocab]
  // (backend memory, valid until the next forward). Throws kvlens::Error for an id outside the
  // vocabulary or when the positions would pass max_position_embeddings or the capacity.
  const DeviceTensor& forward(std::span<const int32_t> tokens);
  // forward() of one token, logits copied to the host.
  std::vector<float> step(int32_t token);

  int64_t position() const { return position_; }
  void reset() { position_ = 0; }
  // Per layer [n, H, context] pre-softmax logits of the last forward (record_attention_logits).
  const std::vector<DeviceTensor>& attention_logits() const { return attention_logits_; }
  const BackendModel& model() const { return *model_; }

 private:
  void ensure_scratch(int64_t n);

  std::shared_ptr<const BackendModel> model_;
  Backend& backend_;
  SessionOptions options_;
  int64_t position_ = 0;                         // tokens in the cache
  std::vector<DeviceTensor> k_cache_, v_cache_;  // per layer [G, capacity, D]
  std::vector<DeviceTensor> attention_logits_;
  // Scratch activations sized for the largest chunk seen so far.
  int64_t scratch_rows_ = 0;
  DeviceTensor hidden_, normed_, q_, k_, v_, attn_out_, proj_, gate_, up_, act_, logits_;
  DeviceTensor logits_view_;  // logits_ seen as [n, vocab] for the last forward
};

}  // namespace kvlens
