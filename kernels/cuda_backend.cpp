// The CUDA backend's lifetime, memory and copies, fences, recorded steps (CUDA graphs), the
// deferred sparsity counts and the lanes of run_tasks (host threads with streams of their own);
// the class is in cuda_backend_impl.h, the ops in cuda_model_ops.cpp and cuda_policy_ops.cpp.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend/policy_op_math.h"
#include "engine/common/error.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_backend_impl.h"
#include "kernels/reductions.cuh"
#include "kernels/step_graph.cuh"

namespace kvlens::cuda {

CudaBackend::CudaBackend(int device) : device_(device) {
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

CudaBackend::~CudaBackend() {
  // The handle, stream and scratch buffers belong to this device; make it current for their
  // release. Errors are ignored (a destructor must not throw).
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_.get());
  lane_pool_.reset();
  for (const std::unique_ptr<Lane>& lane : lanes_) cudaStreamSynchronize(lane->stream);
  if (fork_ != nullptr) cudaEventDestroy(fork_);
}

// Weights stay in their checkpoint dtype (F32, BF16 or F16): the products widen them in
// registers (gemv.cu) or in bounded slices (large-row GEMMs), so a BF16 model reads half the
// bytes of its F32 copy per step.
DeviceTensor CudaBackend::upload_weight(const TensorView& view, std::shared_ptr<void> keep_alive) {
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
  t.backend_layout = std::make_shared<const WeightExtent>(WeightExtent{t.data, byte_size(t)});
  return t;
}

DeviceTensor CudaBackend::alloc(DType dtype, std::vector<int64_t> shape) {
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

void CudaBackend::to_host(const DeviceTensor& src, void* host, size_t bytes) {
  if (bytes > byte_size(src))
    bad_argument("to_host", cat({"at most ", std::to_string(byte_size(src)), " bytes"}),
                 std::to_string(bytes) + " bytes");
  if (bytes == 0) return;
  activate();
  check_cuda(cudaMemcpyAsync(host, src.data, bytes, cudaMemcpyDeviceToHost, stream()),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
}

std::shared_ptr<void> CudaBackend::alloc_host(size_t bytes) {
  activate();
  void* memory = nullptr;
  check_cuda(cudaMallocHost(&memory, std::max<size_t>(bytes, 1)), "cudaMallocHost");
  return std::shared_ptr<void>(memory, [](void* p) { cudaFreeHost(p); });
}

void CudaBackend::rows_to_host_async(const DeviceTensor& src, int64_t rows, int64_t cols,
                                     void* host) {
  const std::string op = "rows_to_host_async";
  const int64_t stride = src.shape.empty() ? 0 : src.shape.back();
  if (rows < 0 || cols < 0 || cols > stride || rows * stride > elements(src))
    bad_argument(op, cat({"rows of ", std::to_string(stride), " elements inside ", describe(src)}),
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

std::unique_ptr<Backend::Fence> CudaBackend::fence() {
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

void CudaBackend::from_host(DeviceTensor& dst, const void* host, size_t bytes) {
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

void CudaBackend::copy_rows(const DeviceTensor& src, int64_t src_row, DeviceTensor& dst,
                            int64_t dst_row, int64_t rows, int64_t row_elems) {
  const std::string op = "copy_rows";
  // Rows of any one dtype (F32 activations and policy rows, a narrow KV cache's rows).
  if (src.dtype != dst.dtype)
    bad_argument(op + ": dst", cat({"the dtype of src (", describe(src), ")"}), describe(dst));
  if (src_row < 0 || dst_row < 0 || rows < 0 || row_elems < 0 ||
      (src_row + rows) * row_elems > elements(src) || (dst_row + rows) * row_elems > elements(dst))
    bad_argument(op, cat({"rows inside both tensors (", describe(src), " -> ", describe(dst), ")"}),
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

// Stream capture of the step's ops into a CUDA graph. Thread-local capture mode: only this
// thread's CUDA calls take part, and calls that cannot be captured (allocations, copies to the
// host) fail with an error, which the caller answers by running the step itself.
std::unique_ptr<StepGraph> CudaBackend::record_step(int64_t position, int64_t rows,
                                                    const std::function<void()>& record) {
  // One recording at a time, from the main lane: tasks of run_tasks run op by op. A host-staged
  // all-reduce waits for the stream, which a capture cannot.
  if (host_group_ || rows < 1 || rows > cuda::SmallIds::kCapacity || capture_.active ||
      &lane() != &main_lane_)
    return nullptr;
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

double CudaBackend::copy_bandwidth_gbps(size_t bytes, int repeats) {
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

void CudaBackend::synchronize() {
  activate();
  Lane& own = lane();
  if (&own != &main_lane_) {
    // From a task of run_tasks (a whole session on a lane: the samples of an eval): the task's
    // own ops and counts; other lanes are busy with theirs.
    queue_deferred_copy(own, own.stream);
    check_cuda(cudaStreamSynchronize(own.stream), "cudaStreamSynchronize");
    deliver_deferred(own);
    return;
  }
  // The lanes' work joined the main stream when their tasks ended: every lane's counts are
  // copied behind it, then one wait covers it all.
  queue_deferred_copy(main_lane_, main_lane_.stream);
  for (const std::unique_ptr<Lane>& lane : lanes_) queue_deferred_copy(*lane, main_lane_.stream);
  check_cuda(cudaStreamSynchronize(main_lane_.stream), "cudaStreamSynchronize");
  deliver_deferred(main_lane_);
  for (const std::unique_ptr<Lane>& lane : lanes_) deliver_deferred(*lane);
}

// Room for `counts` in the lane's deferred buffers: the device address its counts go to, to be
// copied to `counts` by the next synchronize().
int64_t* CudaBackend::deferred_slots(std::span<int64_t> counts) {
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
  buffer.pending.push_back({buffer.used, counts});
  buffer.used += counts.size();
  return device_counts;
}

void CudaBackend::count_nonzero_rows_deferred(const DeviceTensor& mask, int64_t cols,
                                              std::span<int64_t> counts) {
  const RowCount one{&mask, cols, counts};
  count_nonzero_rows_deferred_many({&one, 1});
}

// Every mask is checked before anything is queued; then one launch per kCountMasks masks (a mask
// without rows takes no slot, and no block of the kernel). The argument list is per thread and
// reused (every step).
void CudaBackend::count_nonzero_rows_deferred_many(std::span<const RowCount> masks) {
  thread_local std::vector<cuda::CountArgs> args;
  args.clear();
  for (const RowCount& m : masks) {
    const RowShape shape = counted_rows(*m.mask, m.cols, m.counts);
    args.push_back({rows_ref<const uint8_t>(*m.mask, shape), shape.rows, m.cols, nullptr});
  }
  bool any = false;
  for (size_t i = 0; i < masks.size(); ++i) {
    if (args[i].rows == 0) continue;
    args[i].counts = deferred_slots(masks[i].counts);
    any = true;
  }
  if (!any) return;
  cuda::launch_count_nonzero_rows(args, stream());
  check_launch("count_nonzero_rows");
}

// A plug-in's scores checked where they are: the counts come back with the step's others.
void CudaBackend::count_nonfinite_rows_deferred(const DeviceTensor& x, int64_t cols,
                                                std::span<int64_t> counts) {
  const std::string op = "count_nonfinite_rows_deferred";
  require_cols(cols, op);
  const RowShape shape = row_shape(x, DType::F32, int64_t(counts.size()), cols, op, "x");
  if (shape.rows == 0) return;
  activate();
  cuda::launch_count_nonfinite_rows(x.as<const float>(), shape.rows, shape.stride, cols,
                                    deferred_slots(counts), stream());
  check_launch("count_nonfinite_rows");
}

bool CudaBackend::runs_tasks_in_order() const {
  return lane_limit() <= 1 || capture_.active || current_lane_ != nullptr;
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
void CudaBackend::run_tasks(int64_t count, const std::function<void(int64_t)>& task) {
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

const int64_t* CudaBackend::step_position(int64_t position, const std::string& op) const {
  if (!capture_.active) return nullptr;
  if (position != capture_.position)
    bad_argument(op + ": position (recording a step)",
                 cat({"the recorded step's position ", std::to_string(capture_.position)}),
                 std::to_string(position));
  return &step_state()->position;
}

void CudaBackend::copy_results(const void* device, void* host, size_t bytes) {
  check_cuda(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream()),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
}

// count_nonzero_rows' checks (both forms); the device made current unless there is nothing.
RowShape CudaBackend::counted_rows(const DeviceTensor& mask, int64_t cols,
                                   std::span<int64_t> counts) const {
  const std::string op = "count_nonzero_rows";
  require_cols(cols, op);
  const RowShape shape = row_shape(mask, DType::U8, int64_t(counts.size()), cols, op, "mask");
  if (shape.rows > 0) activate();
  return shape;
}

// A lane's pending counts, from device to pinned memory on `stream` (ordered after the lane's
// counting kernels: its own stream, or the main stream once the lanes have joined it).
void CudaBackend::queue_deferred_copy(const Lane& lane, cudaStream_t stream) {
  for (const DeferredBuffer& buffer : lane.deferred) {
    if (buffer.used == 0) continue;
    check_cuda(cudaMemcpyAsync(buffer.host.get(), buffer.device.get(),
                               buffer.used * sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync");
  }
}

// The counts of a lane whose copies have been waited for, to the callers' spans; then only the
// largest (last) buffer is kept. Each list is taken first so that nothing is left behind.
void CudaBackend::deliver_deferred(Lane& lane) {
  for (DeferredBuffer& buffer : lane.deferred) {
    std::vector<Deferred> pending;
    pending.swap(buffer.pending);
    buffer.used = 0;
    for (const Deferred& d : pending)
      std::copy_n(buffer.host.get() + d.offset, d.counts.size(), d.counts.begin());
  }
  if (lane.deferred.size() > 1) lane.deferred.erase(lane.deferred.begin(), lane.deferred.end() - 1);
}

int64_t CudaBackend::lane_limit() {
  static const int64_t value = [] {
    const char* text = std::getenv("KVLENS_CUDA_LANES");
    const long parsed = text != nullptr ? std::strtol(text, nullptr, 10) : 0;
    return parsed > 0 && parsed <= 64 ? int64_t(parsed) : int64_t(8);
  }();
  return value;
}

thread_local CudaBackend::Lane* CudaBackend::current_lane_ = nullptr;

CudaBackend& cuda_backend_of_extension(Backend& backend, std::string_view extension) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr)
    throw Error("cuda backend", "op extension '" + std::string(extension) + "'", "the CUDA backend",
                backend.name());
  return *cuda;
}

}  // namespace kvlens::cuda

namespace kvlens {

bool cuda_device_available() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the error so later CUDA calls do not report it
    return false;
  }
  return count > 0;
}

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

int64_t cuda_device_memory_bytes(int device) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count)
    throw Error("cuda", "device", cuda::cat({"a device index in [0, ", std::to_string(count), ")"}),
                std::to_string(device));
  cudaDeviceProp properties{};
  cuda::check_cuda(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties");
  return int64_t(properties.totalGlobalMem);
}

void cuda::CudaBackend::all_reduce_sum(DeviceTensor& partial) {
  if (nccl_) {
    activate();
    const size_t count = size_t(partial.numel());
    if (peers_ && peers_->fits(count, partial.dtype)) {
      peers_->all_reduce_sum(rank_, partial.data, count, partial.dtype, stream());
    } else {
      nccl_->all_reduce_sum(rank_, partial.data, count, partial.dtype, stream());
    }
    return;
  }
  if (!host_group_) return;
  if (partial.dtype != DType::F32) {
    throw Error("all_reduce_sum", "dtype", "F32 (a group through host memory)",
                std::string(dtype_name(partial.dtype)));
  }
  activate();
  std::vector<float> host(size_t(partial.numel()));
  const size_t bytes = host.size() * sizeof(float);
  cuda::check_cuda(
      cudaMemcpyAsync(host.data(), partial.data, bytes, cudaMemcpyDeviceToHost, stream()),
      "cudaMemcpyAsync");
  cuda::check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
  host_group_->all_reduce_sum(rank_, host.data(), int64_t(host.size()));
  cuda::check_cuda(
      cudaMemcpyAsync(partial.data, host.data(), bytes, cudaMemcpyHostToDevice, stream()),
      "cudaMemcpyAsync");
  cuda::check_cuda(cudaStreamSynchronize(stream()), "cudaStreamSynchronize");
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    cuda::check_cuda(status, "cudaGetDeviceCount");
  }
  if (device < 0 || device >= count)
    throw Error("cuda", "device", cuda::cat({"a device index in [0, ", std::to_string(count), ")"}),
                std::to_string(device));
  return std::make_unique<cuda::CudaBackend>(device);
}

std::vector<std::unique_ptr<Backend>> make_cuda_backend_group(std::span<const int> devices) {
  std::vector<std::unique_ptr<Backend>> group;
  for (const int device : devices) group.push_back(make_cuda_backend(device));
  if (devices.size() < 2) return group;
  const bool shared_gpu = std::set<int>(devices.begin(), devices.end()).size() < devices.size();
  if (shared_gpu) {
    const auto host = std::make_shared<HostReduceGroup>(int(devices.size()));
    for (size_t r = 0; r < group.size(); ++r)
      static_cast<cuda::CudaBackend&>(*group[r]).join_host_group(host, int(r));
    return group;
  }
  const std::shared_ptr<cuda::NcclGroup> nccl = cuda::NcclGroup::create(devices);
  // The peer all-reduce is opt-in (KVLENS_PEER_ALL_REDUCE=1): slower than NCCL on 2 H200s.
  const char* peer_text = std::getenv("KVLENS_PEER_ALL_REDUCE");
  const std::shared_ptr<cuda::PeerReduceGroup> peers =
      peer_text != nullptr && std::string_view(peer_text) == "1"
          ? cuda::PeerReduceGroup::create(devices)
          : nullptr;
  for (size_t r = 0; r < group.size(); ++r)
    static_cast<cuda::CudaBackend&>(*group[r]).join_group(nccl, peers, int(r));
  return group;
}

}  // namespace kvlens
