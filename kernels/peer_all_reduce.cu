// PeerReduceGroup (peer_all_reduce.h): the rounds' kernel and the peer memory it reads. Each
// rank's kernel copies its partial into its staging half for this round's parity, tells every
// peer the round it reached (a store into the peer's flags), waits until every peer reached it,
// then sums staging[0..R) in rank order. A staging half is written again two rounds later, when
// every peer has finished reading it: a peer publishes round n+1 only after its round-n kernel.
#include <cuda_bf16.h>

#include <algorithm>
#include <set>
#include <string>

#include "engine/common/error.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/peer_all_reduce.h"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 512;

struct PeerArgs {
  int rank = 0, ranks = 0;
  void* data = nullptr;
  size_t count = 0;
  const char* staging[PeerReduceGroup::kMaxRanks] = {};
  uint64_t* flags[PeerReduceGroup::kMaxRanks] = {};
  uint64_t* round = nullptr;
  const volatile int* aborted = nullptr;
};

__device__ __forceinline__ float load_fresh(const float* p) {
  return __ldcv(p);
}
__device__ __forceinline__ float load_fresh(const __nv_bfloat16* p) {
  const unsigned short bits = *reinterpret_cast<const volatile unsigned short*>(p);
  return __bfloat162float(__ushort_as_bfloat16(bits));
}
__device__ __forceinline__ void store(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16(v);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) peer_all_reduce_kernel(PeerArgs a) {
  begin_dependent_grid();
  __shared__ uint64_t round_shared;
  if (threadIdx.x == 0) round_shared = *a.round + 1;
  __syncthreads();
  const uint64_t round = round_shared;
  const size_t half = (round & 1) * PeerReduceGroup::kMaxBytes;
  T* data = static_cast<T*>(a.data);
  T* mine = reinterpret_cast<T*>(const_cast<char*>(a.staging[a.rank]) + half);
  for (size_t i = threadIdx.x; i < a.count; i += kThreads) mine[i] = data[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // the partial is visible to the peers before the flag says so
    for (int p = 0; p < a.ranks; ++p) {
      if (p != a.rank) *reinterpret_cast<volatile uint64_t*>(a.flags[p] + a.rank) = round;
    }
    for (int p = 0; p < a.ranks; ++p) {
      if (p == a.rank) continue;
      const volatile uint64_t* flag = a.flags[a.rank] + p;
      // The abort flag lives in host memory (a slow read): looked at every 1024 spins.
      for (unsigned spins = 1; *flag < round; ++spins) {
        if ((spins & 1023u) == 0 && *a.aborted != 0) break;
      }
    }
    __threadfence_system();
    *a.round = round;
  }
  __syncthreads();
  for (size_t i = threadIdx.x; i < a.count; i += kThreads) {
    float sum = 0.0f;
    for (int p = 0; p < a.ranks; ++p)
      sum += load_fresh(reinterpret_cast<const T*>(a.staging[p] + half) + i);
    store(data + i, sum);
  }
}

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) {
    throw Error("tensor parallel", call, "cudaSuccess", cudaGetErrorString(status));
  }
}

}  // namespace

std::shared_ptr<PeerReduceGroup> PeerReduceGroup::create(std::span<const int> devices,
                                                         bool shared_gpus) {
  if (devices.size() < 2 || devices.size() > size_t(kMaxRanks) ||
      (!shared_gpus && std::set<int>(devices.begin(), devices.end()).size() != devices.size()))
    return nullptr;
  for (const int a : devices) {
    for (const int b : devices) {
      int can = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0)) {
        cudaGetLastError();
        return nullptr;
      }
    }
  }
  int current = 0;
  check(cudaGetDevice(&current), "cudaGetDevice");
  std::shared_ptr<PeerReduceGroup> group(new PeerReduceGroup());
  void* host = nullptr;
  check(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
        "cudaHostAlloc");
  group->aborted_ = static_cast<volatile int*>(host);
  *group->aborted_ = 0;
  for (const int device : devices) {
    check(cudaSetDevice(device), "cudaSetDevice");
    for (const int peer : std::set<int>(devices.begin(), devices.end())) {
      if (peer == device) continue;
      const cudaError_t enabled = cudaDeviceEnablePeerAccess(peer, 0);
      if (enabled == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
      } else {
        check(enabled, "cudaDeviceEnablePeerAccess");
      }
    }
    Rank rank;
    rank.device = device;
    group->ranks_.push_back(rank);  // owned from here: the destructor frees what was made
    Rank& made = group->ranks_.back();
    check(cudaMalloc(&made.staging, 2 * kMaxBytes), "cudaMalloc");
    check(cudaMalloc(reinterpret_cast<void**>(&made.flags), kMaxRanks * sizeof(uint64_t)),
          "cudaMalloc");
    check(cudaMalloc(reinterpret_cast<void**>(&made.round), sizeof(uint64_t)), "cudaMalloc");
    check(cudaMemset(made.flags, 0, kMaxRanks * sizeof(uint64_t)), "cudaMemset");
    check(cudaMemset(made.round, 0, sizeof(uint64_t)), "cudaMemset");
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  check(cudaSetDevice(current), "cudaSetDevice");
  return group;
}

PeerReduceGroup::~PeerReduceGroup() {
  int current = 0;
  cudaGetDevice(&current);
  for (const Rank& rank : ranks_) {
    cudaSetDevice(rank.device);
    cudaFree(rank.staging);
    cudaFree(rank.flags);
    cudaFree(rank.round);
  }
  cudaSetDevice(current);
  if (aborted_) cudaFreeHost(const_cast<int*>(aborted_));
  cudaGetLastError();
}

void PeerReduceGroup::all_reduce_sum(int rank, void* data, size_t count, DType dtype,
                                     cudaStream_t stream) {
  if (*aborted_) {
    throw Error("tensor parallel", "all_reduce_sum", "every rank alive", "a rank failed");
  }
  if (!fits(count, dtype)) {
    throw Error("tensor parallel", "all_reduce_sum",
                "an F32 or BF16 tensor of at most " + std::to_string(kMaxBytes) + " bytes",
                std::string(dtype_name(dtype)) + " [" + std::to_string(count) + "]");
  }
  if (count == 0) return;
  PeerArgs args;
  args.rank = rank;
  args.ranks = int(ranks_.size());
  args.data = data;
  args.count = count;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    args.staging[r] = static_cast<const char*>(ranks_[r].staging);
    args.flags[r] = ranks_[r].flags;
  }
  args.round = ranks_.at(size_t(rank)).round;
  args.aborted = aborted_;
  if (dtype == DType::F32) {
    launch_dependent(peer_all_reduce_kernel<float>, 1, kThreads, 0, stream, args);
  } else {
    launch_dependent(peer_all_reduce_kernel<__nv_bfloat16>, 1, kThreads, 0, stream, args);
  }
  check(cudaGetLastError(), "peer_all_reduce_kernel");
}

void PeerReduceGroup::abort() {
  *aborted_ = 1;
}

}  // namespace kvlens::cuda
