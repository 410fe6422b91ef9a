// Views over a session's scratch and policy buffers (rows, row ranges, reshapes; no storage of
// their own) and the timing of a run's own work, shared by the files of DecoderSession.
#pragma once

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"

namespace kvlens::tensor {

// The same storage seen with another shape (rows of a scratch buffer, or a reshape).
inline DeviceTensor view(const DeviceTensor& tensor, std::vector<int64_t> shape) {
  DeviceTensor result = tensor;
  result.shape = std::move(shape);
  return result;
}

// `shape` of `dtype` at byte `offset` of `bytes`, over the same storage.
inline DeviceTensor rows_of(const DeviceTensor& bytes, int64_t offset, DType dtype,
                            std::vector<int64_t> shape) {
  DeviceTensor result = bytes;
  result.data = static_cast<std::byte*>(bytes.data) + offset;
  result.dtype = dtype;
  result.shape = std::move(shape);
  return result;
}

// Columns [0, cols) of row `row` of a [rows, stride] F32 tensor, as a [1, cols] tensor.
inline DeviceTensor row_prefix(const DeviceTensor& tensor, int64_t row, int64_t cols) {
  DeviceTensor result = tensor;
  result.data = tensor.as<float>() + row * tensor.dim(1);
  result.shape = {1, cols};
  return result;
}

// Row `row` of a [n, ...] tensor as a [1, ...] tensor over the same storage.
inline DeviceTensor row_view(const DeviceTensor& tensor, int64_t row) {
  DeviceTensor result = tensor;
  const int64_t row_elems = tensor.numel() / tensor.dim(0);
  result.data =
      static_cast<std::byte*>(tensor.data) + size_t(row * row_elems) * dtype_size(tensor.dtype);
  result.shape[0] = 1;
  return result;
}

// Rows [first, first + count) of a [n, ...] tensor, over the same storage.
inline DeviceTensor row_range(const DeviceTensor& tensor, int64_t first, int64_t count) {
  DeviceTensor result = row_view(tensor, first);
  result.shape[0] = count;
  return result;
}

// Runs work() and adds its wall time to `seconds`.
template <typename Work>
void timed_work(double& seconds, Work&& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kvlens::tensor
