// Programmatic dependent launch (Hopper and later): every kernel of the backend is launched with
// launch_dependent, which lets the next kernel of the stream start while this one finishes; each
// kernel calls begin_dependent_grid() before it touches memory another kernel writes, which
// waits for the kernel before it to complete (its writes visible) and then lets the one after it
// start. Launch latency then overlaps the previous kernel's tail, and a decode product requests
// its first weights (which no kernel writes) before it waits. Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

namespace kvlens::cuda {

// Waits for the grids this one depends on (a no-op when it was launched without the attribute
// or on a GPU without dependent launch), then allows the next grid of the stream to be
// scheduled: it will wait for this grid in turn, so nothing this grid writes is read early.
__device__ __forceinline__ void begin_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The current device's compute capability major version (0 where it cannot be asked), cached
// per device.
inline int device_compute_major() {
  constexpr int kDevices = 64;
  static std::atomic<int> cached[kDevices] = {};  // major + 1 once known
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) return 0;
  int known = cached[device].load(std::memory_order_relaxed);
  if (known == 0) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    known = major + 1;
    cached[device].store(known, std::memory_order_relaxed);
  }
  return known - 1;
}

// Whether launches on the current device carry the attribute: compute capability 9.0 or later,
// unless $KVLENS_DEPENDENT_LAUNCH is 0 (for measuring what it is worth).
inline bool dependent_launch_enabled() {
  static const bool allowed = [] {
    const char* text = std::getenv("KVLENS_DEPENDENT_LAUNCH");
    return text == nullptr || std::strcmp(text, "0") != 0;
  }();
  return allowed && device_compute_major() >= 9;
}

// Lets `kernel` take `shared_bytes` of dynamic shared memory on the current device, past the
// 48 KiB every kernel may take. The opt-in limit belongs to a kernel on one device: a process
// whose ranks use several GPUs must raise it on each (raising it once per process left every GPU
// but the first refusing the launch as an invalid argument). The limit only ever grows: threads
// launching the same kernel with different sizes (tensor-parallel ranks sharing a GPU) would
// otherwise lower it under each other's launches. Each thread remembers what it saw raised, so a
// launch takes the lock only the first time it needs more. A refusal shows at the launch.
inline void allow_dynamic_shared_memory(const void* kernel, size_t shared_bytes) {
  constexpr size_t kDefaultLimit = 48 * 1024;
  if (shared_bytes <= kDefaultLimit) return;
  struct Limit {
    const void* kernel;
    int device;
    size_t bytes;
  };
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return;
  thread_local std::vector<Limit> seen;  // lower bounds of the limits below
  for (const Limit& l : seen)
    if (l.kernel == kernel && l.device == device && l.bytes >= shared_bytes) return;
  static std::mutex mutex;
  static std::vector<Limit> limits;  // every (kernel, device) raised in this process
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = std::find_if(limits.begin(), limits.end(),
                         [&](const Limit& l) { return l.kernel == kernel && l.device == device; });
  if (it == limits.end()) it = limits.insert(limits.end(), {kernel, device, 0});
  if (it->bytes < shared_bytes &&
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           int(shared_bytes)) == cudaSuccess)
    it->bytes = shared_bytes;
  if (it->bytes >= shared_bytes) seen.push_back(*it);  // a refusal is asked again next time
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) in clusters of `cluster` blocks along x
// (1: no clusters), with the dependent-launch attribute where dependent_launch_enabled(), and the
// kernel's shared memory limit raised where shared_bytes needs it. Errors are left for
// check_launch, as with <<<>>>.
template <typename... Params, typename... Args>
void launch_dependent_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                              cudaStream_t stream, unsigned cluster, Args&&... args) {
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), shared_bytes);
  cudaLaunchAttribute attribute[2];
  unsigned count = 0;
  if (dependent_launch_enabled()) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) {
    attribute[count].id = cudaLaunchAttributeClusterDimension;
    attribute[count++].val.clusterDim = {cluster, 1, 1};
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attribute;
  config.numAttrs = count;
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// launch_dependent_cluster without clusters.
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                      cudaStream_t stream, Args&&... args) {
  launch_dependent_cluster(kernel, grid, block, shared_bytes, stream, 1u,
                           std::forward<Args>(args)...);
}

}  // namespace kvlens::cuda
