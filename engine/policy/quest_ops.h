// Quest's op extension (op_extension.h): its page summaries and page bounds beside the policy
// (quest_policy.cpp). The page selection itself, select_pages, is a core op (the shared
// BudgetedPolicy calls it). The CPU implementation is quest_ops_cpu.cpp, the CUDA one
// kernels/policy/.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/backend/backend.h"

namespace kvlens {

class QuestOps : public OpExtension {
 public:
  static constexpr std::string_view kExtensionName = "quest";

  // Quest's page summaries. Page p holds columns [p * page_size, (p + 1) * page_size). For every
  // page p that intersects [begin, end): page_min[g, p, :] and page_max[g, p, :] = the
  // channel-wise min and max of k_cache[g, j, :] over j in [p * page_size, min((p + 1) *
  // page_size, end)), recomputed from the page's first column, so calling with begin = the
  // previous end keeps a growing last page (and a prefill written meanwhile) up to date. Other
  // pages are untouched. page_min, page_max F32 [G, P, D] with P >= ceil(end / page_size). Plain
  // comparisons in column order (x < m, m < x): exact, the same bits on every backend.
  virtual void page_minmax_update(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                                  int64_t page_size, DeviceTensor& page_min,
                                  DeviceTensor& page_max) = 0;
  // Quest's page upper bound of each query head, on the logit scale, written to every column of
  // the page: out[h, j] = U(h, j / page_size) for j < cols, where with q = q[0, h, :] and the page
  // summaries of KV head g = h / (H/G): U = (sum_c max(q_c * min_c, q_c * max_c)) * s, or with
  // max_only U = (sum_c |q_c| * max_c) * s (the TokenButler code's bound), s = the attention
  // op's F32 scale 1/sqrt(D). Every product rounded, the max taken, then added in channel order
  // (page_bound in policy_op_math.h): the same bits on every backend. q [1, H, D]; page_min and
  // page_max [G, P, D] with P * page_size >= cols; out F32 [H, stride].
  virtual void page_bounds(const DeviceTensor& q, const DeviceTensor& page_min,
                           const DeviceTensor& page_max, int64_t cols, int64_t page_size,
                           bool max_only, DeviceTensor& out) = 0;
};

// `backend`'s QuestOps (backend.extension<QuestOps>() once the CPU implementation is registered,
// which the first call does). Throws kvlens::Error naming the extension and the backend when the
// backend has none.
QuestOps& quest_ops(Backend& backend);

}  // namespace kvlens
