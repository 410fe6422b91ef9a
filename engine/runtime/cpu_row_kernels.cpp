// Row kernels of the CPU policy ops (see cpu_row_kernels.h). The portable axpby calls std::fma
// per element, which baseline x86-64 code cannot inline (a libm call each); the AVX2 kernel runs
// 8 lanes of the same fused multiply-add, so the bits agree.
#include "engine/runtime/cpu_row_kernels.h"

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

#if KVLENS_HAVE_X86_ROW_KERNELS

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
