// Dot-product kernels for the CPU backend (see cpu_dot_kernels.h).
// Dot kernels. dot_rows(x, w, in, rows, y) sets y[r] = sum_k x[k] * w[r * in + k] for r < rows
// (rows <= 4 consecutive weight rows). Each row is summed in one fixed order: lanes k mod 16
// accumulate separately, the 16 partial sums are folded pairwise (16 -> 8 -> 4 -> 2 -> 1), then
// the last in % 8 products are added in order. That order depends neither on `rows` nor on which
// thread runs the row, so results are bit-identical for any thread count and between decode
// (n = 1) and prefill (n > 1). The AVX2 kernels use fused multiply-adds, the portable ones do
// not, so the two kernel sets differ in the last bits (both are far inside test tolerances).
#include "engine/runtime/cpu_dot_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define KVLENS_HAVE_X86_KERNELS 1
#define KVLENS_AVX2 __attribute__((target("avx2,fma,f16c")))
#else
#define KVLENS_HAVE_X86_KERNELS 0
#endif

namespace kvlens {
namespace {

constexpr int kMaxRows = kMaxDotRows;

template <DType W>
inline float load_weight(const void* w, int64_t i) {
  if constexpr (W == DType::F32) {
    return static_cast<const float*>(w)[i];
  } else if constexpr (W == DType::BF16) {
    return bf16_to_f32(static_cast<const uint16_t*>(w)[i]);
  } else {
    return f16_to_f32(static_cast<const uint16_t*>(w)[i]);
  }
}

template <DType W, int R>
void dot_rows_generic_fixed(const float* x, const void* w, int64_t in, float* y) {
  float acc[R][16] = {};
  int64_t k = 0;
  for (; k + 16 <= in; k += 16) {
    for (int r = 0; r < R; ++r) {
      for (int l = 0; l < 16; ++l) acc[r][l] += load_weight<W>(w, r * in + k + l) * x[k + l];
    }
  }
  if (k + 8 <= in) {
    for (int r = 0; r < R; ++r) {
      for (int l = 0; l < 8; ++l) acc[r][l] += load_weight<W>(w, r * in + k + l) * x[k + l];
    }
    k += 8;
  }
  for (int r = 0; r < R; ++r) {
    float s8[8], s4[4], s2[2];
    for (int l = 0; l < 8; ++l) s8[l] = acc[r][l] + acc[r][l + 8];
    for (int l = 0; l < 4; ++l) s4[l] = s8[l] + s8[l + 4];
    for (int l = 0; l < 2; ++l) s2[l] = s4[l] + s4[l + 2];
    float sum = s2[0] + s2[1];
    for (int64_t t = k; t < in; ++t) sum += load_weight<W>(w, r * in + t) * x[t];
    y[r] = sum;
  }
}

template <DType W>
void dot_rows_generic(const float* x, const void* w, int64_t in, int rows, float* y) {
  switch (rows) {
    case 1:
      return dot_rows_generic_fixed<W, 1>(x, w, in, y);
    case 2:
      return dot_rows_generic_fixed<W, 2>(x, w, in, y);
    case 3:
      return dot_rows_generic_fixed<W, 3>(x, w, in, y);
    default:
      return dot_rows_generic_fixed<W, 4>(x, w, in, y);
  }
}

// The portable block: one row of x at a time through the portable row kernel.
template <DType W>
void dot_block_generic(const float* x, int64_t x_stride, int nx, const void* w, int64_t in,
                       int rows, float* y, int64_t y_stride) {
  for (int i = 0; i < nx; ++i) dot_rows_generic<W>(x + i * x_stride, w, in, rows, y + i * y_stride);
}

#if KVLENS_HAVE_X86_KERNELS

// Eight weights widened to F32 (exact for all three dtypes).
template <DType W>
KVLENS_AVX2 inline __m256 load8(const void* w, int64_t i) {
  if constexpr (W == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    const __m128i half =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (W == DType::BF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
    } else {
      return _mm256_cvtph_ps(half);
    }
  }
}

template <DType W, int R>
KVLENS_AVX2 void dot_rows_avx2_fixed(const float* x, const void* w, int64_t in, float* y) {
  __m256 acc0[R], acc1[R];  // lanes k mod 16 in 0..7 and 8..15
  for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= in; k += 16) {
    const __m256 x0 = _mm256_loadu_ps(x + k);
    const __m256 x1 = _mm256_loadu_ps(x + k + 8);
    for (int r = 0; r < R; ++r) {
      acc0[r] = _mm256_fmadd_ps(load8<W>(w, r * in + k), x0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(load8<W>(w, r * in + k + 8), x1, acc1[r]);
    }
  }
  if (k + 8 <= in) {
    const __m256 x0 = _mm256_loadu_ps(x + k);
    for (int r = 0; r < R; ++r) acc0[r] = _mm256_fmadd_ps(load8<W>(w, r * in + k), x0, acc0[r]);
    k += 8;
  }
  for (int r = 0; r < R; ++r) {
    const __m256 s8 = _mm256_add_ps(acc0[r], acc1[r]);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    float sum = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
    for (int64_t t = k; t < in; ++t) sum = std::fma(load_weight<W>(w, r * in + t), x[t], sum);
    y[r] = sum;
  }
}

template <DType W>
KVLENS_AVX2 void dot_rows_avx2(const float* x, const void* w, int64_t in, int rows, float* y) {
  switch (rows) {
    case 1:
      return dot_rows_avx2_fixed<W, 1>(x, w, in, y);
    case 2:
      return dot_rows_avx2_fixed<W, 2>(x, w, in, y);
    case 3:
      return dot_rows_avx2_fixed<W, 3>(x, w, in, y);
    default:
      return dot_rows_avx2_fixed<W, 4>(x, w, in, y);
  }
}

// The block kernel keeps NX x R accumulators for one half of the 16 lanes at a time: the first
// pass sums lanes k mod 16 in 0..7 (plus the trailing 8-chunk, as acc0 does in dot_rows_avx2),
// the second lanes 8..15; each accumulator sees the same fused multiply-adds in the same order as
// in the row kernel, and the fold and the scalar tail are the row kernel's, so outputs match it
// bit for bit. With NX = 4 and R = 3, 12 accumulators + 3 weights + 1 x fit the 16 registers.
template <DType W, int NX, int R>
KVLENS_AVX2 void dot_block_avx2_fixed(const float* x, int64_t x_stride, const void* w, int64_t in,
                                      float* y, int64_t y_stride) {
  alignas(32) float low[NX][R][8];
  __m256 acc[NX][R];
  int64_t tail_begin = 0;
  for (int half = 0; half < 2; ++half) {
    for (int i = 0; i < NX; ++i)
      for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 16 <= in; k += 16) {
      const int64_t at = k + 8 * half;
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = load8<W>(w, r * in + at);
      for (int i = 0; i < NX; ++i) {
        const __m256 xv = _mm256_loadu_ps(x + i * x_stride + at);
        for (int r = 0; r < R; ++r) acc[i][r] = _mm256_fmadd_ps(wv[r], xv, acc[i][r]);
      }
    }
    if (half == 0) {
      if (k + 8 <= in) {
        for (int i = 0; i < NX; ++i) {
          const __m256 xv = _mm256_loadu_ps(x + i * x_stride + k);
          for (int r = 0; r < R; ++r)
            acc[i][r] = _mm256_fmadd_ps(load8<W>(w, r * in + k), xv, acc[i][r]);
        }
        k += 8;
      }
      tail_begin = k;
      for (int i = 0; i < NX; ++i)
        for (int r = 0; r < R; ++r) _mm256_store_ps(low[i][r], acc[i][r]);
    }
  }
  for (int i = 0; i < NX; ++i) {
    for (int r = 0; r < R; ++r) {
      const __m256 s8 = _mm256_add_ps(_mm256_load_ps(low[i][r]), acc[i][r]);
      const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
      const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
      float sum = _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
      for (int64_t t = tail_begin; t < in; ++t)
        sum = std::fma(load_weight<W>(w, r * in + t), x[i * x_stride + t], sum);
      y[i * y_stride + r] = sum;
    }
  }
}

template <DType W, int NX>
KVLENS_AVX2 void dot_block_avx2_x(const float* x, int64_t x_stride, const void* w, int64_t in,
                                  int rows, float* y, int64_t y_stride) {
  switch (rows) {
    case 1:
      return dot_block_avx2_fixed<W, NX, 1>(x, x_stride, w, in, y, y_stride);
    case 2:
      return dot_block_avx2_fixed<W, NX, 2>(x, x_stride, w, in, y, y_stride);
    default:
      return dot_block_avx2_fixed<W, NX, 3>(x, x_stride, w, in, y, y_stride);
  }
}

template <DType W>
KVLENS_AVX2 void dot_block_avx2(const float* x, int64_t x_stride, int nx, const void* w, int64_t in,
                                int rows, float* y, int64_t y_stride) {
  switch (nx) {
    case 1:
      return dot_block_avx2_x<W, 1>(x, x_stride, w, in, rows, y, y_stride);
    case 2:
      return dot_block_avx2_x<W, 2>(x, x_stride, w, in, rows, y, y_stride);
    case 3:
      return dot_block_avx2_x<W, 3>(x, x_stride, w, in, rows, y, y_stride);
    default:
      return dot_block_avx2_x<W, 4>(x, x_stride, w, in, rows, y, y_stride);
  }
}

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
}

