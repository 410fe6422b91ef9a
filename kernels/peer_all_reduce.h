// A tensor-parallel group's small sums over peer-to-peer GPU memory (NVLink or PCIe peer access):
// one kernel per rank that publishes its partial, meets the other ranks at a flag, and adds every
// rank's partial in rank order. A decode step's all-reduces (o_proj's and down_proj's [1, E]
// rows, 8-32 KiB) are latency, not bandwidth: NCCL took about 20 us each on 2 H200s, two per
// layer. Larger sums go to NCCL (kernels/nccl_group.h). Shapes: data [count] F32 or BF16, count
// * dtype size <= kMaxBytes. No NVLink multicast (no cuMulticastCreate): plain peer loads/stores.
// A group uses it only with KVLENS_PEER_ALL_REDUCE=1: exact on 2 H200s (the split's cuda test)
// but slower than NCCL there (8B step 4.71 against 4.44 ms, 70B 27.2 against 24.6 ms;
// docs/performance.md, round 12).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

class PeerReduceGroup {
 public:
  static constexpr size_t kMaxBytes = 64 * 1024;  // one rank's partial per call
  static constexpr int kMaxRanks = 8;

  // Rank r on GPU devices[r], peer access enabled between every pair. Null where some pair
  // cannot reach each other or a GPU appears twice (unless `shared_gpus`: ranks on one GPU, whose
  // kernels then must run on streams of their own, as a test on one GPU does); NCCL then does
  // every sum. Throws kvlens::Error when CUDA fails setting it up.
  static std::shared_ptr<PeerReduceGroup> create(std::span<const int> devices,
                                                 bool shared_gpus = false);
  ~PeerReduceGroup();
  PeerReduceGroup(const PeerReduceGroup&) = delete;
  PeerReduceGroup& operator=(const PeerReduceGroup&) = delete;

  bool fits(size_t count, DType dtype) const {
    return (dtype == DType::F32 || dtype == DType::BF16) && count * dtype_size(dtype) <= kMaxBytes;
  }
  // data [count] on rank's GPU: the sum over the ranks, in place, the same bits on every rank
  // (rank order), queued on `stream` (capturable into a graph: the rounds are counted on the
  // GPU). Every rank must make the same calls in the same order.
  void all_reduce_sum(int rank, void* data, size_t count, DType dtype, cudaStream_t stream);
  // Frees ranks waiting for a rank that will not come (their sums are then garbage); the group
  // is unusable afterwards.
  void abort();

 private:
  PeerReduceGroup() = default;
  struct Rank {
    int device = 0;
    void* staging = nullptr;    // [2][kMaxBytes] on this GPU: its partials, by round parity
    uint64_t* flags = nullptr;  // [kMaxRanks] on this GPU: the last round each peer published
    uint64_t* round = nullptr;  // this rank's round count, on its GPU
  };
  std::vector<Rank> ranks_;
  volatile int* aborted_ = nullptr;  // host memory mapped into every GPU
};

}  // namespace kvlens::cuda
