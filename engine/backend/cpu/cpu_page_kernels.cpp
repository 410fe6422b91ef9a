// Quest's page kernels (see cpu_page_kernels.h). The AVX2 bounds take 8 pages at once, one page
// per lane: an 8 x 8 block of channels is loaded page by page and transposed, so each page's sum
// still adds its channels in order (the bits of page_bound), but 8 pages' sums advance per
// instruction instead of one strided scalar chain each. AVX2 without FMA: no product is fused
// into a sum.
#include "engine/backend/cpu/cpu_page_kernels.h"

#include <algorithm>
#include <bit>

#include "engine/backend/policy_op_math.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define KVLENS_HAVE_X86_PAGE_KERNELS 1
#else
#define KVLENS_HAVE_X86_PAGE_KERNELS 0
#endif

namespace kvlens {
void page_bounds_generic(const float* q, const float* lows, const float* highs, int64_t pages,
                         int64_t head_dim, bool max_only, float scale, float* bounds) {
  for (int64_t p = 0; p < pages; ++p)
    bounds[p] = page_bound(q, lows + p * head_dim, highs + p * head_dim, head_dim, max_only, scale);
}

void page_best_generic(const float* scores, const uint8_t* chosen, int64_t cols, int64_t page_size,
                       float* best, int32_t* cost) {
  for (int64_t p = 0, j0 = 0; j0 < cols; ++p, j0 += page_size) {
    const int64_t j1 = std::min(j0 + page_size, cols);
    float m = scores[j0];
    int32_t c = chosen[j0] == 0;
    for (int64_t j = j0 + 1; j < j1; ++j) {
      m = fmax_inline(m, scores[j]);
      c += chosen[j] == 0;
    }
    best[p] = m;
    cost[p] = c;
  }
}

#if KVLENS_HAVE_X86_PAGE_KERNELS

#define KVLENS_PAGE_AVX2 __attribute__((target("avx2")))

namespace {

// rows[i] (lane c) -> rows[c] (lane i).
KVLENS_PAGE_AVX2 inline void transpose8(__m256 (&rows)[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    rows[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    rows[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// page_bounds of 8 pages (head_dim a multiple of 8) into bounds[0..7].
template <bool kMaxOnly>
KVLENS_PAGE_AVX2 void eight_page_bounds(const float* q, const float* lows, const float* highs,
                                        int64_t head_dim, float scale, float* bounds) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 sums = _mm256_setzero_ps();
  for (int64_t c0 = 0; c0 < head_dim; c0 += 8) {
    __m256 lo[8], hi[8];
    for (int i = 0; i < 8; ++i) hi[i] = _mm256_loadu_ps(highs + i * head_dim + c0);
    transpose8(hi);
    if constexpr (!kMaxOnly) {
      for (int i = 0; i < 8; ++i) lo[i] = _mm256_loadu_ps(lows + i * head_dim + c0);
      transpose8(lo);
    }
    for (int c = 0; c < 8; ++c) {
      const __m256 qc = _mm256_broadcast_ss(q + c0 + c);
      __m256 term;
      if constexpr (kMaxOnly) {
        term = _mm256_mul_ps(_mm256_andnot_ps(sign, qc), hi[c]);
      } else {
        const __m256 low = _mm256_mul_ps(qc, lo[c]), high = _mm256_mul_ps(qc, hi[c]);
        // low < high ? high : low (ordered: a NaN keeps low, as the scalar test)
        term = _mm256_blendv_ps(low, high, _mm256_cmp_ps(low, high, _CMP_LT_OQ));
      }
      sums = _mm256_add_ps(sums, term);
    }
  }
  _mm256_storeu_ps(bounds, _mm256_mul_ps(sums, _mm256_set1_ps(scale)));
}

// The fmax of 8 lanes (the order does not matter but for the sign of a zero maximum).
KVLENS_PAGE_AVX2 inline float fmax_lanes(__m256 m) {
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float best = lanes[0];
  for (int i = 1; i < 8; ++i) best = fmax_inline(best, lanes[i]);
  return best;
}

}  // namespace

KVLENS_PAGE_AVX2 void page_bounds_avx2(const float* q, const float* lows, const float* highs,
                                       int64_t pages, int64_t head_dim, bool max_only, float scale,
                                       float* bounds) {
  int64_t p = 0;
  if (head_dim % 8 == 0) {
    for (; p + 8 <= pages; p += 8) {
      const float* lo = lows + p * head_dim;
      const float* hi = highs + p * head_dim;
      if (max_only) {
        eight_page_bounds<true>(q, lo, hi, head_dim, scale, bounds + p);
      } else {
        eight_page_bounds<false>(q, lo, hi, head_dim, scale, bounds + p);
      }
    }
  }
  page_bounds_generic(q, lows + p * head_dim, highs + p * head_dim, pages - p, head_dim, max_only,
                      scale, bounds + p);
}

KVLENS_PAGE_AVX2 void page_best_avx2(const float* scores, const uint8_t* chosen, int64_t cols,
                                     int64_t page_size, float* best, int32_t* cost) {
  if (page_size % 8 != 0) return page_best_generic(scores, chosen, cols, page_size, best, cost);
  const int64_t full_pages = cols / page_size;
  for (int64_t p = 0; p < full_pages; ++p) {
    const float* s = scores + p * page_size;
    const uint8_t* c = chosen + p * page_size;
    __m256 m = _mm256_loadu_ps(s);
    int32_t open = 0;
    for (int64_t j = 0; j < page_size; j += 8) {
      if (j > 0) {
        const __m256 v = _mm256_loadu_ps(s + j);
        // fmax_inline lane by lane: take v where v > m or m is NaN.
        const __m256 take =
            _mm256_or_ps(_mm256_cmp_ps(v, m, _CMP_GT_OQ), _mm256_cmp_ps(m, m, _CMP_UNORD_Q));
        m = _mm256_blendv_ps(m, v, take);
      }
      const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + j));
      const int zero_bytes = _mm_movemask_epi8(_mm_cmpeq_epi8(bytes, _mm_setzero_si128())) & 0xff;
      open += std::popcount(unsigned(zero_bytes));
    }
    best[p] = fmax_lanes(m);
    cost[p] = open;
  }
  if (full_pages * page_size < cols) {
    page_best_generic(scores + full_pages * page_size, chosen + full_pages * page_size,
                      cols - full_pages * page_size, page_size, best + full_pages,
                      cost + full_pages);
  }
}

#endif  // KVLENS_HAVE_X86_PAGE_KERNELS

}  // namespace kvlens
