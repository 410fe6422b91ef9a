// Work of an eval spread over engines (eval_workers.h): a shared counter hands out tasks, each
// task writes its units' results into their own slots, and the caller reads them in unit order.
#include "engine/eval/eval_workers.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "engine/common/error.h"
#include "engine/policy/registry.h"

namespace kvlens {

void run_on_engines(std::span<const std::shared_ptr<const BackendModel>> models, int64_t count,
                    bool concurrent_within_engine,
                    const std::function<void(size_t engine, int64_t task)>& task) {
  if (models.empty()) throw Error("eval", "engines", "at least one engine (device or worker)");
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  const auto engine_loop = [&](size_t engine) {
    try {
      const auto take_one = [&](int64_t) {
        if (failed.load()) return;
        const int64_t i = next.fetch_add(1);
        if (i < count) task(engine, i);
      };
      // A tensor-parallel engine takes one task at a time: sessions side by side would issue
      // their collectives in a different order on each rank.
      if (concurrent_within_engine && !models[engine]->tensor_parallel) {
        // As many slots as tasks: each slot takes the next task when it starts, so an engine
        // that is quicker takes more, and slots past the end return at once.
        models[engine]->backend->run_tasks(count, take_one);
      } else {
        while (!failed.load() && next.load() < count) take_one(0);
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
      failed = true;
    }
  };
  if (models.size() == 1) {
    engine_loop(0);
  } else {
    std::vector<std::thread> threads;
    for (size_t e = 0; e < models.size(); ++e) threads.emplace_back(engine_loop, e);
    for (std::thread& thread : threads) thread.join();
  }
  if (first_error) std::rethrow_exception(first_error);
}

namespace {

// A dense run steps token by token beside any other policy and goes in one chunk alone; a task
// holding only some of an item's runs keeps the whole lockstep's way, so its numbers are those of
// the unsharded eval on every backend (the CPU's are the same either way, a GPU's need not be).
bool any_policy(std::span<const PolicyConfig> policies) {
  return std::any_of(policies.begin(), policies.end(),
                     [](const PolicyConfig& p) { return !is_reference_policy(p.id); });
}

std::vector<PolicyConfig> runs_of(const EvalTask& task, std::span<const PolicyConfig> policies) {
  std::vector<PolicyConfig> subset;
  for (const size_t run : task.runs) subset.push_back(policies[run]);
  return subset;
}

// Where task t's first unit goes in the range's results.
std::vector<size_t> task_offsets(const std::vector<EvalTask>& tasks) {
  std::vector<size_t> offsets;
  size_t offset = 0;
  for (const EvalTask& task : tasks) {
    offsets.push_back(offset);
    offset += task.runs.size();
  }
  return offsets;
}

}  // namespace

std::vector<CorefSampleResult> evaluate_coref_units(
    std::span<const std::shared_ptr<const BackendModel>> models,
    const std::vector<MarkedCorefSample>& items, std::span<const PolicyConfig> policies,
    const UnitRange& range, bool measure_hit_rate, const ProgressFn& progress) {
  const std::vector<EvalTask> tasks = group_units(range, int64_t(policies.size()));
  const std::vector<size_t> offsets = task_offsets(tasks);
  const bool step_by_step = any_policy(policies);
  std::vector<CorefSampleResult> results(size_t(range.size()));
  std::mutex progress_mutex;
  int64_t done = 0;
  run_on_engines(models, int64_t(tasks.size()), true, [&](size_t engine, int64_t t) {
    const EvalTask& task = tasks[size_t(t)];
    const MarkedCorefSample& item = items.at(size_t(task.item));
    const std::vector<PolicyConfig> subset = runs_of(task, policies);
    std::vector<CorefSampleResult> scored = score_coref_sample_lockstep(
        models[engine], item.sample, item.marked, subset, measure_hit_rate, step_by_step ? 1 : 0);
    for (size_t r = 0; r < scored.size(); ++r) {
      results[offsets[size_t(t)] + r] = std::move(scored[r]);
    }
    if (progress) {
      const std::lock_guard<std::mutex> lock(progress_mutex);
      progress(++done, int64_t(tasks.size()));
    }
  });
  return results;
}

std::vector<PerplexityWindow> evaluate_perplexity_units(
    std::span<const std::shared_ptr<const BackendModel>> models, std::span<const int32_t> tokens,
    int64_t window, int64_t chunk, std::span<const PolicyConfig> policies, const UnitRange& range,
    bool measure_hit_rate, const ProgressFn& progress) {
  if (chunk < 1) throw Error("perplexity", "chunk", "at least 1 token", std::to_string(chunk));
  const auto n = int64_t(tokens.size());
  const std::vector<EvalTask> tasks = group_units(range, int64_t(policies.size()));
  const std::vector<size_t> offsets = task_offsets(tasks);
  const bool step_by_step = any_policy(policies);
  int64_t total_fed = 0;
  for (const EvalTask& task : tasks) total_fed += std::min(window, n - task.item * (window - 1));
  std::vector<PerplexityWindow> results(size_t(range.size()));
  std::mutex progress_mutex;
  int64_t fed = 0;
  run_on_engines(models, int64_t(tasks.size()), false, [&](size_t engine, int64_t t) {
    const EvalTask& task = tasks[size_t(t)];
    ScoreOptions options;
    options.chunk = step_by_step ? 1 : chunk;
    options.hit_rate = measure_hit_rate;
    int64_t reported = 0;  // this window's tokens already added to `fed`
    if (progress) {
      options.progress = [&](int64_t done, int64_t) {
        const std::lock_guard<std::mutex> lock(progress_mutex);
        fed += done - reported;
        reported = done;
        progress(fed, total_fed);
      };
    }
    const std::vector<PolicyConfig> subset = runs_of(task, policies);
    std::vector<PerplexityWindow> scored =
        score_perplexity_window(models[engine], tokens, window, task.item, subset, options);
    for (size_t r = 0; r < scored.size(); ++r) {
      results[offsets[size_t(t)] + r] = std::move(scored[r]);
    }
  });
  return results;
}

int64_t gpus_needed(int64_t weight_bytes, int64_t kv_bytes, int64_t device_bytes) {
  if (device_bytes <= 0) return 1;
  // A tenth of each GPU stays free for the CUDA context, cuBLAS workspaces and fragmentation.
  const int64_t usable = device_bytes - device_bytes / 10;
  const int64_t needed = weight_bytes + kv_bytes;
  return std::max<int64_t>(1, (needed + usable - 1) / usable);
}

void set_multicast_off_defaults() {
  // overwrite = 0: a value the user set (to turn multicast on on purpose) is kept.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 0);
  setenv("NVSHMEM_DISABLE_NVLS", "1", 0);
}

}  // namespace kvlens
