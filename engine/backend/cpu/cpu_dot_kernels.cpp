// Attention kernels for the CPU backend (see cpu_dot_kernels.h), and the choice of the kernel set.
// Each output has one fixed order of operations, so results are bit-identical for any thread
// count and between decode and prefill. The AVX2 kernels use fused multiply-adds, the portable
// ones do not, so the two sets differ in the last bits (both far inside test tolerances); the
// portable set mirrors the AVX2 set's summation trees with std::exp and separate roundings.
#include "engine/backend/cpu/cpu_dot_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "engine/backend/cpu/cpu_attention_x86.h"

#if KVLENS_HAVE_X86_KERNELS
#include <cpuid.h>
#endif

namespace kvlens {
namespace {

// --- attention kernels, portable ---

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// ((l0 + l2) + (l1 + l3)) + ((l4 + l6) + (l5 + l7)): the logits' fold (transpose_sum8 in AVX2).
inline float fold_logit_lanes(const float* l) {
  return ((l[0] + l[2]) + (l[1] + l[3])) + ((l[4] + l[6]) + (l[5] + l[7]));
}

// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)): the softmax total's fold (halves, then
// quarters, then neighbours, as a 256-bit register folds).
inline float fold_halves(const float* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

void attention_logits_generic(const float* q, int64_t q_stride, int nq, const float* keys,
                              int64_t head_dim, int64_t lo, int64_t hi, float scale, float* row,
                              int64_t row_stride) {
  const int64_t body = head_dim / 8 * 8;
  for (int i = 0; i < nq; ++i) {
    const float* qi = q + i * q_stride;
    float* out = row + i * row_stride;
    std::fill(out, out + lo, kNegInf);
    for (int64_t j = lo; j <= hi; ++j) {
      const float* k = keys + j * head_dim;
      float lanes[8] = {};
      for (int64_t d = 0; d < body; d += 8)
        for (int l = 0; l < 8; ++l) lanes[l] += k[d + l] * qi[d + l];
      float sum = fold_logit_lanes(lanes);
      for (int64_t d = body; d < head_dim; ++d) sum += k[d] * qi[d];
      out[j] = sum * scale;
    }
  }
}

// Each listed column through attention_logits_generic over that one column: its operations.
void attention_logits_at_generic(const float* q, const float* keys, int64_t head_dim,
                                 const int32_t* columns, int64_t count, float scale, float* row) {
  for (int64_t c = 0; c < count; ++c) {
    const int64_t j = columns[c];
    attention_logits_generic(q, 0, 1, keys + j * head_dim, head_dim, 0, 0, scale, row + j, 0);
  }
}

int64_t visible_columns_generic(const uint8_t* visible, int64_t begin, int64_t end,
                                int32_t* columns) {
  int64_t count = 0;
  for (int64_t j = begin; j < end; ++j) {
    columns[count] = int32_t(j);
    count += visible[j] != 0;  // no branch: about half the columns are visible
  }
  return count;
}

float softmax_weights_generic(const float* logits, const uint8_t* visible, int64_t begin,
                              int64_t end, float* weights) {
  auto shown = [&](int64_t j) { return !visible || visible[j] != 0; };
  float max_logit = kNegInf;
  for (int64_t j = begin; j < end; ++j)
    if (shown(j)) max_logit = std::max(max_logit, logits[j]);  // passes over NaN
  if (max_logit == kNegInf) {
    std::fill(weights + begin, weights + end, 0.0f);
    return 0.0f;
  }
  float lanes[8] = {};
  for (int64_t j = begin; j < end; ++j) {
    // exp(-inf) is exactly 0, so -inf logits need no test.
    weights[j] = shown(j) ? std::exp(logits[j] - max_logit) : 0.0f;
    lanes[j % 8] += weights[j];
  }
  return fold_halves(lanes);
}

void weighted_values_generic(const float* weights, int64_t weights_stride, int nq,
                             const float* values, int64_t head_dim, int64_t begin, int64_t end,
                             const float* scales, float* out, int64_t out_stride) {
  constexpr int64_t kChunk = 64;
  for (int i = 0; i < nq; ++i) {
    const float* w = weights + i * weights_stride;
    float* o = out + i * out_stride;
    for (int64_t d0 = 0; d0 < head_dim; d0 += kChunk) {
      const int64_t width = std::min(kChunk, head_dim - d0);
      float acc[kChunk] = {};
      for (int64_t j = begin; j < end; ++j) {
        if (w[j] == 0.0f) continue;
        const float* v = values + j * head_dim + d0;
        for (int64_t d = 0; d < width; ++d) acc[d] += w[j] * v[d];
      }
      for (int64_t d = 0; d < width; ++d) o[d0 + d] = acc[d] * scales[i];
    }
  }
}

// weighted_values_generic's sums continued from `sums`, unscaled.
void weighted_values_accumulate_generic(const float* weights, int64_t weights_stride, int nq,
                                        const float* values, int64_t head_dim, int64_t begin,
                                        int64_t end, float* sums, int64_t sums_stride) {
  for (int i = 0; i < nq; ++i) {
    const float* w = weights + i * weights_stride;
    float* acc = sums + i * sums_stride;
    for (int64_t j = begin; j < end; ++j) {
      if (w[j] == 0.0f) continue;
      const float* v = values + j * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) acc[d] += w[j] * v[d];
    }
  }
}

void silu_mul_generic(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const float g = gate[j], e = std::exp(-std::fabs(g));
    out[j] = (g >= 0.0f ? g : g * e) / (1.0f + e) * up[j];
  }
}

#if KVLENS_HAVE_X86_KERNELS

// --- attention kernels, AVX2/FMA ---

using namespace x86;  // the shared helpers (cpu_attention_x86.h)

// A block of logits: Q query rows by K = 8 / Q keys from key j, 8 accumulators (one per (query,
// key) pair, lanes d mod 8) that one transpose-reduce folds instead of 8 horizontal sums; each
// key row is loaded once per step for all Q queries. Pair a's sum is transpose_sum8's fold of its
// own accumulator, then the last head_dim % 8 products by fma in order, then the product with
// scale: the same for any Q or block start. A short last block (count < K, kFull false) repeats
// its last key in the unused rows, so nothing past the cache is read, and stores only `count`
// keys. With `columns` (one query, kGathered) the block's keys are columns[j ..] instead of
// j .. and each logit goes to its own column: the same operations per logit.
template <int Q, bool kFull, bool kPrefetch, int64_t kDim, bool kGathered = false>
KVLENS_AVX2_INLINE void logits_block_avx2(const float* q, int64_t q_stride, const float* keys,
                                          int64_t runtime_dim, int64_t j, int count, __m256 scale,
                                          float* row, int64_t row_stride,
                                          const int32_t* columns = nullptr) {
  static_assert(!kGathered || Q == 1);
  constexpr int K = 8 / Q;
  const int64_t head_dim = kDim > 0 ? kDim : runtime_dim;
  const int64_t body = head_dim / 8 * 8;
  const float* k[K];
  for (int r = 0; r < K; ++r) {
    const int64_t key = j + (kFull ? r : std::min(r, count - 1));
    k[r] = keys + (kGathered ? int64_t(columns[key]) : key) * head_dim;
  }
  __m256 acc[8];  // acc[i * K + r]: query i, key r
  for (int a = 0; a < 8; ++a) acc[a] = _mm256_setzero_ps();
  for (int64_t d = 0; d < body; d += 8) {
    if (kPrefetch && d % 16 == 0) {  // one cache line of each key row two blocks ahead
      for (int r = 0; r < K; ++r) prefetch_ahead(k[r], 2 * K * head_dim + d);
    }
    __m256 kv[K];
    for (int r = 0; r < K; ++r) kv[r] = _mm256_loadu_ps(k[r] + d);
    if constexpr (Q > 1) keep_in_registers(kv);
    for (int i = 0; i < Q; ++i) {
      const __m256 qv = _mm256_loadu_ps(q + i * q_stride + d);
      for (int r = 0; r < K; ++r) acc[i * K + r] = _mm256_fmadd_ps(kv[r], qv, acc[i * K + r]);
    }
  }
  __m256 sums = transpose_sum8(acc);
  if (body < head_dim) {
    alignas(32) float part[8];
    _mm256_store_ps(part, sums);
    for (int a = 0; a < 8; ++a) {
      const float* qi = q + (a / K) * q_stride;
      for (int64_t d = body; d < head_dim; ++d) part[a] = std::fma(k[a % K][d], qi[d], part[a]);
    }
    sums = _mm256_load_ps(part);
  }
  sums = _mm256_mul_ps(sums, scale);
  if constexpr (kGathered) {
    alignas(32) float part[8];
    _mm256_store_ps(part, sums);
    for (int r = 0; r < (kFull ? K : count); ++r) row[columns[j + r]] = part[r];
  } else if constexpr (kFull && Q == 1) {
    _mm256_storeu_ps(row + j, sums);
  } else if constexpr (kFull && Q == 2) {
    _mm_storeu_ps(row + j, _mm256_castps256_ps128(sums));
    _mm_storeu_ps(row + row_stride + j, _mm256_extractf128_ps(sums, 1));
  } else {
    alignas(32) float part[8];
    _mm256_store_ps(part, sums);
    for (int i = 0; i < Q; ++i)
      for (int r = 0; r < (kFull ? K : count); ++r) row[i * row_stride + j + r] = part[i * K + r];
  }
}

template <int Q, bool kPrefetch, int64_t kDim>
KVLENS_AVX2_INLINE void logits_rows_avx2(const float* q, int64_t q_stride, const float* keys,
                                         int64_t head_dim, int64_t lo, int64_t hi, __m256 scale,
                                         float* row, int64_t row_stride) {
  constexpr int K = 8 / Q;
  int64_t j = lo;
  for (; j + K <= hi + 1; j += K)
    logits_block_avx2<Q, true, kPrefetch, kDim>(q, q_stride, keys, head_dim, j, K, scale, row,
                                                row_stride);
  if (j <= hi)
    logits_block_avx2<Q, false, kPrefetch, kDim>(q, q_stride, keys, head_dim, j, int(hi + 1 - j),
                                                 scale, row, row_stride);
}

// kDim: head_dim known at compile time (0: read at run time), so that the common sizes unroll
// their dot products completely; the operations are the same either way.
template <bool kPrefetch, int64_t kDim>
KVLENS_AVX2_INLINE void attention_logits_avx2_t(const float* q, int64_t q_stride, int nq,
                                                const float* keys, int64_t head_dim, int64_t lo,
                                                int64_t hi, float scale, float* row,
                                                int64_t row_stride) {
  for (int i = 0; i < nq; ++i) std::fill(row + i * row_stride, row + i * row_stride + lo, kNegInf);
  const __m256 scale8 = _mm256_set1_ps(scale);
  int i = 0;
  for (; i + 4 <= nq; i += 4)
    logits_rows_avx2<4, kPrefetch, kDim>(q + i * q_stride, q_stride, keys, head_dim, lo, hi, scale8,
                                         row + i * row_stride, row_stride);
  for (; i + 2 <= nq; i += 2)
    logits_rows_avx2<2, kPrefetch, kDim>(q + i * q_stride, q_stride, keys, head_dim, lo, hi, scale8,
                                         row + i * row_stride, row_stride);
  for (; i < nq; ++i)
    logits_rows_avx2<1, kPrefetch, kDim>(q + i * q_stride, q_stride, keys, head_dim, lo, hi, scale8,
                                         row + i * row_stride, row_stride);
}

}  // namespace

