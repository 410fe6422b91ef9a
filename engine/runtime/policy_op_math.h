// Bit-exact helpers shared by the CPU and CUDA token-selection ops of backend.h: the counter-based
// random values of random_rows, the total order select_top_k and select_pages rank by, and the
// float arithmetic of page_bounds and anchor_cosine_update with every rounding spelled out. Plain
// C++ that nvcc also compiles for the device (KVLENS_HOST_DEVICE), so both backends run literally
// the same arithmetic and agree bit for bit.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVLENS_HOST_DEVICE __host__ __device__
#else
#define KVLENS_HOST_DEVICE
#endif

namespace kvlens {

// splitmix64's finaliser (Steele, Lea & Flood 2014; Java's SplittableRandom): the golden-ratio
// increment, then two xor-shift-multiply rounds and a final xor-shift. A bijection of uint64.
KVLENS_HOST_DEVICE constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// random_rows' value at (seed, stream, row, col): the four keys folded in one after another
// (h = splitmix64(h ^ key), starting from splitmix64(seed)), then the top 24 bits of the hash
// scaled by 2^-24, which is exact in F32: a uniform value on the 2^24-point grid of [0, 1).
// The hash of (seed, stream, row), shared by a row's columns.
KVLENS_HOST_DEVICE constexpr uint64_t random_row_hash(uint64_t seed, uint64_t stream,
                                                      uint64_t row) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ row);
}
KVLENS_HOST_DEVICE constexpr float random_unit_in_row(uint64_t row_hash, uint64_t col) {
  return float(uint32_t(splitmix64(row_hash ^ col) >> 40)) * (1.0f / 16777216.0f);
}
KVLENS_HOST_DEVICE constexpr float random_unit(uint64_t seed, uint64_t stream, uint64_t row,
                                               uint64_t col) {
  return random_unit_in_row(random_row_hash(seed, stream, row), col);
}

// select_top_k's ranking as one unsigned key, higher ranks first. The high 32 bits map the score
// to an order-preserving pattern (negative floats bit-inverted, positive ones with the sign bit
// set; -0 counts as +0 and every NaN maps to 0, below -inf); the low 32 bits hold the column, so
// equal scores go to the higher column. Keys of distinct columns differ: a strict total order.
KVLENS_HOST_DEVICE inline uint64_t top_k_key(float score, uint32_t col) {
  uint32_t ordered = 0;  // NaN
  if (score == score) {
    if (score == 0.0f) score = 0.0f;  // -0 -> +0
#if defined(__CUDA_ARCH__)
    const uint32_t bits = __float_as_uint(score);
#else
    uint32_t bits;
    std::memcpy(&bits, &score, sizeof bits);
#endif
    ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (uint64_t(ordered) << 32) | col;
}

}  // namespace kvlens

namespace kvlens {

// Single IEEE operations rounded once each. nvcc contracts a * b + c into an fma by default and
// GCC does not in ISO C++ mode (-ffp-contract=off), so the device side spells the rounding out
// with intrinsics and both backends run literally the same sequence of roundings.
KVLENS_HOST_DEVICE inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVLENS_HOST_DEVICE inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KVLENS_HOST_DEVICE inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
KVLENS_HOST_DEVICE inline float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
KVLENS_HOST_DEVICE inline float abs_f32(float a) {
#if defined(__CUDA_ARCH__)
  return fabsf(a);
#else
  return std::fabs(a);
#endif
}

// The nonzero bytes of bytes[0, n) (count_nonzero_rows' count of a mask row; no branch).
KVLENS_HOST_DEVICE inline int64_t count_nonzero(const uint8_t* bytes, int64_t n) {
  int64_t count = 0;
  for (int64_t j = 0; j < n; ++j) count += bytes[j] != 0;
  return count;
}

// fmax without the library call: NaN only when both are NaN (the sign of a zero maximum may
// differ from fmaxf's).
KVLENS_HOST_DEVICE inline float fmax_inline(float best, float value) {
  return (value > best || best != best) ? value : best;
}

// Quest's page upper bound for one query row q[n] against a page's channel-wise key minimum
// lo[n] and maximum hi[n] (page_bounds in backend.h): the largest q . k any key inside the box
// can reach, sum_c max(q_c lo_c, q_c hi_c), or the TokenButler code's sum_c |q_c| hi_c when
// max_only; summed in channel order, then scaled to the logit scale.
KVLENS_HOST_DEVICE inline float page_bound(const float* q, const float* lo, const float* hi,
                                           int64_t n, bool max_only, float scale) {
  float sum = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    float term;
    if (max_only) {
      term = mul_rn(abs_f32(q[c]), hi[c]);
    } else {
      const float low = mul_rn(q[c], lo[c]), high = mul_rn(q[c], hi[c]);
      term = low < high ? high : low;
    }
    sum = add_rn(sum, term);
  }
  return mul_rn(sum, scale);
}

// cos(x, y) over n values with the conventions of key_anchor_scores: norms clamped to 1e-12, so
// a zero vector gives 0. Three sequential F32 sums (anchor_cosine_update in backend.h).
KVLENS_HOST_DEVICE inline float cosine_similarity(const float* x, const float* y, int64_t n) {
  float dot = 0.0f, xx = 0.0f, yy = 0.0f;
  for (int64_t c = 0; c < n; ++c) {
    dot = add_rn(dot, mul_rn(x[c], y[c]));
    xx = add_rn(xx, mul_rn(x[c], x[c]));
    yy = add_rn(yy, mul_rn(y[c], y[c]));
  }
  constexpr float kTiny = 1e-12f;
  float nx = sqrt_rn(xx), ny = sqrt_rn(yy);
  nx = nx < kTiny ? kTiny : nx;
  ny = ny < kTiny ? kTiny : ny;
  return div_rn(dot, mul_rn(nx, ny));
}

}  // namespace kvlens
