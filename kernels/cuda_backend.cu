// The CUDA Backend (shapes as in engine/runtime/backend.h): device memory freed by shared_ptr
// deleters, copies, argument checks, and dispatch to the per-op kernel launchers, all on one
// stream per backend. CUDA/cuBLAS failures become kvlens::Error("cuda", call, ...).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "engine/common/error.h"
#include "engine/runtime/policy_op_math.h"
#include "engine/runtime/thread_pool.h"
#include "kernels/attention.cuh"
#include "kernels/cuda_backend.h"
#include "kernels/decode_attention.cuh"
#include "kernels/gemv.cuh"
#include "kernels/matmul.cuh"
#include "kernels/norm_ops.cuh"
#include "kernels/policy_ops.cuh"
#include "kernels/reductions.cuh"
#include "kernels/rope.cuh"
#include "kernels/step_graph.cuh"

namespace kvlens {
namespace {

void check_cuda(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  // Clear the runtime's last-error slot: a caught, recoverable failure (cudaMalloc out of
  // memory) would otherwise be reported again by the next launch check.
  cudaGetLastError();
  throw Error("cuda", call, "cudaSuccess", cudaGetErrorString(status));
}

// Launch errors (bad configuration) show up at once; faults inside a kernel surface at the next
// synchronizing call, which then reports them.
void check_launch(const char* kernel) {
  check_cuda(cudaGetLastError(), kernel);
}

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error("cuda", call, "CUBLAS_STATUS_SUCCESS", cublasGetStatusString(status));
}

// Concatenates message pieces. (Chains of `"literal" + std::to_string(...)` trip a GCC 12
// -Wrestrict false positive at -O3.)
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

// Element counts computed here (not DeviceTensor::numel) so that negative dimensions are
// reported instead of wrapping.
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

// Checks the dtype of an operand and that it has storage when it has elements.
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

// A [rows, stride] row tensor of the policy ops (rows < 0: any row count) with stride >= cols.
struct RowShape {
  int64_t rows = 0, stride = 0;
};
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
template <typename T>
cuda::RowsRef<T> rows_ref(const DeviceTensor& t, const RowShape& shape) {
  return {static_cast<T*>(t.data), shape.stride};
}
// Columns are packed into 32 bits by top_k_key; every policy op keeps to the same range.
void require_cols(int64_t cols, const std::string& op) {
  if (cols < 0 || cols > INT32_MAX)
    bad_argument(op + ": cols", "a column count in [0, 2^31)", std::to_string(cols));
}

// Device memory owned by a shared_ptr; the deleter frees it on the device it came from. It
// ignores errors: deleters must not throw, and at process exit the runtime may already be gone.
// cudaFree synchronizes the device, so memory still read by queued kernels is not reused early.
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

// A device buffer reused across calls (staged host spans, results, widened weights). Reuse is
// safe because every use is ordered on the backend's one stream.
class Scratch {
 public:
  void* get(int device, size_t bytes) {
    if (bytes > bytes_) {
      memory_.reset();  // free first: the old buffer is never needed again
      bytes_ = 0;
      const size_t grown = bytes + bytes / 2;  // amortize growth across calls
      memory_ = device_alloc(device, grown);
      bytes_ = grown;
    }
    return memory_.get();
  }

 private:
  std::shared_ptr<void> memory_;
  size_t bytes_ = 0;
};

struct PinnedDeleter {
  void operator()(int64_t* memory) const { cudaFreeHost(memory); }
};
// Page-locked host memory for `count` counts (device-to-host copies into it run asynchronously).
std::unique_ptr<int64_t[], PinnedDeleter> pinned_alloc(size_t count) {
  void* memory = nullptr;
  check_cuda(cudaMallocHost(&memory, count * sizeof(int64_t)), "cudaMallocHost");
  return std::unique_ptr<int64_t[], PinnedDeleter>(static_cast<int64_t*>(memory));
}

struct StreamDeleter {
  void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
};
struct CublasDeleter {
  void operator()(cublasHandle_t handle) const { cublasDestroy(handle); }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    activate();
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    stream_.reset(stream);
    cublasHandle_t handle = nullptr;
    check_cublas(cublasCreate(&handle), "cublasCreate");
    blas_.reset(handle);
    check_cublas(cublasSetStream(handle, stream), "cublasSetStream");
    main_lane_.stream = stream;
    check_cuda(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate");
    // Plain F32 math, no TF32 tensor cores: TF32 rounds the inputs to 10 mantissa bits, far
    // outside the F32 tolerance that parity with the CPU reference needs.
    check_cublas(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    check_cuda(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device_),
               "cudaDeviceGetAttribute");
  }

  ~CudaBackend() override {
    // The handle, stream and scratch buffers belong to this device; make it current for their
    // release. Errors are ignored (a destructor must not throw).
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_.get());
    lane_pool_.reset();
    for (const std::unique_ptr<Lane>& lane : lanes_) cudaStreamSynchronize(lane->stream);
    if (fork_ != nullptr) cudaEventDestroy(fork_);
  }

  std::string name() const override { return "cuda"; }

  // --- memory ---

  // Weights stay in their checkpoint dtype (F32, BF16 or F16): the products widen them in
  // registers (gemv.cu) or in bounded slices (large-row GEMMs), so a BF16 model reads half the
  // bytes of its F32 copy per step.
  DeviceTensor upload_weight(const TensorView& view, std::shared_ptr<void> keep_alive) override {
    const std::string op = "upload_weight " + view.name;
    const int64_t count = element_count(view.shape, op);
    if (size_t(count) * dtype_size(view.dtype) != view.bytes || (count > 0 && !view.data))
      bad_argument(op,
                   cat({std::to_string(size_t(count) * dtype_size(view.dtype)), " bytes of ",
                        dtype_name(view.dtype), " ", shape_string(view.shape)}),
                   cat({std::to_string(view.bytes), " bytes"}));
    activate();
    DeviceTensor t;
    t.dtype = view.dtype;
    t.shape = view.shape;
    if (count == 0) return t;
    t.storage = device_alloc(device_, byte_size(t));
    t.data = t.storage.get();
    check_cuda(cudaMemcpyAsync(t.data, view.data, view.bytes, cudaMemcpyHostToDevice, stream()),
               "cudaMemcpyAsync");
    // The host bytes (kept alive by `keep_alive` until now) must have been read before we let
    // go of them; weights upload once, so a synchronization here costs nothing that matters.
    check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
    keep_alive.reset();
    return t;
  }

  bool supports_cache_dtype(DType dtype) const override { return is_weight_dtype(dtype); }

  DeviceTensor alloc(DType dtype, std::vector<int64_t> shape) override {
    const int64_t count = element_count(shape, "alloc");
    activate();
    DeviceTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    if (count == 0) return t;
    t.storage = device_alloc(device_, byte_size(t));
    t.data = t.storage.get();
    check_cuda(cudaMemsetAsync(t.data, 0, byte_size(t), stream()), "cudaMemsetAsync");
    return t;
  }

