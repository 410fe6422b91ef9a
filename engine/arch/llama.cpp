// Llama (and Mistral, whose sliding window is the attention's, and llama_butler, a Llama with a
// TokenButler predictor beside it): pre-norm attention inputs, SwiGLU MLP, no biases.
#include "engine/arch/architecture.h"
#include "engine/arch/families.h"

namespace kvlens {
namespace {

class Llama final : public Architecture {
 public:
  std::string_view model_types() const override { return "llama, mistral, llama_butler"; }
};

}  // namespace

const Architecture& llama_architecture() {
  static const Llama architecture;
  return architecture;
}

}  // namespace kvlens
