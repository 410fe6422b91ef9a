// A tensor-parallel group's collectives on the GPU: one NCCL communicator per device of the
// group, made at once in this process (ncclCommInitAll), each rank driven by its own host thread.
// NCCL is loaded when a group is first made (dlopen): kvlens runs where NCCL is absent, and only
// a session on several GPUs needs it. NVLink multicast stays off (NCCL_NVLS_ENABLE=0 unless the
// user set it).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/common/dtype.h"

namespace kvlens::cuda {

class NcclGroup {
 public:
  // Rank r on GPU devices[r]. Throws kvlens::Error naming the libraries tried when NCCL cannot
  // be loaded, or NCCL's own message when it fails.
  static std::shared_ptr<NcclGroup> create(std::span<const int> devices);
  ~NcclGroup();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

  int ranks() const { return int(comms_.size()); }
  // data [count] of `dtype` (F32 or BF16) on rank's GPU: the sum over the ranks, in place,
  // queued on `stream` (and recorded there when the stream is being captured into a graph).
  void all_reduce_sum(int rank, void* data, size_t count, DType dtype, cudaStream_t stream);
  // ncclCommAbort on every communicator: ranks blocked in a collective return; the group is
  // unusable afterwards (all_reduce_sum throws).
  void abort();

  // NCCL's entry points, as loaded (nccl_group.cpp).
  struct Library;

 private:
  NcclGroup() = default;
  const Library* library_ = nullptr;
  std::vector<void*> comms_;  // ncclComm_t
  std::atomic<bool> aborted_ = false;
  std::mutex abort_mutex_;
};

}  // namespace kvlens::cuda
