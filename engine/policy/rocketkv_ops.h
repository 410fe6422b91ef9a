// RocketKV's op extension (op_extension.h), beside rocketkv_policy.cpp: stage 2's approximate
// logits of every cached token from its page's key minima and maxima on the query's top-r
// channels. Page summaries themselves are Quest's (quest_ops.h page_minmax_update). The
// arithmetic is rocketkv_math.h's on both backends (CPU: rocketkv_ops_cpu.cpp, CUDA:
// kernels/policy/rocketkv_*): the same bits, so the same visible sets.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/backend/backend.h"

namespace kvlens {

class RocketkvOps : public OpExtension {
 public:
  static constexpr std::string_view kExtensionName = "rocketkv";

  // For every KV group g of q [1, H, D] (G = page_min's first dimension, H/G query heads each):
  // I_g = SparQ's `rank` channels of the group (sparq_magnitude, sparq_pick: largest summed
  // |q_c|), each reading the page maximum where the group's summed q_c > 0 and the minimum
  // otherwise (rocket_reads_max); for each head h of the group and j < cols, with
  // p = j / page_size: out[h, j] = rocket_page_logit(q_h, page_min[g, p], page_max[g, p], I_g,
  // sparq_scale(q_h, I_g)), SparQ's temperature, so the estimate is on the true logits' scale.
  // page_min, page_max F32 [G, P, D] with P * page_size >= cols; 1 <= rank <= D <=
  // kApproxMaxHeadDim; out F32 [H, stride].
  virtual void page_logits(const DeviceTensor& q, const DeviceTensor& page_min,
                           const DeviceTensor& page_max, int64_t cols, int64_t page_size,
                           int64_t rank, DeviceTensor& out) = 0;
};

// `backend`'s RocketkvOps (the CPU implementation registered by the first call). Throws
// kvlens::Error naming the extension and the backend when the backend has none.
RocketkvOps& rocketkv_ops(Backend& backend);

}  // namespace kvlens
