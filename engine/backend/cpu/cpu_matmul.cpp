// The CPU matmul (see cpu_matmul.h): weight panels, the kernels, and the split over threads. A
// kernel call walks k once; per k it broadcasts x[i][k] and multiplies it into two 8-lane
// accumulators per panel, so no horizontal sums remain at the end and 12 accumulators cover the
// FMA units' latency. On the demo model's 10-row lockstep products with the weights in L2 or L3
// this runs at 80-100% of the FMA peak (the previous dot-product kernels, which folded 16 lanes
// per output, ran at about 60%). Each call prefetches the panels its task reads next: in the
// lockstep benchmark that took the 128-token ratio from about 4.05 to 3.5.
#include "engine/backend/cpu/cpu_matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/cpu/cpu_shared_pages.h"
#include "engine/backend/thread_pool.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define KVLENS_HAVE_X86_PANELS 1
#define KVLENS_PANEL_AVX2 __attribute__((target("avx2,fma")))
#else
#define KVLENS_HAVE_X86_PANELS 0
#endif

namespace kvlens {
namespace {

// Where output j of a BF16 panel column sits (see pack_weight_panels).
constexpr int64_t bf16_slot(int64_t j) {
  return j < 8 ? 2 * j : 2 * (j - 8) + 1;
}

template <typename Element, typename Store>
void fill_panels(const WeightPanels& panels, Store store) {
  auto* base = static_cast<Element*>(panels.storage.get());
  for (int64_t p = 0; p < panels.count(); ++p) {
    Element* panel = base + p * panels.in * kPanelRows;
    for (int64_t j = 0; j < kPanelRows && p * kPanelRows + j < panels.out; ++j)
      store(panel, p * kPanelRows + j, j);
  }
}

}  // namespace

std::shared_ptr<void> PanelArena::allocate(size_t bytes) {
  constexpr size_t kChunkBytes = 32u << 20, kPageBytes = 4096;
  bytes = std::max<size_t>(kPageBytes, (bytes + kPageBytes - 1) / kPageBytes * kPageBytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!chunk_ || used_ + bytes > size_) {
    size_ = std::max(kChunkBytes, bytes);
    chunk_ = allocate_host(size_);  // the rest of the previous chunk is never touched
    used_ = 0;
  }
  void* start = static_cast<std::byte*>(chunk_.get()) + used_;
  used_ += bytes;
  return std::shared_ptr<void>(chunk_, start);
}

WeightPanels pack_weight_panels(const DeviceTensor& weight, PanelArena* arena) {
  KVLENS_REQUIRE(
      weight.shape.size() == 2 &&
          (weight.dtype == DType::F32 || weight.dtype == DType::BF16 || weight.dtype == DType::F16),
      "matmul: w", "an F32/BF16/F16 [out, in] tensor", cpu_checks::describe(weight));
  WeightPanels panels;
  panels.dtype = weight.dtype == DType::BF16 ? DType::BF16 : DType::F32;
  panels.out = weight.dim(0);
  panels.in = weight.dim(1);
  panels.source = weight.data;
  // Zero-filled, so the last panel's padding multiplies to zeros.
  const size_t bytes = std::max<size_t>(1, size_t(panels.count()) * panels.panel_bytes());
  panels.storage = arena ? arena->allocate(bytes) : allocate_host(bytes);
  const int64_t in = panels.in;
  if (panels.dtype == DType::BF16) {
    const uint16_t* source = weight.as<const uint16_t>();
    fill_panels<uint16_t>(panels, [&](uint16_t* panel, int64_t row, int64_t j) {
      const uint16_t* from = source + row * in;
      for (int64_t k = 0; k < in; ++k) panel[k * kPanelRows + bf16_slot(j)] = from[k];
    });
  } else {
    std::vector<float> widened(static_cast<size_t>(in));
    fill_panels<float>(panels, [&](float* panel, int64_t row, int64_t j) {
      cpu_checks::widen(weight, row * in, in, widened.data());
      for (int64_t k = 0; k < in; ++k) panel[k * kPanelRows + j] = widened[size_t(k)];
    });
  }
  return panels;
}

namespace {

template <DType W>
float panel_weight(const std::byte* panel, int64_t k, int64_t j) {
  if constexpr (W == DType::BF16) {
    return bf16_to_f32(reinterpret_cast<const uint16_t*>(panel)[k * kPanelRows + bf16_slot(j)]);
  } else {
    return reinterpret_cast<const float*>(panel)[k * kPanelRows + j];
  }
}

template <DType W>
void panel_matmul_generic(const float* x, int64_t x_stride, int nx, const std::byte* first,
                          int64_t in, int panels, float* y, int64_t y_stride) {
  const size_t panel_bytes = size_t(in * kPanelRows) * dtype_size(W);
  for (int i = 0; i < nx; ++i) {
    for (int p = 0; p < panels; ++p) {
      const std::byte* panel = first + size_t(p) * panel_bytes;
      for (int64_t j = 0; j < kPanelRows; ++j) {
        float sum = 0.0f;
        for (int64_t k = 0; k < in; ++k)
          sum = std::fma(x[i * x_stride + k], panel_weight<W>(panel, k, j), sum);
        y[i * y_stride + p * kPanelRows + j] = sum;
      }
    }
  }
}

#if KVLENS_HAVE_X86_PANELS

// The 16 weights of column k of a panel as outputs 0-7 and 8-15.
template <DType W>
KVLENS_PANEL_AVX2 inline void load_column(const std::byte* panel, int64_t k, __m256& low,
                                          __m256& high) {
  if constexpr (W == DType::BF16) {
    const __m256i pairs =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel) + k);  // 32 bytes per column
    low = _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16));
    high = _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(int(0xffff0000u))));
  } else {
    const float* column = reinterpret_cast<const float*>(panel) + k * kPanelRows;
    low = _mm256_loadu_ps(column);
    high = _mm256_loadu_ps(column + 8);
  }
}

