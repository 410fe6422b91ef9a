// Twilight's top-p pruning (top_p_ops.h) on the CPU backend: top_p_math.h's arithmetic, rows
// spread over the backend's thread pool. scores F32 [H, stride], visible U8 [H, stride].
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/cpu/cpu_policy_ops.h"
#include "engine/policy/top_p_math.h"
#include "engine/policy/top_p_ops.h"

namespace kvlens {

namespace {

using namespace cpu_checks;  // require*, describe, cat, row_shape
using cpu_policy::Context;

void run_top_p_prune(const Context& context, const DeviceTensor& scores, int64_t cols, float top_p,
                     int64_t sink_end, int64_t recent_begin, DeviceTensor& visible) {
  const OpName op{"top_p_prune"};
  require_cols(cols, op);
  KVLENS_REQUIRE(top_p > 0.0f && top_p <= 1.0f, op + ": top_p", "a share in (0, 1]",
                 std::to_string(top_p));
  KVLENS_REQUIRE(0 <= sink_end && sink_end <= recent_begin && recent_begin <= cols,
                 op + ": forced columns", cat("0 <= sink_end <= recent_begin <= ", cols),
                 cat(sink_end, ", ", recent_begin));
  const RowShape mask = row_shape(visible, DType::U8, -1, cols, op + ": visible");
  const RowShape rows = row_shape(scores, DType::F32, mask.rows, cols, op + ": scores");
  context.pool.parallel_for(0, mask.rows, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> keys;
    for (int64_t h = begin; h < end; ++h) {
      const float* s = scores.as<const float>() + h * rows.stride;
      uint8_t* v = visible.as<uint8_t>() + h * mask.stride;
      const float best = visible_max(s, v, cols);
      const float total = visible_mass(s, v, cols, best);
      // The candidates' keys sorted once (O(t log t)) and walked in rank order: the same picks,
      // in the same order, as the scan the GPU repeats per pick, so the same sums and columns.
      keys.clear();
      for (int64_t j = 0; j < cols; ++j)
        if (v[j] != 0) keys.push_back(top_k_key(s[j], uint32_t(j)));
      std::sort(keys.begin(), keys.end(), std::greater<uint64_t>());
      size_t next = 0;
      const uint64_t last = top_p_last_key(s, best, total, top_p, [&](uint64_t /*bound*/) {
        return next < keys.size() ? keys[next++] : uint64_t(0);
      });
      for (int64_t j = 0; j < cols; ++j)
        if (v[j] != 0 && !top_p_keeps(s, j, last, sink_end, recent_begin)) v[j] = 0;
    }
  });
}

class CpuTopPOps final : public TopPOps {
 public:
  explicit CpuTopPOps(Backend& backend) : context_(cpu_policy::context_of(backend)) {}
  void top_p_prune(const DeviceTensor& scores, int64_t cols, float top_p, int64_t sink_end,
                   int64_t recent_begin, DeviceTensor& visible) override {
    run_top_p_prune(context_, scores, cols, top_p, sink_end, recent_begin, visible);
  }

 private:
  Context context_;
};

}  // namespace

TopPOps& top_p_ops(Backend& backend) {
  return extension_with_cpu<TopPOps, CpuTopPOps>(backend);
}

}  // namespace kvlens
