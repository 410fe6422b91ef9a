// Twilight's op extension (op_extension.h): top-p pruning of a selection by estimated logits,
// beside twilight_policy.cpp. scores F32 [H, stride], visible U8 [H, stride], first `cols`
// columns in use. The arithmetic is top_p_math.h's on both backends (CPU: top_p_ops_cpu.cpp,
// CUDA: kernels/policy/top_p_*), so both keep the same columns.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/backend/backend.h"

namespace kvlens {

class TopPOps : public OpExtension {
 public:
  static constexpr std::string_view kExtensionName = "top_p";

  // For every row h: w_j = exp(scores[h, j] - max) over the visible columns j < cols (the
  // softmax of the estimates restricted to the base's candidates, unnormalised); the visible
  // columns ranked by score (ties to the higher column) are taken until their weights reach
  // top_p times the row's total; every other visible column is hidden, except the forced ones
  // ([0, sink_end) and [recent_begin, cols)), which stay visible. Hidden columns stay hidden.
  // 0 < top_p <= 1; 0 <= sink_end <= recent_begin <= cols.
  virtual void top_p_prune(const DeviceTensor& scores, int64_t cols, float top_p, int64_t sink_end,
                           int64_t recent_begin, DeviceTensor& visible) = 0;
};

// `backend`'s TopPOps (the CPU implementation registered by the first call). Throws
// kvlens::Error naming the extension and the backend when the backend has none.
TopPOps& top_p_ops(Backend& backend);

}  // namespace kvlens
