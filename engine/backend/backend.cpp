// The default implementations of Backend's operations that a backend may override with a faster
// one (backend.h). Masks are U8 [rows, stride]; counts are host values, one per row.
#include "engine/backend/backend.h"

#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/bandwidth.h"
#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/policy_op_math.h"
#include "engine/common/error.h"

namespace kvlens {

void Backend::count_nonzero_rows(const DeviceTensor& mask, int64_t cols,
                                 std::span<int64_t> counts) {
  const cpu_checks::OpName op{"count_nonzero_rows"};
  cpu_checks::require_cols(cols, op);
  const cpu_checks::RowShape shape =
      cpu_checks::row_shape(mask, DType::U8, int64_t(counts.size()), cols, op + ": mask");
  std::vector<uint8_t> host(size_t(shape.rows * shape.stride));
  to_host(mask, host.data(), host.size());
  for (int64_t r = 0; r < shape.rows; ++r)
    counts[size_t(r)] = count_nonzero(host.data() + r * shape.stride, cols);
}

void Backend::count_nonfinite_rows_deferred(const DeviceTensor& x, int64_t cols,
                                            std::span<int64_t> counts) {
  const cpu_checks::OpName op{"count_nonfinite_rows_deferred"};
  cpu_checks::require_cols(cols, op);
  const cpu_checks::RowShape shape =
      cpu_checks::row_shape(x, DType::F32, int64_t(counts.size()), cols, op + ": x");
  // Host memory is read where it is; a device's rows come back first.
  std::vector<float> copy;
  const float* rows = x.as<const float>();
  if (!host_memory()) {
    copy.resize(size_t(shape.rows * shape.stride));
    to_host(x, copy.data(), copy.size() * sizeof(float));
    rows = copy.data();
  }
  for (int64_t r = 0; r < shape.rows; ++r) {
    int64_t bad = 0;
    for (int64_t j = 0; j < cols; ++j) bad += std::isfinite(rows[r * shape.stride + j]) ? 0 : 1;
    counts[size_t(r)] = bad;
  }
}

void Backend::matmul_many(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                          std::span<DeviceTensor* const> ys) {
  if (ws.size() != ys.size()) {
    throw Error("backend", "matmul_many: ys",
                std::to_string(ws.size()) + " outputs (one per weight)", std::to_string(ys.size()));
  }
  for (size_t i = 0; i < ws.size(); ++i) matmul(x, *ws[i], *ys[i]);
}

void Backend::rope_append_runs(std::span<const RunRopeAppend> runs, int64_t position,
                               const DeviceTensor& inv_freq, float scale) {
  thread_local std::vector<RunAppend> appends;  // reused: every layer of every step
  appends.clear();
  const int64_t positions[] = {position};
  for (const RunRopeAppend& run : runs) {
    if (run.q == nullptr || run.k == nullptr || run.v == nullptr || run.k_cache == nullptr ||
        run.v_cache == nullptr)
      throw Error("backend", "rope_append_runs: runs", "q, k, v and both caches for every run",
                  "a null tensor");
    if (run.q->shape.empty() || run.q->dim(0) != 1 || run.k->shape.empty() || run.k->dim(0) != 1)
      throw Error("backend", "rope_append_runs: q, k", "one row each ([1, heads, D])",
                  "q " + cpu_checks::describe(*run.q) + ", k " + cpu_checks::describe(*run.k));
    rope_pair(*run.q, *run.k, positions, inv_freq, scale);
    appends.push_back({run.k, run.v, run.k_cache, run.v_cache});
  }
  kv_append_runs(appends, position);
}

std::shared_ptr<void> Backend::alloc_host(size_t bytes) {
  return std::shared_ptr<void>(new std::byte[bytes], std::default_delete<std::byte[]>());
}

void Backend::rows_to_host_async(const DeviceTensor& src, int64_t rows, int64_t cols, void* host) {
  const int64_t stride = src.shape.empty() ? 0 : src.shape.back();
  if (rows < 0 || cols < 0 || cols > stride || rows * stride > src.numel()) {
    throw Error("backend", "rows_to_host_async: rows",
                std::to_string(stride) + "-element rows inside " + std::to_string(src.numel()) +
                    " elements, at most that many columns",
                std::to_string(rows) + " x " + std::to_string(cols));
  }
  const size_t element = dtype_size(src.dtype);
  if (cols == stride) return to_host(src, host, size_t(rows * cols) * element);
  for (int64_t r = 0; r < rows; ++r) {
    DeviceTensor row = src;
    row.data = static_cast<std::byte*>(src.data) + size_t(r * stride) * element;
    row.shape = {cols};
    to_host(row, static_cast<std::byte*>(host) + size_t(r * cols) * element,
            size_t(cols) * element);
  }
}

std::unique_ptr<Backend::Fence> Backend::fence() {
  struct Passed final : Fence {
    void wait() override {}
  };
  return std::make_unique<Passed>();
}

double Backend::copy_bandwidth_gbps(size_t bytes, int repeats) {
  return measure_copy_bandwidth_gbps(bytes, repeats);
}

}  // namespace kvlens