  void to_host(const DeviceTensor& src, void* host, size_t bytes) override {
    if (bytes > byte_size(src))
      bad_argument("to_host", cat({"at most ", std::to_string(byte_size(src)), " bytes"}),
                   std::to_string(bytes) + " bytes");
    if (bytes == 0) return;
    activate();
    check_cuda(cudaMemcpyAsync(host, src.data, bytes, cudaMemcpyDeviceToHost, stream()),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  }

  std::shared_ptr<void> alloc_host(size_t bytes) override {
    activate();
    void* memory = nullptr;
    check_cuda(cudaMallocHost(&memory, std::max<size_t>(bytes, 1)), "cudaMallocHost");
    return std::shared_ptr<void>(memory, [](void* p) { cudaFreeHost(p); });
  }

  void rows_to_host_async(const DeviceTensor& src, int64_t rows, int64_t cols,
                          void* host) override {
    const std::string op = "rows_to_host_async";
    const int64_t stride = src.shape.empty() ? 0 : src.shape.back();
    if (rows < 0 || cols < 0 || cols > stride || rows * stride > elements(src))
      bad_argument(op,
                   cat({"rows of ", std::to_string(stride), " elements inside ", describe(src)}),
                   cat({std::to_string(rows), " x ", std::to_string(cols)}));
    // A recorded step replays its ops only: a copy into one of a capture's rotating buffers
    // belongs after the replay, not in it.
    if (capture_.active) bad_argument(op, "a copy outside a step being recorded", "a recording");
    if (rows == 0 || cols == 0) return;
    activate();
    const size_t element = dtype_size(src.dtype);
    check_cuda(
        cudaMemcpy2DAsync(host, size_t(cols) * element, src.data, size_t(stride) * element,
                          size_t(cols) * element, size_t(rows), cudaMemcpyDeviceToHost, stream()),
        "cudaMemcpy2DAsync");
  }

  std::unique_ptr<Fence> fence() override {
    // An event per fence: a capture holds three at a time, so a pool would save little.
    class EventFence final : public Fence {
     public:
      EventFence(int device, cudaStream_t stream) : device_(device) {
        check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
        const cudaError_t recorded = cudaEventRecord(event_, stream);
        if (recorded != cudaSuccess) {
          cudaEventDestroy(event_);
          check_cuda(recorded, "cudaEventRecord");
        }
      }
      ~EventFence() override {
        int current = -1;
        const bool other = cudaGetDevice(&current) == cudaSuccess && current != device_;
        if (other) cudaSetDevice(device_);
        cudaEventDestroy(event_);
        if (other) cudaSetDevice(current);
      }
      void wait() override { check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize"); }

     private:
      int device_;
      cudaEvent_t event_ = nullptr;
    };
    activate();
    return std::make_unique<EventFence>(device_, stream());
  }

  void from_host(DeviceTensor& dst, const void* host, size_t bytes) override {
    if (bytes > byte_size(dst))
      bad_argument("from_host", cat({"at most ", std::to_string(byte_size(dst)), " bytes"}),
                   std::to_string(bytes) + " bytes");
    if (bytes == 0) return;
    activate();
    // From pageable host memory (all the engine uses) cudaMemcpyAsync has consumed the source
    // when it returns, so the caller may reuse `host` at once.
    check_cuda(cudaMemcpyAsync(dst.data, host, bytes, cudaMemcpyHostToDevice, stream()),
               "cudaMemcpyAsync");
  }

  void copy_rows(const DeviceTensor& src, int64_t src_row, DeviceTensor& dst, int64_t dst_row,
                 int64_t rows, int64_t row_elems) override {
    const std::string op = "copy_rows";
    // Rows of any one dtype (F32 activations and policy rows, a narrow KV cache's rows).
    if (src.dtype != dst.dtype)
      bad_argument(op + ": dst", cat({"the dtype of src (", describe(src), ")"}), describe(dst));
    if (src_row < 0 || dst_row < 0 || rows < 0 || row_elems < 0 ||
        (src_row + rows) * row_elems > elements(src) ||
        (dst_row + rows) * row_elems > elements(dst))
      bad_argument(op,
                   cat({"rows inside both tensors (", describe(src), " -> ", describe(dst), ")"}),
                   cat({"rows ", std::to_string(src_row), ".. -> ", std::to_string(dst_row), ".., ",
                        std::to_string(rows), " x ", std::to_string(row_elems)}));
    if (rows == 0 || row_elems == 0) return;
    activate();
    const size_t element = dtype_size(src.dtype);
    const size_t bytes = size_t(rows * row_elems) * element;
    const auto* from =
        static_cast<const std::byte*>(src.data) + size_t(src_row * row_elems) * element;
    auto* to = static_cast<std::byte*>(dst.data) + size_t(dst_row * row_elems) * element;
    // cudaMemcpy leaves overlapping ranges undefined; the CPU backend's memmove allows them, so
    // an overlapping copy goes through a scratch buffer.
    if (from < to + bytes && to < from + bytes) {
      void* bounce = lane().bounce.get(device_, bytes);
      check_cuda(cudaMemcpyAsync(bounce, from, bytes, cudaMemcpyDeviceToDevice, stream()),
                 "cudaMemcpyAsync");
      from = static_cast<const std::byte*>(bounce);
    }
    check_cuda(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream()),
               "cudaMemcpyAsync");
  }

  // --- ops ---

  void embed(const DeviceTensor& table, std::span<const int32_t> ids, DeviceTensor& out) override {
    const std::string op = "embed";
    require_weight(table, op, "table");
    if (table.shape.size() != 2) bad_argument(op + ": table", "[vocab, E]", describe(table));
    require(out, DType::F32, op, "out");
    const int64_t vocab = table.dim(0);
    const int64_t width = table.dim(1);
    const int64_t rows = int64_t(ids.size());
    require_elements(out, rows * width, op, "out");
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= vocab)
        bad_argument(cat({op, ": ids[", std::to_string(i), "]"}),
                     cat({"a token id in [0, ", std::to_string(vocab), ")"}),
                     std::to_string(ids[i]));
    if (rows == 0) return;
    activate();
    // A step's few ids travel in the kernel's arguments (no copy to order before it); a
    // recorded step reads the ids its replay sets.
    cuda::SmallIds small;
    const bool by_value = rows <= cuda::SmallIds::kCapacity;
    if (by_value) std::copy(ids.begin(), ids.end(), small.ids);
    const int32_t* device_ids = nullptr;
    if (capture_.active) {
      if (rows != capture_.rows)
        bad_argument(op + ": ids (recording a step)",
                     cat({std::to_string(capture_.rows), " ids (the recorded rows)"}),
                     std::to_string(rows));
      device_ids = step_state()->ids;
    } else if (!by_value) {
      device_ids = stage(ids);
    }
    cuda::launch_embed(table.data, table.dtype, width, device_ids, small, rows, out.as<float>(),
                       stream());
    check_launch("embed");
  }

  void matmul(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y) override {
    const ProductShape shape = product_shape("matmul", x, w, y);
    if (shape.rows == 0 || shape.out == 0) return;
    activate();
    if (shape.rows <= cuda::kMaxGemvRows) {
      // Decode (one row per run): stream the weights once at memory bandwidth.
      const DeviceTensor* const ws[] = {&w};
      DeviceTensor* const ys[] = {&y};
      launch_products(x, ws, ys, shape, false);
      return;
    }
    gemm(x, w, y, shape);
  }

  // q, k and v (or gate and up) of a decode step: one launch, each product with matmul's bits.
  void matmul_many(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                   std::span<DeviceTensor* const> ys) override {
    ProductShape shape;
    if (!decode_products("matmul_many", x, ws, ys, shape)) {
      Backend::matmul_many(x, ws, ys);
      return;
    }
    if (shape.out == 0) return;
    activate();
    launch_products(x, ws, ys, shape, false);
  }

  // The residual add as the product's last step (one addition per element, add_inplace's bits).
  void matmul_add(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& scratch,
                  DeviceTensor& acc) override {
    const ProductShape shape = product_shape("matmul_add", x, w, acc);
    if (shape.rows < 1 || shape.rows > cuda::kMaxGemvRows || shape.out == 0) {
      Backend::matmul_add(x, w, scratch, acc);
      return;
    }
    activate();
    const DeviceTensor* const ws[] = {&w};
    DeviceTensor* const ys[] = {&acc};
    launch_products(x, ws, ys, shape, true);
  }

  // The norm in the products' kernel where the rows fit in its shared memory (the bits of
  // rmsnorm then matmul_many, normed included).
  void rmsnorm_matmul_many(const DeviceTensor& x, const DeviceTensor& norm_weight, float eps,
                           DeviceTensor& normed, std::span<const DeviceTensor* const> ws,
                           std::span<DeviceTensor* const> ys) override {
    ProductShape shape;
    if (!decode_products("rmsnorm_matmul_many", x, ws, ys, shape) ||
        !norm_fusable(x, ws, norm_weight, normed, shape)) {
      Backend::rmsnorm_matmul_many(x, norm_weight, eps, normed, ws, ys);
      return;
    }
    activate();
    launch_products(x, ws, ys, shape, false, &norm_weight, eps, &normed);
  }

  void rmsnorm_gate_up(const DeviceTensor& x, const DeviceTensor& norm_weight, float eps,
                       DeviceTensor& normed, const DeviceTensor& w_gate, const DeviceTensor& w_up,
                       DeviceTensor& gate, DeviceTensor& up, DeviceTensor& act) override {
    const DeviceTensor* const ws[] = {&w_gate, &w_up};
    DeviceTensor* const ys[] = {&gate, &up};
    ProductShape shape;
    const bool fused = decode_products("rmsnorm_gate_up", x, ws, ys, shape) &&
                       norm_fusable(x, ws, norm_weight, normed, shape) &&
                       w_gate.shape == w_up.shape && act.dtype == DType::F32 &&
                       elements(act) == elements(gate);
    if (!fused) {
      Backend::rmsnorm_gate_up(x, norm_weight, eps, normed, w_gate, w_up, gate, up, act);
      return;
    }
    activate();
    DeviceTensor* const act_out[] = {&act};
    launch_products(x, ws, act_out, shape, false, &norm_weight, eps, &normed, true);
  }

  void rmsnorm(const DeviceTensor& x, const DeviceTensor& weight, float eps,
               DeviceTensor& y) override {
    const std::string op = "rmsnorm";
    require(x, DType::F32, op, "x");
    require_weight(weight, op, "weight");
    require(y, DType::F32, op, "y");
    const int64_t width = elements(weight);
    if (width == 0 || elements(x) % width != 0)
      bad_argument(op + ": x", cat({"rows of ", std::to_string(width)}), describe(x));
    require_elements(y, elements(x), op, "y");
    activate();
    cuda::launch_rmsnorm(x.as<float>(), weight.data, weight.dtype, elements(x) / width, width, eps,
                         y.as<float>(), stream());
    check_launch("rmsnorm");
  }

  using Backend::rope;
  void rope(DeviceTensor& x, std::span<const int64_t> positions, const DeviceTensor& inv_freq,
            float scale) override {
    rope_rows(x, nullptr, positions, inv_freq, scale);
  }

  void rope_pair(DeviceTensor& q, DeviceTensor& k, std::span<const int64_t> positions,
                 const DeviceTensor& inv_freq, float scale) override {
    rope_rows(q, &k, positions, inv_freq, scale);
  }

  void silu_mul(const DeviceTensor& gate, const DeviceTensor& up, DeviceTensor& out) override {
    const std::string op = "silu_mul";
    require(gate, DType::F32, op, "gate");
    require(up, DType::F32, op, "up");
    require(out, DType::F32, op, "out");
    require_elements(up, elements(gate), op, "up");
    require_elements(out, elements(gate), op, "out");
    activate();
    cuda::launch_silu_mul(gate.as<float>(), up.as<float>(), elements(gate), out.as<float>(),
                          stream());
    check_launch("silu_mul");
  }

