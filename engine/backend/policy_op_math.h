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
// lo[n] and maximum hi[n] (page_bounds in engine/policy/quest_ops.h): the largest q . k any key
// inside the box can reach, sum_c max(q_c lo_c, q_c hi_c), or the TokenButler code's sum_c |q_c|
// hi_c when max_only; summed in channel order, then scaled to the logit scale.
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

// The same for doubles (token_filter_step).
KVLENS_HOST_DEVICE inline double dmul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
KVLENS_HOST_DEVICE inline double dadd_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
KVLENS_HOST_DEVICE inline double dsub_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
KVLENS_HOST_DEVICE inline double ddiv_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// Token filtering's per-layer state (TokenFilterOps::token_filter_step), doubles: Welford's count,
// mean and M2 of the key similarities, the same for the values, the threshold tau, and the layer's
// steps and skips so far.
enum TokenFilterSlot {
  kTfKeyCount,
  kTfKeyMean,
  kTfKeyM2,
  kTfValueCount,
  kTfValueMean,
  kTfValueM2,
  kTfTau,
  kTfSteps,
  kTfSkips,
  kTokenFilterState
};

// Welford's update of (count, mean, m2) at state[at..at + 2] with x.
KVLENS_HOST_DEVICE inline void welford_add(double* state, int at, double x) {
  const double count = dadd_rn(state[at], 1.0);
  const double delta = dsub_rn(x, state[at + 1]);
  const double mean = dadd_rn(state[at + 1], ddiv_rn(delta, count));
  state[at] = count;
  state[at + 1] = mean;
  state[at + 2] = dadd_rn(state[at + 2], dmul_rn(delta, dsub_rn(x, mean)));
}

// One step of one layer (tokenfilter_policy.cpp's rule): similarity [2 * G] (keys, then values)
// or null at the layer's first step. Returns whether the token skips the layer; *s_kv receives
// S_kv (untouched at the first step).
KVLENS_HOST_DEVICE inline bool token_filter_step(const float* similarity, int64_t kv_heads,
                                                 double eta, double target, double* state,
                                                 double* s_kv) {
  bool skip = false;
  if (similarity != nullptr) {
    double s_k = 0.0, s_v = 0.0;
    for (int64_t g = 0; g < kv_heads; ++g) {
      s_k = dadd_rn(s_k, double(similarity[g]));
      s_v = dadd_rn(s_v, double(similarity[kv_heads + g]));
      welford_add(state, kTfKeyCount, double(similarity[g]));
      welford_add(state, kTfValueCount, double(similarity[kv_heads + g]));
    }
    s_k = ddiv_rn(s_k, double(kv_heads));
    s_v = ddiv_rn(s_v, double(kv_heads));
    // Population variances (n - 1 would scale both alike and cancel in alpha).
    const double var_k =
        state[kTfKeyCount] > 0.0 ? ddiv_rn(state[kTfKeyM2], state[kTfKeyCount]) : 0.0;
    const double var_v =
        state[kTfValueCount] > 0.0 ? ddiv_rn(state[kTfValueM2], state[kTfValueCount]) : 0.0;
    const double alpha =
        var_k > 0.0 && var_v > 0.0
            ? ddiv_rn(ddiv_rn(1.0, var_v), dadd_rn(ddiv_rn(1.0, var_k), ddiv_rn(1.0, var_v)))
            : 0.5;
    *s_kv = dadd_rn(dmul_rn(alpha, s_k), dmul_rn(dsub_rn(1.0, alpha), s_v));
    skip = target > 0.0 && *s_kv > state[kTfTau];
  }
  state[kTfSteps] = dadd_rn(state[kTfSteps], 1.0);
  if (skip) state[kTfSkips] = dadd_rn(state[kTfSkips], 1.0);
  const double ratio = ddiv_rn(state[kTfSkips], state[kTfSteps]);
  state[kTfTau] = dadd_rn(state[kTfTau], dmul_rn(eta, dsub_rn(ratio, target)));
  return skip;
}

// cos(x, y) over n values with the conventions of key_anchor_scores: norms clamped to 1e-12, so
// a zero vector gives 0. Three sequential F32 sums (anchor_cosine_update in
// engine/policy/tokenfilter_ops.h).
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
