// ThreadPool: a small persistent pool for the CPU backend (engine/backend/cpu/) and the trace
// queries' updates (engine/eval/trace_queries). parallel_for(begin, end, fn) splits
// [begin, end) into chunks that the workers and the calling thread take in turn; no thread is
// created per call, and a call from inside a task runs inline (no nested parallelism).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvlens {

class ThreadPool {
 public:
  // `threads` participants in all, the calling thread included (0 = hardware concurrency).
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }
  // Whether the calling thread is running a task or chunk of some pool (its calls run inline).
  static bool inside_task();

  // Calls fn(chunk_begin, chunk_end) over disjoint chunks covering [begin, end), each at least
  // `grain` long (except the last), and returns when all are done. Which thread runs which chunk
  // is unspecified, so fn must not depend on it. The first exception thrown by fn is rethrown
  // here after every chunk has finished.
  using RangeFn = std::function<void(int64_t chunk_begin, int64_t chunk_end)>;
  void parallel_for(int64_t begin, int64_t end, const RangeFn& fn, int64_t grain = 1);
  // Calls task(i) for every i in [0, count), one index at a time per thread (for a few coarse,
  // uneven tasks, such as the lockstep runs of one layer). Same error rule as parallel_for.
  void for_each(int64_t count, const std::function<void(int64_t)>& task);

 private:
  struct Job {
    const RangeFn* fn = nullptr;
    int64_t begin = 0, end = 0, chunk = 1;
    std::atomic<int64_t> next{0};  // index of the next chunk to take
    int64_t chunks = 0;
  };

  void worker_loop();
  void run_chunks(Job& job);
  // Runs fn over [begin, end) in chunks of `chunk` on every thread of the pool.
  void run_job(int64_t begin, int64_t end, int64_t chunk, const RangeFn& fn);

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one parallel_for at a time (calls from several threads queue up)
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  // Bumped for every job; workers spin briefly on it before sleeping, because decode issues
  // hundreds of short jobs per token and a condition-variable wake-up costs tens of microseconds.
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> busy_{0};  // workers still inside the current job
  bool stop_ = false;
  Job job_;
  std::exception_ptr error_;
};

}  // namespace kvlens
