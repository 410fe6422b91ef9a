// Phi-3 / Phi-3.5 / Phi-4 / Phi-4-mini: Llama's layer math. Their fused qkv_proj and
// gate_up_proj are row views made by the weights loader (engine/model/weights.cpp), and their
// partial rotary embedding is the RoPE table's (ModelConfig::rope_inv_freq), so nothing here
// differs from Llama but the name; a family that changes the layer itself overrides it here.
#include "engine/arch/architecture.h"
#include "engine/arch/families.h"

namespace kvlens {
namespace {

class Phi3 final : public Architecture {
 public:
  std::string_view model_types() const override { return "phi3"; }
};

}  // namespace

const Architecture& phi3_architecture() {
  static const Phi3 architecture;
  return architecture;
}

}  // namespace kvlens
