// ModelWeights: the Llama tensors of a checkpoint, each checked against the config for dtype
// and shape before use. Views point into the memory-mapped safetensors files.
// Shapes (Hugging Face layout, row-major): embed [vocab, E]; wq [H*D, E]; wk, wv [G*D, E];
// wo [E, H*D]; w_gate, w_up [F, E]; w_down [E, F]; norms [E]; lm_head [vocab, E]. phi3's fused
// qkv_proj and gate_up_proj are split into these views (row ranges of the mapped tensor).
// gemma3: norms are F32 host copies holding (1 + weight) (q_norm also times the attention-scale
// correction), and post_attn_norm, post_mlp_norm [E] are present.
#pragma once

#include <memory>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/safetensors.h"

namespace kvlens {

struct LayerWeights {
  TensorView attn_norm, wq, wk, wv, wo;
  TensorView mlp_norm, w_gate, w_up, w_down;
  // Present only where the config says so (empty views otherwise): q/k/v biases
  // (ModelConfig::qkv_bias), per-head q and k norms [head_dim] (qk_norm).
  TensorView bq, bk, bv, q_norm, k_norm;
  // gemma3 (ModelConfig::sandwich_norms): the norm of o_proj's output before the residual
  // (post_attention_layernorm) and of the MLP's (post_feedforward_layernorm).
  TensorView post_attn_norm, post_mlp_norm;
};

struct ModelWeights {
  // Keeps the maps alive, and the host copies the loader derived (gemma3's norms) with them.
  std::shared_ptr<SafetensorsSet> files;
  TensorView embed;
  TensorView final_norm;
  TensorView lm_head;  // == embed when tie_word_embeddings; untied needs lm_head.weight
  std::vector<LayerWeights> layers;

  // Errors name the folder, the tensor and the expected dtype/shape.
  static ModelWeights load(const std::string& model_dir, const ModelConfig& config);
  // The same checks on tensors already named as in a checkpoint folder (a GGUF file's).
  static ModelWeights from_files(std::shared_ptr<SafetensorsSet> files, const ModelConfig& config);
};

}  // namespace kvlens
