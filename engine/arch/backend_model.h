// BackendModel: a model's weights resident in one backend, shared by every session on it, and
// the options of the upload. Per layer: norms [E], wq [H * D, E], wk and wv [G * D, E],
// wo [E, H * D], w_gate and w_up [F, E], w_down [E, F]; embed [vocab, E], lm_head [vocab, E].
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/model.h"

namespace kvlens {

class Architecture;
struct BackendPredictor;
struct TensorParallelShards;

// How a model goes into a backend. Empty fields: as stored / the backend's default.
struct UploadOptions {
  // Every weight converted on the host first, as torch's .to(dtype) does (F32 or BF16; BF16 is
  // rounded to nearest even): an F32 checkpoint run in BF16, or a BF16 one widened to F32.
  std::optional<DType> weight_dtype;
  // The KV caches of sessions on this model. Default: the weights' dtype where the backend keeps
  // caches of that dtype (Backend::supports_cache_dtype: the CUDA backend), else F32.
  std::optional<DType> kv_cache_dtype;
};

// The model's weights resident in one backend (shared by all sessions on that backend).
struct BackendModel {
  std::shared_ptr<const Model> model;
  Backend* backend = nullptr;
  struct Layer {
    DeviceTensor attn_norm, wq, wk, wv, wo, mlp_norm, w_gate, w_up, w_down;
    DeviceTensor bq, bk, bv, q_norm, k_norm;     // empty where the model has none
    DeviceTensor post_attn_norm, post_mlp_norm;  // gemma3's sandwich norms (empty otherwise)
  };
  DeviceTensor embed, final_norm, lm_head, inv_freq;
  // RoPE: inv_freq [rotary_dim / 2] serves every forward call but longrope's and dynamic's long
  // ones (ModelConfig::rope_table); inv_freq_long is longrope's long table (empty otherwise);
  // cos and sin are multiplied by rope_scale (yarn / longrope attention factor).
  DeviceTensor inv_freq_long;
  float rope_scale = 1.0f;
  // gemma3: the local (sliding-window) layers' table [rotary_dim / 2], unscaled (empty when
  // every layer uses inv_freq); layer_uses_local_rope says which layers rotate with it.
  DeviceTensor inv_freq_local;
  bool layer_uses_local_rope(size_t layer) const {
    const std::vector<bool>& local = config().sliding_layers;
    return !inv_freq_local.empty() && layer < local.size() && local[layer];
  }
  std::vector<Layer> layers;
  // The family's layer math (engine/arch/architecture.h), from config.model_type.
  const Architecture* architecture = nullptr;
  // The model's TokenButler predictor on this backend (null when the model has none; set by
  // upload_model, engine/session).
  std::shared_ptr<const BackendPredictor> predictor;

  // The dtype of the sessions' KV caches (resolved from UploadOptions::kv_cache_dtype).
  DType kv_cache_dtype = DType::F32;
  // Set where this is the lead of a model split over a tensor-parallel group (rank 0's shard,
  // lead_tensor_parallel in engine/session/tensor_parallel_session.h): scoring on it steps every
  // rank (score_tokens_lockstep), and an eval's engine may be such a group. Null otherwise.
  std::shared_ptr<const TensorParallelShards> tensor_parallel;

  // The weights alone (the predictor is the policy layer's: upload_model in engine/session puts
  // both). Throws kvlens::Error for a dtype the options cannot have (naming the option's value).
  static std::shared_ptr<BackendModel> upload_weights(std::shared_ptr<const Model> model,
                                                      Backend& backend,
                                                      const UploadOptions& options = {});
  // The dtype of the layers' matrices (the checkpoint's, or UploadOptions::weight_dtype).
  DType weight_dtype() const;
  const ModelConfig& config() const { return model->config; }
  // Bytes of the layers' weights (norms and matrices), and what one decode step reads from the
  // weights: those, the final norm, the lm_head and one embedding row.
  int64_t layer_weight_bytes() const;
  int64_t step_weight_bytes() const;
};

// A model split over a tensor-parallel group (engine/arch/tensor_parallel.h): the whole model and
// every rank's shard, rank order (shards[r] on the backend of rank r).
struct TensorParallelShards {
  std::shared_ptr<const Model> model;
  std::vector<std::shared_ptr<const BackendModel>> shards;
};

}  // namespace kvlens
