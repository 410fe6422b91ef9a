// Top-k row kernels (see cpu_top_k.h). Both are radix selects over 8-bit digits of 64-bit keys
// (rank << 32 | column), taken from the highest bit in which the remaining keys differ. The
// portable kernel builds every candidate's key and narrows them digit by digit. The AVX2 kernel
// ranks the whole row in vectors, takes the first digit from a histogram of the ranks, marks
// every column above the pivot digit in vectors, and hands only the pivot digit's few keys on to
// the same narrowing: about three times faster on rows of a few hundred columns.
#include "engine/backend/cpu/cpu_top_k.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <functional>
#include <vector>

#include "engine/backend/policy_op_math.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define KVLENS_HAVE_X86_TOP_K 1
#else
#define KVLENS_HAVE_X86_TOP_K 0
#endif

namespace kvlens {
namespace {

constexpr int kDigitBits = 8;
constexpr uint32_t kDigits = 1u << kDigitBits;
constexpr size_t kFewKeys = 64;

// Keys still in the race, with the AND and OR of all of them (their common bits).
struct RowKeys {
  std::vector<uint64_t> keys, next;
  uint64_t all_ones = ~uint64_t(0), any_ones = 0;
};

// Four interleaved histograms summed into the first: consecutive keys often share a digit, and
// one histogram would chain their increments through memory.
using Histograms = std::array<std::array<uint32_t, kDigits>, 4>;

// The pivot digit of a histogram: the digit of the k-th largest key (k <= the total). `above`
// receives the count of keys whose digit is higher.
uint32_t pivot_digit(const uint32_t* histogram, int64_t k, int64_t& above) {
  above = 0;
  uint32_t pivot = kDigits - 1;
  while (above + histogram[pivot] < k) above += histogram[pivot--];
  return pivot;
}

void sum_histograms(Histograms& histograms) {
  for (uint32_t d = 0; d < kDigits; ++d)
    histograms[0][d] += histograms[1][d] + histograms[2][d] + histograms[3][d];
}

// The shift that puts the top 8 of the bits where `differing` (not 0) is set in the low digit.
int digit_shift(uint64_t differing) {
  return std::max(0, 63 - std::countl_zero(differing) - (kDigitBits - 1));
}

// Marks chosen[uint32(key)] = 1 for the k largest of the distinct `row.keys` (all of them when
// there are no more than k). Keys whose digit is above the k-th largest one's are in, those
// below are out, and only the ones that share it go on to the next digit; the pass that sorts
// them out also gathers their common bits, so each digit costs two passes over the keys left.
// The keys' chosen bytes are 0 on entry. `row` is consumed.
void select_largest_keys(RowKeys& row, int64_t k, uint8_t* chosen) {
  Histograms histograms;
  for (;;) {
    if (int64_t(row.keys.size()) <= k) {
      for (const uint64_t key : row.keys) chosen[uint32_t(key)] = 1;
      return;
    }
    // A few keys (what usually shares the first digit) are cheaper to order than to histogram.
    if (row.keys.size() <= kFewKeys) {
      const auto kth = row.keys.begin() + (k - 1);
      std::nth_element(row.keys.begin(), kth, row.keys.end(), std::greater<>());
      for (auto key = row.keys.begin(); key <= kth; ++key) chosen[uint32_t(*key)] = 1;
      return;
    }
    // Distinct keys (more than k >= 1 of them) differ somewhere, so `differing` is not 0.
    const int shift = digit_shift(row.all_ones ^ row.any_ones);
    for (auto& histogram : histograms) histogram.fill(0);
    const size_t count = row.keys.size();
    const uint64_t* keys = row.keys.data();
    size_t i = 0;
    for (; i + 4 <= count; i += 4)
      for (size_t lane = 0; lane < 4; ++lane)
        ++histograms[lane][(keys[i + lane] >> shift) & (kDigits - 1)];
    for (; i < count; ++i) ++histograms[0][(keys[i] >> shift) & (kDigits - 1)];
    sum_histograms(histograms);
    int64_t above = 0;
    const uint32_t pivot = pivot_digit(histograms[0].data(), k, above);
    // Branch-free: which side a key falls on is data, not control flow (about half the keys
    // go either way, which a branch would mispredict).
    row.next.resize(row.keys.size());
    uint64_t* next = row.next.data();
    size_t kept = 0;
    uint64_t all_ones = ~uint64_t(0), any_ones = 0;
    for (const uint64_t key : row.keys) {
      const uint32_t digit = uint32_t(key >> shift) & (kDigits - 1);
      const bool equal = digit == pivot;
      chosen[uint32_t(key)] = uint8_t(digit > pivot);
      next[kept] = key;
      kept += equal;
      all_ones &= equal ? key : ~uint64_t(0);
      any_ones |= equal ? key : 0;
    }
    row.next.resize(kept);
    k -= above;
    row.keys.swap(row.next);
    row.all_ones = all_ones;
    row.any_ones = any_ones;
  }
}

// One scratch per thread: the rows of a call run on the backend's threads.
RowKeys& thread_row_keys() {
  thread_local RowKeys row;
  return row;
}

#if KVLENS_HAVE_X86_TOP_K

#define KVLENS_TOP_K_AVX2 __attribute__((target("avx2")))

// Byte l of kByteFlags[m] is bit l of m: an 8-lane compare mask as eight 0/1 bytes.
constexpr std::array<uint64_t, 256> make_byte_flags() {
  std::array<uint64_t, 256> flags{};
  for (uint32_t m = 0; m < 256; ++m)
    for (int l = 0; l < 8; ++l)
      if (m & (1u << l)) flags[m] |= uint64_t(1) << (8 * l);
  return flags;
}
constexpr std::array<uint64_t, 256> kByteFlags = make_byte_flags();

// A candidate's rank: top_k_key's order of its score, moved up by one so that NaN ranks 1 and
// 0 is free to mark the columns that are not candidates (the lowest finite ranks are far above
// 1, so the order among candidates is top_k_key's).
inline uint32_t candidate_rank(float score) {
  const uint32_t ordered = uint32_t(top_k_key(score, 0) >> 32);
  return ordered == 0 ? 1u : ordered;
}

// Histograms.fill(0) in vector stores: with rows of a few hundred columns, the 4 KB memset
// (rep stos, slow to start) was a fifth of the kernel's time. The empty asm hides the address
// from GCC, which would otherwise turn the loop back into that memset.
KVLENS_TOP_K_AVX2 inline void clear_histograms_avx2(Histograms& histograms) {
  auto* words = histograms[0].data();
  static_assert(sizeof(Histograms) == 4 * kDigits * sizeof(uint32_t));
  for (uint32_t d = 0; d < 4 * kDigits; d += 32) {
    uint32_t* at = words + d;
    __asm__("" : "+r"(at));
    for (int v = 0; v < 4; ++v)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + 8 * v), _mm256_setzero_si256());
  }
}

