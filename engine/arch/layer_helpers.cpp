// The layer math every supported family shares: the pre-norm attention inputs and the SwiGLU
// MLP with its residuals (Llama's layout; the families add to it, engine/arch/<family>.cpp).
#include <span>

#include "engine/arch/architecture.h"
#include "engine/backend/tensor_views.h"

namespace kvlens::arch {

void norm_and_qkv(Backend& backend, const ModelConfig& config, const BackendModel::Layer& layer,
                  LayerRows& rows) {
  const DeviceTensor* const weights[] = {&layer.wq, &layer.wk, &layer.wv};
  DeviceTensor* const outputs[] = {&rows.q, &rows.k, &rows.v};
  backend.rmsnorm_matmul_many(rows.hidden, layer.attn_norm, float(config.rms_norm_eps), rows.normed,
                              weights, outputs);
}

void row_parallel_matmul(Backend& backend, const DeviceTensor& x, const DeviceTensor& w,
                         DeviceTensor& y) {
  backend.matmul(x, w, y);
  backend.all_reduce_sum(y);
}

void row_parallel_matmul_add(Backend& backend, const DeviceTensor& x, const DeviceTensor& w,
                             DeviceTensor& scratch, DeviceTensor& residual) {
  if (backend.tensor_parallel_ranks() == 1) {
    backend.matmul_add(x, w, scratch, residual);
    return;
  }
  row_parallel_matmul(backend, x, w, scratch);
  backend.add_inplace(residual, scratch);
}

void output_and_swiglu(Backend& backend, const ModelConfig& config,
                       const BackendModel::Layer& layer, LayerRows& rows) {
  row_parallel_matmul_add(backend, rows.attn, layer.wo, rows.proj, rows.hidden);
  backend.rmsnorm_gate_up(rows.hidden, layer.mlp_norm, float(config.rms_norm_eps), rows.normed,
                          layer.w_gate, layer.w_up, rows.gate, rows.up, rows.act);
  row_parallel_matmul_add(backend, rows.act, layer.w_down, rows.proj, rows.hidden);
}

void norm_heads(Backend& backend, const ModelConfig& config, const BackendModel::Layer& layer,
                LayerRows& rows) {
  const int64_t m = rows.q.dim(0);
  const float eps = float(config.rms_norm_eps);
  DeviceTensor q_heads = tensor::view(rows.q, {m * config.num_heads, config.head_dim});
  DeviceTensor k_heads = tensor::view(rows.k, {m * config.num_kv_heads, config.head_dim});
  backend.rmsnorm(q_heads, layer.q_norm, eps, q_heads);
  backend.rmsnorm(k_heads, layer.k_norm, eps, k_heads);
}

}  // namespace kvlens::arch

namespace kvlens {

void Architecture::attention_inputs(Backend& backend, const ModelConfig& config,
                                    const BackendModel::Layer& layer, LayerRows& rows) const {
  arch::norm_and_qkv(backend, config, layer, rows);
}

void Architecture::attention_output_and_mlp(Backend& backend, const ModelConfig& config,
                                            const BackendModel::Layer& layer,
                                            LayerRows& rows) const {
  arch::output_and_swiglu(backend, config, layer, rows);
}

}  // namespace kvlens