KVLENS_AVX2 void x86::attention_logits_avx2(const float* q, int64_t q_stride, int nq,
                                            const float* keys, int64_t head_dim, int64_t lo,
                                            int64_t hi, float scale, float* row,
                                            int64_t row_stride) {
  if (head_dim == 32) {
    attention_logits_avx2_t<false, 32>(q, q_stride, nq, keys, head_dim, lo, hi, scale, row,
                                       row_stride);
  } else if (head_dim == 64) {
    attention_logits_avx2_t<false, 64>(q, q_stride, nq, keys, head_dim, lo, hi, scale, row,
                                       row_stride);
  } else if (head_dim == 128) {
    static_assert(128 >= kPrefetchDim);
    attention_logits_avx2_t<true, 128>(q, q_stride, nq, keys, head_dim, lo, hi, scale, row,
                                       row_stride);
  } else if (head_dim >= kPrefetchDim) {
    attention_logits_avx2_t<true, 0>(q, q_stride, nq, keys, head_dim, lo, hi, scale, row,
                                     row_stride);
  } else {
    attention_logits_avx2_t<false, 0>(q, q_stride, nq, keys, head_dim, lo, hi, scale, row,
                                      row_stride);
  }
}

namespace {

template <int64_t kDim>
KVLENS_AVX2_INLINE void attention_logits_at_avx2_t(const float* q, const float* keys,
                                                   int64_t head_dim, const int32_t* columns,
                                                   int64_t count, float scale, float* row) {
  const __m256 scale8 = _mm256_set1_ps(scale);
  int64_t c = 0;
  for (; c + 8 <= count; c += 8)
    logits_block_avx2<1, true, false, kDim, true>(q, 0, keys, head_dim, c, 8, scale8, row, 0,
                                                  columns);
  if (c < count)
    logits_block_avx2<1, false, false, kDim, true>(q, 0, keys, head_dim, c, int(count - c), scale8,
                                                   row, 0, columns);
}

}  // namespace

