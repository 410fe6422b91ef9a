// The x86 attention kernels' entry points (AVX2 in cpu_dot_kernels.cpp, AVX-512 in
// cpu_attention_avx512.cpp) and the vector helpers both sets build on, so that the AVX-512
// kernels repeat the AVX2 kernels' operations exactly. Internal to the CPU backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define KVLENS_HAVE_X86_KERNELS 1
#define KVLENS_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KVLENS_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) inline
#define KVLENS_AVX2_LAMBDA __attribute__((target("avx2,fma,f16c"), always_inline))
#else
#define KVLENS_HAVE_X86_KERNELS 0
#endif

#if KVLENS_HAVE_X86_KERNELS
namespace kvlens::x86 {

// The AttentionLogitsFn and SoftmaxWeightsFn of cpu_dot_kernels.h. The AVX-512 ones may only be
// called where cpu_has_avx512f(); they give the AVX2 ones' bits.
void attention_logits_avx2(const float* q, int64_t q_stride, int nq, const float* keys,
                           int64_t head_dim, int64_t lo, int64_t hi, float scale, float* row,
                           int64_t row_stride);
float softmax_weights_avx2(const float* logits, const uint8_t* visible, int64_t begin, int64_t end,
                           float* weights);
// The AttentionLogitsAtFn of cpu_dot_kernels.h: attention_logits_avx2's (and the AVX-512 one's)
// bits at the listed columns.
void attention_logits_at_avx2(const float* q, const float* keys, int64_t head_dim,
                              const int32_t* columns, int64_t count, float scale, float* row);
void attention_logits_avx512(const float* q, int64_t q_stride, int nq, const float* keys,
                             int64_t head_dim, int64_t lo, int64_t hi, float scale, float* row,
                             int64_t row_stride);
float softmax_weights_avx512(const float* logits, const uint8_t* visible, int64_t begin,
                             int64_t end, float* weights);

// The WeightedValuesRowsFn of cpu_dot_kernels.h (head_dim a multiple of 16), in calls of up to
// kValuesRowsPerCall rows (8: 16 accumulators of 32 dimensions).
inline constexpr int kValuesRowsPerCall = 8;
void weighted_values_rows_avx512(const float* const* weights, const float* values,
                                 float* const* sums, int rows, int64_t head_dim, int64_t begin,
                                 int64_t end);

inline constexpr float kMinusInfinity = -std::numeric_limits<float>::infinity();

// The helpers are forced inline: called per block, a call and its set-up would cost as much as
// the block's arithmetic at head_dim 32.

// Pins the N vectors to registers: GCC would otherwise fold a load that several FMAs share into
// each of them as a memory operand, and the loads, not the FMAs, would bound the loop.
template <int N>
KVLENS_AVX2_INLINE void keep_in_registers(__m256 (&v)[N]) {
  if constexpr (N == 1) {
    __asm__("" : "+x"(v[0]));
  } else if constexpr (N == 2) {
    __asm__("" : "+x"(v[0]), "+x"(v[1]));
  } else if constexpr (N == 4) {
    __asm__("" : "+x"(v[0]), "+x"(v[1]), "+x"(v[2]), "+x"(v[3]));
  } else {
    static_assert(N == 8);
    __asm__(""
            : "+x"(v[0]), "+x"(v[1]), "+x"(v[2]), "+x"(v[3]), "+x"(v[4]), "+x"(v[5]), "+x"(v[6]),
              "+x"(v[7]));
  }
}

// Prefetches the cache line `floats` floats past p into L1. The address is formed as an integer:
// it may lie past the end of the cache (a prefetch never faults), where pointer arithmetic
// would be undefined.
KVLENS_AVX2_INLINE void prefetch_ahead(const float* p, int64_t floats) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p) + uintptr_t(floats) * sizeof(float);
  _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T0);
}

