// The approximate-logit policies' op extension (op_extension.h), beside sparq_policy.cpp,
// loki_policy.cpp and doublesparsity_policy.cpp: approximate logits [H, stride] F32 on the true
// logits' scale from part of each key, SparQ's from the query's largest channels, Loki's and
// DoubleSparsity's from keys projected on a calibrated basis [B, D, dims] (B = KV heads for
// Loki's principal directions, query heads for DoubleSparsity's label channels). The arithmetic
// is approx_logit_math.h's on both backends (CPU: approx_logit_ops_cpu.cpp, CUDA:
// kernels/policy/approx_logit_*): the same bits, so the same visible sets.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/backend/backend.h"

namespace kvlens {

class ApproxLogitOps : public OpExtension {
 public:
  static constexpr std::string_view kExtensionName = "approx_logits";

  // SparQ. For every KV group g of q [1, H, D] (G = k_cache's KV heads, H/G query heads each):
  // I_g = the `rank` channels with the largest sum over the group's heads of |q_c|
  // (sparq_magnitude, sparq_pick), and for each head h of the group and j < cols:
  // out[h, j] = sum_{c in I_g} q[h, c] * k_cache[g, j, c] / sqrt(D * l1(q_h on I_g) / l1(q_h)).
  // 1 <= rank <= D <= kApproxMaxHeadDim. out F32 [H, stride].
  virtual void sparq_logits(const DeviceTensor& q, const DeviceTensor& k_cache, int64_t cols,
                            int64_t rank, DeviceTensor& out) = 0;
  // Keys projected on a basis, columns [begin, end): projected[b, j, i] = sum_c k_cache[b /
  // (B / G), j, c] * basis[b, c, i] (project_component) for B = basis rows, a multiple of G.
  // basis F32 [B, D, dims]; projected F32 [B, capacity', dims] with capacity' >= end. Other
  // columns are untouched, so a policy projects each key once.
  virtual void project_keys(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                            const DeviceTensor& basis, DeviceTensor& projected) = 0;
  // The approximate logits of projected keys: with b = h / (H / B), qp = q[0, h, :] projected on
  // basis[b] (project_component), out[h, j] = (qp . projected[b, j, :]) / sqrt(D) for j < cols
  // (projected_logit; D = basis' second dimension, the true logits' scale). out F32 [H, stride].
  virtual void projected_logits(const DeviceTensor& q, const DeviceTensor& basis,
                                const DeviceTensor& projected, int64_t cols, DeviceTensor& out) = 0;
};

// `backend`'s ApproxLogitOps (the CPU implementation registered by the first call). Throws
// kvlens::Error naming the extension and the backend when the backend has none.
ApproxLogitOps& approx_logit_ops(Backend& backend);

}  // namespace kvlens