#endif  // KVLENS_HAVE_X86_KERNELS

}  // namespace

DotKernels pick_dot_kernels(bool allow_simd) {
  DotKernels kernels;
  kernels.f32 = dot_rows_generic<DType::F32>;
  kernels.bf16 = dot_rows_generic<DType::BF16>;
  kernels.f16 = dot_rows_generic<DType::F16>;
  kernels.f32_block = dot_block_generic<DType::F32>;
  kernels.bf16_block = dot_block_generic<DType::BF16>;
  kernels.f16_block = dot_block_generic<DType::F16>;
#if KVLENS_HAVE_X86_KERNELS
  if (allow_simd && cpu_has_avx2_fma()) {
    kernels.isa = "avx2+fma";
    kernels.f32 = dot_rows_avx2<DType::F32>;
    kernels.bf16 = dot_rows_avx2<DType::BF16>;
    kernels.f16 = dot_rows_avx2<DType::F16>;
    kernels.f32_block = dot_block_avx2<DType::F32>;
    kernels.bf16_block = dot_block_avx2<DType::BF16>;
    kernels.f16_block = dot_block_avx2<DType::F16>;
  }
#else
  (void)allow_simd;
#endif
  return kernels;
}

void scaled_logits_row(DotRowsFn dot, const float* q, const float* keys, int64_t head_dim,
                       int64_t lo, int64_t hi, float scale, float* row) {
  std::fill(row, row + lo, -std::numeric_limits<float>::infinity());
  for (int64_t j = lo; j <= hi; j += kMaxRows) {
    const int rows = int(std::min<int64_t>(kMaxRows, hi + 1 - j));
    dot(q, keys + j * head_dim, head_dim, rows, row + j);
  }
  for (int64_t j = lo; j <= hi; ++j) row[j] *= scale;
}

}  // namespace kvlens
