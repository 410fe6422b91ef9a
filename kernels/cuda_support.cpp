// Host-side helpers of the CUDA backend (see cuda_support.h).
#include "kernels/cuda_support.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/common/error.h"

namespace kvlens::cuda {

void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  // Clear the runtime's last-error slot: a caught, recoverable failure (cudaMalloc out of
  // memory) would otherwise be reported again by the next launch check.
  cudaGetLastError();
  throw Error("cuda", call, "cudaSuccess", cudaGetErrorString(status));
}

namespace {

// $KVLENS_CUDA_LAUNCH_STATS=1: every checked launch is counted by its op's name, and the counts
// go to stderr at exit. For finding which ops a launch-bound workload (a batch eval on a small
// model) issues most; off, it costs one test of a cached flag per launch.
class LaunchStats {
 public:
  static LaunchStats* instance() {
    static LaunchStats* stats = [] {
      const char* text = std::getenv("KVLENS_CUDA_LAUNCH_STATS");
      return text != nullptr && std::strcmp(text, "0") != 0 ? new LaunchStats : nullptr;
    }();
    return stats;
  }
  void count(const char* op) {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++counts_[op];
  }

 private:
  LaunchStats() {
    std::atexit([] { instance()->print(); });
  }
  void print() {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<int64_t, std::string>> rows;
    int64_t total = 0;
    for (const auto& [op, n] : counts_) {
      rows.emplace_back(n, op);
      total += n;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::fprintf(stderr, "kvlens: %lld CUDA launches by op\n", static_cast<long long>(total));
    for (const auto& [n, op] : rows)
      std::fprintf(stderr, "%12lld  %5.1f%%  %s\n", static_cast<long long>(n),
                   100.0 * double(n) / double(total), op.c_str());
  }
  std::mutex mutex_;
  std::map<std::string, int64_t> counts_;
};

}  // namespace

void check_launch(const char* kernel) {
  if (LaunchStats* stats = LaunchStats::instance()) stats->count(kernel);
  check_cuda(cudaGetLastError(), kernel);
}

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error("cuda", call, "CUBLAS_STATUS_SUCCESS", cublasGetStatusString(status));
}

std::string cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (std::string_view part : parts) s += part;
  return s;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string describe(const DeviceTensor& t) {
  return std::string(dtype_name(t.dtype)) + " " + shape_string(t.shape);
}

[[noreturn]] void bad_argument(const std::string& op, const std::string& expected,
                               const std::string& found) {
  throw Error("cuda backend", op, expected, found);
}

int64_t element_count(const std::vector<int64_t>& shape, const std::string& op) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) bad_argument(op, "non-negative dimensions", shape_string(shape));
    n *= d;
  }
  return n;
}
int64_t elements(const DeviceTensor& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  return n;
}
size_t byte_size(const DeviceTensor& t) {
  return size_t(elements(t)) * dtype_size(t.dtype);
}

bool is_weight_dtype(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
}

void require(const DeviceTensor& t, DType dtype, const std::string& op, const char* what) {
  if (t.dtype != dtype)
    bad_argument(op + ": " + what, std::string(dtype_name(dtype)) + " tensor", describe(t));
  if (t.data == nullptr && elements(t) > 0)
    bad_argument(op + ": " + what, "an allocated tensor", "no storage");
}
void require_weight(const DeviceTensor& t, const std::string& op, const char* what) {
  if (!is_weight_dtype(t.dtype))
    bad_argument(op + ": " + what, "an F32, BF16 or F16 tensor", describe(t));
  if (t.data == nullptr && elements(t) > 0)
    bad_argument(op + ": " + what, "an allocated tensor", "no storage");
}
void require_elements(const DeviceTensor& t, int64_t count, const std::string& op,
                      const char* what) {
  if (elements(t) != count)
    bad_argument(op + ": " + what, std::to_string(count) + " elements", describe(t));
}

RowShape row_shape(const DeviceTensor& t, DType dtype, int64_t rows, int64_t cols,
                   const std::string& op, const char* what) {
  require(t, dtype, op, what);
  if (t.shape.size() != 2 || t.dim(0) < 0 || (rows >= 0 && t.dim(0) != rows) || t.dim(1) < cols)
    bad_argument(op + ": " + what,
                 cat({dtype_name(dtype), " [", rows < 0 ? "rows" : std::to_string(rows),
                      ", >= ", std::to_string(cols), "]"}),
                 describe(t));
  return {t.dim(0), t.dim(1)};
}
void require_cols(int64_t cols, const std::string& op) {
  if (cols < 0 || cols > INT32_MAX)
    bad_argument(op + ": cols", "a column count in [0, 2^31)", std::to_string(cols));
}

std::shared_ptr<void> device_alloc(int device, size_t bytes) {
  void* pointer = nullptr;
  check_cuda(cudaMalloc(&pointer, bytes), "cudaMalloc");
  return std::shared_ptr<void>(pointer, [device](void* p) {
    int current = -1;
    const bool other = cudaGetDevice(&current) == cudaSuccess && current != device;
    if (other) cudaSetDevice(device);
    cudaFree(p);
    if (other) cudaSetDevice(current);
  });
}

void* Scratch::get(int device, size_t bytes) {
  if (bytes > bytes_) {
    memory_.reset();  // free first: the old buffer is never needed again
    bytes_ = 0;
    const size_t grown = bytes + bytes / 2;  // amortize growth across calls
    memory_ = device_alloc(device, grown);
    bytes_ = grown;
  }
  return memory_.get();
}

std::unique_ptr<int64_t[], PinnedDeleter> pinned_alloc(size_t count) {
  void* memory = nullptr;
  check_cuda(cudaMallocHost(&memory, count * sizeof(int64_t)), "cudaMallocHost");
  return std::unique_ptr<int64_t[], PinnedDeleter>(static_cast<int64_t*>(memory));
}

bool is_uploaded_weight(const DeviceTensor& t) {
  const auto* extent = static_cast<const WeightExtent*>(t.backend_layout.get());
  if (extent == nullptr || t.data == nullptr) return false;
  const auto begin = reinterpret_cast<uintptr_t>(extent->data);
  const auto first = reinterpret_cast<uintptr_t>(t.data);
  return first >= begin && first - begin + byte_size(t) <= extent->bytes;
}

}  // namespace kvlens::cuda
