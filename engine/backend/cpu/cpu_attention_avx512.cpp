// The attention logits, softmax and lockstep value-sum kernels in AVX-512 (cpu_attention_x86.h),
// with the AVX2 kernels' bits. Logits: one 16-lane accumulator holds a key's products with two
// query heads of a KV head (query i in 256-bit half i, lanes d mod 8 as in AVX2), so each key block
// is one broadcast load and one FMA for both heads, and the fold of 8 such accumulators is AVX2's
// transpose_sum8 run on both halves at once. Softmax: the exp of two 8-column blocks in one
// register, the total still added block by block into 8 lanes. Odd query counts, head_dim not a
// multiple of 8 and the cut edge blocks go to the AVX2 code. Value sums of several runs' heads
// over shared values: per key one load of the values and one masked FMA per row and 16 columns.
#include <algorithm>
#include <cstdint>

#include "engine/backend/cpu/cpu_attention_x86.h"

#if KVLENS_HAVE_X86_KERNELS
#define KVLENS_AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))
#define KVLENS_AVX512_INLINE __attribute__((target("avx512f,avx2,fma,f16c"), always_inline)) inline
#define KVLENS_AVX512_LAMBDA __attribute__((target("avx512f,avx2,fma,f16c"), always_inline))

// GCC 12's AVX-512 intrinsics pass an uninitialized vector as the unused merge operand, and
// -Wmaybe-uninitialized reports it at every call (GCC bug 105593): a false alarm in the system
// header, silenced for this file only (the matmul kernels use the zero-masking forms instead, but
// the exp and the conversions here have none).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kvlens::x86 {
namespace {

// The zero-masking forms with every lane set are the plain instructions.
constexpr __mmask16 kAllLanes = 0xFFFF;
constexpr __mmask8 kAllQuads = 0xFF;

// The 8 floats at p in both 256-bit halves (a single broadcast load).
KVLENS_AVX512_INLINE __m512 broadcast8(const float* p) {
  return _mm512_castpd_ps(
      _mm512_maskz_broadcast_f64x4(kAllQuads, _mm256_loadu_pd(reinterpret_cast<const double*>(p))));
}

// The high 256 bits.
KVLENS_AVX512_INLINE __m256 high_half(__m512 x) {
  return _mm256_castpd_ps(_mm512_maskz_extractf64x4_pd(0xF, _mm512_castps_pd(x), 1));
}

// 128-bit lanes (a0, a2, b0, b2) and (a1, a3, b1, b3) of a and b.
KVLENS_AVX512_INLINE __m512 even_quarters(__m512 a, __m512 b) {
  return _mm512_maskz_shuffle_f32x4(kAllLanes, a, b, 0x88);
}
KVLENS_AVX512_INLINE __m512 odd_quarters(__m512 a, __m512 b) {
  return _mm512_maskz_shuffle_f32x4(kAllLanes, a, b, 0xDD);
}

// transpose_sum8 of the low halves of acc[0..8) in the low half of the result and of the high
// halves in the high half: the unpacks and shuffles work within 128-bit lanes as in AVX2, and the
// last step adds each half's low 128 bits to its high 128 bits in AVX2's operand order.
KVLENS_AVX512_INLINE __m512 transpose_sum8_halves(const __m512 (&acc)[8]) {
  __m512 t[4];
  for (int p = 0; p < 4; ++p)
    t[p] = _mm512_add_ps(_mm512_maskz_unpacklo_ps(kAllLanes, acc[2 * p], acc[2 * p + 1]),
                         _mm512_maskz_unpackhi_ps(kAllLanes, acc[2 * p], acc[2 * p + 1]));
  const __m512 u0 =
      _mm512_add_ps(_mm512_shuffle_ps(t[0], t[1], 0x44), _mm512_shuffle_ps(t[0], t[1], 0xEE));
  const __m512 u1 =
      _mm512_add_ps(_mm512_shuffle_ps(t[2], t[3], 0x44), _mm512_shuffle_ps(t[2], t[3], 0xEE));
  // (u0 lane 0 + lane 1, u0 lane 2 + lane 3, u1 lane 0 + lane 1, u1 lane 2 + lane 3) in 128-bit
  // lanes, then reordered to (u0, u1 | u0, u1) of each half.
  const __m512 sums = _mm512_add_ps(even_quarters(u0, u1), odd_quarters(u0, u1));
  return _mm512_maskz_shuffle_f32x4(kAllLanes, sums, sums, 0xD8);
}

// Logits of the query pair (rows 0 and 1) for keys [j, j + 8): count of them valid (kFull: 8),
// the rest repeating the last valid key and not stored. pairs[b]: the queries' block b of 8
// dimensions, query 0 low, query 1 high.
template <bool kFull, bool kPrefetch, int64_t kDim>
KVLENS_AVX512_INLINE void logits_pair_block(const __m512* pairs, const float* keys,
                                            int64_t runtime_dim, int64_t j, int count, __m512 scale,
                                            float* row, int64_t row_stride) {
  const int64_t head_dim = kDim > 0 ? kDim : runtime_dim;
  const float* k[8];
  for (int r = 0; r < 8; ++r) k[r] = keys + (j + (kFull ? r : std::min(r, count - 1))) * head_dim;
  __m512 acc[8];
  for (int r = 0; r < 8; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; d += 8) {
    if (kPrefetch && d % 16 == 0) {  // one cache line of each key row two blocks ahead
      for (int r = 0; r < 8; ++r) prefetch_ahead(k[r], 2 * 8 * head_dim + d);
    }
    const __m512 q = pairs[d / 8];
    for (int r = 0; r < 8; ++r) acc[r] = _mm512_fmadd_ps(broadcast8(k[r] + d), q, acc[r]);
  }
  const __m512 sums = _mm512_mul_ps(transpose_sum8_halves(acc), scale);
  if constexpr (kFull) {
    _mm256_storeu_ps(row + j, _mm512_castps512_ps256(sums));
    _mm256_storeu_ps(row + row_stride + j, high_half(sums));
  } else {
    alignas(64) float part[16];
    _mm512_store_ps(part, sums);
    for (int r = 0; r < count; ++r) {
      row[j + r] = part[r];
      row[row_stride + j + r] = part[8 + r];
    }
  }
}

// Query rows 0 and 1 (q, q + q_stride) over keys [lo, hi]; head_dim a multiple of 8, at most
// kMaxDim.
constexpr int64_t kMaxDim = 256;
template <bool kPrefetch, int64_t kDim>
KVLENS_AVX512_INLINE void logits_pair(const float* q, int64_t q_stride, const float* keys,
                                      int64_t runtime_dim, int64_t lo, int64_t hi, __m512 scale,
                                      float* row, int64_t row_stride) {
  const int64_t head_dim = kDim > 0 ? kDim : runtime_dim;
  __m512 pairs[kMaxDim / 8];
  for (int64_t b = 0; b < head_dim / 8; ++b) {
    pairs[b] = _mm512_castpd_ps(_mm512_mask_broadcast_f64x4(
        _mm512_castps_pd(broadcast8(q + 8 * b)), 0xF0,
        _mm256_loadu_pd(reinterpret_cast<const double*>(q + q_stride + 8 * b))));
  }
  int64_t j = lo;
  for (; j + 8 <= hi + 1; j += 8)
    logits_pair_block<true, kPrefetch, kDim>(pairs, keys, head_dim, j, 8, scale, row, row_stride);
  if (j <= hi)
    logits_pair_block<false, kPrefetch, kDim>(pairs, keys, head_dim, j, int(hi + 1 - j), scale, row,
                                              row_stride);
}

template <bool kPrefetch, int64_t kDim>
KVLENS_AVX512_INLINE void logits_pairs(const float* q, int64_t q_stride, int pairs,
                                       const float* keys, int64_t head_dim, int64_t lo, int64_t hi,
                                       float scale, float* row, int64_t row_stride) {
  const __m512 scale16 = _mm512_set1_ps(scale);
  for (int p = 0; p < pairs; ++p) {
    logits_pair<kPrefetch, kDim>(q + 2 * p * q_stride, q_stride, keys, head_dim, lo, hi, scale16,
                                 row + 2 * p * row_stride, row_stride);
  }
}

// exp_nonpositive_avx2 on 16 lanes: the same operations lane by lane.
KVLENS_AVX512_INLINE __m512 exp_nonpositive_avx512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-110.0f), x);  // max returns a NaN x, which propagates
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(0.000198527617612853646278381f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.00139304355252534151077271f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.00833336077630519866943359f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.0416664853692054748535156f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.166666671633720397949219f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_mul_ps(r, r), p, r));
  const __m512i e = _mm512_cvtps_epi32(n);
  const __m512i e1 = _mm512_srai_epi32(e, 1);
  const __m512i e2 = _mm512_sub_epi32(e, e1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e2, bias), 23));
  return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