KVLENS_AVX2 void x86::attention_logits_at_avx2(const float* q, const float* keys, int64_t head_dim,
                                               const int32_t* columns, int64_t count, float scale,
                                               float* row) {
  if (head_dim == 32) {
    attention_logits_at_avx2_t<32>(q, keys, head_dim, columns, count, scale, row);
  } else if (head_dim == 64) {
    attention_logits_at_avx2_t<64>(q, keys, head_dim, columns, count, scale, row);
  } else {
    attention_logits_at_avx2_t<0>(q, keys, head_dim, columns, count, scale, row);
  }
}

namespace {

// The SiLU product of 8 lanes (SiluMulFn's formula).
KVLENS_AVX2_INLINE __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = exp_nonpositive_avx2(_mm256_or_ps(g, _mm256_set1_ps(-0.0f)));  // exp(-|g|)
  const __m256 nonnegative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ);
  const __m256 numerator = _mm256_blendv_ps(_mm256_mul_ps(g, e), g, nonnegative);
  return _mm256_mul_ps(_mm256_div_ps(numerator, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}

KVLENS_AVX2 void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    _mm256_storeu_ps(out + j, silu_mul8(_mm256_loadu_ps(gate + j), _mm256_loadu_ps(up + j)));
  if (j < n) {  // the tail through the same lanes, so every element gets the same exp
    alignas(32) float g[8] = {}, u[8] = {};
    std::copy(gate + j, gate + n, g);
    std::copy(up + j, up + n, u);
    _mm256_store_ps(g, silu_mul8(_mm256_load_ps(g), _mm256_load_ps(u)));
    std::copy(g, g + (n - j), out + j);
  }
}

