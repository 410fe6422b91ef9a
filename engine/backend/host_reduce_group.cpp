// HostReduceGroup: two barriers around a read of every rank's partial sums; each rank sums all
// of them itself (in rank order, so every rank gets the same bits) between the barriers and
// writes its own buffer only after the second, once nobody reads the partials any more.
#include "engine/backend/host_reduce_group.h"

#include <string>

#include "engine/common/error.h"

namespace kvlens {

HostReduceGroup::HostReduceGroup(int ranks)
    : ranks_(ranks),
      inputs_(size_t(ranks > 0 ? ranks : 0)),
      counts_(size_t(ranks > 0 ? ranks : 0)) {
  if (ranks < 1) throw Error("tensor parallel", "ranks", "at least 1", std::to_string(ranks));
}

void HostReduceGroup::arrive_and_wait(std::unique_lock<std::mutex>& lock) {
  if (aborted_)
    throw Error("tensor parallel", "all_reduce_sum", "every rank alive", "a rank failed");
  const int64_t generation = generation_;
  if (++waiting_ == ranks_) {
    waiting_ = 0;
    ++generation_;
    arrived_.notify_all();
    return;
  }
  arrived_.wait(lock, [&] { return generation_ != generation || aborted_; });
  if (generation_ == generation)
    throw Error("tensor parallel", "all_reduce_sum", "every rank alive", "a rank failed");
}

void HostReduceGroup::all_reduce_sum(int rank, float* data, int64_t count) {
  if (rank < 0 || rank >= ranks_) {
    throw Error("tensor parallel", "rank", "0 .. " + std::to_string(ranks_ - 1),
                std::to_string(rank));
  }
  std::vector<float> total(size_t(count > 0 ? count : 0));
  {
    std::unique_lock lock(mutex_);
    inputs_[size_t(rank)] = data;
    counts_[size_t(rank)] = count;
    arrive_and_wait(lock);
    for (int r = 0; r < ranks_; ++r) {
      if (counts_[size_t(r)] != count) {
        aborted_ = true;
        arrived_.notify_all();
        throw Error("tensor parallel", "all_reduce_sum",
                    "the same element count on every rank (" + std::to_string(count) + ")",
                    std::to_string(counts_[size_t(r)]) + " on rank " + std::to_string(r));
      }
    }
  }
  // The partials stay untouched until every rank passed the second barrier below.
  for (int64_t i = 0; i < count; ++i) {
    float sum = inputs_[0][i];
    for (int r = 1; r < ranks_; ++r) sum += inputs_[size_t(r)][i];
    total[size_t(i)] = sum;
  }
  {
    std::unique_lock lock(mutex_);
    arrive_and_wait(lock);
  }
  for (int64_t i = 0; i < count; ++i) data[i] = total[size_t(i)];
}

void HostReduceGroup::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  arrived_.notify_all();
}

}  // namespace kvlens
