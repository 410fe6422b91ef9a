// The arithmetic of RocketKV's stage-2 page estimate (rocketkv_ops.h) with every rounding
// spelled out, shared by the CPU and CUDA implementations so both give the same bits. Channel
// choice and scale are SparQ's (approx_logit_math.h); what RocketKV adds is the bound it reads:
// per chosen channel the page's key minimum or maximum, by the sign of the group's summed query.
#pragma once

#include <cstdint>

#include "engine/policy/approx_logit_math.h"

namespace kvlens {

// Whether channel c of one KV group reads the page maximum (true) or minimum (false): the sum
// over the group's `group` query heads (rows of q_group, [group, D]) of q_c, in head order from
// +0, is > 0. A zero or NaN sum reads the minimum, as the authors' `where(sum > 0, max, min)`.
KVLENS_HOST_DEVICE inline bool rocket_reads_max(const float* q_group, int64_t group, int64_t D,
                                                int64_t c) {
  float sum = 0.0f;
  for (int64_t h = 0; h < group; ++h) sum = add_rn(sum, q_group[h * D + c]);
  return sum > 0.0f;
}

// The estimate of one page for one query head q[D]: sum_i q[channels[i]] * bound_i (products
// rounded, added in channel order from +0) times scale, where bound_i is page_max[channels[i]]
// when reads_max[i] and page_min[channels[i]] otherwise.
KVLENS_HOST_DEVICE inline float rocket_page_logit(const float* q, const float* page_min,
                                                  const float* page_max, const int32_t* channels,
                                                  const bool* reads_max, int64_t rank,
                                                  float scale) {
  float sum = 0.0f;
  for (int64_t i = 0; i < rank; ++i) {
    const int32_t c = channels[i];
    sum = add_rn(sum, mul_rn(q[c], reads_max[i] ? page_max[c] : page_min[c]));
  }
  return mul_rn(sum, scale);
}

}  // namespace kvlens