// Lanes j mod 8 of the weights, added block by block in ascending j; the first and the last
// block may be cut by the range (they go through edge_logits_avx2 and partial stores).
template <bool kMasked>
KVLENS_AVX2_INLINE float softmax_weights_avx2_t(const float* logits, const uint8_t* visible,
                                                int64_t begin, int64_t end, float* weights) {
  if (begin >= end) return 0.0f;
  const SoftmaxBlocks blocks(begin, end);
  auto block = [&](int64_t j0) KVLENS_AVX2_LAMBDA {
    __m256 x = _mm256_loadu_ps(logits + j0);
    if constexpr (kMasked) x = hide_avx2(x, visible + j0);
    return x;
  };

  __m256 max8 = _mm256_set1_ps(kNegInf);  // max ignores a NaN first operand: NaN passed over
  if (blocks.cut_first)
    max8 = _mm256_max_ps(edge_logits_avx2(logits, visible, blocks.first, begin, end), max8);
  for (int64_t j0 = blocks.whole_begin; j0 < blocks.whole_end; j0 += 8)
    max8 = _mm256_max_ps(block(j0), max8);
  if (blocks.cut_last)
    max8 = _mm256_max_ps(edge_logits_avx2(logits, visible, blocks.last, begin, end), max8);
  const float max_logit = max_of_lanes(max8);
  if (max_logit == kNegInf) {
    std::fill(weights + begin, weights + end, 0.0f);
    return 0.0f;
  }

  const __m256 m = _mm256_set1_ps(max_logit);
  __m256 total8 = _mm256_setzero_ps();
  if (blocks.cut_first) edge_weights(logits, visible, blocks.first, begin, end, m, total8, weights);
  for (int64_t j0 = blocks.whole_begin; j0 < blocks.whole_end; j0 += 8) {
    const __m256 w = block_weights<kMasked>(logits, visible, j0, m);
    total8 = _mm256_add_ps(total8, w);
    _mm256_storeu_ps(weights + j0, w);
  }
  if (blocks.cut_last) edge_weights(logits, visible, blocks.last, begin, end, m, total8, weights);
  return fold_total(total8);
}

}  // namespace

KVLENS_AVX2 float x86::softmax_weights_avx2(const float* logits, const uint8_t* visible,
                                            int64_t begin, int64_t end, float* weights) {
  return visible ? softmax_weights_avx2_t<true>(logits, visible, begin, end, weights)
                 : softmax_weights_avx2_t<false>(logits, nullptr, begin, end, weights);
}

