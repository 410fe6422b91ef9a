// kvlens-cli bench: decode steps/s of a checkpoint and its effective weight-read bandwidth
// (weight bytes per step / median step time; decode reads every weight once per step) next to
// the copy bandwidth of the backend's memory measured in the same process (host memcpy on the CPU,
// device-to-device on a GPU), and the step time over the time to read the weights once at that
// rate. Text table by default, --json for scripts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <utility>
#include <vector>

#include "app/cli/bench_attention_cost.h"
#include "app/cli/bench_tensor_parallel.h"
#include "app/cli/cli_common.h"
#include "app/session/policy_runs.h"
#include "engine/backend/bandwidth.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/policy/predictor_runtime.h"
#include "engine/policy/registry.h"
#include "engine/session/decoder_session.h"

namespace kvlens::cli {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int64_t parameter_count(const Model& model) {
  const ModelWeights& w = model.weights;
  int64_t count = w.embed.numel() + w.final_norm.numel();
  if (w.lm_head.data != w.embed.data) count += w.lm_head.numel();
  for (const LayerWeights& layer : w.layers) {
    for (const TensorView* t : {&layer.attn_norm, &layer.wq, &layer.wk, &layer.wv, &layer.wo,
                                &layer.mlp_norm, &layer.w_gate, &layer.w_up, &layer.w_down}) {
      count += t->numel();
    }
  }
  return count;
}

// The TokenButler predictor's own work per decode step at `context` tokens: its forward for
// the new token (from a layer-0 input row) and the predicted logits of every predicted layer
// (one call, as the tokenbutler policy makes it), synchronized, median over `steps` (after
// `warmup`). Input values do not change the work, so the context is fed as one chunk of fixed rows.
double predictor_step_seconds(const BackendModel& resident, Backend& backend, int64_t context,
                              int64_t warmup, int64_t steps) {
  const ModelConfig& config = resident.config();
  PredictorState predictor(resident.predictor);
  const int64_t E = config.hidden_size, positions = context + warmup + steps;
  std::vector<float> rows(size_t(std::max<int64_t>(context, 1) * E));
  for (size_t i = 0; i < rows.size(); ++i)
    rows[i] = float((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  DeviceTensor input = backend.alloc(DType::F32, {std::max<int64_t>(context, 1), E});
  backend.from_host(input, rows.data(), rows.size() * sizeof(float));
  if (context > 0) predictor.append(input);
  const DeviceTensor one_row = [&] {
    DeviceTensor row = input;
    row.shape = {1, E};
    return row;
  }();
  const int64_t predicted_layers = config.num_layers - 1;
  DeviceTensor scores = backend.alloc(DType::F32, {predicted_layers * config.num_heads, positions});
  std::vector<double> seconds;
  for (int64_t i = 0; i < warmup + steps; ++i) {
    backend.synchronize();
    const auto start = std::chrono::steady_clock::now();
    predictor.append(one_row);
    predictor.predicted_logits(1, predicted_layers, scores);  // as the policy does, at once
    backend.synchronize();
    if (i >= warmup) seconds.push_back(seconds_since(start));
  }
  return median_of(seconds);
}

}  // namespace

void add_bench_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command = app.add_subcommand(
      "bench", "Decode speed and weight-read bandwidth vs. the backend's copy bandwidth");
  static std::string model_dir;
  static int64_t steps = 32, context = 128, warmup = 2, copy_mb = 0, block = 8;
  static int copy_repeats = 5;
  static bool json = false, op_by_op = false;
  static int attention_repeats = 0;
  static std::string policies, sparsity = "0.5";
  static std::vector<std::string> policy_args;
  command->add_option("--model", model_dir, "Hugging Face checkpoint folder")->required();
  command->add_option("--steps", steps, "Timed decode steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--context", context, "Tokens in the cache before the timed steps")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--warmup", warmup, "Untimed decode steps before the timed ones")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command
      ->add_option(
          "--copy-mb", copy_mb,
          "copy buffer size in MiB (0: CPU 4x the last-level cache, 256-1024 MiB; GPU 1024)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command->add_option("--copy-repeats", copy_repeats, "Timed memcpy repeats (median)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_flag("--json", json, "Print the results as one JSON object");
  command->add_flag("--op-by-op", op_by_op,
                    "Run the dense steps op by op, as a policy run's are, instead of replaying a "
                    "recorded step (a CUDA graph): what the recording saves");
  command->add_option("--policies", policies,
                      "Also step these policies in lockstep at the same context and report the "
                      "time ratio to the dense session of this process (comma-separated ids or run "
                      "specs ID@SPARSITY[:KEY=VALUE...], docs/policy_specs.md)");
  command
      ->add_option("--block", block,
                   "With --policies: the dense and lockstep sessions take turns in blocks of this "
                   "many steps, the first of each untimed")
      ->check(CLI::Range(int64_t(2), int64_t(1) << 20))
      ->capture_default_str();
  command
      ->add_option("--sparsity", sparsity, "Sparsities of the --policies runs given as plain ids")
      ->capture_default_str();
  command
      ->add_option("--attention-cost", attention_repeats,
                   "With --policies: after the timed steps, each run's attention over the keys "
                   "it kept at its last step against the dense attention over every key of the "
                   "same caches, median of this many timed repeats of a whole step's calls")
      ->check(CLI::NonNegativeNumber);
  command->add_option("--policy-arg", policy_args,
                      "Policy parameter key=value or policy.key=value (repeatable; a run "
                      "spec's own :key=value wins)");
  add_tensor_parallel_options(*command, common);
  add_common_options(*command, common);
  add_predictor_option(*command, common);
  add_plugin_option(*command, common);
  command->callback([&run, &common] {
    run = [&common] {
      const auto model = load_model(common, model_dir);
      const ModelConfig& config = model->config;
      if (common.tensor_parallel()) {
        TensorParallelBench bench;
        bench.model_dir = model_dir;
        bench.context = context;
        bench.warmup = warmup;
        bench.steps = steps;
        bench.copy_repeats = copy_repeats;
        bench.json = json;
        bench.op_by_op = op_by_op;
        if (!policies.empty()) {
          const std::vector<PolicyConfig> listed =
              resolve_policy_runs(policies, sparsity, policy_args);
          if (listed.size() != 1) {
            throw Error("bench", "--policies", "one policy with --gpus or --devices",
                        std::to_string(listed.size()) + " runs");
          }
          bench.policy = listed.front();
        }
        const std::vector<int> devices =
            session::chosen_devices("bench", common.gpus, common.devices);
        session::require_gpus_hold(common, *model, devices, context + warmup + steps, 1);
        return run_tensor_parallel_bench(common, model, devices, bench);
      }
      // With --policies every block of steps starts with one untimed step.
      const int64_t blocks = (steps + block - 2) / (block - 1);
      const int64_t positions = context + warmup + steps + (policies.empty() ? 0 : blocks);
      if (positions > config.max_position_embeddings) {
        throw Error(
            "bench",
            policies.empty() ? "--context + --warmup + --steps"
                             : "--context + --warmup + --steps + one untimed step per --block",
            "at most max_position_embeddings = " + std::to_string(config.max_position_embeddings),
            std::to_string(positions));
      }
      check_cpu_memory(common, *model, positions,
                       1 + (policies.empty() ? 0 : int64_t(split_comma_list(policies).size())),
                       !policies.empty(), "--context + --warmup + --steps");
      const int devices[] = {0};
      session::require_gpus_hold(
          common, *model, devices, positions,
          1 + (policies.empty() ? 0 : int64_t(split_comma_list(policies).size())));
      const auto backend = make_backend(common);
      const auto resident = upload_model(model, *backend, session::upload_options(common));
      const int64_t step_bytes = resident->step_weight_bytes();

      // Measured after the upload, before decoding, in this process: same memory, same load.
      // The copy runs in the backend's own memory (device to device on a GPU, 1 GiB: far past
      // its L2 cache).
      const bool device_memory = backend->name() != "cpu";
      const size_t copy_bytes = copy_mb > 0     ? size_t(copy_mb) << 20
                                : device_memory ? size_t(1) << 30
                                                : default_copy_bytes();
      const double copy_gbps = backend->copy_bandwidth_gbps(copy_bytes, copy_repeats);
      // The memory's rate counts the bytes read and the bytes written; a step can at best read
      // its weights at that rate (the bound the step time is quoted against).
      const double memory_gbps = 2.0 * copy_gbps;
      const double weight_read_seconds = double(step_bytes) / (memory_gbps * 1e9);

      // The context is a fixed pseudo-random token sequence; decode then follows the model's
      // own greedy choices, as generation would.
      SessionOptions dense_options;
      dense_options.record_steps = !op_by_op;
      DecoderSession session(resident, dense_options);
      std::vector<int32_t> prompt(size_t(std::max<int64_t>(context, 1)));
      uint64_t state = 0x9e3779b97f4a7c15ull;
      for (int32_t& id : prompt) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        id = int32_t((state >> 33) % uint64_t(config.vocab_size));
      }
      int32_t token = prompt.back();
      double prefill_seconds = 0.0;
      // Prefill in chunks: the logits of a chunk are [chunk, vocab] F32 (4 GB for 8192 tokens
      // of a 128k vocabulary at once).
      constexpr int64_t kPrefillChunk = 1024;
      auto prefill = [&](DecoderSession& target) {
        for (int64_t first = 0; first < context; first += kPrefillChunk) {
          const int64_t count = std::min(kPrefillChunk, context - first);
          target.forward(std::span<const int32_t>(prompt.data() + first, size_t(count)));
        }
      };
      if (context > 0) {
        const auto start = std::chrono::steady_clock::now();
        prefill(session);
        backend->synchronize();
        prefill_seconds = seconds_since(start);
      }
      // --policies: the same context in a lockstep session of every listed policy. The two
      // sessions take turns in blocks of steps, so both see the same machine load; the first step
      // of a block finds the caches full of the other session's data, which a session stepped
      // alone never does, so it is not timed (stepping them in turns step by step made the dense
      // steps 1.2-1.4x slower than alone: its ~20 MB of weights and cache no longer stayed in
      // the last-level cache).
      std::optional<DecoderSession> lockstep;
      std::vector<PolicyConfig> runs;
      if (!policies.empty()) {
        runs = resolve_policy_runs(policies, sparsity, policy_args);
        lockstep.emplace(resident, SessionOptions{}, int64_t(runs.size()));
        for (size_t r = 0; r < runs.size(); ++r) {
          if (auto made = make_run_policy(runs[r], lockstep->policy_shape(), *backend))
            lockstep->set_policy(int64_t(r), std::move(made));
        }
        prefill(*lockstep);
      }
      std::vector<float> host_logits;
      // One step: the logits come back to the host (as a viewer would read them) and the first
      // run's greedy choice is the next token of every run.
      auto timed_step = [&](DecoderSession& stepped, int32_t input) {
        const auto start = std::chrono::steady_clock::now();
        const DeviceTensor& logits = stepped.forward(std::span<const int32_t>(&input, 1));
        host_logits.resize(size_t(logits.numel()));
        backend->to_host(logits, host_logits.data(), host_logits.size() * sizeof(float));
        const double seconds = seconds_since(start);
        const auto first_row_end = host_logits.begin() + config.vocab_size;
        const auto next =
            int32_t(std::max_element(host_logits.begin(), first_row_end) - host_logits.begin());
        return std::pair{seconds, next};
      };
      for (int64_t i = 0; i < warmup; ++i) {
        if (lockstep) timed_step(*lockstep, token);
        token = timed_step(session, token).second;
      }
      std::vector<double> step_seconds, lockstep_seconds;
      // Per lockstep run: its own work per step (its attention where it computes its own logits,
      // and its policy's select and observe; the projections, computed for all runs at once, are
      // not split), for the breakdown.
      std::vector<std::vector<double>> run_task_seconds(runs.size());
      // Per lockstep run of a plug-in: the seconds of each step spent in its own code and in
      // the copies to and from host memory made for it (Policy::external_seconds).
      std::vector<std::vector<double>> run_plugin_seconds(runs.size()),
          run_copy_seconds(runs.size());
      std::vector<Policy::ExternalSeconds> external_before(runs.size());
      auto external_now = [&](size_t r) {
        const Policy* policy = lockstep->run(int64_t(r)).policy.get();
        return policy ? policy->external_seconds() : Policy::ExternalSeconds{};
      };
      step_seconds.reserve(size_t(steps));
      if (!lockstep) {
        for (int64_t i = 0; i < steps; ++i) {
          const auto [seconds, next] = timed_step(session, token);
          step_seconds.push_back(seconds);
          token = next;
        }
      }
      std::vector<int32_t> block_tokens;
      for (int64_t timed = 0; lockstep && timed < steps;) {
        const int64_t count = std::min(block - 1, steps - timed);  // timed steps of this block
        // The dense session's tokens (its greedy choices) are the lockstep's too.
        block_tokens.clear();
        for (int64_t i = 0; i <= count; ++i) {
          block_tokens.push_back(token);
          const auto [seconds, next] = timed_step(session, token);
          if (i > 0) step_seconds.push_back(seconds);
          token = next;
        }
        for (int64_t i = 0; i <= count; ++i) {
          for (size_t r = 0; r < runs.size(); ++r) external_before[r] = external_now(r);
          const double seconds = timed_step(*lockstep, block_tokens[size_t(i)]).first;
          if (i == 0) continue;
          for (size_t r = 0; r < runs.size(); ++r) {
            const Policy::ExternalSeconds after = external_now(r);
            run_plugin_seconds[r].push_back(after.plugin - external_before[r].plugin);
            run_copy_seconds[r].push_back(after.copies - external_before[r].copies);
          }
          lockstep_seconds.push_back(seconds);
          const std::vector<double>& tasks = lockstep->run_step_seconds();
          for (size_t r = 0; r < runs.size() && r < tasks.size(); ++r)
            run_task_seconds[r].push_back(tasks[r]);
        }
        timed += count;
      }

      if (attention_repeats > 0 && !lockstep)
        throw Error("bench", "--attention-cost", "--policies to measure", "no --policies");
      const std::vector<AttentionCost> attention_costs =
          attention_repeats > 0 ? measure_attention_cost(*lockstep, *backend, attention_repeats)
                                : std::vector<AttentionCost>{};
      const double step_median = median_of(step_seconds);
      // The predictor's share of a step, where a run of a policy that reads it is listed.
      const bool with_predictor =
          resident->predictor &&
          std::any_of(runs.begin(), runs.end(), [](const PolicyConfig& listed) {
            return policy_info(listed.id).needs_predictor;
          });
      const double predictor_median =
          with_predictor ? predictor_step_seconds(*resident, *backend, context, warmup, steps)
                         : 0.0;
      const double step_min = *std::min_element(step_seconds.begin(), step_seconds.end());
      const double step_max = *std::max_element(step_seconds.begin(), step_seconds.end());
      const double read_gbps = double(step_bytes) / step_median / 1e9;
      const double ratio = read_gbps / copy_gbps;
      const int threads = cpu_backend_threads(*backend);
      const std::string isa(cpu_backend_isa(*backend));
      const std::string dtype(dtype_name(model->weights.lm_head.dtype));
      const int64_t params = parameter_count(*model);
      // Weights smaller than the last-level cache may be served from it, which makes the ratio
      // a cache figure. (Larger ones are streamed in a cycle that evicts each line before its
      // next use; on the 260 MiB-L3 dev VM a 326 MB and a 1.2 GB model read at the same rate.)
      const size_t cache_bytes = device_memory ? 0 : last_level_cache_bytes();
      const bool cache_resident = cache_bytes > 0 && size_t(step_bytes) < cache_bytes;

      if (json) {
        nlohmann::json out = {
            {"model", model_dir},
            {"backend", backend->name()},
            {"threads", threads > 0 ? nlohmann::json(threads) : nlohmann::json()},
            {"kernels", isa.empty() ? nlohmann::json() : nlohmann::json(isa)},
            {"weight_dtype", dtype},
            {"parameters", params},
            {"context", context},
            {"steps", steps},
            {"prefill_seconds", prefill_seconds},
            {"dense_op_by_op", op_by_op},
            {"step_seconds_median", step_median},
            {"step_seconds_total", std::accumulate(step_seconds.begin(), step_seconds.end(), 0.0)},
            {"step_seconds_min", step_min},
            {"step_seconds_max", step_max},
            {"steps_per_second", 1.0 / step_median},
            {"weight_bytes_per_step", step_bytes},
            {"weight_read_gbps", read_gbps},
            {"memcpy_gbps", copy_gbps},
            {"memcpy_bytes", copy_bytes},
            {"memcpy_memory", device_memory ? "device" : "host"},
            {"memory_gbps", memory_gbps},
            {"weight_read_seconds", weight_read_seconds},
            {"step_over_weight_read", step_median / weight_read_seconds},
            {"ratio", ratio},
            {"last_level_cache_bytes", cache_bytes},
            {"weights_may_fit_in_cache", cache_resident},
        };
        if (lockstep) {
          const double lockstep_median = median_of(lockstep_seconds);
          nlohmann::json run_tasks = nlohmann::json::array();
          for (size_t r = 0; r < runs.size(); ++r) {
            nlohmann::json task = {{"policy", runs[r].id},
                                   {"sparsity", runs[r].sparsity},
                                   {"run", session::run_spec(runs[r])},
                                   {"task_seconds_median", median_of(run_task_seconds[r])}};
            const std::string source = policy_source(runs[r].id);
            if (!source.empty()) {
              task["plugin"] = source;
              task["plugin_seconds_median"] = median_of(run_plugin_seconds[r]);
              task["plugin_copy_seconds_median"] = median_of(run_copy_seconds[r]);
            }
            run_tasks.push_back(task);
          }
          out["lockstep"] = {{"policies", policies},
                             {"sparsity", sparsity},
                             {"block", block},
                             {"runs", lockstep->runs()},
                             {"step_seconds_median", lockstep_median},
                             {"steps_per_second", 1.0 / lockstep_median},
                             {"ratio_to_dense", lockstep_median / step_median},
                             {"run_tasks", run_tasks}};
        }
        if (attention_repeats > 0) {
          nlohmann::json costs = nlohmann::json::array();
          for (const AttentionCost& cost : attention_costs) {
            costs.push_back({{"run", session::run_spec(runs[size_t(cost.run)])},
                             {"kept_share", cost.kept_share},
                             {"read_share", cost.read_share},
                             {"masked_layers", cost.masked_layers},
                             {"fused_layers", cost.fused_layers},
                             {"attention_seconds", cost.masked_seconds},
                             {"dense_attention_seconds", cost.dense_seconds},
                             {"ratio_to_dense", cost.masked_seconds / cost.dense_seconds},
                             {"repeats", attention_repeats}});
          }
          out["attention_cost"] = costs;
        }
        if (with_predictor) {
          const PredictorConfig& pc = resident->predictor->config();
          out["predictor"] = {{"path", resident->predictor->predictor->path},
                              {"parameters", pc.parameter_count()},
                              {"parameter_fraction", double(pc.parameter_count()) / double(params)},
                              {"step_seconds_median", predictor_median},
                              {"share_of_dense_step", predictor_median / step_median}};
        }
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
      }
      std::string backend_text = backend->name();
      if (threads > 0) backend_text += " (" + std::to_string(threads) + " threads, " + isa + ")";
      std::printf("model           %s\n", model_dir.c_str());
      std::printf("                %.1fM parameters, %s, %lld layers, hidden %lld, vocab %lld\n",
                  double(params) / 1e6, dtype.c_str(), (long long)config.num_layers,
                  (long long)config.hidden_size, (long long)config.vocab_size);
      std::printf("backend         %s\n", backend_text.c_str());
      if (context > 0) {
        std::printf("context         %lld tokens, prefill %.3f s (%.1f tokens/s)\n",
                    (long long)context, prefill_seconds, double(context) / prefill_seconds);
      }
      std::printf("decode steps    %lld timed after %lld warm-up\n", (long long)steps,
                  (long long)warmup);
      std::printf("step time       %.2f ms median (min %.2f, max %.2f)\n", step_median * 1e3,
                  step_min * 1e3, step_max * 1e3);
      std::printf("steps/s         %.2f\n", 1.0 / step_median);
      std::printf("weight bytes    %.1f MB per step\n", double(step_bytes) / 1e6);
      std::printf("weight read     %.2f GB/s\n", read_gbps);
      std::printf(
          "memcpy          %.2f GB/s (%s memory, %zu MiB buffer, median of %d, bytes copied / s)\n",
          copy_gbps, device_memory ? "device" : "host", copy_bytes >> 20, copy_repeats);
      std::printf("read bound      %.3f ms at %.0f GB/s read + written: step / that = %.2f\n",
                  weight_read_seconds * 1e3, memory_gbps, step_median / weight_read_seconds);
      std::printf("ratio           %.2f (weight read / memcpy)\n", ratio);
      if (lockstep) {
        const double lockstep_median = median_of(lockstep_seconds);
        std::printf("lockstep        %lld runs (%s at %s), %.2f ms median per step, %.2f steps/s\n",
                    (long long)lockstep->runs(), policies.c_str(), sparsity.c_str(),
                    lockstep_median * 1e3, 1.0 / lockstep_median);
        std::printf("lockstep ratio  %.2f (lockstep step / dense step, same context)\n",
                    lockstep_median / step_median);
        // Each run's own work, on one thread at a time (together they exceed the wall time).
        for (size_t r = 0; r < runs.size(); ++r) {
          std::printf(
              "  run %-3zu %-12s %.3f ms per step (own attention and policy work, median)\n", r,
              session::run_spec(runs[r]).c_str(), median_of(run_task_seconds[r]) * 1e3);
          if (!policy_source(runs[r].id).empty()) {
            std::printf(
                "          plug-in      %.3f ms per step in its own code, %.3f ms in copies "
                "to and from host memory (medians; part of the above)\n",
                median_of(run_plugin_seconds[r]) * 1e3, median_of(run_copy_seconds[r]) * 1e3);
          }
        }
      }
      for (const AttentionCost& cost : attention_costs) {
        std::printf(
            "attention       %s: %.3f ms over its kept keys (%.1f%% of %lld masked layers' "
            "pairs, %.1f%% of their keys seen by some head of a group) against %.3f ms dense: "
            "%.2fx (median of %d)\n",
            session::run_spec(runs[size_t(cost.run)]).c_str(), cost.masked_seconds * 1e3,
            100.0 * cost.kept_share, (long long)cost.masked_layers, 100.0 * cost.read_share,
            cost.dense_seconds * 1e3, cost.masked_seconds / cost.dense_seconds, attention_repeats);
      }
      if (with_predictor) {
        const PredictorConfig& pc = resident->predictor->config();
        std::printf(
            "predictor       %.3f ms per step median (%.2f%% of a dense step): its forward "
            "and the predicted logits of %lld layers; %.2fM parameters (%.2f%% of the "
            "model)\n",
            predictor_median * 1e3, 100.0 * predictor_median / step_median,
            (long long)(config.num_layers - 1), double(pc.parameter_count()) / 1e6,
            100.0 * double(pc.parameter_count()) / double(params));
      }
      if (cache_resident) {
        std::printf(
            "note            the weights fit in the %.0f MiB last-level cache, so the read\n"
            "                rate may partly be cache bandwidth\n",
            double(cache_bytes) / double(1 << 20));
      }
      return 0;
    };
  });
}

}  // namespace kvlens::cli
