// Qwen3: Llama's layer with an RMSNorm of every head's query and key over head_dim (q_norm,
// k_norm [D]) before RoPE; q [m, H * D] seen as [m * H, D] rows, k as [m * G, D].
#include "engine/arch/architecture.h"
#include "engine/arch/families.h"

namespace kvlens {
namespace {

class Qwen3 final : public Architecture {
 public:
  std::string_view model_types() const override { return "qwen3"; }
  void attention_inputs(Backend& backend, const ModelConfig& config,
                        const BackendModel::Layer& layer, LayerRows& rows) const override {
    arch::norm_and_qkv(backend, config, layer, rows);
    if (layer.q_norm.empty()) return;
    arch::norm_heads(backend, config, layer, rows);
  }
};

}  // namespace

const Architecture& qwen3_architecture() {
  static const Qwen3 architecture;
  return architecture;
}

}  // namespace kvlens