// Eight sums at once: lane a of the result is ((l0 + l2) + (l1 + l3)) + ((l4 + l6) + (l5 + l7))
// of acc[a] (two unpack levels, then the 128-bit halves): a transpose-reduce in 12 shuffles and 7
// adds instead of 8 horizontal sums.
KVLENS_AVX2_INLINE __m256 transpose_sum8(const __m256 (&acc)[8]) {
  __m256 t[4];  // t[p] lanes: acc[2p](0+2), acc[2p+1](0+2), acc[2p](1+3), acc[2p+1](1+3) | +4
  for (int p = 0; p < 4; ++p)
    t[p] = _mm256_add_ps(_mm256_unpacklo_ps(acc[2 * p], acc[2 * p + 1]),
                         _mm256_unpackhi_ps(acc[2 * p], acc[2 * p + 1]));
  // u[h] lanes: acc[4h .. 4h + 4) summed over lanes 0-3 | the same over lanes 4-7
  const __m256 u0 =
      _mm256_add_ps(_mm256_shuffle_ps(t[0], t[1], 0x44), _mm256_shuffle_ps(t[0], t[1], 0xEE));
  const __m256 u1 =
      _mm256_add_ps(_mm256_shuffle_ps(t[2], t[3], 0x44), _mm256_shuffle_ps(t[2], t[3], 0xEE));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Long key rows (head_dim >= kPrefetchDim) are prefetched ahead in software: the hardware
// prefetchers keep up with short rows but not with several 512-byte streams from L3 or memory
// (measured: about 1.3x faster at head_dim 128 when the cache is not in L2, and slower at 32).
constexpr int64_t kPrefetchDim = 128;

// exp(x) for x <= 0 (and NaN -> NaN), within ~1 ulp: x = n ln2 + r with |r| <= ln2 / 2 (ln2 in
// two parts, Cody-Waite), exp(r) = 1 + (r + r^2 P(r)) with SLEEF's degree-5 minimax P (expf's
// 1-ulp polynomial), then the scaling by 2^n in two normal factors 2^(n >> 1) and
// 2^(n - (n >> 1)), so results down to the subnormals round once. x is clamped below at -110,
// where the result rounds to 0, so -inf gives exactly 0; x = 0 gives exactly 1 (n = 0, r = 0).
KVLENS_AVX2_INLINE __m256 exp_nonpositive_avx2(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(-110.0f), x);  // max returns a NaN x, which propagates
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(0.000198527617612853646278381f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.00139304355252534151077271f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.00833336077630519866943359f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.0416664853692054748535156f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.166666671633720397949219f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_mul_ps(r, r), p, r));
  const __m256i e = _mm256_cvtps_epi32(n);
  const __m256i e1 = _mm256_srai_epi32(e, 1);
  const __m256i e2 = _mm256_sub_epi32(e, e1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// All ones in lane l where seen[l] == 0.
KVLENS_AVX2_INLINE __m256 hidden_lanes_avx2(const uint8_t* seen) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(seen));
  return _mm256_castsi256_ps(
      _mm256_cmpeq_epi32(_mm256_cvtepu8_epi32(bytes), _mm256_setzero_si256()));
}

// -inf where visible[j0 + l] == 0.
KVLENS_AVX2_INLINE __m256 hide_avx2(__m256 x, const uint8_t* seen) {
  return _mm256_blendv_ps(x, _mm256_set1_ps(kMinusInfinity), hidden_lanes_avx2(seen));
}

// All ones in lane l where bit l of `lanes` is set.
KVLENS_AVX2_INLINE __m256i lane_mask_avx2(unsigned lanes) {
  const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(lanes)), bits), bits);
}

// The lanes of the block [j0, j0 + 8) (j0 a multiple of 8) inside the range [begin, end), and of
// those the visible ones (visible may be null: all). Only the in-range bytes of visible are read,
// and no branch depends on them.
KVLENS_AVX2_INLINE unsigned range_lanes(int64_t j0, int64_t begin, int64_t end) {
  const int64_t lo = std::max<int64_t>(begin - j0, 0), hi = std::min<int64_t>(end - j0, 8);
  return lo < hi ? ((1u << hi) - 1u) & ~((1u << lo) - 1u) : 0u;
}
KVLENS_AVX2_INLINE unsigned taking_lanes(const uint8_t* visible, int64_t j0, int64_t begin,
                                         int64_t end) {
  if (!visible) return range_lanes(j0, begin, end);
  unsigned lanes = 0;
  for (int64_t j = std::max(j0, begin); j < std::min(j0 + 8, end); ++j)
    lanes |= unsigned(visible[j] != 0) << (j - j0);
  return lanes;
}