  void layer_norm(const DeviceTensor& x, const DeviceTensor& weight, const DeviceTensor& bias,
                  float eps, DeviceTensor& y) override {
    const std::string op = "layer_norm";
    require(x, DType::F32, op, "x");
    require_weight(weight, op, "weight");
    require_weight(bias, op, "bias");
    require(y, DType::F32, op, "y");
    const int64_t width = elements(weight);
    if (width == 0 || elements(bias) != width || elements(x) % width != 0)
      bad_argument(op + ": x", cat({"rows of ", std::to_string(width), " and a bias as wide"}),
                   describe(x) + ", bias " + describe(bias));
    require_elements(y, elements(x), op, "y");
    if (weight.dtype != bias.dtype)
      bad_argument(op + ": bias", "the weight's dtype", describe(bias));
    activate();
    cuda::launch_layer_norm(x.as<float>(), weight.data, bias.data, weight.dtype,
                            elements(x) / width, width, eps, y.as<float>(), stream());
    check_launch("layer_norm");
  }

  void bias_activation(DeviceTensor& x, const DeviceTensor* bias, Activation act) override {
    const std::string op = "bias_activation";
    require(x, DType::F32, op, "x");
    int64_t width = elements(x);
    if (bias != nullptr) {
      require_weight(*bias, op, "bias");
      width = elements(*bias);
      if (width == 0 || elements(x) % width != 0)
        bad_argument(op + ": x", cat({"rows of ", std::to_string(width)}), describe(x));
    }
    activate();
    const int kind = act == Activation::Gelu ? 1 : act == Activation::Silu ? 2 : 0;
    cuda::launch_bias_activation(x.as<float>(), elements(x), bias ? bias->data : nullptr,
                                 bias ? bias->dtype : DType::F32, width, kind, stream());
    check_launch("bias_activation");
  }

  void add_inplace(DeviceTensor& x, const DeviceTensor& y) override {
    const std::string op = "add_inplace";
    require(x, DType::F32, op, "x");
    require(y, DType::F32, op, "y");
    require_elements(y, elements(x), op, "y");
    activate();
    cuda::launch_add_inplace(x.as<float>(), y.as<float>(), elements(x), stream());
    check_launch("add_inplace");
  }

  void kv_append(const DeviceTensor& k, const DeviceTensor& v, DeviceTensor& k_cache,
                 DeviceTensor& v_cache, int64_t first_position) override {
    const std::string op = "kv_append";
    // An empty v_cache: keys alone (Backend::kv_append).
    const bool keys_only = v_cache.empty();
    const CacheShape cache =
        keys_only ? cache_shape(k_cache, op, "k_cache") : cache_shape(k_cache, v_cache, op);
    require(k, DType::F32, op, "k");
    if (!keys_only) require(v, DType::F32, op, "v");
    const int64_t row_elements = cache.kv_heads * cache.head_dim;
    if (row_elements == 0 || elements(k) % row_elements != 0)
      bad_argument(
          op + ": k",
          cat({"[n, ", std::to_string(cache.kv_heads), ", ", std::to_string(cache.head_dim), "]"}),
          describe(k));
    if (!keys_only) require_elements(v, elements(k), op, "v");
    const int64_t rows = elements(k) / row_elements;
    if (first_position < 0 || first_position + rows > cache.capacity)
      bad_argument(op,
                   cat({"positions inside the cache capacity ", std::to_string(cache.capacity)}),
                   cat({std::to_string(first_position), " + ", std::to_string(rows), " rows"}));
    activate();
    cuda::launch_kv_append(k.as<float>(), keys_only ? nullptr : v.as<float>(), k_cache.data,
                           keys_only ? nullptr : v_cache.data, k_cache.dtype, rows, cache.kv_heads,
                           cache.head_dim, cache.capacity, first_position,
                           step_position(first_position, op), stream());
    check_launch("kv_append");
  }

  void attention(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                 int64_t first_position, int64_t window, Visibility visible, DeviceTensor& out,
                 DeviceTensor* logits_out) override {
    const std::string op = "attention";
    const CacheShape cache = cache_shape(k_cache, v_cache, op);
    require(q, DType::F32, op, "q");
    require(out, DType::F32, op, "out");
    if (q.shape.size() != 3 || q.dim(2) != cache.head_dim || cache.kv_heads == 0 ||
        q.dim(1) % cache.kv_heads != 0)
      bad_argument(op + ": q",
                   cat({"[n, H, ", std::to_string(cache.head_dim), "] with H a multiple of ",
                        std::to_string(cache.kv_heads), " KV heads"}),
                   describe(q));
    const int64_t rows = q.dim(0);
    const int64_t heads = q.dim(1);
    require_elements(out, elements(q), op, "out");
    const int64_t context = first_position + rows;
    if (first_position < 0 || context > cache.capacity)
      bad_argument(op,
                   cat({"positions inside the cache capacity ", std::to_string(cache.capacity)}),
                   cat({std::to_string(first_position), " + ", std::to_string(rows), " rows"}));
    const bool want_logits = logits_out != nullptr && !logits_out->empty();
    if (want_logits) {
      require(*logits_out, DType::F32, op, "logits_out");
      const std::vector<int64_t>& shape = logits_out->shape;
      if (shape.size() != 3 || shape[0] != rows || shape[1] != heads || shape[2] < context)
        bad_argument(op + ": logits_out",
                     cat({"F32 [", std::to_string(rows), ", ", std::to_string(heads),
                          ", S >= ", std::to_string(context), "]"}),
                     describe(*logits_out));
    }
    if (visible.mask != nullptr) {
      const DeviceTensor& mask = *visible.mask;
      require(mask, DType::U8, op, "visibility mask");
      if (rows != 1) bad_argument(op + ": visibility mask", "n == 1", std::to_string(rows));
      if (mask.shape.size() != 2 || mask.dim(0) != heads || mask.dim(1) != context)
        bad_argument(op + ": visibility mask",
                     cat({"U8 [", std::to_string(heads), ", ", std::to_string(context), "]"}),
                     describe(mask));
    }
    if (rows == 0) return;
    activate();
    cuda::AttentionArgs args;
    args.q = q.as<float>();
    args.k_cache = k_cache.data;
    args.v_cache = v_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.out = out.as<float>();
    args.logits = want_logits ? logits_out->as<float>() : nullptr;
    args.mask = visible.mask ? visible.mask->as<uint8_t>() : nullptr;
    args.mask_stride = context;
    args.rows = rows;
    args.heads = heads;
    args.kv_heads = cache.kv_heads;
    args.head_dim = cache.head_dim;
    args.capacity = cache.capacity;
    args.first_position = first_position;
    args.window = window;
    args.context = context;
    args.logits_stride = want_logits ? logits_out->dim(2) : context;
    // head_dim^-0.5 rounded to F32 once, as transformers multiplies F32 scores by the Python
    // float `scaling`.
    args.scale = float(1.0 / std::sqrt(double(cache.head_dim)));
    const int64_t floats = cuda::decode_attention_scratch_floats(args, sm_count_);
    if (capture_.active) {
      // Only the split decode kernel replays at other positions (it reads the position on the
      // device); the per-row kernel sizes its work by the context. Logits replay into the same
      // rows, so they must be as wide as the cache (any later context fits).
      if (floats == 0 || (want_logits && logits_out->dim(2) < cache.capacity))
        bad_argument(op,
                     "an op of an unrecorded step (rows > 1, logits narrower than the cache, or "
                     "a head group the split kernel does not take)",
                     "a step being recorded");
      args.step_position = step_position(first_position, op);
    }
    if (floats > 0) {
      float* parts =
          static_cast<float*>(lane().attention_parts.get(device_, size_t(floats) * sizeof(float)));
      cuda::launch_decode_attention(args, parts, sm_count_, stream());
    } else {
      cuda::launch_attention(args, stream());
    }
    check_launch("attention");
  }

  void argmax_rows(const DeviceTensor& x, std::span<int32_t> out) override {
    const std::string op = "argmax_rows";
    const int64_t rows = int64_t(out.size());
    const int64_t cols = logit_columns(x, rows, op);
    if (rows == 0) return;
    activate();
    auto* device_out = static_cast<int32_t*>(lane().results.get(device_, out.size_bytes()));
    cuda::launch_argmax_rows(x.as<float>(), rows, cols, device_out, stream());
    check_launch("argmax_rows");
    copy_results(device_out, out.data(), out.size_bytes());
  }

  void log_prob_rows(const DeviceTensor& x, std::span<const int32_t> targets,
                     std::span<double> out) override {
    const std::string op = "log_prob_rows";
    if (targets.size() != out.size())
      bad_argument(op + ": out", std::to_string(targets.size()) + " values (one per target)",
                   std::to_string(out.size()));
    const int64_t rows = int64_t(out.size());
    const int64_t cols = logit_columns(x, rows, op);
    for (size_t i = 0; i < targets.size(); ++i)
      if (targets[i] < 0 || targets[i] >= cols)
        bad_argument(cat({op, ": targets[", std::to_string(i), "]"}),
                     cat({"a token id in [0, ", std::to_string(cols), ")"}),
                     std::to_string(targets[i]));
    if (rows == 0) return;
    activate();
    const int32_t* device_targets = stage(targets);
    auto* device_out = static_cast<double*>(lane().results.get(device_, out.size_bytes()));
    cuda::launch_log_prob_rows(x.as<float>(), rows, cols, device_targets, device_out, stream());
    check_launch("log_prob_rows");
    copy_results(device_out, out.data(), out.size_bytes());
  }

