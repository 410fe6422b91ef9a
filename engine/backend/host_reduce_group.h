// The all-reduce of a tensor-parallel group whose ranks live in host memory (CPU backends, one
// per rank, each stepped by its own thread): Backend::all_reduce_sum for the CPU, so that the
// split of a model over ranks is checked against one backend where there is no GPU.
// data: [count] F32, the rank's partial sums in, the total out.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

namespace kvlens {

class HostReduceGroup {
 public:
  explicit HostReduceGroup(int ranks);
  int ranks() const { return ranks_; }
  // Waits for every rank's call, then writes into each rank's `data` the sum over ranks taken in
  // rank order ((p0 + p1) + p2 ...): the same bits on every rank. The ranks pass the same count.
  // Throws kvlens::Error once abort() was called (before or while waiting).
  void all_reduce_sum(int rank, float* data, int64_t count);
  // Releases every waiting rank with an error; later calls fail too.
  void abort();

 private:
  // Blocks until all ranks arrived at this barrier (a generation count, so it is reusable).
  void arrive_and_wait(std::unique_lock<std::mutex>& lock);

  const int ranks_;
  std::mutex mutex_;
  std::condition_variable arrived_;
  int waiting_ = 0;
  int64_t generation_ = 0;
  bool aborted_ = false;
  std::vector<float*> inputs_;
  std::vector<int64_t> counts_;
};

}  // namespace kvlens
