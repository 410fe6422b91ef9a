// Llama (and Mistral, whose sliding window is the attention's, and llama_butler, a Llama with a
// TokenButler predictor beside it): pre-norm attention inputs, SwiGLU MLP, no biases.
#include "engine/arch/architecture.h"
#include "engine/arch/families.h"

namespace kvlens {
namespace {

class Llama final : public Architecture {
 public:
  std::string_view model_types() const override { return "llama, mistral, llama_butler"; }
  void attention_inputs(Backend& backend, const ModelConfig& config,
                        const BackendModel::Layer& layer, LayerRows& rows) const override {
    arch::norm_and_qkv(backend, config, layer, rows);
  }
  void attention_output_and_mlp(Backend& backend, const ModelConfig& config,
                                const BackendModel::Layer& layer, LayerRows& rows) const override {
    arch::output_and_swiglu(backend, config, layer, rows);
  }
};

}  // namespace

const Architecture& llama_architecture() {
  static const Llama architecture;
  return architecture;
}

}  // namespace kvlens