  // --- token-selection (policy) ops (kernels/policy_ops.cu) ---

  void attention_logits(const DeviceTensor& q, const DeviceTensor& k_cache, int64_t position,
                        int64_t window, DeviceTensor& logits) override {
    const std::string op = "attention_logits";
    require(q, DType::F32, op, "q");
    const CacheShape cache = cache_shape(k_cache, op, "k_cache");
    if (q.shape.size() != 3 || q.dim(0) != 1 || q.dim(2) != cache.head_dim || cache.kv_heads == 0 ||
        q.dim(1) % cache.kv_heads != 0)
      bad_argument(op + ": q",
                   cat({"[1, H, ", std::to_string(cache.head_dim), "] with H a multiple of ",
                        std::to_string(cache.kv_heads), " KV heads"}),
                   describe(q));
    if (position < 0 || position >= cache.capacity)
      bad_argument(op + ": position",
                   cat({"a position below the capacity ", std::to_string(cache.capacity)}),
                   std::to_string(position));
    const int64_t cols = position + 1;
    require_cols(cols, op);
    const int64_t heads = q.dim(1);
    const RowShape shape = row_shape(logits, DType::F32, heads, cols, op, "logits");
    if (heads == 0) return;
    activate();
    cuda::LogitArgs args;
    args.q = q.as<float>();
    args.k_cache = k_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.logits = rows_ref<float>(logits, shape);
    args.heads = heads;
    args.kv_heads = cache.kv_heads;
    args.head_dim = cache.head_dim;
    args.capacity = cache.capacity;
    args.cols = cols;
    args.lo = window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
    args.window = window;
    args.step_position = step_position(position, op);
    args.scale = float(1.0 / std::sqrt(double(cache.head_dim)));  // as in attention()
    cuda::launch_attention_logits(args, sm_count_, stream());
    check_launch("attention_logits");
  }

  void attention_visible(const DeviceTensor& logits, int64_t cols, const DeviceTensor* visible,
                         const DeviceTensor& v_cache, DeviceTensor& out,
                         DeviceTensor* probs) override {
    const std::string op = "attention_visible";
    require_cols(cols, op);
    const CacheShape cache = cache_shape(v_cache, op, "v_cache", cols);
    const RowShape logit_shape = row_shape(logits, DType::F32, -1, cols, op, "logits");
    const int64_t heads = logit_shape.rows;
    if (cache.kv_heads == 0 || heads % cache.kv_heads != 0)
      bad_argument(
          op + ": logits",
          cat({"a row count divisible by the ", std::to_string(cache.kv_heads), " KV heads"}),
          describe(logits));
    cuda::VisibleAttentionArgs args;
    args.logits = rows_ref<const float>(logits, logit_shape);
    if (visible)
      args.visible = rows_ref<const uint8_t>(
          *visible, row_shape(*visible, DType::U8, heads, cols, op, "visible"));
    if (probs)
      args.probs = rows_ref<float>(*probs, row_shape(*probs, DType::F32, heads, cols, op, "probs"));
    const bool want_out = !out.empty();
    if (!want_out && !probs) bad_argument(op + ": out", "an output tensor or probs", "neither");
    if (want_out) {
      require(out, DType::F32, op, "out");
      require_elements(out, heads * cache.head_dim, op, "out");
    }
    if (heads == 0) return;
    activate();
    args.v_cache = v_cache.data;
    args.cache_dtype = v_cache.dtype;
    args.out = want_out ? out.as<float>() : nullptr;
    args.heads = heads;
    args.kv_heads = cache.kv_heads;
    args.head_dim = cache.head_dim;
    args.capacity = cache.capacity;
    args.cols = cols;
    args.step_position = capture_.active ? step_position(cols - 1, op) : nullptr;
    float* parts = static_cast<float*>(lane().attention_parts.get(
        device_, size_t(cuda::visible_attention_scratch_floats(args, sm_count_)) * sizeof(float)));
    cuda::launch_attention_visible(args, parts, sm_count_, stream());
    check_launch("attention_visible");
  }

  void select_top_k(const DeviceTensor& scores, int64_t cols, const DeviceTensor* eligible,
                    int64_t k, DeviceTensor& selected) override {
    const std::string op = "select_top_k";
    require_cols(cols, op);
    const RowShape shape = row_shape(selected, DType::U8, -1, cols, op, "selected");
    const RowShape score_shape = row_shape(scores, DType::F32, shape.rows, cols, op, "scores");
    cuda::RowsRef<const uint8_t> allowed;
    if (eligible)
      allowed = rows_ref<const uint8_t>(
          *eligible, row_shape(*eligible, DType::U8, shape.rows, cols, op, "eligible"));
    if (k <= 0 || cols == 0 || shape.rows == 0) return;
    activate();
    cuda::launch_select_top_k(rows_ref<const float>(scores, score_shape), allowed,
                              rows_ref<uint8_t>(selected, shape), shape.rows, cols, k, stream());
    check_launch("select_top_k");
  }

  void fill_columns(DeviceTensor& mask, int64_t begin, int64_t end, uint8_t value) override {
    const std::string op = "fill_columns";
    const RowShape shape = row_shape(mask, DType::U8, -1, 0, op, "mask");
    if (begin < 0 || end > shape.stride)
      bad_argument(op + ": columns",
                   cat({"a range inside [0, ", std::to_string(shape.stride), ")"}),
                   cat({std::to_string(begin), ":", std::to_string(end)}));
    if (end <= begin || shape.rows == 0) return;
    activate();
    cuda::launch_fill_columns(rows_ref<uint8_t>(mask, shape), shape.rows, begin, end, value,
                              stream());
    check_launch("fill_columns");
  }

  // Counted where the mask lives: only the counts cross to the host (the default would copy the
  // whole [rows, stride] mask, megabytes per layer for a long-context model).
  void count_nonzero_rows(const DeviceTensor& mask, int64_t cols,
                          std::span<int64_t> counts) override {
    const RowShape shape = counted_rows(mask, cols, counts);
    if (shape.rows == 0) return;
    auto* device_counts =
        static_cast<int64_t*>(lane().results.get(device_, size_t(shape.rows) * sizeof(int64_t)));
    cuda::launch_count_nonzero_rows(rows_ref<const uint8_t>(mask, shape), shape.rows, cols,
                                    device_counts, stream());
    check_launch("count_nonzero_rows");
    copy_results(device_counts, counts.data(), size_t(shape.rows) * sizeof(int64_t));
  }

  void mask_and(DeviceTensor& mask, const DeviceTensor& other, int64_t cols) override {
    const std::string op = "mask_and";
    require_cols(cols, op);
    const RowShape shape = row_shape(mask, DType::U8, -1, cols, op, "mask");
    const RowShape other_shape = row_shape(other, DType::U8, shape.rows, cols, op, "other");
    if (shape.rows * cols == 0) return;
    activate();
    cuda::launch_mask_and(rows_ref<uint8_t>(mask, shape),
                          rows_ref<const uint8_t>(other, other_shape), shape.rows, cols, stream());
    check_launch("mask_and");
  }

  void accumulate_rows(DeviceTensor& acc, const DeviceTensor& x, const DeviceTensor* keep,
                       int64_t cols) override {
    const std::string op = "accumulate_rows";
    require_cols(cols, op);
    const RowShape shape = row_shape(acc, DType::F32, -1, cols, op, "acc");
    const RowShape x_shape = row_shape(x, DType::F32, shape.rows, cols, op, "x");
    cuda::RowsRef<const uint8_t> kept;
    if (keep)
      kept =
          rows_ref<const uint8_t>(*keep, row_shape(*keep, DType::U8, shape.rows, cols, op, "keep"));
    if (shape.rows * cols == 0) return;
    activate();
    cuda::launch_accumulate_rows(rows_ref<float>(acc, shape), rows_ref<const float>(x, x_shape),
                                 kept, shape.rows, cols, stream());
    check_launch("accumulate_rows");
  }

  void sum_row_groups(const DeviceTensor& x, int64_t cols, int64_t group,
                      DeviceTensor& out) override {
    const std::string op = "sum_row_groups";
    require_cols(cols, op);
    const RowShape shape = row_shape(x, DType::F32, -1, cols, op, "x");
    if (group <= 0 || shape.rows % group != 0)
      bad_argument(op + ": group",
                   cat({"a positive divisor of the ", std::to_string(shape.rows), " rows"}),
                   std::to_string(group));
    const int64_t groups = shape.rows / group;
    const RowShape out_shape = row_shape(out, DType::F32, groups, cols, op, "out");
    if (groups * cols == 0) return;
    activate();
    cuda::launch_sum_row_groups(rows_ref<const float>(x, shape), groups, group, cols,
                                rows_ref<float>(out, out_shape), stream());
    check_launch("sum_row_groups");
  }

  void expand_row_groups(const DeviceTensor& mask, int64_t cols, int64_t group,
                         DeviceTensor& out) override {
    const std::string op = "expand_row_groups";
    require_cols(cols, op);
    if (group <= 0) bad_argument(op + ": group", "a positive group size", std::to_string(group));
    const RowShape shape = row_shape(mask, DType::U8, -1, cols, op, "mask");
    const RowShape out_shape = row_shape(out, DType::U8, shape.rows * group, cols, op, "out");
    if (out_shape.rows * cols == 0) return;
    activate();
    cuda::launch_expand_row_groups(rows_ref<const uint8_t>(mask, shape), out_shape.rows, group,
                                   cols, rows_ref<uint8_t>(out, out_shape), stream());
    check_launch("expand_row_groups");
  }

