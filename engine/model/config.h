// ModelConfig: the fields of a Hugging Face config.json that a Llama-family decoder needs
// (model_type llama, mistral, llama_butler, qwen2, qwen3, phi3, gemma3_text, or gemma3 with its
// text part under text_config), validated on load, and the rotary tables [rotary_dim / 2]
// transformers computes from them (rope_inv_freq; Gemma 3's local layers: rope_inv_freq_local).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/common/dtype.h"

namespace kvlens {

struct RopeScaling {
  // transformers' rope_type: default, linear, llama3, yarn, dynamic (NTK-aware) and longrope
  // (phi3 also spells it "su" or "yarn").
  enum class Type { kNone, kLinear, kLlama3, kYarn, kDynamic, kLongRope };
  Type type = Type::kNone;
  double factor = 1.0;  // linear, llama3, yarn, dynamic; longrope: the context ratio it implies
  // llama3 only:
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3, yarn, longrope: the pre-training context. dynamic: config.json's
  // max_position_embeddings, the length past which the base is rescaled per forward call.
  int64_t original_max_position_embeddings = 8192;
  // yarn and longrope: cos and sin are multiplied by it (resolved at parse time from
  // attention_factor, mscale / mscale_all_dim or factor, as transformers does).
  double attention_factor = 1.0;
  // yarn only:
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  // longrope only: per-frequency divisors [rotary_dim / 2] for forward calls that stay within
  // original_max_position_embeddings (short) and for those that reach past it (long).
  std::vector<double> short_factor, long_factor;
};

struct ModelConfig {
  // "llama", "mistral", "llama_butler", "qwen2", "qwen3", "phi3" or "gemma3_text" (a "gemma3"
  // config's text_config is read as one; multimodal_prefix then says so).
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;    // num_hidden_layers
  int64_t num_heads = 0;     // num_attention_heads
  int64_t num_kv_heads = 0;  // num_key_value_heads (defaults to num_attention_heads)
  int64_t head_dim = 0;      // explicit head_dim, else hidden_size / num_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  // Positions a sequence may use. dynamic RoPE: config.json's value times factor (the context the
  // NTK rescaling was configured for; transformers sets no limit), the original value is in
  // rope_scaling.original_max_position_embeddings.
  int64_t max_position_embeddings = 2048;
  // mistral, phi3: keys older than this many positions are masked (phi3: only when given), in
  // every layer. gemma3: only in the layers sliding_layers marks.
  std::optional<int64_t> sliding_window;
  // One flag per layer where the window applies to some layers only (gemma3's layer_types or
  // sliding_window_pattern: the "local" layers); empty when it applies to all of them.
  std::vector<bool> sliding_layers;
  // gemma3: the RoPE base of the local layers (rope_local_base_freq, or rope_parameters'
  // sliding_attention.rope_theta), which never scale; rope_theta and rope_scaling are the global
  // layers'. 0: every layer uses rope_theta.
  double rope_local_theta = 0.0;
  // Attention logits are q.k * attention_scalar^-0.5 (gemma3: query_pre_attn_scalar; others:
  // head_dim). 0: head_dim.
  double attention_scalar = 0.0;
  // gemma3: logits = tanh(logits / cap) * cap (final_logit_softcapping; 0: none).
  double final_logit_softcap = 0.0;
  // Attention logits soft-capped before the mask and the softmax: z = tanh(z / cap) * cap, z the
  // scaled q.k (attn_logit_softcapping; 0: none, as every Gemma 3 checkpoint has it).
  double attn_logit_softcap = 0.0;
  // The MLP's gate activation: silu (SwiGLU) or gelu_pytorch_tanh (gemma3's GeGLU).
  enum class Activation { kSilu, kGeluTanh };
  Activation hidden_activation = Activation::kSilu;
  // gemma3: the input embeddings are multiplied by sqrt(hidden_size) (1: not scaled).
  double embedding_scale = 1.0;
  // gemma3: RMSNorm weights w scale by (1 + w), and each layer has a norm after the attention
  // (applied to o_proj's output before the residual) and one after the MLP (post_attn_norm,
  // post_mlp_norm); the one before the MLP is the usual mlp_norm (pre_feedforward_layernorm).
  bool norm_weight_offset = false;
  bool sandwich_norms = false;
  // gemma3 configs: the weights are those of Gemma3ForConditionalGeneration (the language
  // model's tensors under language_model.* or model.language_model.*).
  bool multimodal_prefix = false;
  // Channels of each head that RoPE rotates (rotate-half within them); the rest pass through.
  // head_dim except phi3 with partial_rotary_factor: int(head_dim * factor) (Phi-4-mini: 0.75).
  int64_t rotary_dim = 0;
  // phi3: q, k and v are row ranges of one self_attn.qkv_proj.weight [(H + 2G) * D, E], gate and
  // up of one mlp.gate_up_proj.weight [2F, E] (ModelWeights views them, no copies).
  bool fused_projections = false;
  // Bias vectors on the q, k and v projections (qwen2).
  bool qkv_bias = false;
  // Per-head RMSNorm of q and k over head_dim before RoPE (qwen3: q_norm, k_norm).
  bool qk_norm = false;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // config may give one id or a list
  DType torch_dtype = DType::F32;      // declared dtype (weights may differ per tensor)
  std::string source;                  // path it was loaded from, for messages

  // Parses and validates; every error names `source`, the field and what was expected.
  static ModelConfig parse(const std::string& json_text, const std::string& source);
  static ModelConfig load(const std::string& config_json_path);

  // The rotary inverse frequencies [rotary_dim / 2] (head_dim / 2 where rotary_dim is 0) after
  // rope_scaling, as transformers computes them, for a forward call whose largest position is
  // seq_len - 1. Only longrope and dynamic depend on seq_len: transformers' dynamic_rope_update
  // picks the table per call from the call's largest position (longrope: the long factors past
  // original_max_position_embeddings; dynamic: a base rescaled for seq_len past it), so keys
  // cached by earlier calls keep the rotation they got. seq_len 0: the table of short calls.
  // `linear` scaling of positions is folded in.
  std::vector<float> rope_inv_freq(int64_t seq_len = 0) const;
  // Which table a forward call up to position seq_len - 1 uses: the one of short calls (every
  // call but longrope's and dynamic's long ones), longrope's long one, or (dynamic past its
  // original length) one computed for that very seq_len.
  enum class RopeTable { kShort, kLong, kPerLength };
  RopeTable rope_table(int64_t seq_len) const;
  // The factor cos and sin are multiplied by (yarn, longrope: attention_factor; 1 otherwise).
  double rope_attention_scale() const;

  // Whether layer `layer` is a sliding-window (local) one, and the keys its queries see: the
  // last `window` positions, the query's own included (0: all of them).
  bool layer_is_local(int64_t layer) const;
  int64_t layer_window(int64_t layer) const;
  // The local layers' RoPE table [rotary_dim / 2] (rope_local_theta, unscaled); empty when every
  // layer uses rope_inv_freq.
  std::vector<float> rope_inv_freq_local() const;
  // A text line such as "local x5, global" per run of layer kinds ("all" when every layer is
  // alike), for `info`.
  std::string layer_pattern() const;
};

}  // namespace kvlens
