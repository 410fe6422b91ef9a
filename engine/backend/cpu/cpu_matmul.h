// The CPU backend's matmul: its weight layout, kernels and split over threads. A weight [out, in]
// is repacked once into panels of 16 output rows stored input-column-major, panels: [ceil(out /
// 16)][in][16] (BF16 or F32; the last panel zero-padded), so one load brings the 16 weights of one
// input column of a panel. The kernels keep each output's sum in one register lane: y[i][o] is the
// fused multiply-add chain over k = 0, 1, ..., in - 1, starting from 0. That order depends on
// nothing else (how many rows of x or panels a call takes, the thread, the ISA), so decode, prefill
// and lockstep rows all get the same bits, and the portable kernel (std::fma) gives the AVX2
// kernel's bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "engine/common/dtype.h"

namespace kvlens {

struct DeviceTensor;
class ThreadPool;

inline constexpr int64_t kPanelRows = 16;

// The most (row of x, panel) pairs, rows of x and panels one kernel call takes.
struct PanelCallLimits {
  int pairs = 0, rows = 0, panels = 0;
};
// The AVX2 kernels keep two 8-lane accumulators per pair: 12 accumulators plus the weights and
// one x value fill the 16 registers. The portable kernels take the same shapes.
inline constexpr PanelCallLimits kAvx2PanelLimits{6, 6, 6};
// The AVX-512 kernels keep one 16-lane accumulator per pair: 24 of the 32 registers, the rest
// for up to 4 panel columns and the x value. 12 rows at most, so the 10 rows of a lockstep step
// are one group (each weight read once per step) and prefill groups take 2 panels per call; 4
// panels at most, as more made one-row products (decode) slower on a Zen 5 core.
inline constexpr PanelCallLimits kAvx512PanelLimits{24, 12, 4};
// The largest `rows` of any kernel set.
inline constexpr int kMaxPanelCallRows = std::max(kAvx2PanelLimits.rows, kAvx512PanelLimits.rows);

struct WeightPanels {
  DType dtype = DType::F32;  // BF16 (a BF16 weight) or F32 (F32 and F16 weights, widened)
  int64_t out = 0, in = 0;
  const void* source = nullptr;  // the [out, in] data the panels were made from
  std::shared_ptr<void> storage;

  int64_t count() const { return (out + kPanelRows - 1) / kPanelRows; }
  size_t panel_bytes() const { return size_t(in * kPanelRows) * dtype_size(dtype); }
  const std::byte* panel(int64_t p) const {
    return static_cast<const std::byte*>(storage.get()) + size_t(p) * panel_bytes();
  }
};

// Where a backend's weight panels live: consecutive packs share large mappings (huge pages where
// the system offers them), in upload order, which is the order a decode step reads them. A step
// that streams every weight then needs a few TLB entries instead of one per 4 KiB. Thread-safe.
class PanelArena {
 public:
  // Zero-filled, page-aligned storage that keeps its mapping alive.
  std::shared_ptr<void> allocate(size_t bytes);

 private:
  std::mutex mutex_;
  std::shared_ptr<void> chunk_;
  size_t used_ = 0, size_ = 0;
};

// Repacks an F32, BF16 or F16 weight [out, in] (F16 widened to F32, exactly). Within a BF16
// panel's column, output j sits at element 2j (j < 8) or 2(j - 8) + 1, so that the low and high
// halves of each 32-bit pair widen to outputs 0-7 and 8-15 with one shift and one mask.
// Storage from `arena`, or a mapping of its own when null.
WeightPanels pack_weight_panels(const DeviceTensor& weight, PanelArena* arena = nullptr);

// The panels of `weight`: those upload_weight stored with it (backend_layout) when they still
// describe its data and shape, otherwise packed now into per-thread scratch (valid until the
// thread's next call).
const WeightPanels& panels_for(const DeviceTensor& weight);

// y[i * y_stride + p * 16 + j] = the fused multiply-add chain over k of
// x[i * x_stride + k] * weight(p * 16 + j, k), for i < nx and p < panels (within the kernel set's
// PanelCallLimits), from panels read at `first` (panel_bytes apart). Writes all 16 outputs of every
// panel, the zero padding's included. At each k it also prefetches ahead + p * panel_bytes +
// k * ahead_step for each of its panels (weights it will read later; any address will do).
using PanelMatmulKernel = void(const float* x, int64_t x_stride, int nx, const std::byte* first,
                               int64_t in, int panels, float* y, int64_t y_stride,
                               const std::byte* ahead, int64_t ahead_step);
using PanelMatmulFn = PanelMatmulKernel*;

PanelMatmulKernel panel_matmul_generic_f32, panel_matmul_generic_bf16;
// Only on x86 builds, and only to be called where the CPU has AVX2 and FMA.
PanelMatmulKernel panel_matmul_avx2_f32, panel_matmul_avx2_bf16;
// Only on x86 builds, and only to be called where cpu_has_avx512f().
PanelMatmulKernel panel_matmul_avx512_f32, panel_matmul_avx512_bf16;
bool cpu_has_avx512f();  // AVX-512 Foundation and FMA (false off x86)

// y [n, out] = x [n, in] times the weight's transpose, over the pool's threads, with one of the
// kernels above (the BF16 one for BF16 panels) in calls within its limits.
void panel_matmul(ThreadPool& pool, PanelMatmulFn kernel, PanelCallLimits limits,
                  const WeightPanels& panels, const float* x, int64_t n, float* y);

}  // namespace kvlens