  void random_rows(uint64_t seed, uint64_t stream_id, int64_t cols, DeviceTensor& out) override {
    const std::string op = "random_rows";
    require_cols(cols, op);
    const RowShape shape = row_shape(out, DType::F32, -1, cols, op, "out");
    if (shape.rows * cols == 0) return;
    activate();
    cuda::launch_random_rows(seed, stream_id, shape.rows, cols, rows_ref<float>(out, shape),
                             stream());
    check_launch("random_rows");
  }

  void axpby_rows(DeviceTensor& y, float alpha, const DeviceTensor& x, float beta,
                  int64_t cols) override {
    const std::string op = "axpby_rows";
    require_cols(cols, op);
    const RowShape shape = row_shape(y, DType::F32, -1, cols, op, "y");
    const RowShape x_shape = row_shape(x, DType::F32, -1, cols, op, "x");
    if (x_shape.rows != shape.rows && x_shape.rows != 1)
      bad_argument(op + ": x", cat({"1 or ", std::to_string(shape.rows), " rows"}), describe(x));
    if (shape.rows * cols == 0) return;
    activate();
    cuda::launch_axpby_rows(rows_ref<float>(y, shape), alpha, rows_ref<const float>(x, x_shape),
                            beta, shape.rows, x_shape.rows != shape.rows, cols, stream());
    check_launch("axpby_rows");
  }

  void pool_rows(const DeviceTensor& x, int64_t cols, Pool pool, int64_t kernel,
                 DeviceTensor& out) override {
    const std::string op = "pool_rows";
    require_cols(cols, op);
    if (kernel < 1 || kernel % 2 == 0 || kernel > INT32_MAX)
      bad_argument(op + ": kernel", "an odd kernel size >= 1", std::to_string(kernel));
    const RowShape shape = row_shape(x, DType::F32, -1, cols, op, "x");
    const RowShape out_shape = row_shape(out, DType::F32, shape.rows, cols, op, "out");
    if (shape.rows * cols == 0) return;
    if (x.data == out.data) bad_argument(op + ": out", "a tensor apart from x", "x itself");
    activate();
    cuda::launch_pool_rows(rows_ref<const float>(x, shape), shape.rows, cols, pool == Pool::Average,
                           kernel, rows_ref<float>(out, out_shape), stream());
    check_launch("pool_rows");
  }

  void key_anchor_scores(const DeviceTensor& k_cache, int64_t cols, const DeviceTensor& members,
                         DeviceTensor& out) override {
    const std::string op = "key_anchor_scores";
    require_cols(cols, op);
    const CacheShape cache = cache_shape(k_cache, op, "k_cache", cols);
    const RowShape shape = row_shape(out, DType::F32, -1, cols, op, "out");
    if (cache.kv_heads == 0 || shape.rows % cache.kv_heads != 0)
      bad_argument(op + ": out",
                   cat({"a row count that is a multiple of the ", std::to_string(cache.kv_heads),
                        " KV heads"}),
                   describe(out));
    const RowShape member_shape = row_shape(members, DType::U8, shape.rows, cols, op, "members");
    if (shape.rows == 0 || cols == 0) return;
    activate();
    cuda::KeyAnchorArgs args;
    args.k_cache = k_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.members = rows_ref<const uint8_t>(members, member_shape);
    args.out = rows_ref<float>(out, shape);
    args.rows = shape.rows;
    args.rows_per_group = shape.rows / cache.kv_heads;
    args.head_dim = cache.head_dim;
    args.capacity = cache.capacity;
    args.cols = cols;
    cuda::launch_key_anchor_scores(args, stream());
    check_launch("key_anchor_scores");
  }

  void page_minmax_update(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                          int64_t page_size, DeviceTensor& page_min,
                          DeviceTensor& page_max) override {
    const std::string op = "page_minmax_update";
    require_page_size(page_size, op);
    const CacheShape cache = cache_shape(k_cache, op, "k_cache");
    if (begin < 0 || begin > end || end > cache.capacity)
      bad_argument(op + ": columns",
                   cat({"a range inside [0, ", std::to_string(cache.capacity), "]"}),
                   cat({std::to_string(begin), ":", std::to_string(end)}));
    const int64_t pages = page_summary_pages(page_min, page_max, cache, op);
    if (pages * page_size < end)
      bad_argument(op + ": page_min",
                   cat({"at least ", std::to_string((end + page_size - 1) / page_size), " pages"}),
                   describe(page_min));
    if (begin == end || cache.kv_heads == 0 || cache.head_dim == 0) return;
    activate();
    cuda::PageMinMaxArgs args;
    args.k_cache = k_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.page_min = page_min.as<float>();
    args.page_max = page_max.as<float>();
    args.kv_heads = cache.kv_heads;
    args.capacity = cache.capacity;
    args.head_dim = cache.head_dim;
    args.pages = pages;
    args.page_size = page_size;
    args.first = begin / page_size;
    args.last = (end - 1) / page_size;
    args.end = end;
    cuda::launch_page_minmax_update(args, stream());
    check_launch("page_minmax_update");
  }

  void page_bounds(const DeviceTensor& q, const DeviceTensor& page_min,
                   const DeviceTensor& page_max, int64_t cols, int64_t page_size, bool max_only,
                   DeviceTensor& out) override {
    const std::string op = "page_bounds";
    require_cols(cols, op);
    require_page_size(page_size, op);
    require(q, DType::F32, op, "q");
    if (q.shape.size() != 3 || q.dim(0) != 1 || q.dim(1) < 0 || q.dim(2) < 0)
      bad_argument(op + ": q", "[1, H, D]", describe(q));
    const int64_t heads = q.dim(1), head_dim = q.dim(2);
    if (page_min.shape.size() != 3 || page_min.dim(0) <= 0 || heads % page_min.dim(0) != 0)
      bad_argument(op + ": page_min",
                   cat({"[G, pages, ", std::to_string(head_dim), "] with G dividing the ",
                        std::to_string(heads), " heads"}),
                   describe(page_min));
    const CacheShape groups{page_min.dim(0), 0, head_dim};
    const int64_t pages = page_summary_pages(page_min, page_max, groups, op);
    if (pages * page_size < cols)
      bad_argument(op + ": page_min",
                   cat({"at least ", std::to_string((cols + page_size - 1) / page_size), " pages"}),
                   describe(page_min));
    const RowShape shape = row_shape(out, DType::F32, heads, cols, op, "out");
    if (heads == 0 || cols == 0) return;
    activate();
    cuda::PageBoundArgs args;
    args.q = q.as<float>();
    args.page_min = page_min.as<float>();
    args.page_max = page_max.as<float>();
    args.out = rows_ref<float>(out, shape);
    args.heads = heads;
    args.kv_heads = groups.kv_heads;
    args.head_dim = head_dim;
    args.pages = pages;
    args.page_size = page_size;
    args.cols = cols;
    args.max_only = max_only;
    args.scale = float(1.0 / std::sqrt(double(head_dim)));  // as in attention()
    cuda::launch_page_bounds(args, stream());
    check_launch("page_bounds");
  }

  void select_pages(const DeviceTensor& scores, int64_t cols, int64_t page_size, int64_t k,
                    DeviceTensor& selected) override {
    const std::string op = "select_pages";
    require_cols(cols, op);
    require_page_size(page_size, op);
    const RowShape shape = row_shape(selected, DType::U8, -1, cols, op, "selected");
    const RowShape score_shape = row_shape(scores, DType::F32, shape.rows, cols, op, "scores");
    if (k <= 0 || cols == 0 || shape.rows == 0) return;
    activate();
    cuda::launch_select_pages(rows_ref<const float>(scores, score_shape),
                              rows_ref<uint8_t>(selected, shape), shape.rows, cols, page_size, k,
                              stream());
    check_launch("select_pages");
  }

  void anchor_cosine_update(const DeviceTensor& cache, int64_t column, float decay,
                            DeviceTensor& anchor, DeviceTensor& similarity) override {
    const std::string op = "anchor_cosine_update";
    const CacheShape shape = cache_shape(cache, op, "cache");
    if (shape.head_dim > cuda::kMaxAnchorDim)
      bad_argument(op + ": cache",
                   cat({"a head dimension of at most ", std::to_string(cuda::kMaxAnchorDim)}),
                   describe(cache));
    if (column < 0 || column >= shape.capacity)
      bad_argument(op + ": column",
                   cat({"a column below the capacity ", std::to_string(shape.capacity)}),
                   std::to_string(column));
    require(anchor, DType::F32, op, "anchor");
    if (anchor.shape != std::vector<int64_t>{shape.kv_heads, shape.head_dim})
      bad_argument(op + ": anchor", shape_string({shape.kv_heads, shape.head_dim}),
                   describe(anchor));
    require(similarity, DType::F32, op, "similarity");
    require_elements(similarity, shape.kv_heads, op, "similarity");
    if (shape.kv_heads == 0) return;
    activate();
    cuda::AnchorCosineArgs args;
    args.cache = cache.data;
    args.cache_dtype = cache.dtype;
    args.anchor = anchor.as<float>();
    args.similarity = similarity.as<float>();
    args.kv_heads = shape.kv_heads;
    args.capacity = shape.capacity;
    args.head_dim = shape.head_dim;
    args.column = column;
    args.decay = decay;
    cuda::launch_anchor_cosine_update(args, stream());
    check_launch("anchor_cosine_update");
  }

