// The top-k row kernel in AVX-512 (cpu_top_k.h's contract; the set the other kernels choose).
// It ranks the row 16 lanes at a time (top_k_key's order of the scores as 32-bit ranks, 0 for
// the columns that are not candidates) and packs the candidates' ranks; a quickselect over the
// packed ranks finds t, the k-th largest rank; then every rank above t is in, and of the ranks
// equal to t the highest columns (top_k_key's tie-break) fill the rest. Each quickselect pass
// splits the ranks left with vpcompressd around a pivot taken from a sorted sample at the k-th's
// expected place, so a row of a few hundred columns takes two or three short passes instead of
// the radix kernel's histograms and 64-bit keys; the last few ranks, and the pivots in their
// samples, are selected by counting rather than sorting (no mispredicted comparisons).
#include <algorithm>
#include <bit>
#include <functional>
#include <vector>

#include "engine/backend/cpu/cpu_top_k.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>

namespace kvlens {
namespace {

#define KVLENS_TOP_K_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,popcnt")))

// The zero-masking forms with every lane set are the plain instructions; GCC 12's unmasked
// intrinsics warn of an uninitialized pass-through operand (its bug 105593).
constexpr __mmask16 kAllLanes = 0xFFFF;

// A pass that keeps all but the pivot's equals is possible with unlucky samples; after
// kMaxPasses the rest goes to nth_element, so no row costs more than a few passes.
constexpr int kMaxPasses = 8;
// Ranks this few (two registers) are selected by counting, without a branch on their values.
constexpr int64_t kFewRanks = 32;
constexpr int64_t kSamples = 16;
// Every buffer has room for a full 16-lane store past its last element.
constexpr int64_t kSlack = 16;

struct Scratch {
  std::vector<uint32_t> rank, packed, above, below;
};

// One per thread: the rows of a call run on the backend's threads.
Scratch& thread_scratch(int64_t cols) {
  thread_local Scratch scratch;
  const size_t size = size_t(cols + kSlack);
  for (auto* buffer : {&scratch.rank, &scratch.packed, &scratch.above, &scratch.below})
    if (buffer->size() < size) buffer->resize(size);
  return scratch;
}

KVLENS_TOP_K_AVX512 inline __mmask16 first_lanes(int64_t count) {
  return count >= 16 ? kAllLanes : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1u);
}

// The k-th largest (1 <= k <= n) of n <= kFewRanks values counted with their repeats: the value
// with fewer than k values above it and at least k at or above it, found by counting for every
// value how many are above and at or above it (the data decides no branch: sorting a few values
// mispredicts about every other comparison).
KVLENS_TOP_K_AVX512 uint32_t few_kth_largest(const uint32_t* values, int64_t n, int64_t k) {
  const __mmask16 low_lanes = first_lanes(n), high_lanes = first_lanes(n - 16);
  const __m512i low = _mm512_maskz_loadu_epi32(low_lanes, values);
  const __m512i high = _mm512_maskz_loadu_epi32(high_lanes, values + 16);
  uint32_t kth = values[0];
  for (int64_t i = 0; i < n; ++i) {
    const __m512i v = _mm512_set1_epi32(int32_t(values[i]));
    const int64_t above =
        std::popcount(unsigned(_mm512_mask_cmpgt_epu32_mask(low_lanes, low, v))) +
        std::popcount(unsigned(_mm512_mask_cmpgt_epu32_mask(high_lanes, high, v)));
    const int64_t at_or_above =
        std::popcount(unsigned(_mm512_mask_cmpge_epu32_mask(low_lanes, low, v))) +
        std::popcount(unsigned(_mm512_mask_cmpge_epu32_mask(high_lanes, high, v)));
    kth = above < k && k <= at_or_above ? values[i] : kth;
  }
  return kth;
}

// The k-th largest (1 <= k <= n) of the n values counted with their repeats: the t with fewer
// than k values above it and at least k at or above it. values, above and below are buffers of
// at least n + kSlack; their contents are consumed. Each pass splits the values around a pivot:
// the sample of kSamples evenly spaced values at the place the k-th would take in it.
KVLENS_TOP_K_AVX512 uint32_t kth_largest(uint32_t* values, int64_t n, int64_t k, uint32_t* above,
                                         uint32_t* below) {
  for (int pass = 0;; ++pass) {
    if (n <= kFewRanks) return few_kth_largest(values, n, k);
    if (pass == kMaxPasses) {
      std::nth_element(values, values + (k - 1), values + n, std::greater<>());
      return values[k - 1];
    }
    uint32_t sample[kSamples];
    for (int64_t s = 0; s < kSamples; ++s) sample[s] = values[(2 * s + 1) * n / (2 * kSamples)];
    const int64_t place = std::clamp<int64_t>((2 * k - 1) * kSamples / (2 * n), 0, kSamples - 1);
    const uint32_t pivot_value = few_kth_largest(sample, kSamples, place + 1);
    const __m512i pivot = _mm512_set1_epi32(int32_t(pivot_value));
    int64_t count_above = 0, count_below = 0;
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 lanes = first_lanes(n - i);
      const __m512i v = _mm512_maskz_loadu_epi32(lanes, values + i);
      const __mmask16 greater = _mm512_mask_cmpgt_epu32_mask(lanes, v, pivot);
      const __mmask16 less = _mm512_mask_cmplt_epu32_mask(lanes, v, pivot);
      _mm512_storeu_si512(above + count_above, _mm512_maskz_compress_epi32(greater, v));
      _mm512_storeu_si512(below + count_below, _mm512_maskz_compress_epi32(less, v));
      count_above += std::popcount(unsigned(greater));
      count_below += std::popcount(unsigned(less));
    }
    if (k <= count_above) {
      std::swap(values, above);
      n = count_above;
    } else if (k <= n - count_below) {
      return pivot_value;  // the k-th is one of the pivot's equals
    } else {
      k -= n - count_below;
      std::swap(values, below);
      n = count_below;
    }
  }
}

}  // namespace

