// kvlens-cli eval: co-reference accuracy/coverage or windowed perplexity, one result per
// (policy, sparsity) pair, as a table on stdout and, with --json, the DESIGN.md result file.
// Every policy runs in the decode simulation (POLICIES.md), all of them in one lockstep session;
// dense is the reference row. --match effective searches each run's nominal sparsity so that its
// effective sparsity meets the run's target (engine/eval/sparsity_match.h); the rows then carry
// both figures and the target.
#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "app/cli/cli_common.h"
#include "app/cli/eval_report.h"
#include "app/session/model_input.h"
#include "app/session/policy_runs.h"
#include "engine/arch/tensor_parallel.h"
#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/eval/coref_eval.h"
#include "engine/eval/coref_pools.h"
#include "engine/eval/eval_shards.h"
#include "engine/eval/eval_workers.h"
#include "engine/eval/perplexity.h"
#include "engine/eval/sparsity_match.h"
#include "engine/policy/registry.h"
#include "engine/session/memory_estimate.h"
#include "engine/session/tensor_parallel_session.h"
#if KVLENS_HAVE_CUDA
#include "kernels/cuda_backend.h"
#include "kernels/policy/cuda_policy_ops.h"
#endif

namespace kvlens::cli {
namespace {

// Keys stay in the documented order, for people reading the file.
using Json = nlohmann::ordered_json;

// Tokens per forward pass inside a perplexity window. Bounded rather than a whole window: the
// logits scratch is [chunk, vocab] F32, which for a 128k vocabulary and a long context would not
// fit; on the CPU backend the chunk size does not change the numbers.
constexpr int64_t kPerplexityChunk = 512;

// CLI11 binds options to storage that must outlive the parse.
struct EvalFlags {
  std::string model_dir, task, policies = reference_policy().id, sparsities = "0";
  int64_t samples = 200, first_index = 0, window = 0, max_tokens = 0;
  uint64_t seed = 0;
  bool hard = false, hit_rate = false;
  std::string pools_path, text_file, json_path, per_sample_path;
  std::vector<std::string> policy_args;
  std::string csv_path;
  std::string match = "none";
  double match_tolerance = MatchOptions{}.tolerance;
};
EvalFlags flags;

struct FlagOptions {
  CLI::Option *samples, *seed, *first_index, *hard, *pools, *per_sample;  // coref only
  CLI::Option *text_file, *window, *max_tokens;                           // ppl only
  CLI::Option* match_tolerance;
};
FlagOptions options;

// Every (policy, sparsity) pair, each checked before anything is loaded or run.
std::vector<PolicyConfig> resolve_runs() {
  return resolve_policy_runs(flags.policies, flags.sparsities, flags.policy_args);
}

// Flags of the other task are refused rather than silently ignored.
void check_task_flags() {
  const bool coref = flags.task == "coref";
  const std::vector<CLI::Option*> other =
      coref ? std::vector<CLI::Option*>{options.text_file, options.window, options.max_tokens}
            : std::vector<CLI::Option*>{options.samples, options.seed,  options.first_index,
                                        options.hard,    options.pools, options.per_sample};
  for (const CLI::Option* option : other) {
    if (*option) {
      throw Error("eval", option->get_name(),
                  coref ? "only with --task ppl" : "only with --task coref",
                  "--task " + flags.task);
    }
  }
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Json null_if_not_finite(double value) {
  return std::isfinite(value) ? Json(value) : Json();
}

// The mean top-50% hit rate over the rows the run's policy scored; null where it scored none
// (dense; a run whose layers were all left dense or gated, as tokenfilter gates them) or where
// --hit-rate was not given.
void set_hit_rate(Json& row, const HitRateStats& stats) {
  row["hit_rate"] = null_if_not_finite(stats.mean());
}

// Effective sparsity into the row (overall, per layer, per head); dense runs hide nothing.
double set_sparsity(Json& row, const SparsityStats& stats) {
  const double overall = stats.steps > 0 ? stats.overall() : 0.0;
  row["effective_sparsity"] = overall;
  if (stats.steps > 0) {
    row["effective_sparsity_per_layer"] = stats.per_layer();
    row["effective_sparsity_per_head"] = stats.per_head();
  }
  return overall;
}

// One line per (policy, sparsity): the sweep format for plotting tools. A matched run adds the
// target it was matched to as a last column.
constexpr const char* kCsvHeader =
    "policy,sparsity,effective_sparsity,accuracy,coverage,ppl,samples,hit_rate";
constexpr const char* kCsvMatchedColumn = ",target_sparsity";

std::string csv_value(const Json& value) {
  if (value.is_null()) return "";
  if (value.is_string()) return value.get<std::string>();
  char text[64];
  if (value.is_number_integer()) {
    std::snprintf(text, sizeof text, "%lld", (long long)value.get<int64_t>());
  } else {
    std::snprintf(text, sizeof text, "%.6g", value.get<double>());
  }
  return text;
}

void write_csv_row(std::ostream& out, const Json& row) {
  const char* keys[] = {"policy",  "sparsity", "effective_sparsity", "accuracy", "coverage", "ppl",
                        "samples", "hit_rate"};
  for (size_t i = 0; i < std::size(keys); ++i) {
    out << (i ? "," : "") << csv_value(row[keys[i]]);
  }
  if (row.contains("target_sparsity")) out << ',' << csv_value(row["target_sparsity"]);
  out << '\n';
}

// The paper's Table 2 shape: one line per (policy, sparsity), the nominal and effective sparsity
// beside the task's scores.
void print_table(const std::vector<Json>& rows, const std::string& task, bool hit_rate) {
  const bool coref = task == "coref";
  // The policy and the run's own knobs (its sparsity has a column): h2o:window=16.
  const auto label_of = [](const Json& row) {
    const std::string spec = row["run"].get<std::string>();
    const size_t knobs = spec.find(':');
    return row["policy"].get<std::string>() +
           (knobs == std::string::npos ? "" : spec.substr(knobs));
  };
  int width = 12;
  for (const Json& row : rows) width = std::max(width, int(label_of(row).size()));
  // Matched: the target first, then the nominal sparsity found for it and what it achieved.
  const bool matched = !rows.empty() && rows.front().contains("target_sparsity");
  if (matched) std::printf("%-*s %8s %8s %9s ", width, "policy", "target", "nominal", "effective");
  if (!matched) std::printf("%-*s %8s %9s ", width, "policy", "sparsity", "effective");
  if (coref) {
    std::printf("%9s %9s %8s", "accuracy", "coverage", "samples");
  } else {
    std::printf("%10s %8s %9s", "ppl", "windows", "tokens");
  }
  std::printf(hit_rate ? " %8s\n" : "\n", "hit rate");
  for (const Json& row : rows) {
    std::printf("%-*s ", width, label_of(row).c_str());
    if (matched) std::printf("%8.3f ", row["target_sparsity"].get<double>());
    std::printf("%8.3f %9.3f ", row["sparsity"].get<double>(),
                row["effective_sparsity"].get<double>());
    if (coref) {
      std::printf("%9.4f %9.4f %8lld", row["accuracy"].get<double>(), row["coverage"].get<double>(),
                  (long long)row["samples"].get<int64_t>());
    } else {
      const double ppl = row["ppl"].is_null() ? NAN : row["ppl"].get<double>();
      std::printf("%10.3f %8lld %9lld", ppl, (long long)row["samples"].get<int64_t>(),
                  (long long)row["tokens_scored"].get<int64_t>());
    }
    if (!hit_rate) {
      std::printf("\n");
    } else if (row["hit_rate"].is_null()) {
      std::printf(" %8s\n", "-");
    } else {
      std::printf(" %8.4f\n", row["hit_rate"].get<double>());
    }
  }
  std::fflush(stdout);
}

Json result_row(const PolicyConfig& run) {
  // "run": the canonical run spec, which tells apart two runs of one policy and sparsity that
  // differ in a knob (h2o@0.7 and h2o@0.7:window=16).
  Json row = {{"policy", run.id},
              {"sparsity", run.sparsity},
              {"run", session::run_spec(run)},
              {"effective_sparsity", 0.0},
              {"accuracy", nullptr},
              {"coverage", nullptr},
              {"ppl", nullptr},
              {"samples", nullptr},
              {"hit_rate", nullptr}};
  // A plug-in's results say which file ran (reproducible from the JSON alone).
  const std::string source = policy_source(run.id);
  if (!source.empty()) row["plugin"] = source;
  return row;
}

// The work spread over engines and shards (issue 44 items 3 and 4): --shard I/N, --workers N
// (CPU), --devices / --gpus (CUDA). Apart from --shard none of them changes a result.
struct DistributionFlags {
  std::string shard;
  int64_t workers = 1;
  std::string devices;
  int64_t gpus = 0;
  // GPUs (CPU: ranks) an engine splits the model over; 0: the fewest that hold it (1 on the CPU).
  int64_t tensor_parallel = 0;
};
DistributionFlags distribution;

// Everything that decides an eval's numbers, recorded in a shard's partial result so that merge
// joins only shards of one run. --threads, --workers, --devices and --gpus are left out: they
// change who computes, never what.
Json run_parameters(const CommonOptions& common, const std::vector<PolicyConfig>& runs,
                    std::span<const int32_t> text_tokens, int64_t window) {
  Json specs = Json::array();
  for (const PolicyConfig& run : runs) specs.push_back(session::run_spec(run));
  Json parameters = {{"task", flags.task},
                     {"model", flags.model_dir},
                     {"runs", specs},
                     {"hit_rate", flags.hit_rate},
                     {"backend", common.backend},
                     {"cpu_kernels", common.cpu_kernels},
                     {"dtype", common.dtype},
                     {"kv_dtype", common.kv_dtype},
                     {"predictor", common.predictor}};
  if (flags.task == "coref") {
    parameters["samples"] = flags.samples;
    parameters["first_index"] = flags.first_index;
    parameters["seed"] = flags.seed;
    parameters["hard"] = flags.hard;
    parameters["coref_pools"] = flags.pools_path;
  } else {
    // The text itself, not only its file name: FNV-1a over the token ids.
    uint64_t hash = 14695981039346656037ull;
    for (const int32_t token : text_tokens) {
      for (int byte = 0; byte < 4; ++byte) {
        hash = (hash ^ ((uint32_t(token) >> (8 * byte)) & 0xffu)) * 1099511628211ull;
      }
    }
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
    parameters["text_file"] = flags.text_file;
    parameters["text_tokens"] = int64_t(text_tokens.size());
    parameters["text_tokens_fnv1a"] = hex;
    parameters["window"] = window;
  }
  return parameters;
}

// --shard, --workers, --devices and --gpus against each other and the backend.
void check_distribution_flags(const CommonOptions& common) {
  if (!distribution.shard.empty()) {
    parse_shard(distribution.shard);
    if (flags.json_path.empty()) {
      throw Error("eval", "--shard",
                  "--json FILE for the shard's partial result (merge joins them)");
    }
    if (!flags.csv_path.empty() || !flags.per_sample_path.empty()) {
      throw Error("eval", "--shard",
                  "no --csv or --per-sample (kvlens-cli merge writes them from the partials)",
                  !flags.csv_path.empty() ? "--csv" : "--per-sample");
    }
  }
  if (distribution.workers < 1) {
    throw Error("eval", "--workers", "at least 1 engine", std::to_string(distribution.workers));
  }
  const bool gpu_flags = !distribution.devices.empty() || distribution.gpus > 0;
  if (common.backend == "cuda" && distribution.workers > 1) {
    throw Error("eval", "--workers",
                "--backend cpu (on cuda, --devices or --gpus: one engine a GPU)");
  }
  if (common.backend != "cuda" && gpu_flags) {
    throw Error("eval", !distribution.devices.empty() ? "--devices" : "--gpus",
                "--backend cuda (on the CPU, --workers N)", "--backend " + common.backend);
  }
  if (!distribution.devices.empty() && distribution.gpus > 0) {
    throw Error("eval", "--gpus", "either --devices or --gpus, not both");
  }
  if (distribution.tensor_parallel < 0) {
    throw Error("eval", "--tensor-parallel", "at least 1 GPU an engine",
                std::to_string(distribution.tensor_parallel));
  }
}

#if KVLENS_HAVE_CUDA
// The GPUs the eval's engines run on: --devices as given, --gpus N as 0..N-1, else GPU 0.
std::vector<int> chosen_devices() {
  return session::chosen_devices("eval", distribution.gpus, distribution.devices);
}

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(1ll << 30));
  return text;
}

// Before anything is uploaded: an engine of one GPU holds the whole model, so it must fit one
// GPU; a model that needs more is refused naming how many it needs and the flag that splits it.
void require_gpus(const CommonOptions& common, const Model& model, int64_t kv_bytes,
                  const std::vector<int>& devices) {
  for (const int device : devices) {
    const GpuNeed need = gpu_need(common, model, kv_bytes, cuda_device_memory_bytes(device));
    if (need.gpus > 1) {
      throw Error("eval", "--tensor-parallel",
                  "at least " + std::to_string(need.gpus) + " GPUs of " + gib(need.device_bytes) +
                      " an engine for " + flags.model_dir + " at " + need.dtype + " (weights " +
                      gib(need.weight_bytes) + ", caches " + gib(need.kv_bytes) +
                      "): --tensor-parallel N splits each engine's copy over N GPUs",
                  "GPU " + std::to_string(device) + " holding a whole copy (" +
                      gib(need.device_bytes) + ")");
    }
  }
}
#endif

// The GPUs (CPU: ranks) each engine splits the model over: --tensor-parallel, else the fewest
// GPUs of the first device that hold the model with the eval's caches (1 where it fits one, and
// always 1 on the CPU).
int64_t engine_ranks([[maybe_unused]] const CommonOptions& common,
                     [[maybe_unused]] const Model& model, [[maybe_unused]] int64_t longest,
                     [[maybe_unused]] int64_t runs) {
  if (distribution.tensor_parallel > 0) return distribution.tensor_parallel;
#if KVLENS_HAVE_CUDA
  if (common.backend == "cuda" && cuda_device_available()) {
    const int device = chosen_devices().front();
    if (device < cuda_device_count()) {
      // 0 (no split up to 64 GPUs holds it): 1, which require_gpus then refuses by name.
      return std::max<int64_t>(1, gpus_needed_split(model, estimate_memory(model), longest,
                                                    cuda_device_memory_bytes(device),
                                                    session::weight_scale(common, model), runs));
    }
  }
#endif
  return 1;
}

// One engine (backend + resident model) per worker or GPU, each built once. `backends` outlives
// the models that point into it.
struct Engines {
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::shared_ptr<const BackendModel>> models;
};

// A model split over `group` (a tensor-parallel group's ranks), led by rank 0's shard.
std::shared_ptr<const BackendModel> upload_split(const std::shared_ptr<const Model>& model,
                                                 const std::vector<std::unique_ptr<Backend>>& group,
                                                 const UploadOptions& upload) {
  std::vector<Backend*> ranks;
  for (const auto& backend : group) ranks.push_back(backend.get());
  return lead_tensor_parallel(model, upload_tensor_parallel(model, ranks, upload));
}

// `ranks` GPUs (CPU: ranks) an engine: one backend per engine, or a tensor-parallel group of
// `ranks` backends per engine (the GPUs in --devices order, consecutive ones together).
Engines make_engines(const CommonOptions& common, const std::shared_ptr<const Model>& model,
                     int64_t kv_bytes, int64_t ranks, int64_t longest, int64_t runs) {
  Engines engines;
  const UploadOptions upload = session::upload_options(common);
  if (ranks > 1) check_tensor_parallel(*model, ranks);
  if (common.backend == "cuda") {
#if KVLENS_HAVE_CUDA
    const std::vector<int> devices = chosen_devices();
    const int count = cuda_device_count();
    if (count == 0) {
      throw Error("--backend", "cuda", "a CUDA device (none was found; use --backend cpu)");
    }
    for (const int device : devices) {
      if (device >= count) {
        throw Error("eval", !distribution.devices.empty() ? "--devices" : "--gpus",
                    "GPUs this host has (" + std::to_string(count) + ": indices 0.." +
                        std::to_string(count - 1) + ")",
                    "GPU " + std::to_string(device));
      }
    }
    if (ranks > 1) {
      if (int64_t(devices.size()) % ranks != 0) {
        throw Error("eval", "--tensor-parallel",
                    "a number of GPUs an engine that divides the " +
                        std::to_string(devices.size()) + " GPUs given (--gpus / --devices)",
                    std::to_string(ranks));
      }
      for (size_t first = 0; first < devices.size(); first += size_t(ranks)) {
        const std::vector<int> members(devices.begin() + int64_t(first),
                                       devices.begin() + int64_t(first) + ranks);
        session::require_gpus_hold(common, *model, members, longest, runs);
        std::vector<std::unique_ptr<Backend>> group = session::make_backend_group(common, members);
        engines.models.push_back(upload_split(model, group, upload));
        for (auto& backend : group) engines.backends.push_back(std::move(backend));
      }
      return engines;
    }
    require_gpus(common, *model, kv_bytes, devices);
    register_cuda_policy_ops();
    for (const int device : devices) engines.backends.push_back(make_cuda_backend(device));
#else
    (void)kv_bytes;
    (void)longest;
    (void)runs;
    engines.backends.push_back(make_backend(common));
#endif
  } else {
    // The cores are shared out between the workers; the CPU backend's numbers do not depend on
    // how many threads it has.
    CommonOptions worker = common;
    const int64_t cores = common.threads > 0
                              ? common.threads
                              : int64_t(std::max(1u, std::thread::hardware_concurrency()));
    worker.threads = int(std::max<int64_t>(1, cores / distribution.workers));
    if (ranks > 1) {
      // Each worker a group of CPU ranks (a check of the split where there is no GPU), its
      // share of the cores divided among them.
      const std::vector<int> members(size_t(ranks), 0);
      for (int64_t w = 0; w < distribution.workers; ++w) {
        std::vector<std::unique_ptr<Backend>> group = session::make_backend_group(worker, members);
        engines.models.push_back(upload_split(model, group, upload));
        for (auto& backend : group) engines.backends.push_back(std::move(backend));
      }
      return engines;
    }
    for (int64_t w = 0; w < distribution.workers; ++w)
      engines.backends.push_back(make_backend(worker));
  }
  for (const auto& backend : engines.backends) {
    engines.models.push_back(upload_model(model, *backend, upload));
  }
  return engines;
}

int run_eval(const CommonOptions& common) {
  if (flags.task != "coref" && flags.task != "ppl") {
    throw Error("--task", "task", "coref or ppl", "'" + flags.task + "'");
  }
  check_task_flags();
  if (flags.task == "ppl" && !*options.text_file) {
    throw Error("eval", "--text-file", "a text file to compute the perplexity of with --task ppl");
  }
  check_distribution_flags(common);
  const SparsityMatch match = parse_sparsity_match(flags.match, "--match");
  MatchOptions match_options;
  match_options.tolerance = flags.match_tolerance;
  validate_match_options(match_options, "--match-tolerance");
  if (match == SparsityMatch::None && *options.match_tolerance) {
    throw Error("eval", "--match-tolerance", "only with --match effective", "--match none");
  }
  std::vector<PolicyConfig> runs = resolve_runs();
  const bool sharded = !distribution.shard.empty();
  const ShardSpec shard = sharded ? parse_shard(distribution.shard) : ShardSpec{};
  // Every shard would have to search the same nominal budgets on all the samples; the matched
  // run specs a whole `--match effective` eval prints (h2o@0.5957) are what shards take instead.
  if (sharded && match == SparsityMatch::Effective) {
    throw Error("eval", "--match",
                "none with --shard (match once without --shard, then shard the matched run specs "
                "it reports, e.g. h2o@0.5957)",
                "effective");
  }

  // Opened before any compute, so a bad output path fails at once.
  std::optional<AtomicOutputFile> json_out, per_sample_out;
  if (!flags.json_path.empty()) json_out.emplace(flags.json_path, "--json");
  if (!flags.per_sample_path.empty()) per_sample_out.emplace(flags.per_sample_path, "--per-sample");
  std::optional<AtomicOutputFile> csv_out;
  if (!flags.csv_path.empty()) csv_out.emplace(flags.csv_path, "--csv");

  const auto model = load_model(common, flags.model_dir);
  const Tokenizer& tokenizer = model->require_tokenizer();
  std::optional<CorefPools> pools;
  std::vector<MarkedCorefSample> samples;
  std::vector<int32_t> text_tokens;
  int64_t window = 0, items = 0, longest = 0;
  if (flags.task == "coref") {
    pools = load_coref_pools_option(flags.pools_path);
    samples = mark_coref_samples(model->config, *pools, tokenizer, flags.seed, flags.first_index,
                                 flags.samples, flags.hard);
    items = int64_t(samples.size());
    for (const MarkedCorefSample& s : samples) {
      longest = std::max(longest, int64_t(s.marked.tokens.size()));
    }
  } else {
    text_tokens = tokenizer.encode(read_text_file(flags.text_file), true);
    if (flags.max_tokens > 0 && int64_t(text_tokens.size()) > flags.max_tokens) {
      text_tokens.resize(size_t(flags.max_tokens));
    }
    window = *options.window ? flags.window : model->config.max_position_embeddings;
    items = perplexity_window_count(model->config, int64_t(text_tokens.size()), window);
    longest = std::min(window, int64_t(text_tokens.size()));
    // A window's runs hold its tokens in their caches at once, on each worker.
    check_cpu_memory(common, *model, longest, int64_t(runs.size()) * distribution.workers, true,
                     "--window / --max-tokens (and --workers)");
  }
  const int64_t units_total = items * int64_t(runs.size());
  const UnitRange range = shard_units(units_total, shard);
  const int64_t kv_bytes = estimate_memory(*model).cuda_kv_cache_per_1k *
                           ((longest + 1023) / 1024) * int64_t(runs.size());
  // A nominal budget that is capped or is not a share of tokens is said once, before the run.
  std::vector<std::string> warnings;
  for (const PolicyConfig& run : runs) {
    for (std::string& line : nominal_budget_warnings(run, model->config.num_layers)) {
      std::fprintf(stderr, "kvlens-cli: warning: %s\n", line.c_str());
      warnings.push_back(std::move(line));
    }
  }
  const int64_t ranks = engine_ranks(common, *model, longest, int64_t(runs.size()));
  // Every run must be one a split can run as one GPU would, before anything is uploaded.
  for (const PolicyConfig& run : runs) check_tensor_parallel_policy(run, model->config, ranks);
  const Engines engines =
      make_engines(common, model, kv_bytes, ranks, longest, int64_t(runs.size()));

  std::printf("eval %s  model %s  backend %s  runs %zu in lockstep", flags.task.c_str(),
              flags.model_dir.c_str(), engines.backends.front()->name().c_str(), runs.size());
  if (engines.models.size() > 1) std::printf("  engines %zu", engines.models.size());
  if (ranks > 1) std::printf("  each split over %lld ranks", (long long)ranks);
  if (sharded) {
    std::printf("  shard %lld/%lld: units [%lld, %lld) of %lld", (long long)shard.index,
                (long long)shard.count, (long long)range.begin, (long long)range.end,
                (long long)units_total);
  }
  std::printf("\n");
  std::fflush(stdout);
  // Every (policy, sparsity) pair is a run of one lockstep session: the text is read once per
  // sample or window and each step is one batched pass over the weights.
  const auto start = std::chrono::steady_clock::now();
  ProgressBar bar(common.progress, "eval " + flags.task, flags.task == "coref" ? "samples" : "tok");
  const ProgressFn progress = [&bar](int64_t done, int64_t total) { bar.update(done, total); };
  // Matched: every round of the search is one evaluation of the runs still searching, over all
  // the units; the result kept for a run is the evaluation at its chosen nominal sparsity.
  std::vector<MatchOutcome> outcomes;
  const auto evaluate = [&](const auto& evaluate_runs) {
    using Result = typename std::decay_t<decltype(evaluate_runs(runs))>::value_type;
    if (match == SparsityMatch::None) return evaluate_runs(runs);
    const std::function<std::vector<Result>(std::span<const PolicyConfig>)> each =
        [&](std::span<const PolicyConfig> configs) { return evaluate_runs(configs); };
    std::vector<Result> chosen = evaluate_matched<Result>(runs, each, match_options, outcomes);
    const std::vector<PolicyConfig> targets = runs;
    for (size_t i = 0; i < runs.size(); ++i) {
      runs[i] = matched_config(targets[i], outcomes[i]);
      if (outcomes[i].warning.empty()) continue;
      const std::string line = session::run_spec(targets[i]) + ": " + outcomes[i].warning;
      std::fprintf(stderr, "kvlens-cli: warning: %s\n", line.c_str());
      warnings.push_back(line);
    }
    return chosen;
  };
  EvalReport report{flags.task, flags.model_dir, flags.hit_rate, {}, {}, {}, {}, warnings};
  if (sharded) {
    EvalPartial partial;
    partial.range = range;
    if (flags.task == "coref") {
      partial.coref =
          evaluate_coref_units(engines.models, samples, runs, range, flags.hit_rate, progress);
    } else {
      partial.perplexity =
          evaluate_perplexity_units(engines.models, text_tokens, window, kPerplexityChunk, runs,
                                    range, flags.hit_rate, progress);
    }
    const double seconds = seconds_since(start);
    for (const PolicyConfig& run : runs) report.rows.push_back(result_row(run));
    partial.parameters = run_parameters(common, runs, text_tokens, window);
    partial.rows = report.rows;
    partial.shard = shard;
    partial.units_total = units_total;
    json_out->stream() << partial_to_json(partial).dump() << '\n';
    json_out->commit();
    std::printf("%.1f s for %lld units: partial result in %s (kvlens-cli merge joins the shards)\n",
                seconds, (long long)range.size(), flags.json_path.c_str());
    return 0;
  }
  // Every unit of the given runs (a search round evaluates fewer runs than the whole eval).
  const auto all_units = [&](std::span<const PolicyConfig> configs) {
    return UnitRange{0, items * int64_t(configs.size())};
  };
  if (flags.task == "coref") {
    report.coref = evaluate([&](std::span<const PolicyConfig> configs) {
      const std::vector<PolicyConfig> these(configs.begin(), configs.end());
      return summarize_coref_units(
          evaluate_coref_units(engines.models, samples, these, all_units(configs), flags.hit_rate,
                               progress),
          these.size());
    });
  } else {
    report.perplexity = evaluate([&](std::span<const PolicyConfig> configs) {
      const std::vector<PolicyConfig> these(configs.begin(), configs.end());
      return summarize_perplexity_units(
          evaluate_perplexity_units(engines.models, text_tokens, window, kPerplexityChunk, these,
                                    all_units(configs), flags.hit_rate, progress),
          these.size(), window);
    });
  }
  const double seconds = seconds_since(start);
  for (size_t i = 0; i < runs.size(); ++i) {
    report.rows.push_back(result_row(runs[i]));
    if (match == SparsityMatch::None) continue;
    report.rows.back()["target_sparsity"] = outcomes[i].target;
    report.rows.back()["matched"] = outcomes[i].matched;
    report.rows.back()["match_evaluations"] = outcomes[i].evaluations;
  }
  if (match == SparsityMatch::Effective) {
    report.match = {{"mode", "effective"},
                    {"tolerance", match_options.tolerance},
                    {"holds", "on average over the evaluated steps, layers and heads"},
                    {"calibration", "the evaluation's own " +
                                        std::string(flags.task == "coref" ? "samples" : "windows")},
                    {"seconds", seconds}};
  }
  report.warnings = warnings;
  write_eval_report(report, json_out ? &*json_out : nullptr, csv_out ? &*csv_out : nullptr,
                    per_sample_out ? &*per_sample_out : nullptr);
  if (match == SparsityMatch::None) {
    std::printf("%.1f s for %zu runs\n", seconds, runs.size());
  } else {
    int64_t evaluations = 0;
    for (const MatchOutcome& outcome : outcomes) evaluations += outcome.evaluations;
    std::printf(
        "%.1f s for %zu runs matched to their effective sparsity (tolerance %.3f, on "
        "average over the evaluated steps): %lld run evaluations\n",
        seconds, runs.size(), match_options.tolerance, (long long)evaluations);
  }
  return 0;
}

}  // namespace

