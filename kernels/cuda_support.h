// Host-side helpers of the CUDA backend (kernels/cuda_backend_impl.h): CUDA and cuBLAS status
// checks, operand checks that name the op and what it expected, and device and pinned memory
// owned by smart pointers. Row tensors of the policy ops are [rows, stride], row-major.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend/backend.h"
#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {

// CUDA and cuBLAS failures become kvlens::Error("cuda", call, ...).
void check_cuda(cudaError_t status, const char* call);
// Launch errors (bad configuration) show up at once; faults inside a kernel surface at the next
// synchronizing call, which then reports them.
void check_launch(const char* kernel);
void check_cublas(cublasStatus_t status, const char* call);

// Concatenates message pieces. (Chains of `"literal" + std::to_string(...)` trip a GCC 12
// -Wrestrict false positive at -O3.)
std::string cat(std::initializer_list<std::string_view> parts);
std::string shape_string(const std::vector<int64_t>& shape);
std::string describe(const DeviceTensor& t);  // "BF16 [2, 3]"
[[noreturn]] void bad_argument(const std::string& op, const std::string& expected,
                               const std::string& found);

// Element counts computed here (not DeviceTensor::numel) so that negative dimensions are
// reported instead of wrapping.
int64_t element_count(const std::vector<int64_t>& shape, const std::string& op);
int64_t elements(const DeviceTensor& t);
size_t byte_size(const DeviceTensor& t);
bool is_weight_dtype(DType dtype);  // F32, BF16 or F16

// Checks the dtype of an operand and that it has storage when it has elements.
void require(const DeviceTensor& t, DType dtype, const std::string& op, const char* what);
void require_weight(const DeviceTensor& t, const std::string& op, const char* what);
void require_elements(const DeviceTensor& t, int64_t count, const std::string& op,
                      const char* what);

// A [rows, stride] row tensor of the policy ops (rows < 0: any row count) with stride >= cols.
struct RowShape {
  int64_t rows = 0, stride = 0;
};
RowShape row_shape(const DeviceTensor& t, DType dtype, int64_t rows, int64_t cols,
                   const std::string& op, const char* what);
template <typename T>
RowsRef<T> rows_ref(const DeviceTensor& t, const RowShape& shape) {
  return {static_cast<T*>(t.data), shape.stride};
}
// An optional U8 [rows, stride] mask operand (eligible, keep), checked as row_shape checks; empty
// (null data) where t is null.
inline RowsRef<const uint8_t> optional_mask_ref(const DeviceTensor* t, int64_t rows, int64_t cols,
                                                const std::string& op, const char* what) {
  if (t == nullptr) return {};
  return rows_ref<const uint8_t>(*t, row_shape(*t, DType::U8, rows, cols, op, what));
}
// Columns are packed into 32 bits by top_k_key; every policy op keeps to the same range.
void require_cols(int64_t cols, const std::string& op);

// What the CUDA backend keeps in DeviceTensor::backend_layout of an uploaded weight: the bytes
// upload_weight filled, which no op writes afterwards. A tensor (or view) inside them may be read
// before the kernels ahead of its reader have finished (the decode products' first weights).
struct WeightExtent {
  const void* data = nullptr;
  size_t bytes = 0;
};
bool is_uploaded_weight(const DeviceTensor& t);

// Device memory owned by a shared_ptr; the deleter frees it on the device it came from. It
// ignores errors: deleters must not throw, and at process exit the runtime may already be gone.
// cudaFree synchronizes the device, so memory still read by queued kernels is not reused early.
std::shared_ptr<void> device_alloc(int device, size_t bytes);

// A device buffer reused across calls (staged host spans, results, widened weights). Reuse is
// safe because every use is ordered on the stream of the lane that owns it.
class Scratch {
 public:
  void* get(int device, size_t bytes);

 private:
  std::shared_ptr<void> memory_;
  size_t bytes_ = 0;
};

struct PinnedDeleter {
  void operator()(int64_t* memory) const { cudaFreeHost(memory); }
};
// Page-locked host memory for `count` counts (device-to-host copies into it run asynchronously).
std::unique_ptr<int64_t[], PinnedDeleter> pinned_alloc(size_t count);

struct StreamDeleter {
  void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
};
struct CublasDeleter {
  void operator()(cublasHandle_t handle) const { cublasDestroy(handle); }
};

}  // namespace kvlens::cuda
