// PredictorStepOps (engine/policy/predictor_step_ops.h) on the CUDA backend: the state's tensors
// checked against the predictor's config, then predictor_step_kernels.cu. A predictor whose
// weights are not all of one dtype, or whose dimensions the kernels do not take, is not taken
// (its states run the reference ops). register_cuda_policy_ops (cuda_policy_ops.cpp) registers it.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/op_extension.h"
#include "engine/common/error.h"
#include "engine/policy/predictor_step_ops.h"
#include "kernels/cuda_backend_impl.h"
#include "kernels/policy/cuda_policy_ops.h"
#include "kernels/policy/predictor_step_kernels.cuh"

namespace kvlens::cuda {
namespace {

class CudaPredictorStepOps final : public PredictorStepOps {
 public:
  explicit CudaPredictorStepOps(Backend& backend)
      : backend_(cuda_backend_of_extension(backend, PredictorStepOps::kExtensionName)) {
    backend_.activate();
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    check_cuda(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute");
  }

  bool takes(const BackendPredictor& p) const override {
    // $KVLENS_FUSED_PREDICTOR_STEP=0 takes no predictor (for measuring what the fusion is worth).
    static const bool enabled = [] {
      const char* text = std::getenv("KVLENS_FUSED_PREDICTOR_STEP");
      return text == nullptr || std::strcmp(text, "0") != 0;
    }();
    const PredictorStepArgs a = dimensions(p);
    if (!enabled || !predictor_step_fusable(a)) return false;
    std::vector<const DeviceTensor*> weights = {
        &p.input_proj,       &p.q_proj_attn,     &p.k_proj_attn,     &p.v_proj_attn,
        &p.norm1_weight,     &p.norm1_bias,      &p.ffn_in_weight,   &p.ffn_in_bias,
        &p.ffn_out_weight,   &p.ffn_out_bias,    &p.q_importance_in, &p.k_importance_in,
        &p.q_importance_out, &p.k_importance_out};
    if (a.importance_norms) {
      for (const DeviceTensor* t :
           {&p.norm2_weight, &p.norm2_bias, &p.norm_importance_weight, &p.norm_importance_bias})
        weights.push_back(t);
    }
    // One dtype; the products read 16-byte words of every weight row.
    for (const DeviceTensor* t : weights)
      if (t->dtype != a.w_dtype || t->data == nullptr ||
          reinterpret_cast<uintptr_t>(t->data) % 16 != 0)
        return false;
    return true;
  }

  int64_t scratch_floats(const PredictorConfig& c) const override {
    return predictor_step_scratch_floats(c.hidden_size, c.reduced_size, c.heads,
                                         c.attention_head_dim(), c.intermediate);
  }

  void decode_step(const DecodeStep& step) override {
    const BackendPredictor& p = *step.predictor;
    PredictorStepArgs a = dimensions(p);
    a.position = step.position;
    require_operands(step, a);
    a.x = step.x->as<const float>();
    a.input_proj = p.input_proj.data;
    a.q_attn = p.q_proj_attn.data;
    a.k_attn = p.k_proj_attn.data;
    a.v_attn = p.v_proj_attn.data;
    a.norm1_weight = p.norm1_weight.data;
    a.norm1_bias = p.norm1_bias.data;
    a.ffn_in_weight = p.ffn_in_weight.data;
    a.ffn_in_bias = p.ffn_in_bias.data;
    a.ffn_out_weight = p.ffn_out_weight.data;
    a.ffn_out_bias = p.ffn_out_bias.data;
    a.norm2_weight = p.norm2_weight.data;
    a.norm2_bias = p.norm2_bias.data;
    a.norm_importance_weight = p.norm_importance_weight.data;
    a.norm_importance_bias = p.norm_importance_bias.data;
    a.q_importance_in = p.q_importance_in.data;
    a.k_importance_in = p.k_importance_in.data;
    a.q_importance_out = p.q_importance_out.data;
    a.k_importance_out = p.k_importance_out.data;
    a.attention_inv_freq = p.attention_inv_freq.as<const float>();
    a.importance_inv_freq = p.importance_inv_freq.as<const float>();
    a.capacity = step.attention_keys->dim(1);
    a.attention_keys = step.attention_keys->as<float>();
    a.attention_values = step.attention_values->as<float>();
    a.importance_keys = step.importance_keys->as<float>();
    a.query = step.query->as<float>();
    a.scratch = step.scratch->as<float>();
    backend_.activate();
    launch_predictor_step(a, sm_count_, backend_.stream());
    check_launch("predictor_step");
  }

 private:
  // The predictor's dimensions and weight dtype (the step's own fields left at their defaults).
  static PredictorStepArgs dimensions(const BackendPredictor& p) {
    const PredictorConfig& c = p.config();
    PredictorStepArgs a;
    a.hidden = c.hidden_size;
    a.reduced = c.reduced_size;
    a.heads = c.heads;
    a.head_dim = c.attention_head_dim();
    a.intermediate = c.intermediate;
    a.slots = (c.layers - 1) * c.heads;
    a.importance_dim = c.importance_dim;
    a.eps = float(c.layer_norm_eps);
    a.attention_scale = attention_scale(a.head_dim);
    a.importance_norms = c.variant == PredictorConfig::Variant::kHf;
    a.w_dtype = p.input_proj.dtype;
    return a;
  }

  // The state's tensors as PredictorState makes them: F32 caches with room at the position, an
  // F32 [1, E] input, a query row of every slot and enough scratch. A mismatch is a bug in the
  // caller: an error naming the tensor.
  void require_operands(const DecodeStep& step, const PredictorStepArgs& a) const {
    const std::string op = "predictor_step";
    auto cache = [&](const DeviceTensor* t, const char* what, int64_t groups, int64_t width) {
      if (t == nullptr || t->dtype != DType::F32 || t->shape.size() != 3 || t->dim(0) != groups ||
          t->dim(2) != width || t->dim(1) <= a.position || t->dim(1) != step.attention_keys->dim(1))
        bad_argument(op + ": " + what,
                     cat({"an F32 [", std::to_string(groups), ", capacity > ",
                          std::to_string(a.position), ", ", std::to_string(width), "] cache"}),
                     t == nullptr ? std::string("none") : describe(*t));
    };
    cache(step.attention_keys, "attention_keys", a.heads, a.head_dim);
    cache(step.attention_values, "attention_values", a.heads, a.head_dim);
    cache(step.importance_keys, "importance_keys", a.slots, a.importance_dim);
    require(*step.x, DType::F32, op, "x");
    if (step.x->numel() != a.hidden)
      bad_argument(op + ": x", cat({"F32 [1, ", std::to_string(a.hidden), "]"}), describe(*step.x));
    require(*step.query, DType::F32, op, "query");
    require(*step.scratch, DType::F32, op, "scratch");
    if (step.query->numel() != a.slots * a.importance_dim ||
        step.scratch->numel() <
            predictor_step_scratch_floats(a.hidden, a.reduced, a.heads, a.head_dim, a.intermediate))
      bad_argument(op + ": query, scratch", "the predictor's query row and step scratch",
                   describe(*step.query) + ", " + describe(*step.scratch));
  }

  CudaBackend& backend_;
  int sm_count_ = 0;
};

}  // namespace

void register_cuda_predictor_step_ops() {
  register_op_extension(
      std::string(PredictorStepOps::kExtensionName), "cuda",
      [](Backend& backend) { return std::make_unique<CudaPredictorStepOps>(backend); });
}

}  // namespace kvlens::cuda