// The accumulators live in one flat array whose loops unroll completely, so GCC keeps all of
// them in registers (a nested array was spilled and reloaded every k).
template <DType W, int NX, int P>
KVLENS_PANEL_AVX2 void panel_matmul_avx2_fixed(const float* x, int64_t x_stride,
                                               const std::byte* first, int64_t in, float* y,
                                               int64_t y_stride, const std::byte* ahead,
                                               int64_t ahead_step) {
  static_assert(NX * P <= kAvx2PanelLimits.pairs);
  constexpr int kAccumulators = 2 * NX * P;
  const size_t panel_bytes = size_t(in * kPanelRows) * dtype_size(W);
  __m256 acc[kAccumulators];
#pragma GCC unroll 12
  for (int a = 0; a < kAccumulators; ++a) acc[a] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t k = 0; k < in; ++k) {
#pragma GCC unroll 6
    for (int p = 0; p < P; ++p) {
      const std::byte* panel = first + size_t(p) * panel_bytes;
      _mm_prefetch(
          reinterpret_cast<const char*>(ahead + size_t(p) * panel_bytes + size_t(k * ahead_step)),
          _MM_HINT_T0);
      __m256 low, high;
      load_column<W>(panel, k, low, high);
#pragma GCC unroll 6
      for (int i = 0; i < NX; ++i) {
        const __m256 xv = _mm256_broadcast_ss(x + i * x_stride + k);
        acc[2 * (i * P + p)] = _mm256_fmadd_ps(low, xv, acc[2 * (i * P + p)]);
        acc[2 * (i * P + p) + 1] = _mm256_fmadd_ps(high, xv, acc[2 * (i * P + p) + 1]);
      }
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < NX; ++i) {
#pragma GCC unroll 6
    for (int p = 0; p < P; ++p) {
      float* out = y + i * y_stride + p * kPanelRows;
      _mm256_storeu_ps(out, acc[2 * (i * P + p)]);
      _mm256_storeu_ps(out + 8, acc[2 * (i * P + p) + 1]);
    }
  }
}

// One (rows of x, panels) shape's kernel as a PanelMatmulFn (nx and panels are implied).
template <DType W, int NX, int P>
constexpr PanelMatmulFn fixed_kernel() {
  return [](const float* x, int64_t x_stride, int, const std::byte* first, int64_t in, int,
            float* y, int64_t y_stride, const std::byte* ahead, int64_t ahead_step) {
    panel_matmul_avx2_fixed<W, NX, P>(x, x_stride, first, in, y, y_stride, ahead, ahead_step);
  };
}