GpuNeed gpu_need(const CommonOptions& common, const Model& model, int64_t kv_bytes,
                 int64_t device_bytes) {
  GpuNeed need;
  need.device_bytes = device_bytes;
  need.kv_bytes = kv_bytes;
  const std::optional<DType> dtype = session::upload_options(common).weight_dtype;
  if (!dtype) {
    need.weight_bytes = estimate_memory(model).cuda_weight_bytes;
    need.dtype = std::string(dtype_name(model.config.torch_dtype));
  } else {
    const int64_t size = *dtype == DType::F32 ? 4 : 2;
    for (const std::string& name : model.weights.files->names()) {
      need.weight_bytes += model.weights.files->tensor(name).numel() * size;
    }
    need.dtype = std::string(dtype_name(*dtype));
  }
  need.gpus = gpus_needed(need.weight_bytes, need.kv_bytes, device_bytes);
  return need;
}

void write_eval_report(EvalReport& report, AtomicOutputFile* json_out, AtomicOutputFile* csv_out,
                       AtomicOutputFile* per_sample_out) {
  std::vector<Json>& rows = report.rows;
  if (report.task == "coref") {
    for (size_t i = 0; i < rows.size(); ++i) {
      const CorefEvalResult& result = report.coref[i];
      Json& row = rows[i];
      row["accuracy"] = result.accuracy;
      row["coverage"] = result.coverage;
      row["samples"] = result.samples;
      row["answer_tokens"] = result.answer_tokens;
      set_sparsity(row, result.sparsity);
      set_hit_rate(row, result.hit_rate);
      if (per_sample_out) {
        for (const CorefSampleResult& s : result.per_sample) {
          Json line = {{"policy", row["policy"]},
                       {"sparsity", row["sparsity"]},
                       {"run", row["run"]},
                       {"index", s.index},
                       {"answer", s.answer},
                       {"tokens", s.tokens},
                       {"answer_token_begin", s.answer_token_begin},
                       {"answer_token_end", s.answer_token_end},
                       {"correct_tokens", s.correct_tokens},
                       {"all_correct", s.all_correct},
                       {"canonical", s.canonical},
                       {"answer_nll", s.answer_nll}};
          if (report.hit_rate) line["hit_rate"] = null_if_not_finite(s.hit_rate.mean());
          per_sample_out->stream() << line.dump() << '\n';
        }
      }
    }
  } else {
    for (size_t i = 0; i < rows.size(); ++i) {
      const PerplexityResult& result = report.perplexity[i];
      Json& row = rows[i];
      row["ppl"] = null_if_not_finite(result.ppl);
      row["samples"] = result.windows;
      row["tokens_scored"] = result.tokens_scored;
      row["window"] = result.window;
      set_sparsity(row, result.sparsity);
      set_hit_rate(row, result.hit_rate);
    }
  }
  print_table(rows, report.task, report.hit_rate);
  Json results = Json::array();
  const bool matched = !rows.empty() && rows.front().contains("target_sparsity");
  if (csv_out) csv_out->stream() << kCsvHeader << (matched ? kCsvMatchedColumn : "") << '\n';
  for (const Json& row : rows) {
    if (csv_out) write_csv_row(csv_out->stream(), row);
    results.push_back(row);
  }
  if (json_out) {
    Json out = {{"task", report.task}, {"model", report.model}, {"results", results}};
    if (!report.match.is_null()) out["match"] = report.match;
    if (!report.warnings.empty()) out["warnings"] = report.warnings;
    json_out->stream() << out.dump(2) << '\n';
    json_out->commit();
  }
  if (per_sample_out) per_sample_out->commit();
  if (csv_out) csv_out->commit();
}

