// An eval's tasks spread over several engines in one process (issue 44 item 3): one engine per
// GPU (or, on the CPU, per --workers share of the cores), each with its own backend and resident
// model, built once. Tasks are handed out as engines free up; results land at their unit's place,
// so the gathered order (and every sum taken over it) does not depend on who ran what.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/eval/eval_shards.h"

namespace kvlens {

// Runs task(engine, i) for i in [0, count), each exactly once, on one thread per engine (models[e]
// is engine e) that takes the next task when it is free. `concurrent_within_engine`: each engine
// also runs several tasks at a time through its backend's run_tasks (the CPU's cores, a GPU's
// streams), as one engine alone would (not one that leads a tensor-parallel group,
// BackendModel::tensor_parallel: its tasks go one at a time). The first exception stops the handing
// out and is rethrown once every engine has stopped. Throws kvlens::Error for no engines.
void run_on_engines(std::span<const std::shared_ptr<const BackendModel>> models, int64_t count,
                    bool concurrent_within_engine,
                    const std::function<void(size_t engine, int64_t task)>& task);

// The coref units of `range` (item = sample offset from items[0]) scored on `models`, one result
// per unit in unit order; each equals evaluate_coref_lockstep's for that sample and run.
// `progress` gets (tasks done, tasks), one call at a time.
std::vector<CorefSampleResult> evaluate_coref_units(
    std::span<const std::shared_ptr<const BackendModel>> models,
    const std::vector<MarkedCorefSample>& items, std::span<const PolicyConfig> policies,
    const UnitRange& range, bool measure_hit_rate, const ProgressFn& progress);

// The perplexity units of `range` (item = window) the same way; each engine scores its windows
// one after another (a window's ops use the engine's cores). `progress` gets (tokens fed, tokens
// of the range's windows).
std::vector<PerplexityWindow> evaluate_perplexity_units(
    std::span<const std::shared_ptr<const BackendModel>> models, std::span<const int32_t> tokens,
    int64_t window, int64_t chunk, std::span<const PolicyConfig> policies, const UnitRange& range,
    bool measure_hit_rate, const ProgressFn& progress);

// GPUs of `device_bytes` each that a model of `weight_bytes` needs, with `kv_bytes` of cache
// and scratch beside it, keeping a tenth of each GPU for the runtime: at least 1.
int64_t gpus_needed(int64_t weight_bytes, int64_t kv_bytes, int64_t device_bytes);

// Issue 44: NVLink multicast stays off in everything kvlens starts (NCCL_NVLS_ENABLE=0,
// TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1), each set only where the user did
// not set it. Called at the start of kvlens-cli (and the app).
void set_multicast_off_defaults();

}  // namespace kvlens
