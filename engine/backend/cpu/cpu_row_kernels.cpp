// Row kernels of the CPU policy ops (see cpu_row_kernels.h). The portable axpby calls std::fma
// per element, which baseline x86-64 code cannot inline (a libm call each); the AVX2 kernel runs
// 8 lanes of the same fused multiply-add, so the bits agree. The AVX2 squared lengths take 8 rows
// at a time: each row's 8 lanes are independent of the other rows' (no add chain per row holds
// the loop up) and one transpose folds the 8 rows' lanes in the portable fold's order.
#include "engine/backend/cpu/cpu_row_kernels.h"

#include <cmath>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define KVLENS_HAVE_X86_ROW_KERNELS 1
#else
#define KVLENS_HAVE_X86_ROW_KERNELS 0
#endif

namespace kvlens {

void axpby_row_generic(float alpha, const float* x, float beta, float* y, int64_t n) {
  if (beta == 0.0f) {
    for (int64_t j = 0; j < n; ++j) y[j] = alpha * x[j];
    return;
  }
  for (int64_t j = 0; j < n; ++j) y[j] = std::fma(alpha, x[j], beta * y[j]);
}

void squared_norms_generic(const float* rows, int64_t count, int64_t dim, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float* v = rows + i * dim;
    float lanes[8] = {};
    int64_t d = 0;
    for (; d + 8 <= dim; d += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += v[d + l] * v[d + l];
    float sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
                ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (; d < dim; ++d) sum += v[d] * v[d];
    out[i] = sum;
  }
}

#if KVLENS_HAVE_X86_ROW_KERNELS

#define KVLENS_ROW_AVX2 __attribute__((target("avx2")))

KVLENS_ROW_AVX2 void squared_norms_avx2(const float* rows, int64_t count, int64_t dim, float* out) {
  const int64_t whole = dim / 8 * 8;
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    // Each row's 8 lanes: the products added in ascending d from 0 (0 + p is p), the 8 rows
    // interleaved so that their add chains overlap.
    __m256 lanes[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) lanes[r] = _mm256_setzero_ps();
    for (int64_t d = 0; d < whole; d += 8) {
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) {
        const __m256 x = _mm256_loadu_ps(rows + (i + r) * dim + d);
        lanes[r] = _mm256_add_ps(lanes[r], _mm256_mul_ps(x, x));
      }
    }
    // Rows r and r + 4 side by side: the low halves plus the high halves give (l0 + l4, l1 + l5,
    // l2 + l6, l3 + l7) of row r (low) and of row r + 4 (high).
    __m256 pairs[4];
    for (int r = 0; r < 4; ++r) {
      pairs[r] = _mm256_add_ps(_mm256_permute2f128_ps(lanes[r], lanes[r + 4], 0x20),
                               _mm256_permute2f128_ps(lanes[r], lanes[r + 4], 0x31));
    }
    // hadd of hadds: (a0 + a1) + (a2 + a3) per row, rows 0-3 low and 4-7 high, in order.
    const __m256 sums =
        _mm256_hadd_ps(_mm256_hadd_ps(pairs[0], pairs[1]), _mm256_hadd_ps(pairs[2], pairs[3]));
    _mm256_storeu_ps(out + i, sums);
    if (whole < dim) {
      for (int r = 0; r < 8; ++r) {
        const float* v = rows + (i + r) * dim;
        float sum = out[i + r];
        for (int64_t d = whole; d < dim; ++d) sum += v[d] * v[d];
        out[i + r] = sum;
      }
    }
  }
  if (i < count) squared_norms_generic(rows + i * dim, count - i, dim, out + i);
}

__attribute__((target("avx2,fma"))) void axpby_row_avx2(float alpha, const float* x, float beta,
                                                        float* y, int64_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  int64_t j = 0;
  if (beta == 0.0f) {
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, _mm256_mul_ps(a, _mm256_loadu_ps(x + j)));
    for (; j < n; ++j) y[j] = alpha * x[j];
    return;
  }
  const __m256 b = _mm256_set1_ps(beta);
  for (; j + 8 <= n; j += 8) {
    const __m256 scaled = _mm256_mul_ps(b, _mm256_loadu_ps(y + j));
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(a, _mm256_loadu_ps(x + j), scaled));
  }
  // The tail through the same instruction, one lane at a time (no libm call).
  for (; j < n; ++j) {
    const __m128 r = _mm_fmadd_ss(_mm_set_ss(alpha), _mm_set_ss(x[j]), _mm_set_ss(beta * y[j]));
    y[j] = _mm_cvtss_f32(r);
  }
}

#endif

}  // namespace kvlens