template <DType W>
void panel_matmul_avx2(const float* x, int64_t x_stride, int nx, const std::byte* first, int64_t in,
                       int panels, float* y, int64_t y_stride, const std::byte* ahead,
                       int64_t ahead_step) {
  // [nx - 1][panels - 1]: every shape with nx * panels <= kAvx2PanelLimits.pairs.
  static constexpr PanelMatmulFn kKernels[kAvx2PanelLimits.pairs][kAvx2PanelLimits.pairs] = {
      {fixed_kernel<W, 1, 1>(), fixed_kernel<W, 1, 2>(), fixed_kernel<W, 1, 3>(),
       fixed_kernel<W, 1, 4>(), fixed_kernel<W, 1, 5>(), fixed_kernel<W, 1, 6>()},
      {fixed_kernel<W, 2, 1>(), fixed_kernel<W, 2, 2>(), fixed_kernel<W, 2, 3>()},
      {fixed_kernel<W, 3, 1>(), fixed_kernel<W, 3, 2>()},
      {fixed_kernel<W, 4, 1>()},
      {fixed_kernel<W, 5, 1>()},
      {fixed_kernel<W, 6, 1>()}};
  const PanelMatmulFn kernel =
      nx >= 1 && nx <= kAvx2PanelLimits.pairs && panels >= 1 && panels <= kAvx2PanelLimits.pairs
          ? kKernels[nx - 1][panels - 1]
          : nullptr;
  if (kernel) return kernel(x, x_stride, nx, first, in, panels, y, y_stride, ahead, ahead_step);
  // Not a shape the callers use; the portable loop gives the same bits.
  panel_matmul_generic<W>(x, x_stride, nx, first, in, panels, y, y_stride);
}

#endif  // KVLENS_HAVE_X86_PANELS

}  // namespace

void panel_matmul_generic_f32(const float* x, int64_t x_stride, int nx, const std::byte* first,
                              int64_t in, int panels, float* y, int64_t y_stride,
                              const std::byte* ahead, int64_t ahead_step) {
  (void)ahead, (void)ahead_step;
  panel_matmul_generic<DType::F32>(x, x_stride, nx, first, in, panels, y, y_stride);
}
void panel_matmul_generic_bf16(const float* x, int64_t x_stride, int nx, const std::byte* first,
                               int64_t in, int panels, float* y, int64_t y_stride,
                               const std::byte* ahead, int64_t ahead_step) {
  (void)ahead, (void)ahead_step;
  panel_matmul_generic<DType::BF16>(x, x_stride, nx, first, in, panels, y, y_stride);
}

namespace {

// The last panel when out is not a multiple of 16: computed in full into scratch, of which the
// valid outputs are copied.
void partial_panel(PanelMatmulFn kernel, const float* x, int nx, const WeightPanels& panels,
                   int64_t p, float* y) {
  float scratch[kMaxPanelCallRows * kPanelRows];
  kernel(x, panels.in, nx, panels.panel(p), panels.in, 1, scratch, kPanelRows, panels.panel(p), 0);
  const int64_t first = p * kPanelRows, width = panels.out - first;
  for (int i = 0; i < nx; ++i) {
    std::memcpy(y + i * panels.out + first, scratch + i * kPanelRows,
                size_t(width) * sizeof(float));
  }
}

}  // namespace

const WeightPanels& panels_for(const DeviceTensor& weight) {
  const auto* packed = static_cast<const WeightPanels*>(weight.backend_layout.get());
  if (packed && packed->source == weight.data && packed->out == weight.dim(0) &&
      packed->in == weight.dim(1) &&
      (packed->dtype == DType::BF16) == (weight.dtype == DType::BF16)) {
    return *packed;
  }
  thread_local WeightPanels scratch;  // per thread: tasks of run_tasks may issue matmuls
  scratch = pack_weight_panels(weight);
  return scratch;
}

