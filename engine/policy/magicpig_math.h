// The arithmetic of magicpig's LSH sampling (magicpig_ops.h) with every rounding spelled out,
// shared by the CPU and CUDA implementations so both sample the same keys and give the same
// weights bit for bit. Vectors are F32 [D]; hyperplanes F32 [tables * bits, D] (plane t * bits + b
// is bit b of table t); a code is the integer sum of bit b << b, below 2^bits <= 2^20, so it is
// held exactly in F32.
#pragma once

#include <cstdint>

#include "engine/backend/policy_op_math.h"

namespace kvlens {

// Keys whose inclusion probability falls below this get the weight 1 / kMagicpigMinProb: the
// authors add 1e-4 to p for the same reason (sparse_attention.cc transform_kernel), so a key
// nearly opposite the query, whose p underflows, cannot take over the softmax.
constexpr float kMagicpigMinProb = 1e-4f;
// A key is sampled when its bucket equals the query's in at least this many tables (lsh.cc
// LSH::retrieve marks an index on its second hit).
constexpr int kMagicpigCollisions = 2;

// x . y over D channels, ascending, one rounding per product and per sum; y widened to F32 by
// `widen` (a KV cache may be BF16 or F16 on the GPU).
template <typename T, typename Widen>
KVLENS_HOST_DEVICE inline float dot_fixed(const float* x, const T* y, int64_t d, Widen widen) {
  float sum = 0.0f;
  for (int64_t i = 0; i < d; ++i) sum = add_rn(sum, mul_rn(x[i], widen(y[i])));
  return sum;
}

// Table t's code of x: bit b set where x . plane(t * bits + b) > 0 (SimHash, sign of a random
// projection; a zero projection counts as 0 as the authors' `> 0` does).
template <typename T, typename Widen>
KVLENS_HOST_DEVICE inline float simhash_code(const T* x, const float* planes, int64_t d,
                                             int64_t table, int64_t bits, Widen widen) {
  uint32_t code = 0;
  for (int64_t b = 0; b < bits; ++b) {
    const float* plane = planes + (table * bits + b) * d;
    float sum = 0.0f;
    for (int64_t i = 0; i < d; ++i) sum = add_rn(sum, mul_rn(plane[i], widen(x[i])));
    if (sum > 0.0f) code |= 1u << uint32_t(b);
  }
  return float(code);
}

// The tables (of `tables`) in which two codes rows agree.
KVLENS_HOST_DEVICE inline int64_t code_collisions(const float* a, const float* b, int64_t tables) {
  int64_t same = 0;
  for (int64_t t = 0; t < tables; ++t) same += a[t] == b[t];
  return same;
}

// acos(x) for x in [-1, 1]: Abramowitz & Stegun 4.4.46 (sqrt(1 - |x|) times a degree-7
// polynomial, absolute error <= 2e-8 in exact arithmetic), reflected for x < 0. Library acos
// differs between glibc and CUDA, so neither is used.
KVLENS_HOST_DEVICE inline float acos_fixed(float x) {
  const float a = abs_f32(x) < 1.0f ? abs_f32(x) : 1.0f;
  float poly = -0.0012624911f;
  poly = add_rn(mul_rn(poly, a), 0.0066700901f);
  poly = add_rn(mul_rn(poly, a), -0.0170881256f);
  poly = add_rn(mul_rn(poly, a), 0.0308918810f);
  poly = add_rn(mul_rn(poly, a), -0.0501743046f);
  poly = add_rn(mul_rn(poly, a), 0.0889789874f);
  poly = add_rn(mul_rn(poly, a), -0.2145988016f);
  poly = add_rn(mul_rn(poly, a), 1.5707963050f);
  const float r = mul_rn(sqrt_rn(add_rn(1.0f, -a)), poly);
  return x < 0.0f ? add_rn(3.14159265358979f, -r) : r;
}

// The bits of a float and back, on either side of the device boundary.
KVLENS_HOST_DEVICE inline uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}

KVLENS_HOST_DEVICE inline float bits_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