// The logits of the block [j0, j0 + 8) (j0 a multiple of 8) that is cut by the range [begin, end)
// or by the mask: -inf in the lanes outside and in hidden lanes. Nothing outside the range is
// read (a masked load), and no lane goes through memory: a block written lane by lane and read
// back whole stalls the store forwarding.
KVLENS_AVX2_INLINE __m256 edge_logits_avx2(const float* logits, const uint8_t* visible, int64_t j0,
                                           int64_t begin, int64_t end) {
  const __m256i take = lane_mask_avx2(taking_lanes(visible, j0, begin, end));
  return _mm256_blendv_ps(_mm256_set1_ps(kMinusInfinity), _mm256_maskload_ps(logits + j0, take),
                          _mm256_castsi256_ps(take));
}

// A softmax row's 8-column blocks over [begin, end) (begin < end): the first and the last block
// (multiples of 8), whether the range cuts them, and the whole blocks [whole_begin, whole_end).
struct SoftmaxBlocks {
  SoftmaxBlocks(int64_t begin, int64_t end)
      : first(begin / 8 * 8),
        last((end - 1) / 8 * 8),
        cut_first(first < begin || first + 8 > end),
        cut_last(last > first && last + 8 > end),
        whole_begin(cut_first ? first + 8 : first),
        whole_end(cut_last ? last : last + 8) {}
  int64_t first, last;
  bool cut_first, cut_last;
  int64_t whole_begin, whole_end;
};

// The largest of the 8 lanes.
KVLENS_AVX2_INLINE float max_of_lanes(__m256 max8) {
  __m128 max4 = _mm_max_ps(_mm256_castps256_ps128(max8), _mm256_extractf128_ps(max8, 1));
  max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
  return _mm_cvtss_f32(_mm_max_ss(max4, _mm_movehdup_ps(max4)));
}

// The softmax total's fold of 8 lanes: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
KVLENS_AVX2_INLINE float fold_total(__m256 total8) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(total8), _mm256_extractf128_ps(total8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// The softmax weights of the cut block [j0, j0 + 8) (edge_logits_avx2's lanes, exp(x - m)),
// added to total8 and stored for the columns inside [begin, end).
KVLENS_AVX2_INLINE void edge_weights(const float* logits, const uint8_t* visible, int64_t j0,
                                     int64_t begin, int64_t end, __m256 m, __m256& total8,
                                     float* weights) {
  // The lanes that do not take part enter exp as 0 and leave as exactly 0, which is what
  // exp(-inf - m) gives (block_weights' way, without a result below the subnormals).
  const __m256 take = _mm256_castsi256_ps(lane_mask_avx2(taking_lanes(visible, j0, begin, end)));
  const __m256 x = _mm256_and_ps(
      take, _mm256_sub_ps(_mm256_maskload_ps(logits + j0, _mm256_castps_si256(take)), m));
  const __m256 w = _mm256_and_ps(take, exp_nonpositive_avx2(x));
  total8 = _mm256_add_ps(total8, w);
  _mm256_maskstore_ps(weights + j0, lane_mask_avx2(range_lanes(j0, begin, end)), w);
}

// The softmax weights of the whole block [j0, j0 + 8): hidden lanes enter exp as 0 and leave as
// exactly 0. As -inf they would give the same 0, but through a result below the subnormals,
// which costs the FPU a slow assist (measured: half the columns hidden made the masked softmax
// about 1.6x slower than none).
template <bool kMasked>
KVLENS_AVX2_INLINE __m256 block_weights(const float* logits, const uint8_t* visible, int64_t j0,
                                        __m256 m) {
  if constexpr (kMasked) {
    const __m256 hidden = hidden_lanes_avx2(visible + j0);
    const __m256 x = _mm256_andnot_ps(hidden, _mm256_sub_ps(_mm256_loadu_ps(logits + j0), m));
    return _mm256_andnot_ps(hidden, exp_nonpositive_avx2(x));
  } else {
    return exp_nonpositive_avx2(_mm256_sub_ps(_mm256_loadu_ps(logits + j0), m));
  }
}

}  // namespace kvlens::x86
#endif  // KVLENS_HAVE_X86_KERNELS