namespace {

void add_distribution_options(CLI::App& command) {
  command.add_option("--shard", distribution.shard,
                     "Evaluate only shard I of N (I/N, 0-based: 0/4 .. 3/4) of the (sample or "
                     "window) x run units and write a partial result to --json; kvlens-cli merge "
                     "joins the shards into the same result as one run (docs/multi_host.md)");
  command
      .add_option("--workers", distribution.workers,
                  "CPU: engines in this process, each with its share of the cores, the units "
                  "handed out among them (results identical to one engine)")
      ->check(CLI::PositiveNumber);
  command.add_option("--devices", distribution.devices,
                     "cuda: comma-separated GPUs, one engine (a whole copy of the model) on each, "
                     "the units handed out among them (results identical to one GPU)");
  command.add_option("--gpus", distribution.gpus, "cuda: GPUs 0..N-1 (as --devices 0,...,N-1)")
      ->check(CLI::PositiveNumber);
  command
      .add_option("--tensor-parallel", distribution.tensor_parallel,
                  "GPUs each engine splits the model over (tensor parallelism; consecutive GPUs "
                  "of --devices / --gpus together; on the CPU, ranks of each --workers engine). "
                  "Default: the fewest GPUs that hold the model, 1 where it fits one")
      ->check(CLI::PositiveNumber);
}

}  // namespace

