// The arithmetic of the approximate-logit policies' ops (approx_logit_ops.h: sparq, loki,
// doublesparsity) with every rounding spelled out, shared by the CPU and CUDA implementations
// so both give the same bits. Plain C++ that nvcc also compiles for the device.
#pragma once

#include <cstdint>

#include "engine/backend/policy_op_math.h"

namespace kvlens {

// The widest head the ops take: SparQ's channel choice keeps one flag per channel on the stack.
inline constexpr int64_t kApproxMaxHeadDim = 512;

// SparQ's magnitude of channel c in one KV group: the sum over the group's `group` query heads
// (rows of q_group, [group, D]) of |q_c|, in head order.
KVLENS_HOST_DEVICE inline float sparq_magnitude(const float* q_group, int64_t group, int64_t D,
                                                int64_t c) {
  float magnitude = 0.0f;
  for (int64_t h = 0; h < group; ++h) magnitude = add_rn(magnitude, abs_f32(q_group[h * D + c]));
  return magnitude;
}

// SparQ's channels of one KV group from its magnitudes[D] (sparq_magnitude): the `rank` largest,
// ties to the lower channel, NaN ranking lowest (top_k_key's order on the mirrored channel
// index), written to channels[0, rank) in ascending order.
KVLENS_HOST_DEVICE inline void sparq_pick(const float* magnitudes, int64_t D, int64_t rank,
                                          int32_t* channels) {
  bool taken[kApproxMaxHeadDim];
  for (int64_t c = 0; c < D; ++c) taken[c] = false;
  for (int64_t i = 0; i < rank; ++i) {
    int64_t best = -1;
    uint64_t best_key = 0;
    for (int64_t c = 0; c < D; ++c) {
      if (taken[c]) continue;
      const uint64_t key = top_k_key(magnitudes[c], uint32_t(D - 1 - c));
      if (best < 0 || key > best_key) best = c, best_key = key;
    }
    taken[best] = true;
  }
  int64_t n = 0;
  for (int64_t c = 0; c < D; ++c)
    if (taken[c]) channels[n++] = int32_t(c);
}

// SparQ's scale of one query head q[D] over its chosen channels: 1 / sqrt(D * l1(q_I) / l1(q)),
// the authors' temperature for a dot product over part of the channels (both L1 sums in channel
// order). A query that is 0 on the chosen channels (every approximate logit 0) gets the true
// logits' 1 / sqrt(D) rather than an infinite scale.
KVLENS_HOST_DEVICE inline float sparq_scale(const float* q, int64_t D, const int32_t* channels,
                                            int64_t rank) {
  float chosen = 0.0f, all = 0.0f;
  for (int64_t i = 0; i < rank; ++i) chosen = add_rn(chosen, abs_f32(q[channels[i]]));
  for (int64_t c = 0; c < D; ++c) all = add_rn(all, abs_f32(q[c]));
  const float coverage = (chosen > 0.0f && all > 0.0f) ? div_rn(chosen, all) : 1.0f;
  return div_rn(1.0f, sqrt_rn(mul_rn(float(D), coverage)));
}

// sum_i q[channels[i]] * key(channels[i]) (products rounded, added in order from +0) times
// scale. `key(c)` reads channel c of the key as F32 (the CUDA cache may hold BF16 or F16).
template <typename Key>
KVLENS_HOST_DEVICE inline float sparq_logit(const float* q, Key key, const int32_t* channels,
                                            int64_t rank, float scale) {
  float sum = 0.0f;
  for (int64_t i = 0; i < rank; ++i) sum = add_rn(sum, mul_rn(q[channels[i]], key(channels[i])));
  return mul_rn(sum, scale);
}

// Component i of a row x projected on basis [D, dims]: sum_c x(c) * basis[c, i], in channel
// order from +0 (`x(c)` reads channel c as F32).
template <typename Row>
KVLENS_HOST_DEVICE inline float project_component(Row x, const float* basis, int64_t D,
                                                  int64_t dims, int64_t i) {
  float sum = 0.0f;
  for (int64_t c = 0; c < D; ++c) sum = add_rn(sum, mul_rn(x(c), basis[c * dims + i]));
  return sum;
}

// The approximate logit of a projected query qp[dims] and projected key kp[dims]:
// (sum_i qp[i] * kp[i]) * scale, in order from +0.
KVLENS_HOST_DEVICE inline float projected_logit(const float* qp, const float* kp, int64_t dims,
                                                float scale) {
  float sum = 0.0f;
  for (int64_t i = 0; i < dims; ++i) sum = add_rn(sum, mul_rn(qp[i], kp[i]));
  return mul_rn(sum, scale);
}

}  // namespace kvlens