// Set in lane l where seen[l] == 0, for 16 lanes.
KVLENS_AVX512_INLINE __mmask16 hidden_lanes_avx512(const uint8_t* seen) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(seen));
  return _mm512_cmpeq_epi32_mask(_mm512_cvtepu8_epi32(bytes), _mm512_setzero_si512());
}

// softmax_weights_avx2_t with the whole blocks two at a time: the max is exact whatever the
// grouping (a zero's sign aside, which no weight sees: exp(+-0) = 1), and each pair of blocks'
// weights are added to the 8-lane total low block first, so the total's additions are AVX2's.
template <bool kMasked>
KVLENS_AVX512_INLINE float softmax_weights_avx512_t(const float* logits, const uint8_t* visible,
                                                    int64_t begin, int64_t end, float* weights) {
  if (begin >= end) return 0.0f;
  const SoftmaxBlocks blocks(begin, end);
  const int64_t pairs_end = blocks.whole_begin + (blocks.whole_end - blocks.whole_begin) / 16 * 16;

  __m256 max8 = _mm256_set1_ps(kMinusInfinity);  // max ignores a NaN first operand
  __m512 max16 = _mm512_set1_ps(kMinusInfinity);
  if (blocks.cut_first)
    max8 = _mm256_max_ps(edge_logits_avx2(logits, visible, blocks.first, begin, end), max8);
  for (int64_t j0 = blocks.whole_begin; j0 < pairs_end; j0 += 16) {
    __m512 x = _mm512_loadu_ps(logits + j0);
    if constexpr (kMasked)
      x = _mm512_mask_mov_ps(x, hidden_lanes_avx512(visible + j0), _mm512_set1_ps(kMinusInfinity));
    max16 = _mm512_max_ps(x, max16);
  }
  if (pairs_end < blocks.whole_end) {
    __m256 x = _mm256_loadu_ps(logits + pairs_end);
    if constexpr (kMasked) x = hide_avx2(x, visible + pairs_end);
    max8 = _mm256_max_ps(x, max8);
  }
  // The cut last block: its taking part lanes, -inf in the others (edge_logits_avx2's lanes).
  // Lanes built in a register (taking_lanes): a block written lane by lane to memory and loaded
  // back whole stalls the store forwarding, and a decode row ends in a cut block 7 times in 8.
  const __mmask16 last_taking =
      blocks.cut_last ? __mmask16(taking_lanes(visible, blocks.last, begin, end)) : __mmask16(0);
  if (blocks.cut_last) {
    const __m512 x =
        _mm512_mask_loadu_ps(_mm512_set1_ps(kMinusInfinity), last_taking, logits + blocks.last);
    max8 = _mm256_max_ps(_mm512_castps512_ps256(x), max8);
  }
  max8 = _mm256_max_ps(_mm512_castps512_ps256(max16), max8);
  max8 = _mm256_max_ps(high_half(max16), max8);
  const float max_logit = max_of_lanes(max8);
  if (max_logit == kMinusInfinity) {
    std::fill(weights + begin, weights + end, 0.0f);
    return 0.0f;
  }

  const __m256 m = _mm256_set1_ps(max_logit);
  const __m512 m16 = _mm512_set1_ps(max_logit);
  __m256 total8 = _mm256_setzero_ps();
  if (blocks.cut_first) edge_weights(logits, visible, blocks.first, begin, end, m, total8, weights);
  for (int64_t j0 = blocks.whole_begin; j0 < pairs_end; j0 += 16) {
    __m512 w;
    if constexpr (kMasked) {
      // Hidden lanes enter exp as 0 and leave as exactly 0 (see block_weights).
      const __mmask16 shown = __mmask16(~hidden_lanes_avx512(visible + j0));
      const __m512 x = _mm512_maskz_sub_ps(shown, _mm512_loadu_ps(logits + j0), m16);
      w = _mm512_maskz_mov_ps(shown, exp_nonpositive_avx512(x));
    } else {
      w = exp_nonpositive_avx512(_mm512_maskz_sub_ps(kAllLanes, _mm512_loadu_ps(logits + j0), m16));
    }
    total8 = _mm256_add_ps(total8, _mm512_castps512_ps256(w));
    total8 = _mm256_add_ps(total8, high_half(w));
    _mm512_storeu_ps(weights + j0, w);
  }
  if (pairs_end < blocks.whole_end) {
    const __m256 w = block_weights<kMasked>(logits, visible, pairs_end, m);
    total8 = _mm256_add_ps(total8, w);
    _mm256_storeu_ps(weights + pairs_end, w);
  }
  if (blocks.cut_last) {
    // edge_weights' lanes: exp(x - m) where the lane takes part, exactly 0 elsewhere (entering
    // exp as 0, as block_weights does); stored for the columns below end.
    const __m512 x = _mm512_maskz_sub_ps(
        last_taking, _mm512_maskz_loadu_ps(last_taking, logits + blocks.last), m16);
    const __m512 w = _mm512_maskz_mov_ps(last_taking, exp_nonpositive_avx512(x));
    total8 = _mm256_add_ps(total8, _mm512_castps512_ps256(w));
    _mm512_mask_storeu_ps(weights + blocks.last, __mmask16(range_lanes(blocks.last, begin, end)),
                          w);
  }
  return fold_total(total8);
}

