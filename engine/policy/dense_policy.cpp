// dense (POLICIES.md): S = {0..t}. The reference every other policy is compared with.
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

class DensePolicy final : public Policy {
 public:
  // Chooses without this step's logits (see Policy::reads_logits).
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  LayerDecision select(const LayerStep&, DeviceTensor&, DeviceTensor&) override {
    return LayerDecision::Dense;
  }
};

}  // namespace

PolicyInfo dense_policy_info() {
  return {"dense", "reference", "Every cached token is visible (S = {0..t}).", {}, true};
}

std::unique_ptr<Policy> make_dense_policy(const PolicyShape&, Backend&, const ParamValues&,
                                          double) {
  return std::make_unique<DensePolicy>();
}

}  // namespace kvlens
