// The tensor-parallel bench: the same fixed pseudo-random context and greedy decode as the
// one-GPU bench, each step's logits copied to the host from rank 0; the weight-read bound is the
// largest shard's step bytes at GPU 0's copy rate (every GPU of a host is the same part).
#include "app/cli/bench_tensor_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/backend/bandwidth.h"
#include "engine/session/tensor_parallel_session.h"

namespace kvlens::cli {

int run_tensor_parallel_bench(const session::CommonOptions& common,
                              std::shared_ptr<const Model> model, std::span<const int> devices,
                              const TensorParallelBench& bench) {
  const ModelConfig& config = model->config;
  std::vector<std::unique_ptr<Backend>> group = session::make_backend_group(common, devices);
  std::vector<Backend*> backends;
  for (const auto& b : group) backends.push_back(b.get());
  const auto shards = upload_tensor_parallel(model, backends, session::upload_options(common));
  int64_t shard_bytes = 0;
  for (const auto& shard : shards) shard_bytes = std::max(shard_bytes, shard->step_weight_bytes());
  Backend& lead = *backends.front();
  const bool device_memory = lead.name() != "cpu";
  const size_t copy_bytes = device_memory ? size_t(1) << 30 : default_copy_bytes();
  const double copy_gbps = lead.copy_bandwidth_gbps(copy_bytes, bench.copy_repeats);
  const double weight_read_seconds = double(shard_bytes) / (2.0 * copy_gbps * 1e9);

  SessionOptions options;
  options.record_steps = !bench.op_by_op;
  TensorParallelSession session(model, shards, options);
  session.set_policy(0, bench.policy);
  std::vector<int32_t> prompt(size_t(std::max<int64_t>(bench.context, 1)));
  uint64_t state = 0x9e3779b97f4a7c15ull;
  for (int32_t& id : prompt) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    id = int32_t((state >> 33) % uint64_t(config.vocab_size));
  }
  constexpr int64_t kPrefillChunk = 1024;
  const auto prefill_start = std::chrono::steady_clock::now();
  for (int64_t first = 0; first < bench.context; first += kPrefillChunk) {
    const int64_t count = std::min(kPrefillChunk, bench.context - first);
    session.forward(std::span<const int32_t>(prompt.data() + first, size_t(count)));
  }
  lead.synchronize();
  const double prefill_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - prefill_start).count();

  int32_t token = prompt.back();
  std::vector<float> host_logits(size_t(config.vocab_size));
  std::vector<double> step_seconds;
  for (int64_t i = 0; i < bench.warmup + bench.steps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const DeviceTensor& logits = session.forward(std::span<const int32_t>(&token, 1));
    lead.to_host(logits, host_logits.data(), host_logits.size() * sizeof(float));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    token = int32_t(std::max_element(host_logits.begin(), host_logits.end()) - host_logits.begin());
    if (i >= bench.warmup) step_seconds.push_back(seconds);
  }
  const double step_median = median_of(step_seconds);
  std::string devices_text;
  for (const int d : devices) {
    if (!devices_text.empty()) devices_text += ',';
    devices_text += std::to_string(d);
  }

  if (bench.json) {
    const nlohmann::json out = {
        {"model", bench.model_dir},
        {"backend", lead.name()},
        {"tensor_parallel", int64_t(devices.size())},
        {"devices", devices_text},
        {"policy", bench.policy.id},
        {"sparsity", bench.policy.sparsity},
        {"context", bench.context},
        {"steps", bench.steps},
        {"prefill_seconds", prefill_seconds},
        {"step_seconds_median", step_median},
        {"step_seconds_min", *std::min_element(step_seconds.begin(), step_seconds.end())},
        {"step_seconds_max", *std::max_element(step_seconds.begin(), step_seconds.end())},
        {"shard_weight_bytes_per_step", shard_bytes},
        {"memcpy_gbps", copy_gbps},
        {"shard_weight_read_seconds", weight_read_seconds},
        {"step_over_shard_weight_read", step_median / weight_read_seconds},
        {"dense_op_by_op", bench.op_by_op},
    };
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("model           %s\n", bench.model_dir.c_str());
  std::printf("split           %zu ranks (%s %s), %lld heads and %lld KV heads each\n",
              devices.size(), lead.name().c_str(), devices_text.c_str(),
              (long long)shards.front()->config().num_heads,
              (long long)shards.front()->config().num_kv_heads);
  std::printf("context         %lld tokens, prefill %.3f s\n", (long long)bench.context,
              prefill_seconds);
  std::printf("step time       %.3f ms median of %lld (after %lld warm-up)\n", step_median * 1e3,
              (long long)bench.steps, (long long)bench.warmup);
  std::printf("shard bytes     %.1f MB per step per rank\n", double(shard_bytes) / 1e6);
  std::printf("read bound      %.3f ms per rank at %.0f GB/s read + written: step / that = %.2f\n",
              weight_read_seconds * 1e3, 2.0 * copy_gbps, step_median / weight_read_seconds);
  return 0;
}

}  // namespace kvlens::cli