// sum_histograms then pivot_digit (the same pivot and `above`), eight digits at a time from the
// top: the digit-by-digit scan was a chain of up to 256 dependent steps, a quarter of the
// kernel's time on short rows.
KVLENS_TOP_K_AVX2 inline uint32_t pivot_digit_avx2(const Histograms& histograms, int64_t k,
                                                   int64_t& above) {
  above = 0;
  for (int64_t d0 = kDigits - 8; d0 >= 0; d0 -= 8) {
    __m256i counts = _mm256_setzero_si256();
    for (const auto& histogram : histograms)
      counts = _mm256_add_epi32(
          counts, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(histogram.data() + d0)));
    alignas(32) uint32_t block[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(block), counts);
    int64_t block_total = 0;
    for (const uint32_t count : block) block_total += count;
    if (above + block_total < k) {
      above += block_total;
      continue;
    }
    for (int d = 7;; --d) {  // the block holds the pivot: the k-th key is in it
      if (above + block[d] >= k) return uint32_t(d0 + d);
      above += block[d];
    }
  }
  return 0;  // not reached: k <= the total
}

#endif  // KVLENS_HAVE_X86_TOP_K

}  // namespace

void top_k_row_generic(const float* scores, const uint8_t* allowed, int64_t cols, int64_t k,
                       uint8_t* chosen) {
  if (k <= 0 || cols <= 0) return;
  RowKeys& row = thread_row_keys();
  // Every column's key is written and kept only when it is a candidate: no branch.
  row.keys.resize(size_t(cols));
  uint64_t* keys = row.keys.data();
  uint64_t all_ones = ~uint64_t(0), any_ones = 0;
  size_t count = 0;
  for (int64_t j = 0; j < cols; ++j) {
    const uint64_t key = top_k_key(scores[j], uint32_t(j));
    const bool candidate = chosen[j] == 0 && (!allowed || allowed[j] != 0);
    keys[count] = key;
    count += candidate;
    // A non-candidate leaves the AND and OR as they are.
    all_ones &= candidate ? key : ~uint64_t(0);
    any_ones |= candidate ? key : 0;
  }
  row.keys.resize(count);
  row.all_ones = all_ones;
  row.any_ones = any_ones;
  select_largest_keys(row, k, chosen);
}