namespace {

// acc[i][c] += w_i[j] * v[8c .. 8c + 8) for the NQ heads, fused, the value row loaded into
// registers once for all of them. kBlend is for a key that some heads see and others do not:
// every head's multiply-add is computed and kept only where its weight is nonzero, so a hidden
// key (weight 0, even with an inf or NaN value) leaves the sums exactly as skipping it would. A
// policy's mask is scattered (about half the keys hidden per head): the blend costs a little more
// than the FMAs, where a branch per key and head would be mispredicted about every other time.
template <int NQ, int C, bool kBlend, bool kPrefetch>
KVLENS_AVX2_INLINE void fma_value_row(__m256 (&acc)[NQ][C], const float* weights,
                                      int64_t weights_stride, int64_t j, const float* v,
                                      int64_t head_dim) {
  if constexpr (kPrefetch) {  // this chunk of the value row 16 keys ahead
    for (int c = 0; c < C; c += 2) prefetch_ahead(v, 16 * head_dim + 8 * c);
  }
  __m256 vv[C];
  for (int c = 0; c < C; ++c) vv[c] = _mm256_loadu_ps(v + 8 * c);
  if constexpr (NQ > 1) keep_in_registers(vv);
  for (int i = 0; i < NQ; ++i) {
    const __m256 w8 = _mm256_broadcast_ss(weights + i * weights_stride + j);
    if constexpr (kBlend) {
      // w != 0, true for NaN (as the scalar test): the weights that take part.
      const __m256 taken = _mm256_cmp_ps(w8, _mm256_setzero_ps(), _CMP_NEQ_UQ);
      for (int c = 0; c < C; ++c)
        acc[i][c] = _mm256_blendv_ps(acc[i][c], _mm256_fmadd_ps(w8, vv[c], acc[i][c]), taken);
    } else {
      for (int c = 0; c < C; ++c) acc[i][c] = _mm256_fmadd_ps(w8, vv[c], acc[i][c]);
    }
  }
}

// The offsets (0-7) of the set bits of each byte value, in ascending order: the keys of a block
// of 8 that a head takes, from the movemask of its nonzero weights.
struct TakenKeys {
  alignas(64) uint8_t offsets[256][8] = {};
  constexpr TakenKeys() {
    for (int mask = 0; mask < 256; ++mask)
      for (int bit = 0, n = 0; bit < 8; ++bit)
        if (mask & (1 << bit)) offsets[mask][n++] = uint8_t(bit);
  }
};
constexpr TakenKeys kTakenKeys;

// visible_columns_generic 8 columns at a time: the offsets of a block's visible bytes from
// kTakenKeys, added to the block's first column, stored as 8 lanes of which the count is kept.
KVLENS_AVX2 int64_t visible_columns_avx2(const uint8_t* visible, int64_t begin, int64_t end,
                                         int32_t* columns) {
  int64_t count = 0, j = begin;
  for (; j + 8 <= end; j += 8) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(visible + j));
    const unsigned shown =
        ~unsigned(_mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_setzero_si128()))) & 0xffu;
    const __m128i offsets =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kTakenKeys.offsets[shown]));
    _mm256_storeu_si256(
        reinterpret_cast<__m256i*>(columns + count),
        _mm256_add_epi32(_mm256_set1_epi32(int32_t(j)), _mm256_cvtepu8_epi32(offsets)));
    count += __builtin_popcount(shown);
  }
  for (; j < end; ++j) {
    columns[count] = int32_t(j);
    count += visible[j] != 0;
  }
  return count;
}

// The keys each of NQ heads takes (nonzero weight) in the blocks of a policy's scattered mask,
// collected in ascending order and then added from the lists: a branch per key and head would be
// mispredicted about every other time, a blend per key and head costs as much as the FMAs
// themselves, and in the lists the hidden keys cost nothing. The heads' lists are walked side by
// side (NQ * C independent FMA chains; one head's C would leave the FMA latency exposed).
template <int NQ>
struct TakenLists {
  static constexpr int kCapacity = 256;  // flushed before a block could overflow it
  alignas(32) int32_t keys[NQ][kCapacity + 8];
  int count[NQ] = {};

  bool any() const {
    for (int i = 0; i < NQ; ++i)
      if (count[i] > 0) return true;
    return false;
  }
  bool nearly_full() const {
    for (int i = 0; i < NQ; ++i)
      if (count[i] > kCapacity - 8) return true;
    return false;
  }
};