// weighted_values_rows: each row's multiply-add is masked by its weight != 0 (true for NaN, as
// the AVX2 test), which leaves its sums exactly as skipping the key does. kRows x kBlocks
// accumulators: with two runs' heads or more, enough independent chains to keep both FMA pipes
// busy (a row's sums wait on the FMA latency key after key). Each key's values are loaded once
// for all rows.
template <int kRows, int kBlocks>
KVLENS_AVX512_INLINE void values_rows_chunk(const float* const* weights, const float* values,
                                            float* const* sums, int64_t head_dim, int64_t d0,
                                            int64_t begin, int64_t end) {
  __m512 acc[kRows][kBlocks];
  for (int i = 0; i < kRows; ++i)
    for (int b = 0; b < kBlocks; ++b) acc[i][b] = _mm512_loadu_ps(sums[i] + d0 + 16 * b);
  const __m512 zero = _mm512_setzero_ps();
  auto add_key = [&](int64_t j) KVLENS_AVX512_LAMBDA {
    __m512 v[kBlocks];
    for (int b = 0; b < kBlocks; ++b) v[b] = _mm512_loadu_ps(values + j * head_dim + d0 + 16 * b);
    for (int i = 0; i < kRows; ++i) {
      const __m512 w = _mm512_set1_ps(weights[i][j]);
      const __mmask16 taken = _mm512_cmp_ps_mask(w, zero, _CMP_NEQ_UQ);
      for (int b = 0; b < kBlocks; ++b)
        acc[i][b] = _mm512_mask3_fmadd_ps(w, v[b], acc[i][b], taken);
    }
  };
  int64_t j = begin;
  for (; j + 8 <= end; j += 8) {
    // A block of 8 keys that no row takes (hidden, evicted) is skipped unread.
    int taken = 0;
    for (int i = 0; i < kRows; ++i)
      taken |= _mm256_movemask_ps(
          _mm256_cmp_ps(_mm256_loadu_ps(weights[i] + j), _mm256_setzero_ps(), _CMP_NEQ_UQ));
    if (taken == 0) continue;
    for (int64_t t = j; t < j + 8; ++t) add_key(t);
  }
  for (; j < end; ++j) add_key(j);
  for (int i = 0; i < kRows; ++i)
    for (int b = 0; b < kBlocks; ++b) _mm512_storeu_ps(sums[i] + d0 + 16 * b, acc[i][b]);
}

