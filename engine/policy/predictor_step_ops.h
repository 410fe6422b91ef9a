// The TokenButler predictor's fused decode step, an op extension (op_extension.h) a backend may
// offer: PredictorState::append of one token as a few kernels instead of its eighteen backend
// ops, which stay the reference (the CPU runs them; so does any backend without the extension,
// and one whose fused step does not take the predictor). The CUDA implementation is
// kernels/policy/predictor_step_ops_cuda.cpp.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/backend/op_extension.h"
#include "engine/policy/predictor_runtime.h"

namespace kvlens {

class PredictorStepOps : public OpExtension {
 public:
  static constexpr std::string_view kExtensionName = "tokenbutler_predictor_step";

  // One decode token of PredictorState::append: x F32 [1, E] at `position`, the caches of the
  // state (attention keys/values F32 [H, capacity, Er/H], importance keys F32 [(N-1)*H, capacity,
  // d']) with room at `position`; `query` F32 [1, (N-1)*H*d'] receives the token's importance
  // query; `scratch` F32 of at least scratch_floats(config) values.
  struct DecodeStep {
    const BackendPredictor* predictor = nullptr;
    const DeviceTensor* x = nullptr;
    int64_t position = 0;
    DeviceTensor *attention_keys = nullptr, *attention_values = nullptr;
    DeviceTensor *importance_keys = nullptr, *query = nullptr, *scratch = nullptr;
  };
  // Whether the fused step takes this predictor (its weights' dtypes and its dimensions); a
  // state asks once and then sends every decode token to decode_step, or none.
  virtual bool takes(const BackendPredictor& predictor) const = 0;
  // The scratch the step needs for this predictor.
  virtual int64_t scratch_floats(const PredictorConfig& config) const = 0;
  // Queues the step of a predictor it takes. Results agree with the ops' within F32 rounding
  // (other summation orders).
  virtual void decode_step(const DecodeStep& step) = 0;
};

}  // namespace kvlens