// Appends the keys j + t with bit t of taken[i] set to head i's list.
template <int NQ>
KVLENS_AVX2_INLINE void collect_taken(TakenLists<NQ>& lists, const int (&taken)[NQ], int64_t j) {
  const __m256i base = _mm256_set1_epi32(int32_t(j));
  for (int i = 0; i < NQ; ++i) {
    const __m128i offsets =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kTakenKeys.offsets[taken[i]]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lists.keys[i] + lists.count[i]),
                        _mm256_add_epi32(base, _mm256_cvtepu8_epi32(offsets)));
    lists.count[i] += __builtin_popcount(unsigned(taken[i]));
  }
}

// f(std::integral_constant<int, i>) for i = 0 .. N - 1: the head index a compile-time constant,
// so that the accumulators it picks stay in registers (indexed at run time, GCC keeps the whole
// array in memory).
template <typename F, int... I>
KVLENS_AVX2_INLINE void for_each_index(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}

// Adds the listed keys into the accumulators (each head's keys in ascending order) and empties
// the lists.
template <int NQ, int C>
KVLENS_AVX2_INLINE void add_taken(__m256 (&acc)[NQ][C], TakenLists<NQ>& lists, const float* weights,
                                  int64_t weights_stride, const float* values, int64_t head_dim) {
  int common = lists.count[0];
  for (int i = 1; i < NQ; ++i) common = std::min(common, lists.count[i]);
  auto add = [&](auto head, int n) KVLENS_AVX2_LAMBDA {
    constexpr int i = decltype(head)::value;
    const int32_t j = lists.keys[i][n];
    const __m256 w8 = _mm256_broadcast_ss(weights + i * weights_stride + j);
    const float* v = values + j * head_dim;
    for (int c = 0; c < C; ++c)
      acc[i][c] = _mm256_fmadd_ps(w8, _mm256_loadu_ps(v + 8 * c), acc[i][c]);
  };
  constexpr auto heads = std::make_integer_sequence<int, NQ>{};
  for (int n = 0; n < common; ++n)
    for_each_index([&](auto head) KVLENS_AVX2_LAMBDA { add(head, n); }, heads);
  for_each_index(
      [&](auto head) KVLENS_AVX2_LAMBDA {
        for (int n = common; n < lists.count[decltype(head)::value]; ++n) add(head, n);
      },
      heads);
  for (int i = 0; i < NQ; ++i) lists.count[i] = 0;
}

// Columns [0, 8 * C) of NQ heads' weighted sums over keys [begin, end) (values and out already
// offset to the chunk), in NQ * C accumulators (8 for the wide chunks: enough independent FMA
// chains to hide the FMA latency). Aligned blocks of 8 keys whose NQ x 8 weights are all nonzero
// (every block of a dense row, in practice) run without a test per key, blocks of zeros (hidden
// or outside the window) are skipped without reading their values, the keys of the rest go
// through per-head lists of the keys taken (TakenLists), and the keys before and after the
// aligned blocks blend each head's multiply-add by its weight. All give the same fused
// multiply-adds in the same order (each head's taken keys in ascending order).
// kAccumulate: the sums start from out (and are stored back unscaled) instead of from zero, so a
// range split in pieces gives the sums of the whole range.
template <int NQ, int C, bool kPrefetch, bool kAccumulate>
KVLENS_AVX2_INLINE void weighted_values_chunk_avx2(const float* weights, int64_t weights_stride,
                                                   const float* values, int64_t head_dim,
                                                   int64_t begin, int64_t end, const float* scales,
                                                   float* out, int64_t out_stride) {
  __m256 acc[NQ][C];
  for (int i = 0; i < NQ; ++i)
    for (int c = 0; c < C; ++c)
      acc[i][c] = kAccumulate ? _mm256_loadu_ps(out + i * out_stride + 8 * c) : _mm256_setzero_ps();
  int64_t j = begin;
  for (const int64_t aligned = std::min(end, (begin + 7) / 8 * 8); j < aligned; ++j)
    fma_value_row<NQ, C, true, kPrefetch>(acc, weights, weights_stride, j, values + j * head_dim,
                                          head_dim);
  TakenLists<NQ> lists;
  for (; j + 8 <= end; j += 8) {
    int taken[NQ], all_taken = 0xff, any_taken = 0;  // bit t: key j + t
    for (int i = 0; i < NQ; ++i) {
      const __m256 w = _mm256_loadu_ps(weights + i * weights_stride + j);
      // w != 0, true for NaN (as the scalar test).
      taken[i] = _mm256_movemask_ps(_mm256_cmp_ps(w, _mm256_setzero_ps(), _CMP_NEQ_UQ));
      all_taken &= taken[i];
      any_taken |= taken[i];
    }
    if (all_taken == 0xff) {
      if (lists.any()) add_taken<NQ, C>(acc, lists, weights, weights_stride, values, head_dim);
      for (int64_t t = j; t < j + 8; ++t)
        fma_value_row<NQ, C, false, kPrefetch>(acc, weights, weights_stride, t,
                                               values + t * head_dim, head_dim);
    } else if (any_taken != 0) {
      collect_taken<NQ>(lists, taken, j);
      if (lists.nearly_full())
        add_taken<NQ, C>(acc, lists, weights, weights_stride, values, head_dim);
    }
  }
  if (lists.any()) add_taken<NQ, C>(acc, lists, weights, weights_stride, values, head_dim);
  for (; j < end; ++j)
    fma_value_row<NQ, C, true, kPrefetch>(acc, weights, weights_stride, j, values + j * head_dim,
                                          head_dim);
  for (int i = 0; i < NQ; ++i) {
    if constexpr (kAccumulate) {
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + i * out_stride + 8 * c, acc[i][c]);
    } else {
      const __m256 scale = _mm256_set1_ps(scales[i]);
      for (int c = 0; c < C; ++c)
        _mm256_storeu_ps(out + i * out_stride + 8 * c, _mm256_mul_ps(acc[i][c], scale));
    }
  }
}