// ln(x) for x > 0 (normal floats): x = m 2^e with m in [sqrt(1/2), sqrt(2)), then
// ln m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.172, by its series to s^11 (truncation
// below 1e-9 relative), plus e ln 2 with ln 2 split so e * hi is exact.
KVLENS_HOST_DEVICE inline float log_fixed(float x) {
  uint32_t bits = float_bits(x);
  int32_t e = int32_t((bits >> 23) & 0xffu) - 127;
  bits = (bits & 0x007fffffu) | 0x3f800000u;  // m in [1, 2)
  float m = bits_float(bits);
  if (m > 1.41421356f) {
    m = mul_rn(m, 0.5f);
    ++e;
  }
  const float s = div_rn(add_rn(m, -1.0f), add_rn(m, 1.0f));
  const float s2 = mul_rn(s, s);
  float poly = 1.0f / 11.0f;
  poly = add_rn(mul_rn(poly, s2), 1.0f / 9.0f);
  poly = add_rn(mul_rn(poly, s2), 1.0f / 7.0f);
  poly = add_rn(mul_rn(poly, s2), 1.0f / 5.0f);
  poly = add_rn(mul_rn(poly, s2), 1.0f / 3.0f);
  poly = add_rn(mul_rn(poly, s2), 1.0f);
  const float ln_m = mul_rn(mul_rn(2.0f, s), poly);
  constexpr float kLn2Hi = 0.693145751953125f;  // 16 significant bits: e * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860676533018725e-06f;
  const float fe = float(e);
  return add_rn(add_rn(mul_rn(fe, kLn2Hi), ln_m), mul_rn(fe, kLn2Lo));
}

// x^n for an integer n >= 0 by n - 1 multiplications in order (exact order, no pow()).
KVLENS_HOST_DEVICE inline float power_fixed(float x, int64_t n) {
  float result = 1.0f;
  for (int64_t i = 0; i < n; ++i) result = mul_rn(result, x);
  return result;
}

// The probability that a key at collision probability u per bit (u = 1 - theta / pi) shares its
// query's bucket in at least 2 of L tables of K bits: with v = u^K (one table),
// p = 1 - (1 - v)^L - L v (1 - v)^(L - 1) = 1 - (1 - v)^(L - 1) (1 + (L - 1) v). Where that
// subtraction would cancel (the two terms above 1/2), p is summed as the binomial tail
// sum_{m >= 2} C(L, m) v^m (1 - v)^(L - m) instead, each term from the one before.
KVLENS_HOST_DEVICE inline float magicpig_probability(float u, int64_t bits, int64_t tables) {
  const float v = power_fixed(u, bits);
  const float w = add_rn(1.0f, -v);
  const float at_most_one =
      mul_rn(power_fixed(w, tables - 1), add_rn(1.0f, mul_rn(float(tables - 1), v)));
  if (at_most_one < 0.5f || w == 0.0f) return add_rn(1.0f, -at_most_one);
  // term(m) = C(L, m) v^m w^(L - m); term(2) from term(0) = w^L.
  const float ratio = div_rn(v, w);
  float term = power_fixed(w, tables);
  term = mul_rn(mul_rn(term, float(tables)), ratio);                    // m = 1
  term = mul_rn(mul_rn(term, div_rn(float(tables - 1), 2.0f)), ratio);  // m = 2
  float sum = 0.0f;
  for (int64_t m = 2; m <= tables && term > 0.0f; ++m) {
    sum = add_rn(sum, term);
    if (term < mul_rn(sum, 1e-9f)) break;  // the rest is below F32's resolution of the sum
    term = mul_rn(mul_rn(term, div_rn(float(tables - m), float(m + 1))), ratio);
  }
  return sum;
}

// u for a query and a key from their dot product and squared lengths: cos clamped to [-1, 1]
// (0 for a zero vector: an orthogonal key), then 1 - acos(cos) / pi.
KVLENS_HOST_DEVICE inline float magicpig_u(float dot, float q_squared, float k_squared) {
  const float norms = mul_rn(sqrt_rn(q_squared), sqrt_rn(k_squared));
  float c = norms > 0.0f ? div_rn(dot, norms) : 0.0f;
  if (!(c <= 1.0f)) c = c != c ? 0.0f : 1.0f;
  if (c < -1.0f) c = -1.0f;
  return add_rn(1.0f, -div_rn(acos_fixed(c), 3.14159265358979f));
}

// The additive log-weight of a sampled key: ln(1 / max(p, kMagicpigMinProb)) = -ln(max(...)),
// exactly 0 where p == 1.
KVLENS_HOST_DEVICE inline float magicpig_log_weight(float p) {
  const float floored = p > kMagicpigMinProb ? p : kMagicpigMinProb;
  return floored >= 1.0f ? 0.0f : -log_fixed(floored);
}

}  // namespace kvlens