void panel_matmul(ThreadPool& pool, PanelMatmulFn kernel, PanelCallLimits limits,
                  const WeightPanels& panels, const float* x, int64_t n, float* y) {
  const int64_t in = panels.in, out = panels.out;
  // The rows of x go through the kernel in groups of nearly equal size (10 lockstep runs with
  // the AVX2 kernels as 5 + 5: 10 accumulators each; with AVX-512 as one group by 2 panels),
  // each call taking as many panels as the accumulators allow (AVX2: 6 for one row). Few rows
  // (decode, lockstep) go panel by panel, every group over a panel in turn while it is in L1; many
  // (prefill) go by blocks of panels that stay in L2 while every group passes over them. Either way
  // the weights come from memory once per call.
  const int64_t groups = (n + limits.rows - 1) / limits.rows;
  const int64_t group_rows = (n + groups - 1) / groups;
  auto panels_for_rows = [&](int64_t rows) {
    return std::clamp<int64_t>(limits.pairs / rows, 1, limits.panels);
  };
  const int64_t panels_per_call = panels_for_rows(group_rows);
  const bool by_panel = groups <= 2;
  constexpr size_t kBlockBytes = 256 * 1024;
  const int64_t block =
      by_panel ? panels_per_call
               : std::max<int64_t>(panels_per_call, int64_t(kBlockBytes / panels.panel_bytes()));
  // Tasks of a whole number of calls where that splits evenly over the threads (16 panels of one
  // row on 2 threads: 4 x 4, not 6 + 6 + 4).
  const int64_t count = panels.count(), threads = pool.size();
  const int64_t calls = (count + panels_per_call - 1) / panels_per_call;
  const int64_t tasks = (calls + threads - 1) / threads * threads;
  const int64_t grain = (count + tasks - 1) / tasks;
  const int64_t full_panels = out / kPanelRows;  // the last one may be partial
  // While a call computes, it prefetches what the next call of its task reads: panel by panel,
  // each group fetches its share of the next panels, so the weights stream from memory without
  // a pause while the FMAs run (the hardware prefetchers stop at page ends).
  const int64_t column_bytes = int64_t(panels.panel_bytes()) / in;
  pool.parallel_for(
      0, count,
      [&](int64_t panel_begin, int64_t panel_end) {
        for (int64_t b0 = panel_begin; b0 < panel_end; b0 += block) {
          const int64_t b1 = std::min(panel_end, b0 + block);
          for (int64_t i = 0, g = 0; i < n; i += group_rows, ++g) {
            const int nx = int(std::min(group_rows, n - i));
            const int64_t per_call = panels_for_rows(nx);
            for (int64_t p = b0; p < b1;) {
              if (p >= full_panels) {
                partial_panel(kernel, x + i * in, nx, panels, p, y + i * out);
                ++p;
                continue;
              }
              const int64_t whole = std::min({per_call, b1 - p, full_panels - p});
              const std::byte* ahead = panels.panel(p);
              int64_t ahead_step = 0;
              if (by_panel && p + whole < count) {
                ahead =
                    panels.panel(p + whole) + size_t(g) * (panels.panel_bytes() / size_t(groups));
                ahead_step = column_bytes / groups;
              }
              kernel(x + i * in, in, nx, panels.panel(p), in, int(whole),
                     y + i * out + p * kPanelRows, out, ahead, ahead_step);
              p += whole;
            }
          }
        }
      },
      grain);
}

#if KVLENS_HAVE_X86_PANELS
void panel_matmul_avx2_f32(const float* x, int64_t x_stride, int nx, const std::byte* first,
                           int64_t in, int panels, float* y, int64_t y_stride,
                           const std::byte* ahead, int64_t ahead_step) {
  panel_matmul_avx2<DType::F32>(x, x_stride, nx, first, in, panels, y, y_stride, ahead, ahead_step);
}
void panel_matmul_avx2_bf16(const float* x, int64_t x_stride, int nx, const std::byte* first,
                            int64_t in, int panels, float* y, int64_t y_stride,
                            const std::byte* ahead, int64_t ahead_step) {
  panel_matmul_avx2<DType::BF16>(x, x_stride, nx, first, in, panels, y, y_stride, ahead,
                                 ahead_step);
}
#endif

}  // namespace kvlens
