// Gemma 3 (gemma3_text, and a gemma3 checkpoint's language model): Llama's attention inputs with
// Qwen3's per-head q/k RMSNorm, then sandwich norms around the attention output and the GeGLU MLP:
// hidden += post_attn_norm(o_proj(attn)); hidden += post_mlp_norm(down(gelu_tanh(gate) * up)) of
// mlp_norm(hidden). Rows as in architecture.h: hidden [m, E], q [m, H * D], gate and up [m, F].
// The norms hold (1 + weight) and q_norm the attention-scalar fold (engine/model/weights.cpp);
// the scaled embeddings, per-layer windows and RoPE bases and the logit soft-cap are the
// session's (ModelConfig fields).
#include "engine/arch/architecture.h"
#include "engine/arch/families.h"

namespace kvlens {
namespace {

class Gemma3 final : public Architecture {
 public:
  std::string_view model_types() const override { return "gemma3_text"; }

  void attention_inputs(Backend& backend, const ModelConfig& config,
                        const BackendModel::Layer& layer, LayerRows& rows) const override {
    arch::norm_and_qkv(backend, config, layer, rows);
    arch::norm_heads(backend, config, layer, rows);
  }

  void attention_output_and_mlp(Backend& backend, const ModelConfig& config,
                                const BackendModel::Layer& layer, LayerRows& rows) const override {
    const float eps = float(config.rms_norm_eps);
    arch::row_parallel_matmul(backend, rows.attn, layer.wo, rows.proj);
    backend.rmsnorm(rows.proj, layer.post_attn_norm, eps, rows.proj);
    backend.add_inplace(rows.hidden, rows.proj);
    const DeviceTensor* const weights[] = {&layer.w_gate, &layer.w_up};
    DeviceTensor* const outputs[] = {&rows.gate, &rows.up};
    backend.rmsnorm_matmul_many(rows.hidden, layer.mlp_norm, eps, rows.normed, weights, outputs);
    backend.gelu_tanh_mul(rows.gate, rows.up, rows.act);
    arch::row_parallel_matmul(backend, rows.act, layer.w_down, rows.proj);
    backend.rmsnorm(rows.proj, layer.post_mlp_norm, eps, rows.proj);
    backend.add_inplace(rows.hidden, rows.proj);
  }
};

}  // namespace

const Architecture& gemma3_architecture() {
  static const Gemma3 architecture;
  return architecture;
}

}  // namespace kvlens