void add_eval_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command = app.add_subcommand(
      "eval", "Co-reference accuracy/coverage or perplexity per (policy, sparsity) pair");
  command->add_option("--model", flags.model_dir, "Hugging Face checkpoint folder")->required();
  command->add_option("--task", flags.task, "coref or ppl")->required();
  command
      ->add_option("--policies", flags.policies,
                   "Comma-separated policy ids (kvlens-cli policies lists them) or run specs "
                   "ID@SPARSITY[:KEY=VALUE...], e.g. dense,h2o@0.3,h2o@0.7:window=16 "
                   "(docs/policy_specs.md)")
      ->capture_default_str();
  command
      ->add_option("--sparsity", flags.sparsities,
                   "Comma-separated sparsities in [0,1); one result per (policy, sparsity) for "
                   "each plain id of --policies (a run spec with @ keeps its own)")
      ->capture_default_str();
  command->add_option("--json", flags.json_path, "Write the results as JSON to this file");
  command->add_option("--csv", flags.csv_path,
                      "Also write one CSV line per (policy, sparsity): a sweep for plotting");
  command->add_option("--policy-arg", flags.policy_args,
                      "Policy parameter key=value for every policy that has it, or "
                      "policy.key=value for one (repeatable; a run spec's own :key=value wins)");
  options.samples =
      command->add_option("--samples", flags.samples, "coref: number of samples (default 200)")
          ->check(CLI::PositiveNumber);
  options.seed = command->add_option("--seed", flags.seed, "coref: generator seed (default 0)");
  options.first_index = command
                            ->add_option("--first-index", flags.first_index,
                                         "coref: index of the first sample (default 0)")
                            ->check(CLI::NonNegativeNumber);
  options.hard = command->add_flag("--hard", flags.hard,
                                   "coref: 2-3 locations per sample, asking about one of them");
  options.pools =
      command->add_option("--coref-pools", flags.pools_path,
                          "coref: pools JSON (default: assets/benchmarks/coref/pools.json)");
  options.per_sample = command->add_option("--per-sample", flags.per_sample_path,
                                           "coref: write one JSON line per sample to this file");
  options.text_file = command->add_option("--text-file", flags.text_file,
                                          "ppl: text file (encoded with BOS); required for ppl");
  options.window = command->add_option(
      "--window", flags.window,
      "ppl: tokens per window, each scored from an empty cache (default: the model's positions)");
  options.max_tokens = command
                           ->add_option("--max-tokens", flags.max_tokens,
                                        "ppl: use only the first N tokens of the file (0 = all)")
                           ->check(CLI::NonNegativeNumber);
  command
      ->add_option("--match", flags.match,
                   "none, or effective: search each run's nominal sparsity so that its effective "
                   "sparsity, on average over the evaluated steps, is its given sparsity "
                   "(the rows report the target, the nominal found and the effective)")
      ->capture_default_str();
  options.match_tolerance =
      command->add_option("--match-tolerance", flags.match_tolerance,
                          "--match effective: accepted |effective - target| (default 0.005)");
  command->add_flag("--hit-rate", flags.hit_rate,
                    "Also measure each run's mean top-50% hit rate of its policy scores against "
                    "the true attention logits (slower: every step's logits are read back)");
  add_distribution_options(*command);
  add_common_options(*command, common);
  add_predictor_option(*command, common);
  add_plugin_option(*command, common);
  command->callback([&run, &common] { run = [&common] { return run_eval(common); }; });
}

}  // namespace kvlens::cli