template <int kRows>
KVLENS_AVX512_INLINE void values_rows(const float* const* weights, const float* values,
                                      float* const* sums, int64_t head_dim, int64_t begin,
                                      int64_t end) {
  int64_t d0 = 0;
  for (; d0 + 32 <= head_dim; d0 += 32)
    values_rows_chunk<kRows, 2>(weights, values, sums, head_dim, d0, begin, end);
  if (d0 < head_dim) values_rows_chunk<kRows, 1>(weights, values, sums, head_dim, d0, begin, end);
}

KVLENS_AVX512_INLINE void values_rows_share(int rows, const float* const* weights,
                                            const float* values, float* const* sums,
                                            int64_t head_dim, int64_t begin, int64_t end) {
  switch (rows) {
    case 1:
      return values_rows<1>(weights, values, sums, head_dim, begin, end);
    case 2:
      return values_rows<2>(weights, values, sums, head_dim, begin, end);
    case 3:
      return values_rows<3>(weights, values, sums, head_dim, begin, end);
    case 4:
      return values_rows<4>(weights, values, sums, head_dim, begin, end);
    case 5:
      return values_rows<5>(weights, values, sums, head_dim, begin, end);
    case 6:
      return values_rows<6>(weights, values, sums, head_dim, begin, end);
    case 7:
      return values_rows<7>(weights, values, sums, head_dim, begin, end);
    default:
      return values_rows<8>(weights, values, sums, head_dim, begin, end);
  }
}

}  // namespace