// Every column of NQ heads: chunks of 8 * C columns, then of 8, then the last head_dim % 8
// columns in scalars with the same operations (fma in ascending j, zeros skipped).
template <int NQ, int C, bool kPrefetch, bool kAccumulate>
KVLENS_AVX2 void weighted_values_heads_avx2(const float* weights, int64_t weights_stride,
                                            const float* values, int64_t head_dim, int64_t begin,
                                            int64_t end, const float* scales, float* out,
                                            int64_t out_stride) {
  int64_t d = 0;
  for (; d + 8 * C <= head_dim; d += 8 * C)
    weighted_values_chunk_avx2<NQ, C, kPrefetch, kAccumulate>(
        weights, weights_stride, values + d, head_dim, begin, end, scales, out + d, out_stride);
  if constexpr (C > 4) {
    for (; d + 32 <= head_dim; d += 32)
      weighted_values_chunk_avx2<NQ, 4, kPrefetch, kAccumulate>(
          weights, weights_stride, values + d, head_dim, begin, end, scales, out + d, out_stride);
  }
  for (; d + 8 <= head_dim; d += 8)
    weighted_values_chunk_avx2<NQ, 1, kPrefetch, kAccumulate>(
        weights, weights_stride, values + d, head_dim, begin, end, scales, out + d, out_stride);
  for (; d < head_dim; ++d) {
    for (int i = 0; i < NQ; ++i) {
      const float* w = weights + i * weights_stride;
      float sum = kAccumulate ? out[i * out_stride + d] : 0.0f;
      for (int64_t j = begin; j < end; ++j)
        if (w[j] != 0.0f) sum = std::fma(w[j], values[j * head_dim + d], sum);
      out[i * out_stride + d] = kAccumulate ? sum : sum * scales[i];
    }
  }
}

template <bool kPrefetch, bool kAccumulate>
KVLENS_AVX2_INLINE void weighted_values_avx2_t(const float* weights, int64_t weights_stride, int nq,
                                               const float* values, int64_t head_dim, int64_t begin,
                                               int64_t end, const float* scales, float* out,
                                               int64_t out_stride) {
  int i = 0;
  for (; i + 4 <= nq; i += 4)
    weighted_values_heads_avx2<4, 2, kPrefetch, kAccumulate>(
        weights + i * weights_stride, weights_stride, values, head_dim, begin, end,
        kAccumulate ? scales : scales + i, out + i * out_stride, out_stride);
  for (; i + 2 <= nq; i += 2)
    weighted_values_heads_avx2<2, 4, kPrefetch, kAccumulate>(
        weights + i * weights_stride, weights_stride, values, head_dim, begin, end,
        kAccumulate ? scales : scales + i, out + i * out_stride, out_stride);
  for (; i < nq; ++i)
    weighted_values_heads_avx2<1, 8, kPrefetch, kAccumulate>(
        weights + i * weights_stride, weights_stride, values, head_dim, begin, end,
        kAccumulate ? scales : scales + i, out + i * out_stride, out_stride);
}

