// The matmul's AVX-512 kernels (cpu_matmul.h): the AVX2 kernels' scheme with one 16-lane
// accumulator per (row of x, panel) pair, so a panel column is one load and the 32 registers hold
// up to kAvx512PanelLimits.pairs accumulators. Each output is still the fused multiply-add chain
// over k = 0, 1, ..., in - 1 from 0, so the bits are those of the AVX2 and portable kernels; on a
// core with full-width AVX-512 FMA units the lockstep products run about twice as fast.
#include "engine/backend/cpu/cpu_matmul.h"

#include <array>
#include <utility>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define KVLENS_HAVE_AVX512_PANELS 1
#define KVLENS_PANEL_AVX512 __attribute__((target("avx512f,fma")))
#else
#define KVLENS_HAVE_AVX512_PANELS 0
#endif

namespace kvlens {

#if KVLENS_HAVE_AVX512_PANELS
namespace {

constexpr int kPairs = kAvx512PanelLimits.pairs, kRows = kAvx512PanelLimits.rows,
              kPanels = kAvx512PanelLimits.panels;

// The zero-masking forms with every lane set are the plain instructions; GCC 12's unmasked
// intrinsics warn of an uninitialized pass-through operand (its bug 105593).
constexpr __mmask16 kAllLanes = 0xFFFF;

// Column k of a panel in output order. A BF16 column is 8 pairs (pack_weight_panels: output j
// in the low half of pair j, output j + 8 in its high half), loaded into both 256-bit halves: the
// low lanes keep the low halves (shifted up), the high lanes the high halves (masked), two ALU
// operations where a widening load would take the shuffle unit.
template <DType W>
KVLENS_PANEL_AVX512 inline __m512 load_column(const std::byte* panel, int64_t k) {
  if constexpr (W == DType::BF16) {
    const __m512i pairs = _mm512_maskz_broadcast_i64x4(
        0xFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel) + k));
    const __m512i low = _mm512_maskz_slli_epi32(kAllLanes, pairs, 16);
    return _mm512_castsi512_ps(
        _mm512_mask_and_epi32(low, 0xFF00, pairs, _mm512_set1_epi32(int(0xffff0000u))));
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(panel) + k * kPanelRows);
  }
}

template <DType W, int NX, int P>
KVLENS_PANEL_AVX512 void panel_matmul_avx512_fixed(const float* x, int64_t x_stride,
                                                   const std::byte* first, int64_t in, float* y,
                                                   int64_t y_stride, const std::byte* ahead,
                                                   int64_t ahead_step) {
  static_assert(NX * P <= kPairs && NX <= kRows && P <= kPanels);
  const size_t panel_bytes = size_t(in * kPanelRows) * dtype_size(W);
  __m512 acc[NX * P];
#pragma GCC unroll 24
  for (int a = 0; a < NX * P; ++a) acc[a] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t k = 0; k < in; ++k) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      _mm_prefetch(
          reinterpret_cast<const char*>(ahead + size_t(p) * panel_bytes + size_t(k * ahead_step)),
          _MM_HINT_T0);
    }
    __m512 column[P];
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) column[p] = load_column<W>(first + size_t(p) * panel_bytes, k);
#pragma GCC unroll 12
    for (int i = 0; i < NX; ++i) {
      const __m512 xv = _mm512_set1_ps(x[i * x_stride + k]);
#pragma GCC unroll 4
      for (int p = 0; p < P; ++p) acc[i * P + p] = _mm512_fmadd_ps(column[p], xv, acc[i * P + p]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < NX; ++i) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      _mm512_storeu_ps(y + i * y_stride + p * kPanelRows, acc[i * P + p]);
    }
  }
}

template <DType W, int NX, int P>
constexpr PanelMatmulFn fixed_kernel() {
  if constexpr (NX * P > kPairs) {
    return nullptr;
  } else {
    return [](const float* x, int64_t x_stride, int, const std::byte* first, int64_t in, int,
              float* y, int64_t y_stride, const std::byte* ahead, int64_t ahead_step) {
      panel_matmul_avx512_fixed<W, NX, P>(x, x_stride, first, in, y, y_stride, ahead, ahead_step);
    };
  }
}

template <DType W, int NX, int... Ps>
constexpr std::array<PanelMatmulFn, kPanels> kernels_of_rows(std::integer_sequence<int, Ps...>) {
  return {fixed_kernel<W, NX, Ps + 1>()...};
}

template <DType W, int... NXs>
constexpr std::array<std::array<PanelMatmulFn, kPanels>, kRows> kernel_table(
    std::integer_sequence<int, NXs...>) {
  return {kernels_of_rows<W, NXs + 1>(std::make_integer_sequence<int, kPanels>())...};
}

template <DType W>
void panel_matmul_avx512(const float* x, int64_t x_stride, int nx, const std::byte* first,
                         int64_t in, int panels, float* y, int64_t y_stride, const std::byte* ahead,
                         int64_t ahead_step) {
  // [nx - 1][panels - 1]: every shape within kAvx512PanelLimits.
  static constexpr auto kKernels = kernel_table<W>(std::make_integer_sequence<int, kRows>());
  const PanelMatmulFn kernel = nx >= 1 && nx <= kRows && panels >= 1 && panels <= kPanels
                                   ? kKernels[size_t(nx - 1)][size_t(panels - 1)]
                                   : nullptr;
  if (kernel) return kernel(x, x_stride, nx, first, in, panels, y, y_stride, ahead, ahead_step);
  // Not a shape panel_matmul issues; the portable loop gives the same bits.
  (W == DType::BF16 ? panel_matmul_generic_bf16 : panel_matmul_generic_f32)(
      x, x_stride, nx, first, in, panels, y, y_stride, ahead, ahead_step);
}

}  // namespace

void panel_matmul_avx512_f32(const float* x, int64_t x_stride, int nx, const std::byte* first,
                             int64_t in, int panels, float* y, int64_t y_stride,
                             const std::byte* ahead, int64_t ahead_step) {
  panel_matmul_avx512<DType::F32>(x, x_stride, nx, first, in, panels, y, y_stride, ahead,
                                  ahead_step);
}
void panel_matmul_avx512_bf16(const float* x, int64_t x_stride, int nx, const std::byte* first,
                              int64_t in, int panels, float* y, int64_t y_stride,
                              const std::byte* ahead, int64_t ahead_step) {
  panel_matmul_avx512<DType::BF16>(x, x_stride, nx, first, in, panels, y, y_stride, ahead,
                                   ahead_step);
}

bool cpu_has_avx512f() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
}

#else

bool cpu_has_avx512f() {
  return false;
}

#endif  // KVLENS_HAVE_AVX512_PANELS

}  // namespace kvlens
