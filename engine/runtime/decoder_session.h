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
#include "engine/policy/policy.h"
#include "engine/policy/sparsity_stats.h"
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
  // Runs `policy` at every single-token step from position `first_step` on (0: the decode
  // simulation; the prompt length: prefill + decode, the prompt fed densely in chunks). Its row
  // buffers span the session's capacity (options.capacity, else max_position_embeddings).
  void set_policy(std::unique_ptr<Policy> policy, int64_t first_step = 0);
  const Policy* policy() const { return policy_.get(); }
  // The policy's row buffers as left by the last single-token forward, per layer: what each head
  // saw (U8 [H, stride]; meaningful where the layer's decision was Masked), the scores it ranked
  // by (F32 [H, stride]) and its decision. Columns 0..position()-1 are in use.
  const std::vector<DeviceTensor>& visible() const { return visible_; }
  const std::vector<DeviceTensor>& policy_scores() const { return scores_; }
  const std::vector<LayerDecision>& decisions() const { return decisions_; }
  PolicyShape policy_shape() const;
  // Effective sparsity over every policy step so far (reset by set_policy).
  const SparsityStats& sparsity() const { return sparsity_; }

  // Per layer [n, H, context] pre-softmax logits of the last forward (record_attention_logits).
  const std::vector<DeviceTensor>& attention_logits() const { return attention_logits_; }
  const BackendModel& model() const { return *model_; }

 private:
  void ensure_scratch(int64_t n);
  // One layer's attention for a single token under the policy; writes attn_heads [1, H, D].
  void policy_attention(size_t layer, const DeviceTensor& q_heads, int64_t window,
                        DeviceTensor& attn_heads);
  void record_sparsity(size_t layer, LayerDecision decision, int64_t cols);

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
  // Policy state: per layer row buffers [H, stride] (see visible()), plus shared scratch.
  std::unique_ptr<Policy> policy_;
  int64_t policy_first_step_ = 0;
  std::vector<DeviceTensor> visible_, scores_;
  std::vector<LayerDecision> decisions_;
  DeviceTensor policy_logits_, policy_probs_;  // [H, stride]
  SparsityStats sparsity_;
  std::vector<uint8_t> host_visible_;  // [H, stride]: a mask read back to count it
};

}  // namespace kvlens