#if KVLENS_HAVE_X86_TOP_K

KVLENS_TOP_K_AVX2 void top_k_row_avx2(const float* scores, const uint8_t* allowed, int64_t cols,
                                      int64_t k, uint8_t* chosen) {
  if (k <= 0 || cols <= 0) return;
  thread_local std::vector<uint32_t> rank_storage;
  rank_storage.resize(size_t(cols));
  uint32_t* rank = rank_storage.data();

  // Pass 1: every column's rank (0 for a non-candidate), the candidates' count and common bits.
  const __m256i zero = _mm256_setzero_si256(), ones = _mm256_set1_epi32(-1);
  const __m256i sign = _mm256_set1_epi32(int32_t(0x80000000u)), nan_rank = _mm256_set1_epi32(1);
  __m256i all8 = ones, any8 = zero, count8 = zero;
  int64_t j = 0;
  for (; j + 8 <= cols; j += 8) {
    // x + 0 turns -0 into +0 and leaves every other value (NaN included) as it is.
    const __m256 x = _mm256_add_ps(_mm256_loadu_ps(scores + j), _mm256_setzero_ps());
    const __m256i bits = _mm256_castps_si256(x);
    // Negative: ~bits; positive: bits with the sign bit set (top_k_key's order).
    __m256i r = _mm256_xor_si256(bits, _mm256_or_si256(_mm256_srai_epi32(bits, 31), sign));
    r = _mm256_blendv_epi8(r, nan_rank, _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    const __m256i taken =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(chosen + j)));
    __m256i candidate = _mm256_cmpeq_epi32(taken, zero);
    if (allowed) {
      const __m256i ok =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(allowed + j)));
      candidate = _mm256_andnot_si256(_mm256_cmpeq_epi32(ok, zero), candidate);
    }
    r = _mm256_and_si256(r, candidate);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(rank + j), r);
    any8 = _mm256_or_si256(any8, r);
    all8 = _mm256_and_si256(all8, _mm256_or_si256(r, _mm256_xor_si256(candidate, ones)));
    count8 = _mm256_sub_epi32(count8, candidate);
  }
  alignas(32) uint32_t lanes_all[8], lanes_any[8], lanes_count[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_all), all8);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_any), any8);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes_count), count8);
  uint32_t all_ones = ~0u, any_ones = 0;
  int64_t candidates = 0;
  for (int l = 0; l < 8; ++l) {
    all_ones &= lanes_all[l];
    any_ones |= lanes_any[l];
    candidates += lanes_count[l];
  }
  for (; j < cols; ++j) {
    const bool candidate = chosen[j] == 0 && (!allowed || allowed[j] != 0);
    rank[j] = candidate ? candidate_rank(scores[j]) : 0;
    all_ones &= candidate ? rank[j] : ~0u;
    any_ones |= rank[j];
    candidates += candidate;
  }
  if (candidates <= k) {
    for (int64_t c = 0; c < cols; ++c) chosen[c] |= uint8_t(rank[c] != 0);
    return;
  }

  // The first digit: the top 8 bits in which the candidates' ranks differ. Equal ranks leave
  // only the columns to decide: every candidate then goes on to the narrowing.
  const uint32_t differing = all_ones ^ any_ones;
  const int shift = differing == 0 ? 0 : digit_shift(differing);
  uint32_t pivot = 0;
  int64_t above = 0;
  if (differing != 0) {
    alignas(32) Histograms histograms;
    clear_histograms_avx2(histograms);
    int64_t c = 0;
    for (; c + 4 <= cols; c += 4)
      for (int lane = 0; lane < 4; ++lane) {
        const uint32_t r = rank[c + lane];
        histograms[size_t(lane)][(r >> shift) & (kDigits - 1)] += r != 0;
      }
    for (; c < cols; ++c) histograms[0][(rank[c] >> shift) & (kDigits - 1)] += rank[c] != 0;
    pivot = pivot_digit_avx2(histograms, k, above);
  }

  // Pass 2: candidates above the pivot digit are in; those on it go on as keys.
  RowKeys& row = thread_row_keys();
  row.keys.clear();
  uint64_t key_all = ~uint64_t(0), key_any = 0;
  auto keep = [&](int64_t c) {
    const uint64_t key = (uint64_t(rank[c]) << 32) | uint64_t(c);
    row.keys.push_back(key);
    key_all &= key;
    key_any |= key;
  };
  const __m128i shift128 = _mm_cvtsi32_si128(differing == 0 ? 32 : shift);
  const __m256i pivot8 = _mm256_set1_epi32(int32_t(pivot)), low_digit = _mm256_set1_epi32(255);
  int64_t c = 0;
  for (; c + 8 <= cols; c += 8) {
    const __m256i r = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rank + c));
    const __m256i candidate = _mm256_xor_si256(_mm256_cmpeq_epi32(r, zero), ones);
    // With equal ranks (shift 32) every digit is 0: nothing is above, every candidate is on it.
    const __m256i digit = _mm256_and_si256(_mm256_srl_epi32(r, shift128), low_digit);
    const __m256i higher = _mm256_and_si256(_mm256_cmpgt_epi32(digit, pivot8), candidate);
    const __m256i equal = _mm256_and_si256(_mm256_cmpeq_epi32(digit, pivot8), candidate);
    const uint32_t higher_bits = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(higher)));
    uint32_t equal_bits = uint32_t(_mm256_movemask_ps(_mm256_castsi256_ps(equal)));
    uint64_t flags;
    std::memcpy(&flags, chosen + c, sizeof flags);
    flags |= kByteFlags[higher_bits];
    std::memcpy(chosen + c, &flags, sizeof flags);
    for (; equal_bits != 0; equal_bits &= equal_bits - 1) keep(c + std::countr_zero(equal_bits));
  }
  for (; c < cols; ++c) {
    if (rank[c] == 0) continue;
    const uint32_t digit = differing == 0 ? 0 : (rank[c] >> shift) & (kDigits - 1);
    if (digit > pivot) chosen[c] = 1;
    if (digit == pivot) keep(c);
  }
  row.all_ones = key_all;
  row.any_ones = key_any;
  select_largest_keys(row, k - above, chosen);
}

#endif  // KVLENS_HAVE_X86_TOP_K

}  // namespace kvlens
