// ModelConfig: the fields of a Hugging Face config.json that a Llama-family decoder needs
// (model_type llama or mistral), validated on load.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/common/dtype.h"

namespace kvlens {

struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  // llama3 only:
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string model_type;  // "llama", "mistral", "llama_butler", "qwen2" or "qwen3"
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
  int64_t max_position_embeddings = 2048;
  std::optional<int64_t> sliding_window;  // mistral: keys older than this many positions are masked
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

  // The rotary inverse frequencies [head_dim / 2] after rope_scaling, as transformers computes
  // them.
  std::vector<float> rope_inv_freq() const;
  // Attention scaling of positions for `linear` scaling is folded into rope_inv_freq.
};

}  // namespace kvlens