  void token_filter_step(const DeviceTensor* similarity, double eta, double target, int64_t column,
                         DeviceTensor& state, DeviceTensor& scores, DeviceTensor& keep) override {
    const std::string op = "token_filter_step";
    require(state, DType::U8, op, "state");
    require_elements(state, 8 * kTokenFilterState, op, "state");
    require(keep, DType::U8, op, "keep");
    if (elements(keep) < 1) bad_argument(op + ": keep", "at least one element", describe(keep));
    require(scores, DType::F32, op, "scores");
    if (scores.shape.size() != 2 || column < 0 || column >= scores.dim(1))
      bad_argument(op + ": scores",
                   cat({"[rows, stride] with column ", std::to_string(column), " < stride"}),
                   describe(scores));
    int64_t kv_heads = 0;
    if (similarity != nullptr) {
      require(*similarity, DType::F32, op, "similarity");
      if (elements(*similarity) < 2 || elements(*similarity) % 2 != 0)
        bad_argument(op + ": similarity", "2 * G elements (keys, then values)",
                     describe(*similarity));
      kv_heads = elements(*similarity) / 2;
    }
    activate();
    cuda::launch_token_filter_step(similarity ? similarity->as<float>() : nullptr, kv_heads, eta,
                                   target, column, static_cast<double*>(state.data),
                                   {scores.as<float>(), scores.dim(1)}, scores.dim(0),
                                   keep.as<uint8_t>(), stream());
    check_launch(op.c_str());
  }

  void zero_unless(DeviceTensor& rows, const DeviceTensor& keep) override {
    const std::string op = "zero_unless";
    require(rows, DType::F32, op, "rows");
    require(keep, DType::U8, op, "keep");
    if (elements(keep) < 1) bad_argument(op + ": keep", "at least one element", describe(keep));
    activate();
    cuda::launch_zero_unless(rows.as<float>(), elements(rows), keep.as<uint8_t>(), stream());
    check_launch(op.c_str());
  }

