// A model family's layer math, as llama.cpp keeps one graph builder per architecture: what a
// decoder layer computes before its attention (norm, q/k/v products and the family's extras,
// RoPE excluded: the session rotates) and after it (o_proj, the MLP, the residuals). Rows are
// hidden [m, E], normed [m, E], q [m, H * D], k and v [m, G * D], attn [m, H * D], proj [m, E],
// gate, up and act [m, F]; every tensor a view of m rows of the session's scratch.
#pragma once

#include <string_view>

#include "engine/arch/backend_model.h"
#include "engine/backend/backend.h"
#include "engine/model/config.h"

namespace kvlens {

struct LayerRows {
  DeviceTensor hidden, normed, q, k, v, attn, proj, gate, up, act;
};

class Architecture {
 public:
  virtual ~Architecture() = default;
  // The model_type values it serves, comma separated (for messages and `info`).
  virtual std::string_view model_types() const = 0;
  // normed = input_norm(hidden), then q, k, v (before RoPE). The session rotates q and k. The
  // default is Llama's (arch::norm_and_qkv); a family overrides what it adds.
  virtual void attention_inputs(Backend& backend, const ModelConfig& config,
                                const BackendModel::Layer& layer, LayerRows& rows) const;
  // hidden += o_proj(attn); then hidden += mlp(post_attention_norm(hidden)), normed, gate, up,
  // act and proj used as scratch. The default is Llama's SwiGLU (arch::output_and_swiglu).
  virtual void attention_output_and_mlp(Backend& backend, const ModelConfig& config,
                                        const BackendModel::Layer& layer, LayerRows& rows) const;
};

// The architecture of config.model_type (one of those ModelConfig accepts); throws
// kvlens::Error naming the model_type for any other.
const Architecture& architecture_for(const ModelConfig& config);

// The shared helpers the families build on (engine/arch/layer_helpers.cpp).
namespace arch {
// normed = rmsnorm(hidden, attn_norm), then q, k, v = normed * wq^T, wk^T, wv^T (one backend call).
void norm_and_qkv(Backend& backend, const ModelConfig& config, const BackendModel::Layer& layer,
                  LayerRows& rows);
// y = x * w^T for a row-parallel w (o_proj, down_proj: the rank's columns, Megatron-LM's split),
// then summed over the tensor-parallel ranks (Backend::all_reduce_sum; alone, just the product).
void row_parallel_matmul(Backend& backend, const DeviceTensor& x, const DeviceTensor& w,
                         DeviceTensor& y);
// residual += x * w^T summed over the ranks (alone: Backend::matmul_add, one fused call).
void row_parallel_matmul_add(Backend& backend, const DeviceTensor& x, const DeviceTensor& w,
                             DeviceTensor& scratch, DeviceTensor& residual);
// hidden += attn * wo^T; normed = rmsnorm(hidden, mlp_norm); act = silu(normed * w_gate^T) *
// (normed * w_up^T); hidden += act * w_down^T.
void output_and_swiglu(Backend& backend, const ModelConfig& config,
                       const BackendModel::Layer& layer, LayerRows& rows);
// An RMSNorm of every head's query and key over head_dim (q_norm, k_norm [D]), before RoPE:
// q [m, H * D] seen as [m * H, D] rows, k as [m * G, D] (Qwen3, Gemma 3).
void norm_heads(Backend& backend, const ModelConfig& config, const BackendModel::Layer& layer,
                LayerRows& rows);
}  // namespace arch

}  // namespace kvlens
