// Qwen2: Llama's layer with biases on the q, k and v products (added before RoPE).
#include "engine/arch/architecture.h"
#include "engine/arch/families.h"

namespace kvlens {
namespace {

class Qwen2 final : public Architecture {
 public:
  std::string_view model_types() const override { return "qwen2"; }
  void attention_inputs(Backend& backend, const ModelConfig& config,
                        const BackendModel::Layer& layer, LayerRows& rows) const override {
    arch::norm_and_qkv(backend, config, layer, rows);
    if (layer.bq.empty()) return;  // config.qkv_bias false: the weights loader found none
    backend.bias_activation(rows.q, &layer.bq, Backend::Activation::None);
    backend.bias_activation(rows.k, &layer.bk, Backend::Activation::None);
    backend.bias_activation(rows.v, &layer.bv, Backend::Activation::None);
  }
};

}  // namespace

const Architecture& qwen2_architecture() {
  static const Qwen2 architecture;
  return architecture;
}

}  // namespace kvlens
