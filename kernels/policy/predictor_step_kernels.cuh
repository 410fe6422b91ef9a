// The TokenButler predictor's forward for one decode token in six kernels (PredictorStepOps,
// engine/policy/predictor_step_ops.h), in place of the eighteen backend ops of
// PredictorState::append, which stay the CPU reference. Shapes: x [E]; reduced [Er] = H heads of
// hd; ffn [2Er]; hidden [E]; importance hidden [2m] (queries' m, then keys'); query and each
// importance key [slots, d']. Every product row is F32, every weight one dtype (F32, BF16, F16).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

struct PredictorStepArgs {
  int64_t hidden = 0, reduced = 0, heads = 0, head_dim = 0, intermediate = 0;
  int64_t slots = 0, importance_dim = 0;
  int64_t position = 0, capacity = 0;  // the new token's position; the caches' rows per group
  float eps = 0.0f;
  float attention_scale = 0.0f;   // of the predictor's own attention (attention_scale(hd))
  bool importance_norms = false;  // the hf variant's norm2 and norm_importance
  DType w_dtype = DType::F32;     // every weight, bias and norm parameter
  const float* x = nullptr;       // [E]
  const void *input_proj = nullptr, *q_attn = nullptr, *k_attn = nullptr, *v_attn = nullptr;
  const void *norm1_weight = nullptr, *norm1_bias = nullptr;
  const void *ffn_in_weight = nullptr, *ffn_in_bias = nullptr;    // [2Er, Er], [2Er]
  const void *ffn_out_weight = nullptr, *ffn_out_bias = nullptr;  // [E, 2Er], [E]
  const void *norm2_weight = nullptr, *norm2_bias = nullptr;
  const void *norm_importance_weight = nullptr, *norm_importance_bias = nullptr;
  const void *q_importance_in = nullptr, *k_importance_in = nullptr;    // [m, E]
  const void *q_importance_out = nullptr, *k_importance_out = nullptr;  // [slots * d', m]
  const float *attention_inv_freq = nullptr, *importance_inv_freq = nullptr;
  float *attention_keys = nullptr, *attention_values = nullptr;  // F32 [H, capacity, hd]
  float* importance_keys = nullptr;                              // F32 [slots, capacity, d']
  float* query = nullptr;                                        // F32 [slots * d']
  // Scratch (predictor_step_scratch_floats): reduced, ffn, hidden, importance hidden, and the
  // split attention's partial sums [H, splits, hd + 2].
  float* scratch = nullptr;
  int64_t splits = 1;
};

constexpr int64_t kPredictorMaxHeadDim = 32;  // hd and d' (even) up to this
constexpr int64_t kPredictorMaxSplits = 64;

// Whether the kernels take these dimensions (every product's input a multiple of 8 values,
// hd and d' even and at most kPredictorMaxHeadDim).
bool predictor_step_fusable(const PredictorStepArgs& args);
// Scratch floats the launch needs for these dimensions (at most kPredictorMaxSplits splits).
int64_t predictor_step_scratch_floats(int64_t hidden, int64_t reduced, int64_t heads,
                                      int64_t head_dim, int64_t intermediate);

// Enqueues the six kernels; args.splits is set by the launch.
void launch_predictor_step(PredictorStepArgs args, int sm_count, cudaStream_t stream);

}  // namespace kvlens::cuda