KVLENS_AVX512 void weighted_values_rows_avx512(const float* const* weights, const float* values,
                                               float* const* sums, int rows, int64_t head_dim,
                                               int64_t begin, int64_t end) {
  // Rows in even shares of at most kValuesRowsPerCall (10 as 5 + 5, not 8 + 2: a share of few
  // rows has few accumulator chains and waits on the FMA latency).
  const int calls = (rows + kValuesRowsPerCall - 1) / kValuesRowsPerCall;
  for (int i = 0, call = 0; call < calls; ++call) {
    const int share = (rows - i) / (calls - call);
    values_rows_share(share, weights + i, values, sums + i, head_dim, begin, end);
    i += share;
  }
}

KVLENS_AVX512 void attention_logits_avx512(const float* q, int64_t q_stride, int nq,
                                           const float* keys, int64_t head_dim, int64_t lo,
                                           int64_t hi, float scale, float* row,
                                           int64_t row_stride) {
  const int pairs = head_dim % 8 == 0 && head_dim <= kMaxDim ? nq / 2 : 0;
  if (pairs > 0) {
    for (int i = 0; i < 2 * pairs; ++i)
      std::fill(row + i * row_stride, row + i * row_stride + lo, kMinusInfinity);
    if (head_dim == 32) {
      logits_pairs<false, 32>(q, q_stride, pairs, keys, head_dim, lo, hi, scale, row, row_stride);
    } else if (head_dim == 64) {
      logits_pairs<false, 64>(q, q_stride, pairs, keys, head_dim, lo, hi, scale, row, row_stride);
    } else if (head_dim == 128) {
      static_assert(128 >= kPrefetchDim);
      logits_pairs<true, 128>(q, q_stride, pairs, keys, head_dim, lo, hi, scale, row, row_stride);
    } else if (head_dim >= kPrefetchDim) {
      logits_pairs<true, 0>(q, q_stride, pairs, keys, head_dim, lo, hi, scale, row, row_stride);
    } else {
      logits_pairs<false, 0>(q, q_stride, pairs, keys, head_dim, lo, hi, scale, row, row_stride);
    }
  }
  // The rest (an odd query, or every query of an unusual head_dim) through AVX2: the logits do
  // not depend on which queries share a call.
  if (2 * pairs < nq) {
    attention_logits_avx2(q + 2 * pairs * q_stride, q_stride, nq - 2 * pairs, keys, head_dim, lo,
                          hi, scale, row + 2 * pairs * row_stride, row_stride);
  }
}

KVLENS_AVX512 float softmax_weights_avx512(const float* logits, const uint8_t* visible,
                                           int64_t begin, int64_t end, float* weights) {
  return visible ? softmax_weights_avx512_t<true>(logits, visible, begin, end, weights)
                 : softmax_weights_avx512_t<false>(logits, nullptr, begin, end, weights);
}

}  // namespace kvlens::x86
#endif  // KVLENS_HAVE_X86_KERNELS
