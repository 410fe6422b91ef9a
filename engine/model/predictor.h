// A TokenButler predictor (POLICIES.md, "The TokenButler predictor"): its sizes and weights,
// loaded from `predictor.safetensors` + `predictor.json` beside a model, or from the layer-0
// attention of a Hugging Face `llama_butler` checkpoint. Shapes ([out, in] as in PyTorch):
//   input_proj [Er, E]; q/k/v_proj_attn [Er, Er]; norm1 [Er]; ffn.0 [2Er, Er] + [2Er];
//   ffn.2 [E, 2Er] + [E]; norm2, norm_importance [E]; q/k_proj_importance.0 [m, E];
//   q/k_proj_importance.2 [N*H*d', m] (the slots of layer l, head h at rows (h*N + l)*d').
//
// predictor.json (written by tools/train_predictor.py and tools/convert_tokenbutler.py):
//   {"format": "kvlens-tokenbutler-predictor", "version": 1, "variant": "v1" | "hf",
//    "hidden_size": E, "attn_reduce_factor": r, "heads": H, "layers": N, "dDash": d',
//    "intdim": m, "layer_norm_eps": 1e-5, "rope_theta": theta,
//    "rope_scaling": {"rope_type": "llama3", "factor": 32, "low_freq_factor": 1,
//                     "high_freq_factor": 4, "original_max_position_embeddings": 8192},
//    "parameters": count, "base_model": {...}, "training": {...}}   (the last two: provenance)
// predictor.safetensors holds the tensors under the names above (the PyTorch module's
// state_dict names, without the `sparse_token_predictor.` prefix), F32, F16 or BF16.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/safetensors.h"

namespace kvlens {

struct PredictorConfig {
  enum class Variant { kV1, kHf };
  Variant variant = Variant::kHf;
  int64_t hidden_size = 0;         // E: the base model's hidden size
  int64_t attn_reduce_factor = 8;  // r
  int64_t reduced_size = 0;        // Er = E / r
  int64_t heads = 0;               // H: the base model's query heads (also the predictor's)
  int64_t layers = 0;              // N: the base model's layers
  int64_t importance_dim = 16;     // d' (dDash)
  int64_t intermediate = 512;      // m (intdim)
  double layer_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  // Forced llama3 scaling (factor 32, low 1, high 4, original 8192), as the reference code does
  // whatever the base model uses.
  RopeScaling rope_scaling;
  std::string source;  // the file the sizes came from, for messages

  int64_t attention_head_dim() const { return reduced_size / heads; }
  // Parameters of the predictor's modules (v1 counts its unused norm2; hf adds norm_importance).
  int64_t parameter_count() const;
  // Inverse frequencies [dim / 2] of the predictor's rotary embeddings (dim = the attention head
  // width or d'), with the forced llama3 scaling.
  std::vector<float> rope_inv_freq(int64_t dim) const;
  static const char* variant_name(Variant v) { return v == Variant::kV1 ? "v1" : "hf"; }
};

struct PredictorWeights {
  TensorView input_proj, q_proj_attn, k_proj_attn, v_proj_attn;
  TensorView norm1_weight, norm1_bias;
  TensorView ffn_in_weight, ffn_in_bias, ffn_out_weight, ffn_out_bias;
  TensorView norm2_weight, norm2_bias;                      // applied in hf only
  TensorView norm_importance_weight, norm_importance_bias;  // hf only (empty in v1)
  TensorView q_importance_in, q_importance_out, k_importance_in, k_importance_out;
};

struct Predictor {
  std::string path;  // predictor.safetensors, or the llama_butler folder it came from
  PredictorConfig config;
  PredictorWeights weights;
  std::shared_ptr<SafetensorsSet> files;   // keeps the maps alive (null when sharing the model's)
  std::shared_ptr<const void> keep_alive;  // other owners of the views' memory

  // predictor.safetensors (path) + predictor.json beside it; checked against the base model.
  static std::shared_ptr<const Predictor> load_file(const std::string& safetensors_path,
                                                    const ModelConfig& model);
  // The predictor inside a llama_butler checkpoint's weights (names under
  // model.layers.0.self_attn.sparse_token_predictor.), sized by its config.json fields.
  static std::shared_ptr<const Predictor> from_butler(const std::string& model_dir,
                                                      std::shared_ptr<SafetensorsSet> files,
                                                      const ModelConfig& model);
};

// Where a model's predictor comes from: an explicit file (--predictor), else a llama_butler
// checkpoint's own weights, else predictor.safetensors in the model folder. `searched` lists the
// places looked at when none was found (for the tokenbutler policy's error). A .gguf file: a
// predictor beside it or a bundled one for its model (gguf_predictor.h).
struct PredictorLookup {
  std::shared_ptr<const Predictor> predictor;
  std::vector<std::string> searched;
};

}  // namespace kvlens