KVLENS_AVX2 void weighted_values_avx2(const float* weights, int64_t weights_stride, int nq,
                                      const float* values, int64_t head_dim, int64_t begin,
                                      int64_t end, const float* scales, float* out,
                                      int64_t out_stride) {
  if (head_dim >= kPrefetchDim) {
    weighted_values_avx2_t<true, false>(weights, weights_stride, nq, values, head_dim, begin, end,
                                        scales, out, out_stride);
  } else {
    weighted_values_avx2_t<false, false>(weights, weights_stride, nq, values, head_dim, begin, end,
                                         scales, out, out_stride);
  }
}

KVLENS_AVX2 void weighted_values_accumulate_avx2(const float* weights, int64_t weights_stride,
                                                 int nq, const float* values, int64_t head_dim,
                                                 int64_t begin, int64_t end, float* sums,
                                                 int64_t sums_stride) {
  if (head_dim >= kPrefetchDim) {
    weighted_values_avx2_t<true, true>(weights, weights_stride, nq, values, head_dim, begin, end,
                                       nullptr, sums, sums_stride);
  } else {
    weighted_values_avx2_t<false, true>(weights, weights_stride, nq, values, head_dim, begin, end,
                                        nullptr, sums, sums_stride);
  }
}

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (ECX): older clang has no "f16c" for __builtin_cpu_supports.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

#endif  // KVLENS_HAVE_X86_KERNELS

}  // namespace

DotKernels pick_dot_kernels(bool allow_simd, bool allow_avx512) {
  DotKernels kernels;
  kernels.matmul_f32 = panel_matmul_generic_f32;
  kernels.matmul_bf16 = panel_matmul_generic_bf16;
  kernels.attention_logits = attention_logits_generic;
  kernels.attention_logits_at = attention_logits_at_generic;
  kernels.visible_columns = visible_columns_generic;
  kernels.softmax_weights = softmax_weights_generic;
  kernels.weighted_values = weighted_values_generic;
  kernels.weighted_values_accumulate = weighted_values_accumulate_generic;
  kernels.silu_mul = silu_mul_generic;
  kernels.axpby = axpby_row_generic;
  kernels.squared_norms = squared_norms_generic;
  kernels.top_k = top_k_row_generic;
  kernels.page_bounds = page_bounds_generic;
  kernels.page_best = page_best_generic;
#if KVLENS_HAVE_X86_KERNELS
  if (allow_simd && cpu_has_avx2_fma()) {
    kernels.isa = "avx2+fma";
    kernels.matmul_f32 = panel_matmul_avx2_f32;
    kernels.matmul_bf16 = panel_matmul_avx2_bf16;
    kernels.attention_logits = x86::attention_logits_avx2;
    kernels.attention_logits_at = x86::attention_logits_at_avx2;
    kernels.visible_columns = visible_columns_avx2;
    kernels.softmax_weights = x86::softmax_weights_avx2;
    kernels.weighted_values = weighted_values_avx2;
    kernels.weighted_values_accumulate = weighted_values_accumulate_avx2;
    kernels.silu_mul = silu_mul_avx2;
    kernels.axpby = axpby_row_avx2;
    kernels.squared_norms = squared_norms_avx2;
    kernels.top_k = top_k_row_avx2;
    kernels.page_bounds = page_bounds_avx2;
    kernels.page_best = page_best_avx2;
    if (allow_avx512 && cpu_has_avx512f()) {
      kernels.isa = "avx2+fma, avx512f matmul, logits, softmax, values";
      kernels.matmul_f32 = panel_matmul_avx512_f32;
      kernels.matmul_bf16 = panel_matmul_avx512_bf16;
      kernels.matmul_limits = kAvx512PanelLimits;
      kernels.attention_logits = x86::attention_logits_avx512;
      kernels.softmax_weights = x86::softmax_weights_avx512;
      kernels.weighted_values_rows = x86::weighted_values_rows_avx512;
      if (cpu_has_avx512_top_k()) {  // BW and VL too: the byte masks
        kernels.isa = "avx2+fma, avx512f matmul, logits, softmax, values, avx512bw top-k";
        kernels.top_k = top_k_row_avx512;
      }
    }
  }
#else
  (void)allow_simd, (void)allow_avx512;
#endif
  return kernels;
}

}  // namespace kvlens
