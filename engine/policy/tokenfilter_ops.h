// Token filtering's op extension (op_extension.h): its anchor similarities and per-step decision
// beside the policy (tokenfilter_policy.cpp). The gate it sets is applied by the core op
// zero_unless (the session does, for any gating policy). The CPU implementation is
// tokenfilter_ops_cpu.cpp, the CUDA one kernels/policy/.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/backend/backend.h"

namespace kvlens {

class TokenFilterOps : public OpExtension {
 public:
  static constexpr std::string_view kExtensionName = "tokenfilter";

  // Token filtering's similarity to an EMA anchor, per KV head g of cache [G, capacity, D]:
  // with x = cache[g, column, :] and a = anchor[g, :] (F32 [G, D]), similarity[g] = x . a /
  // (max(||x||, 1e-12) * max(||a||, 1e-12)) (0 for a zero vector), then a <- decay * a +
  // (1 - decay) * x (each product rounded, then added; decay = 0 sets a = x, the first token).
  // similarity F32 with G elements. Sequential F32 sums per head (cosine_similarity in
  // policy_op_math.h): the same bits on every backend.
  virtual void anchor_cosine_update(const DeviceTensor& cache, int64_t column, float decay,
                                    DeviceTensor& anchor, DeviceTensor& similarity) = 0;
  // Token filtering's decision for one layer and step, on the backend (tokenfilter_policy.cpp has
  // the rule). state, U8 [8 * kTokenFilterState] holding doubles (token_filter_step in
  // policy_op_math.h: the running variances of the per-head similarities, tau, the layer's steps
  // and skips), is updated; similarity F32 [2 * G] (the key then the value similarities), or null
  // at the layer's first step (no decision: not skipped); scores[r, column] = float(S_kv) for every
  // row r of the F32 [R, stride] scores (not written at the first step); keep U8 [1, 1] = 0 when
  // the token skips the layer, else 1. The same double arithmetic on every backend (no fused
  // multiply-adds): the same bits.
  virtual void token_filter_step(const DeviceTensor* similarity, double eta, double target,
                                 int64_t column, DeviceTensor& state, DeviceTensor& scores,
                                 DeviceTensor& keep) = 0;
};

// `backend`'s TokenFilterOps (backend.extension<TokenFilterOps>() once the CPU implementation is
// registered, which the first call does). Throws kvlens::Error naming the extension and the
// backend when the backend has none.
TokenFilterOps& tokenfilter_ops(Backend& backend);

}  // namespace kvlens
