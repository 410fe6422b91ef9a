// ThreadPool: workers wait for a new job generation (spinning briefly, then sleeping), take
// chunks from a shared atomic counter, and report back through `busy_`.
#include "engine/backend/thread_pool.h"

#include <algorithm>
#include <chrono>

namespace kvlens {
namespace {

// Set while a thread runs chunks, so a parallel_for issued from inside a task runs inline
// instead of waiting on the pool it is part of.
thread_local bool tls_inside_task = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long an idle thread polls before it sleeps. Long enough to bridge the small serial ops
// between two matmuls of one decode step, short enough not to hold a core between steps.
constexpr auto kSpinTime = std::chrono::microseconds(100);
// Polls with the pause instruction first; after that it yields, so on a machine with more
// runnable threads than cores the thread everyone is waiting for (often our own worker, parked
// behind another process) gets the core. On a busy 2-core VM this made 2-thread decode 1.5x
// faster; on an idle one sched_yield returns at once and costs about a microsecond.
constexpr int kPauseIterations = 64;

// Polls `ready` for up to kSpinTime; true when it became true.
template <typename Ready>
bool spin_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinTime;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if (i < kPauseIterations) {
      cpu_relax();
    } else {
      std::this_thread::yield();
      if (std::chrono::steady_clock::now() > deadline) return false;
    }
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = int(std::max(1u, std::thread::hardware_concurrency()));
  workers_.reserve(size_t(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::run_chunks(Job& job) {
  const bool was_inside = tls_inside_task;
  tls_inside_task = true;
  for (;;) {
    const int64_t index = job.next.fetch_add(1, std::memory_order_relaxed);
    if (index >= job.chunks) break;
    const int64_t chunk_begin = job.begin + index * job.chunk;
    const int64_t chunk_end = std::min(job.end, chunk_begin + job.chunk);
    try {
      (*job.fn)(chunk_begin, chunk_end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      job.next.store(job.chunks, std::memory_order_relaxed);  // skip what is left
    }
  }
  tls_inside_task = was_inside;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    auto fresh = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(fresh)) {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, fresh);
    }
    seen = generation_.load(std::memory_order_acquire);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
    }
    run_chunks(job_);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

bool ThreadPool::inside_task() {
  return tls_inside_task;
}

void ThreadPool::parallel_for(int64_t begin, int64_t end, const RangeFn& fn, int64_t grain) {
  if (end <= begin) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t range = end - begin;
  if (workers_.empty() || tls_inside_task || range <= grain) {
    fn(begin, end);
    return;
  }
  // A few chunks per thread so a thread that the OS delays does not hold up the rest.
  const int64_t target_chunks = int64_t(size()) * 4;
  run_job(begin, end, std::max(grain, (range + target_chunks - 1) / target_chunks), fn);
}

void ThreadPool::for_each(int64_t count, const std::function<void(int64_t)>& task) {
  const RangeFn fn = [&](int64_t chunk_begin, int64_t chunk_end) {
    for (int64_t i = chunk_begin; i < chunk_end; ++i) task(i);
  };
  if (workers_.empty() || tls_inside_task || count <= 1) {
    if (count > 0) fn(0, count);
    return;
  }
  run_job(0, count, 1, fn);
}

void ThreadPool::run_job(int64_t begin, int64_t end, int64_t chunk, const RangeFn& fn) {
  const int64_t range = end - begin;
  std::lock_guard<std::mutex> call_lock(call_mutex_);
  job_.fn = &fn;
  job_.begin = begin;
  job_.end = end;
  job_.chunk = chunk;
  job_.chunks = (range + chunk - 1) / chunk;
  job_.next.store(0, std::memory_order_relaxed);
  error_ = nullptr;
  busy_.store(int(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();

  run_chunks(job_);

  auto finished = [&] { return busy_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(finished)) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, finished);
  }
  if (error_) {
    std::exception_ptr error = error_;
    error_ = nullptr;
    std::rethrow_exception(error);
  }
}

}  // namespace kvlens