  // Stream capture of the step's ops into a CUDA graph. Thread-local capture mode: only this
  // thread's CUDA calls take part, and calls that cannot be captured (allocations, copies to the
  // host) fail with an error, which the caller answers by running the step itself.
  std::unique_ptr<StepGraph> record_step(int64_t position, int64_t rows,
                                         const std::function<void()>& record) override {
    if (rows < 1 || rows > cuda::SmallIds::kCapacity || capture_.active) return nullptr;
    activate();
    if (!step_state_) {
      step_state_ = device_alloc(device_, sizeof(cuda::StepState));
      check_cuda(cudaMemsetAsync(step_state_.get(), 0, sizeof(cuda::StepState), stream()),
                 "cudaMemsetAsync");
    }
    check_cuda(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal),
               "cudaStreamBeginCapture");
    capture_ = {true, position, rows};
    cudaGraph_t graph = nullptr;
    try {
      record();
    } catch (...) {
      capture_.active = false;
      cudaStreamEndCapture(stream(), &graph);  // ends the (possibly invalidated) capture
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      throw;
    }
    capture_.active = false;
    check_cuda(cudaStreamEndCapture(stream(), &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check_cuda(instantiated, "cudaGraphInstantiate");
    return std::make_unique<cuda::CudaStepGraph>(device_, stream(), exec, step_state(), rows,
                                                 step_state_);
  }

  double copy_bandwidth_gbps(size_t bytes, int repeats) override {
    if (bytes == 0 || repeats < 1)
      bad_argument("copy_bandwidth_gbps", "a positive size and repeat count",
                   cat({std::to_string(bytes), " bytes, ", std::to_string(repeats), " repeats"}));
    activate();
    const std::shared_ptr<void> from = device_alloc(device_, bytes);
    const std::shared_ptr<void> to = device_alloc(device_, bytes);
    check_cuda(cudaMemsetAsync(from.get(), 1, bytes, stream()), "cudaMemsetAsync");
    cudaEvent_t start = nullptr, stop = nullptr;
    check_cuda(cudaEventCreate(&start), "cudaEventCreate");
    check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
    std::vector<float> milliseconds;
    for (int i = 0; i <= repeats; ++i) {  // the first copy is the untimed warm-up
      check_cuda(cudaEventRecord(start, stream()), "cudaEventRecord");
      check_cuda(cudaMemcpyAsync(to.get(), from.get(), bytes, cudaMemcpyDeviceToDevice, stream()),
                 "cudaMemcpyAsync");
      check_cuda(cudaEventRecord(stop, stream()), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
      float elapsed = 0.0f;
      check_cuda(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
      if (i > 0) milliseconds.push_back(elapsed);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(milliseconds.begin(), milliseconds.end());
    const size_t n = milliseconds.size();
    const double median =
        n % 2 ? milliseconds[n / 2] : 0.5 * (double(milliseconds[n / 2 - 1]) + milliseconds[n / 2]);
    return double(bytes) / (median * 1e-3) / 1e9;
  }

  void synchronize() override {
    activate();
    // The lanes' work joined the main stream when their tasks ended: every lane's counts are
    // copied behind it, then one wait covers it all.
    queue_deferred_copy(main_lane_, main_lane_.stream);
    for (const std::unique_ptr<Lane>& lane : lanes_) queue_deferred_copy(*lane, main_lane_.stream);
    check_cuda(cudaStreamSynchronize(main_lane_.stream), "cudaStreamSynchronize");
    deliver_deferred(main_lane_);
    for (const std::unique_ptr<Lane>& lane : lanes_) deliver_deferred(*lane);
  }

  void count_nonzero_rows_deferred(const DeviceTensor& mask, int64_t cols,
                                   std::span<int64_t> counts) override {
    const RowShape shape = counted_rows(mask, cols, counts);
    if (shape.rows == 0) return;
    Lane& lane = this->lane();
    if (lane.deferred.empty() ||
        lane.deferred.back().used + counts.size() > lane.deferred.back().capacity) {
      // A larger buffer beside the full one: no wait for the device inside a step. Both are copied
      // and delivered by the next synchronize(), which then keeps the larger.
      const size_t last = lane.deferred.empty() ? 0 : lane.deferred.back().capacity;
      const size_t capacity = std::max<size_t>(counts.size(), 2 * last + 4096);
      DeferredBuffer buffer;
      buffer.device = device_alloc(device_, capacity * sizeof(int64_t));
      buffer.host = pinned_alloc(capacity);
      buffer.capacity = capacity;
      lane.deferred.push_back(std::move(buffer));
    }
    DeferredBuffer& buffer = lane.deferred.back();
    int64_t* device_counts = static_cast<int64_t*>(buffer.device.get()) + buffer.used;
    cuda::launch_count_nonzero_rows(rows_ref<const uint8_t>(mask, shape), shape.rows, cols,
                                    device_counts, stream());
    check_launch("count_nonzero_rows");
    buffer.pending.push_back({buffer.used, counts});
    buffer.used += counts.size();
  }

  // Tasks on a few host threads, each with its own stream and scratch (a lane): a lockstep step's
  // per-run attention and policy work is hundreds of small launches per run, which one thread
  // issues far slower than the device runs them. The lanes wait for the main stream's work
  // before the tasks, and the main stream for theirs after, so stream order is as if one thread
  // had issued every op. $KVLENS_CUDA_LANES sets the lanes (default 8; 1 runs the tasks in order
  // on the calling thread). Capturing a whole step of runs into a CUDA graph instead (relaxed
  // stream capture from every lane, cudaGraphExecUpdate of the last graph, one launch) was
  // measured slower: 12.3 against 8.2 ms for 8 policies on the 1B shape (H200), as capturing an op
  // costs the host about what launching it does here and the device idles until the capture ends.
  void run_tasks(int64_t count, const std::function<void(int64_t)>& task) override {
    const int64_t wanted = std::min<int64_t>(count, lane_limit());
    if (wanted <= 1 || capture_.active || current_lane_ != nullptr) {
      Backend::run_tasks(count, task);
      return;
    }
    activate();
    while (int64_t(lanes_.size()) < wanted) lanes_.push_back(std::make_unique<Lane>(*this));
    if (!lane_pool_ || lane_pool_->size() < wanted)
      lane_pool_ = std::make_unique<ThreadPool>(int(lane_limit()));
    check_cuda(cudaEventRecord(fork_, main_lane_.stream), "cudaEventRecord");
    for (int64_t l = 0; l < wanted; ++l)
      check_cuda(cudaStreamWaitEvent(lanes_[size_t(l)]->stream, fork_, 0), "cudaStreamWaitEvent");
    std::atomic<int64_t> next{0};
    std::exception_ptr error;
    std::mutex error_mutex;
    lane_pool_->for_each(wanted, [&](int64_t l) {
      Lane& lane = *lanes_[size_t(l)];
      current_lane_ = &lane;
      try {
        activate();
        for (int64_t i = next++; i < count; i = next++) task(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      current_lane_ = nullptr;
    });
    // The join, even after a failure: later ops on the main stream come after the lanes' ops.
    for (int64_t l = 0; l < wanted; ++l) {
      Lane& lane = *lanes_[size_t(l)];
      check_cuda(cudaEventRecord(lane.done, lane.stream), "cudaEventRecord");
      check_cuda(cudaStreamWaitEvent(main_lane_.stream, lane.done, 0), "cudaStreamWaitEvent");
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  struct ProductShape {
    int64_t rows = 0, in = 0, out = 0;
  };
  // Decode products of one input (every weight of one dtype, 1..kMaxGemvRows rows, at most
  // kMaxGemvProducts of them): checks them and sums their widths into shape.out; false where
  // the gemv kernel does not take them (then the caller falls back to the generic path).
  static bool decode_products(const std::string& op, const DeviceTensor& x,
                              std::span<const DeviceTensor* const> ws,
                              std::span<DeviceTensor* const> ys, ProductShape& shape) {
    if (ws.size() != ys.size())
      bad_argument(op + ": ys", std::to_string(ws.size()) + " outputs (one per weight)",
                   std::to_string(ys.size()));
    bool fits = ws.size() <= size_t(cuda::kMaxGemvProducts) && !ws.empty();
    shape = ProductShape{};
    for (size_t i = 0; i < ws.size(); ++i) {
      const ProductShape one = product_shape(op, x, *ws[i], *ys[i]);
      fits =
          fits && one.rows >= 1 && one.rows <= cuda::kMaxGemvRows && ws[i]->dtype == ws[0]->dtype;
      shape.rows = one.rows;
      shape.in = one.in;
      shape.out += one.out;
    }
    return fits;
  }

  // Whether an RMSNorm over x's rows (and a SiLU pair) can run inside the products' kernel: the
  // warp kernel takes the operands (gemv_fusable; the scalar fallback fuses nothing) and the
  // rows fit in its shared memory.
  static bool norm_fusable(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                           const DeviceTensor& norm_weight, const DeviceTensor& normed,
                           const ProductShape& shape) {
    cuda::GemvProducts products;
    for (size_t i = 0; i < ws.size(); ++i) products.w[i] = ws[i]->data;
    products.count = int(ws.size());
    // (the fused kernel is built for a norm weight in F32 or in the products' dtype)
    return (norm_weight.dtype == DType::F32 || norm_weight.dtype == ws[0]->dtype) &&
           elements(norm_weight) == shape.in && normed.dtype == DType::F32 &&
           elements(normed) == elements(x) && cuda::gemv_stages_rows(shape.rows, shape.in) &&
           cuda::gemv_fusable(x.as<float>(), products, ws[0]->dtype, shape.rows, shape.in);
  }

  void launch_products(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                       std::span<DeviceTensor* const> ys, const ProductShape& shape,
                       bool accumulate, const DeviceTensor* norm_weight = nullptr, float eps = 0.0f,
                       DeviceTensor* normed = nullptr, bool silu_pair = false) {
    cuda::GemvCall call;
    call.x = x.as<float>();
    call.rows = shape.rows;
    call.in = shape.in;
    call.w_dtype = ws[0]->dtype;
    call.accumulate = accumulate;
    call.silu_pair = silu_pair;
    for (size_t i = 0; i < ws.size(); ++i) {
      call.products.w[i] = ws[i]->data;
      call.products.y[i] = silu_pair ? ys[0]->as<float>() : ys[i]->as<float>();
      call.products.out[i] = ws[i]->dim(0);
    }
    call.products.count = int(ws.size());
    if (norm_weight != nullptr) {
      call.norm_weight = norm_weight->data;
      call.norm_dtype = norm_weight->dtype;
      call.eps = eps;
      call.normed = normed->as<float>();
    }
    cuda::launch_gemv(call, sm_count_, stream());
    check_launch("gemv");
  }

  struct CacheShape {
    int64_t kv_heads = 0, capacity = 0, head_dim = 0;
  };

  // One cache [G, capacity, D] of F32, BF16 or F16 (a KV cache in the model's dtype); with
  // cols >= 0 it must hold that many positions.
  static CacheShape cache_shape(const DeviceTensor& cache, const std::string& op, const char* name,
                                int64_t cols = -1) {
    require_weight(cache, op, name);
    if (cache.shape.size() != 3)
      bad_argument(op + ": " + name, "[G, capacity, D]", describe(cache));
    const CacheShape shape{cache.dim(0), cache.dim(1), cache.dim(2)};
    if (cols > shape.capacity)
      bad_argument(op + ": cols", cat({"at most the capacity ", std::to_string(shape.capacity)}),
                   std::to_string(cols));
    return shape;
  }

  // Quest's page summaries: two F32 [G, pages, D] tensors of one shape, G and D those of
  // `expected` (a cache's or q's); returns the page count.
  static int64_t page_summary_pages(const DeviceTensor& page_min, const DeviceTensor& page_max,
                                    const CacheShape& expected, const std::string& op) {
    require(page_min, DType::F32, op, "page_min");
    require(page_max, DType::F32, op, "page_max");
    if (page_min.shape.size() != 3 || page_min.dim(0) != expected.kv_heads || page_min.dim(1) < 0 ||
        page_min.dim(2) != expected.head_dim || page_max.shape != page_min.shape)
      bad_argument(op + ": page_min, page_max",
                   cat({"two F32 [", std::to_string(expected.kv_heads), ", pages, ",
                        std::to_string(expected.head_dim), "] tensors"}),
                   describe(page_min) + ", " + describe(page_max));
    return page_min.dim(1);
  }

  static void require_page_size(int64_t page_size, const std::string& op) {
    if (page_size < 1)
      bad_argument(op + ": page_size", "a page size >= 1", std::to_string(page_size));
  }

  static CacheShape cache_shape(const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                const std::string& op) {
    cache_shape(k_cache, op, "k_cache");
    if (v_cache.shape != k_cache.shape || v_cache.dtype != k_cache.dtype)
      bad_argument(op + ": v_cache",
                   "the dtype and shape of k_cache " + std::string(dtype_name(k_cache.dtype)) +
                       shape_string(k_cache.shape),
                   describe(v_cache));
    return {k_cache.dim(0), k_cache.dim(1), k_cache.dim(2)};
  }

  // Logit rows for argmax / log_prob: x [rows, V] F32; returns V.
  static int64_t logit_columns(const DeviceTensor& x, int64_t rows, const std::string& op) {
    require(x, DType::F32, op, "x");
    const int64_t cols = x.shape.empty() ? 0 : x.shape.back();
    if (cols <= 0 || cols > INT32_MAX || rows * cols != elements(x))
      bad_argument(op + ": x", std::to_string(rows) + " rows of logits", describe(x));
    return cols;
  }

  // The operands of y[n, out] = x[n, in] * w[out, in]^T, checked.
  static ProductShape product_shape(const std::string& op, const DeviceTensor& x,
                                    const DeviceTensor& w, const DeviceTensor& y) {
    require(x, DType::F32, op, "x");
    require_weight(w, op, "w");
    require(y, DType::F32, op, "y");
    if (w.shape.size() != 2) bad_argument(op + ": w", "[out, in]", describe(w));
    const int64_t out_features = w.dim(0);
    const int64_t in_features = w.dim(1);
    if (in_features == 0 || elements(x) % in_features != 0)
      bad_argument(op + ": x", cat({"rows of ", std::to_string(in_features)}), describe(x));
    const int64_t rows = elements(x) / in_features;
    require_elements(y, rows * out_features, op, "y");
    if (rows > INT_MAX || in_features > INT_MAX || out_features > INT_MAX)
      bad_argument(op, "dimensions below 2^31 (cuBLAS int API)", describe(x) + " x " + describe(w));
    return {rows, in_features, out_features};
  }

  // Many rows (a prefill chunk): cuBLAS SGEMM; BF16/F16 weights over slices of output features
  // widened to F32 in a bounded scratch buffer (exact widening, the F32 products the CPU
  // reference computes).
  void gemm(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y,
            const ProductShape& shape) {
    // One cuBLAS handle for every lane: its stream is set per call, under the lock.
    std::lock_guard<std::mutex> lock(blas_mutex_);
    check_cublas(cublasSetStream(blas_.get(), stream()), "cublasSetStream");
    if (w.dtype == DType::F32) {
      check_cublas(cuda::sgemm_x_wt(blas_.get(), x.as<float>(), w.as<float>(), y.as<float>(),
                                    shape.rows, shape.in, shape.out, shape.out),
                   "cublasSgemm");
      return;
    }
    constexpr int64_t kWidenedElements = int64_t(1) << 24;  // 64 MiB of F32
    const int64_t slice = std::max<int64_t>(1, kWidenedElements / shape.in);
    float* widened = static_cast<float*>(
        lane().widen.get(device_, size_t(std::min(slice, shape.out) * shape.in) * sizeof(float)));
    const size_t element_bytes = dtype_size(w.dtype);
    for (int64_t first = 0; first < shape.out; first += slice) {
      const int64_t count = std::min(slice, shape.out - first);
      cuda::launch_widen_to_f32(
          static_cast<const char*>(w.data) + size_t(first * shape.in) * element_bytes, w.dtype,
          count * shape.in, widened, stream());
      check_launch("widen_to_f32");
      check_cublas(cuda::sgemm_x_wt(blas_.get(), x.as<float>(), widened, y.as<float>() + first,
                                    shape.rows, shape.in, count, shape.out),
                   "cublasSgemm");
    }
  }

  void activate() const { check_cuda(cudaSetDevice(device_), "cudaSetDevice"); }

  cuda::StepState* step_state() const { return static_cast<cuda::StepState*>(step_state_.get()); }
  // While a step is being recorded: the device copy of its position, which the recorded kernels
  // read (`position` must be the recorded one); null otherwise.
  // rope of x, and of x2 where given, in one launch.
  void rope_rows(DeviceTensor& x, DeviceTensor* x2, std::span<const int64_t> positions,
                 const DeviceTensor& inv_freq, float scale) {
    const std::string op = "rope";
    require(inv_freq, DType::F32, op, "inv_freq");
    // The rotated channels come from inv_freq [R/2], the head dimension from a 3-D x [n, heads,
    // D] (else D = R), the heads from x's size.
    const int64_t rotary_dim = 2 * elements(inv_freq);
    const int64_t rows = int64_t(positions.size());
    auto heads_of = [&](const DeviceTensor& t, const char* name, int64_t head_dim) {
      require(t, DType::F32, op, name);
      if (rotary_dim == 0 || rotary_dim > head_dim || (rows == 0 && elements(t) != 0) ||
          (rows > 0 && elements(t) % (rows * head_dim) != 0))
        bad_argument(op + ": " + name,
                     cat({"[", std::to_string(rows), ", heads, ", std::to_string(head_dim),
                          "], D >= ", std::to_string(rotary_dim)}),
                     describe(t));
      return rows > 0 ? elements(t) / (rows * head_dim) : 0;
    };
    const int64_t head_dim = x.shape.size() == 3 ? x.shape[2] : rotary_dim;
    const int64_t heads = heads_of(x, "x", head_dim);
    int64_t heads2 = 0;
    if (x2 != nullptr) {
      if ((x2->shape.size() == 3 ? x2->shape[2] : rotary_dim) != head_dim)
        bad_argument(op + ": k", cat({"[n, heads, ", std::to_string(head_dim), "]"}),
                     describe(*x2));
      heads2 = heads_of(*x2, "k", head_dim);
    }
    if (rows == 0 || (heads == 0 && heads2 == 0)) return;
    activate();
    // A step's rows share one position and a chunk's are consecutive: then the kernel derives
    // them from two values passed by value, with no host-to-device copy to order first.
    const int64_t first = positions[0];
    const int64_t stride = rows > 1 ? positions[1] - positions[0] : 0;
    bool arithmetic = stride == 0 || stride == 1;
    for (int64_t i = 2; i < rows && arithmetic; ++i)
      arithmetic = positions[size_t(i)] == first + i * stride;
    const int64_t* recorded = nullptr;
    if (capture_.active) {
      if (!arithmetic || stride != 0)
        bad_argument(op + ": positions (recording a step)", "the recorded step's position",
                     "several positions");
      recorded = step_position(first, op);
    }
    const int64_t* device_positions = arithmetic ? nullptr : stage(positions);
    float* first_rows = heads > 0 ? x.as<float>() : x2->as<float>();
    const int64_t first_heads = heads > 0 ? heads : heads2;
    cuda::launch_rope(first_rows, first_heads, heads > 0 && x2 ? x2->as<float>() : nullptr,
                      heads > 0 ? heads2 : 0, rows, head_dim, rotary_dim, device_positions, first,
                      stride, recorded, inv_freq.as<float>(), scale, stream());
    check_launch("rope");
  }

  const int64_t* step_position(int64_t position, const std::string& op) const {
    if (!capture_.active) return nullptr;
    if (position != capture_.position)
      bad_argument(op + ": position (recording a step)",
                   cat({"the recorded step's position ", std::to_string(capture_.position)}),
                   std::to_string(position));
    return &step_state()->position;
  }
  cudaStream_t stream() const { return lane().stream; }

  // Copies host values (ids, positions, targets) to device memory for the next kernel.
  template <typename T>
  const T* stage(std::span<const T> host) {
    void* device = lane().staging.get(device_, host.size_bytes());
    check_cuda(
        cudaMemcpyAsync(device, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream()),
        "cudaMemcpyAsync");
    return static_cast<const T*>(device);
  }

  void copy_results(const void* device, void* host, size_t bytes) {
    check_cuda(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream()),
               "cudaMemcpyAsync");
    check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  }

  // A stream and the scratch buffers its ops reuse (ordered by that stream alone): the main
  // stream's, and one per host thread of run_tasks.
  struct Deferred {
    size_t offset;
    std::span<int64_t> counts;
  };
  // count_nonzero_rows_deferred's counts in device memory, copied to pinned host memory behind
  // their kernels and on to the callers' spans by synchronize().
  struct DeferredBuffer {
    std::shared_ptr<void> device;
    std::unique_ptr<int64_t[], PinnedDeleter> host;
    size_t capacity = 0, used = 0;
    std::vector<Deferred> pending;
  };
  struct Lane {
    Lane() = default;
    // A lane of run_tasks: a stream of its own and the event that marks its tasks' end.
    explicit Lane(const CudaBackend& backend) : owner(&backend) {
      backend.activate();
      cudaStream_t created = nullptr;
      check_cuda(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags");
      owned_stream.reset(created);
      stream = created;
      check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    }
    ~Lane() {
      if (done != nullptr) cudaEventDestroy(done);
    }
    Lane(const Lane&) = delete;
    Lane& operator=(const Lane&) = delete;

    const CudaBackend* owner = nullptr;  // (the main lane's is not asked)
    cudaStream_t stream = nullptr;
    std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter> owned_stream;
    cudaEvent_t done = nullptr;
    Scratch staging;          // host spans copied in
    Scratch results;          // argmax / log-prob values copied out
    Scratch widen;            // F32 slices of a BF16/F16 weight for many-row products
    Scratch attention_parts;  // the split attention kernels' per-slice softmax pieces
    Scratch bounce;           // overlapping copy_rows
    // count_nonzero_rows_deferred's buffers: the last has room, earlier ones filled up since the
    // last delivery.
    std::vector<DeferredBuffer> deferred;
  };
  // The calling thread's lane when it runs a task of this backend, else the main one (asked
  // for every op: one comparison).
  Lane& lane() {
    return current_lane_ != nullptr && current_lane_->owner == this ? *current_lane_ : main_lane_;
  }
  const Lane& lane() const {
    return current_lane_ != nullptr && current_lane_->owner == this ? *current_lane_ : main_lane_;
  }
  // count_nonzero_rows' checks (both forms); the device made current unless there is nothing.
  RowShape counted_rows(const DeviceTensor& mask, int64_t cols, std::span<int64_t> counts) const {
    const std::string op = "count_nonzero_rows";
    require_cols(cols, op);
    const RowShape shape = row_shape(mask, DType::U8, int64_t(counts.size()), cols, op, "mask");
    if (shape.rows > 0) activate();
    return shape;
  }
  // A lane's pending counts, from device to pinned memory on `stream` (ordered after the lane's
  // counting kernels: its own stream, or the main stream once the lanes have joined it).
  static void queue_deferred_copy(const Lane& lane, cudaStream_t stream) {
    for (const DeferredBuffer& buffer : lane.deferred) {
      if (buffer.used == 0) continue;
      check_cuda(cudaMemcpyAsync(buffer.host.get(), buffer.device.get(),
                                 buffer.used * sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
                 "cudaMemcpyAsync");
    }
  }
  // The counts of a lane whose copies have been waited for, to the callers' spans; then only the
  // largest (last) buffer is kept. Each list is taken first so that nothing is left behind.
  static void deliver_deferred(Lane& lane) {
    for (DeferredBuffer& buffer : lane.deferred) {
      std::vector<Deferred> pending;
      pending.swap(buffer.pending);
      buffer.used = 0;
      for (const Deferred& d : pending)
        std::copy_n(buffer.host.get() + d.offset, d.counts.size(), d.counts.begin());
    }
    if (lane.deferred.size() > 1)
      lane.deferred.erase(lane.deferred.begin(), lane.deferred.end() - 1);
  }
  static int64_t lane_limit() {
    static const int64_t value = [] {
      const char* text = std::getenv("KVLENS_CUDA_LANES");
      const long parsed = text != nullptr ? std::strtol(text, nullptr, 10) : 0;
      return parsed > 0 && parsed <= 64 ? int64_t(parsed) : int64_t(8);
    }();
    return value;
  }

  int device_;
  // Declaration order = reverse release order: buffers, then the cuBLAS handle, then its stream.
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter> stream_;
  std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDeleter> blas_;
  std::mutex blas_mutex_;
  Lane main_lane_;  // stream_'s
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::unique_ptr<ThreadPool> lane_pool_;
  cudaEvent_t fork_ = nullptr;              // the main stream's point the lanes start from
  static thread_local Lane* current_lane_;  // the lane of a run_tasks task on this thread
  int sm_count_ = 0;                        // streaming multiprocessors (kernel grid sizes)
  // A step being recorded (record_step) and the device state its replays set.
  struct Capture {
    bool active = false;
    int64_t position = 0, rows = 0;
  } capture_;
  std::shared_ptr<void> step_state_;
};

thread_local CudaBackend::Lane* CudaBackend::current_lane_ = nullptr;

}  // namespace

bool cuda_device_available() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the error so later CUDA calls do not report it
    return false;
  }
  return count > 0;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    check_cuda(status, "cudaGetDeviceCount");
  }
  if (device < 0 || device >= count)
    throw Error("cuda", "device", cat({"a device index in [0, ", std::to_string(count), ")"}),
                std::to_string(device));
  return std::make_unique<CudaBackend>(device);
}

}  // namespace kvlens
