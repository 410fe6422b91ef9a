// The arithmetic of twilight's top-p pruning (top_p_ops.h) with every rounding spelled out,
// shared by the CPU and CUDA implementations so both keep the same columns. One row at a time:
// scores [cols] F32 (estimated logits), visible [cols] U8 (the base selector's candidates).
#pragma once

#include <cstdint>

#include "engine/backend/policy_op_math.h"

namespace kvlens {

KVLENS_HOST_DEVICE inline float floor_f32(float a) {
#if defined(__CUDA_ARCH__)
  return floorf(a);
#else
  return std::floor(a);
#endif
}

// exp(x) for x <= 0 from single roundings only (library exps differ between glibc and CUDA, so
// neither is used): x = n ln2 + r with n = floor(x log2 e + 1/2) and ln2 split in a part whose
// products with n are exact and a remainder, then a degree-6 Taylor polynomial of e^r (|r| <=
// ln2 / 2, relative error ~2e-7) in Horner form, then times 2^n built from its exponent bits.
// x below -87 (where 2^n leaves the normal floats), -inf and NaN give 0.
KVLENS_HOST_DEVICE inline float exp_nonpositive(float x) {
  if (!(x > -87.0f)) return 0.0f;
  if (x > 0.0f) x = 0.0f;
  const float n = floor_f32(add_rn(mul_rn(x, 1.44269504088896341f), 0.5f));
  constexpr float kLn2Hi = 0.693145751953125f;  // 16 significant bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860676533018725e-06f;
  const float r = add_rn(add_rn(x, -mul_rn(n, kLn2Hi)), -mul_rn(n, kLn2Lo));
  float poly = 1.0f / 720.0f;
  poly = add_rn(mul_rn(poly, r), 1.0f / 120.0f);
  poly = add_rn(mul_rn(poly, r), 1.0f / 24.0f);
  poly = add_rn(mul_rn(poly, r), 1.0f / 6.0f);
  poly = add_rn(mul_rn(poly, r), 0.5f);
  poly = add_rn(mul_rn(poly, r), 1.0f);
  poly = add_rn(mul_rn(poly, r), 1.0f);
  const uint32_t bits = uint32_t(int32_t(n) + 127) << 23;  // n in [-126, 0]
#if defined(__CUDA_ARCH__)
  const float scale = __uint_as_float(bits);
#else
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
#endif
  return mul_rn(poly, scale);
}

// The largest score among the visible columns (-inf where none is visible or all are NaN).
KVLENS_HOST_DEVICE inline float visible_max(const float* scores, const uint8_t* visible,
                                            int64_t cols) {
  float best = -INFINITY;
  for (int64_t j = 0; j < cols; ++j)
    if (visible[j] != 0) best = fmax_inline(best, scores[j]);
  return best;
}

// The softmax denominator over the visible columns: sum of exp(score - best), column order.
KVLENS_HOST_DEVICE inline float visible_mass(const float* scores, const uint8_t* visible,
                                             int64_t cols, float best) {
  float total = 0.0f;
  for (int64_t j = 0; j < cols; ++j)
    if (visible[j] != 0) total = add_rn(total, exp_nonpositive(add_rn(scores[j], -best)));
  return total;
}

// The top-p prefix's last key: visible columns are taken in top_k_key order (highest estimate
// first, ties to the higher column), their weights exp(score - best) added in that order, until
// the sum reaches top_p * total (or the columns run out). Returns the key of the last column
// taken (0 where none is visible): the prefix is exactly the visible columns whose key is >= it.
// `next_below(bound)` returns the largest key of a visible column below `bound` (0: none); the
// CPU scans the row, the GPU reduces over a block, both exactly (keys are a strict order).
template <typename NextBelow>
KVLENS_HOST_DEVICE inline uint64_t top_p_last_key(const float* scores, float best, float total,
                                                  float top_p, NextBelow next_below) {
  const float target = mul_rn(top_p, total);
  float taken = 0.0f;
  uint64_t bound = ~uint64_t(0), last = 0;
  for (;;) {
    const uint64_t key = next_below(bound);
    if (key == 0) break;
    last = bound = key;
    const uint32_t col = uint32_t(key & 0xffffffffu);
    taken = add_rn(taken, exp_nonpositive(add_rn(scores[col], -best)));
    if (taken >= target) break;
  }
  return last;
}

// Whether visible column j stays: inside the prefix (key >= last) or forced ([0, sink_end) and
// [recent_begin, cols)).
KVLENS_HOST_DEVICE inline bool top_p_keeps(const float* scores, int64_t j, uint64_t last,
                                           int64_t sink_end, int64_t recent_begin) {
  if (j < sink_end || j >= recent_begin) return true;
  return top_k_key(scores[j], uint32_t(j)) >= last;
}

}  // namespace kvlens
