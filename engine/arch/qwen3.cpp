// Qwen3: Llama's layer with an RMSNorm of every head's query and key over head_dim (q_norm,
// k_norm [D]) before RoPE; q [m, H * D] seen as [m * H, D] rows, k as [m * G, D].
#include "engine/arch/architecture.h"
#include "engine/arch/families.h"
#include "engine/backend/tensor_views.h"

namespace kvlens {
namespace {

class Qwen3 final : public Architecture {
 public:
  std::string_view model_types() const override { return "qwen3"; }
  void attention_inputs(Backend& backend, const ModelConfig& config,
                        const BackendModel::Layer& layer, LayerRows& rows) const override {
    arch::norm_and_qkv(backend, config, layer, rows);
    if (layer.q_norm.empty()) return;
    const int64_t m = rows.q.dim(0);
    const float eps = float(config.rms_norm_eps);
    DeviceTensor q_heads = tensor::view(rows.q, {m * config.num_heads, config.head_dim});
    DeviceTensor k_heads = tensor::view(rows.k, {m * config.num_kv_heads, config.head_dim});
    backend.rmsnorm(q_heads, layer.q_norm, eps, q_heads);
    backend.rmsnorm(k_heads, layer.k_norm, eps, k_heads);
  }
};

}  // namespace

const Architecture& qwen3_architecture() {
  static const Qwen3 architecture;
  return architecture;
}

}  // namespace kvlens