KVLENS_TOP_K_AVX512 void top_k_row_avx512(const float* scores, const uint8_t* allowed, int64_t cols,
                                          int64_t k, uint8_t* chosen) {
  if (k <= 0 || cols <= 0) return;
  Scratch& scratch = thread_scratch(cols);
  uint32_t* rank = scratch.rank.data();
  uint32_t* packed = scratch.packed.data();

  // Every column's rank (0 for a non-candidate) and the candidates' ranks packed.
  const __m512i zero = _mm512_setzero_si512(), sign = _mm512_set1_epi32(int32_t(0x80000000u));
  const __m512i nan_rank = _mm512_set1_epi32(1);
  int64_t candidates = 0;
  for (int64_t j = 0; j < cols; j += 16) {
    const __mmask16 lanes = first_lanes(cols - j);
    // x + 0 turns -0 into +0 and leaves every other value (NaN included) as it is.
    const __m512 x = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, scores + j), _mm512_setzero_ps());
    const __m512i bits = _mm512_castps_si512(x);
    // Negative: ~bits; positive: bits with the sign bit set (top_k_key's order); NaN ranks 1,
    // below every number and above the non-candidates' 0.
    __m512i r =
        _mm512_xor_si512(bits, _mm512_or_si512(_mm512_maskz_srai_epi32(kAllLanes, bits, 31), sign));
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), nan_rank);
    __mmask16 candidate = _mm512_mask_cmpeq_epi32_mask(
        lanes, _mm512_maskz_cvtepu8_epi32(kAllLanes, _mm_maskz_loadu_epi8(lanes, chosen + j)),
        zero);
    if (allowed) {
      candidate = _mm512_mask_cmpneq_epi32_mask(
          candidate,
          _mm512_maskz_cvtepu8_epi32(kAllLanes, _mm_maskz_loadu_epi8(lanes, allowed + j)), zero);
    }
    r = _mm512_maskz_mov_epi32(candidate, r);
    _mm512_storeu_si512(rank + j, r);
    _mm512_storeu_si512(packed + candidates, _mm512_maskz_compress_epi32(candidate, r));
    candidates += std::popcount(unsigned(candidate));
  }
  const __m128i ones = _mm_set1_epi8(1);
  if (candidates <= k) {
    for (int64_t j = 0; j < cols; j += 16) {
      const __m512i r = _mm512_loadu_si512(rank + j);
      _mm_mask_storeu_epi8(chosen + j,
                           _mm512_mask_cmpneq_epi32_mask(first_lanes(cols - j), r, zero), ones);
    }
    return;
  }

  const uint32_t kth =
      kth_largest(packed, candidates, k, scratch.above.data(), scratch.below.data());
  // Ranks above the k-th's are in (kth >= 1, so only candidates pass).
  const __m512i threshold = _mm512_set1_epi32(int32_t(kth));
  int64_t taken = 0;
  for (int64_t j = 0; j < cols; j += 16) {
    const __mmask16 lanes = first_lanes(cols - j);
    const __mmask16 greater =
        _mm512_mask_cmpgt_epu32_mask(lanes, _mm512_loadu_si512(rank + j), threshold);
    _mm_mask_storeu_epi8(chosen + j, greater, ones);
    taken += std::popcount(unsigned(greater));
  }
  // Of the ranks equal to it, the highest columns, k - taken (>= 1) of them.
  int64_t wanted = k - taken;
  for (int64_t j = (cols - 1) / 16 * 16; j >= 0 && wanted > 0; j -= 16) {
    unsigned equal = _mm512_mask_cmpeq_epi32_mask(first_lanes(cols - j),
                                                  _mm512_loadu_si512(rank + j), threshold);
    for (int extra = std::popcount(equal) - int(wanted); extra > 0; --extra)
      equal &= equal - 1;  // drops the lowest column
    _mm_mask_storeu_epi8(chosen + j, __mmask16(equal), ones);
    wanted -= std::popcount(equal);
  }
}

bool cpu_has_avx512_top_k() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("popcnt");
}

}  // namespace kvlens

#endif
