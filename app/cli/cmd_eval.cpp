// kvlens-cli eval: co-reference accuracy/coverage or windowed perplexity, one result per
// (policy, sparsity) pair, as a table on stdout and, with --json, the DESIGN.md result file.
// Every policy runs in the decode simulation (POLICIES.md); dense is the reference row.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "app/cli/cli_common.h"
#include "app/cli/model_input.h"
#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/eval/coref_eval.h"
#include "engine/eval/coref_pools.h"
#include "engine/eval/perplexity.h"
#include "engine/policy/registry.h"

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
  std::string model_dir, task, policies = "dense", sparsities = "0";
  int64_t samples = 200, first_index = 0, window = 0, max_tokens = 0;
  uint64_t seed = 0;
  bool hard = false;
  std::string pools_path, text_file, json_path, per_sample_path;
  std::vector<std::string> policy_args;
  std::string csv_path;
};
EvalFlags flags;

struct FlagOptions {
  CLI::Option *samples, *seed, *first_index, *hard, *pools, *per_sample;  // coref only
  CLI::Option *text_file, *window, *max_tokens;                           // ppl only
};
FlagOptions options;

// Non-empty items of a comma-separated flag value.
std::vector<std::string> split_list(const std::string& text, const std::string& flag,
                                    const std::string& what) {
  std::vector<std::string> items = split_comma_list(text);
  for (const std::string& item : items) {
    if (item.empty()) {
      throw Error(flag, "list", "a comma-separated list of " + what, "'" + text + "'");
    }
  }
  return items;
}

double parse_sparsity(const std::string& item) {
  char* end = nullptr;
  const double value = std::strtod(item.c_str(), &end);
  if (end != item.c_str() + item.size() || !(value >= 0.0 && value < 1.0)) {
    throw Error("--sparsity", "sparsity", "a number in [0, 1)", "'" + item + "'");
  }
  return value;
}

// --policy-arg items that apply to `id`: "key=value" goes to every policy declaring the key,
// "id.key=value" to that policy only.
std::vector<std::string> args_for(const std::string& id) {
  std::vector<std::string> out;
  const PolicyInfo& info = policy_info(id);
  for (const std::string& item : flags.policy_args) {
    const size_t eq = item.find('='), dot = item.find('.');
    std::string key = item.substr(0, eq);
    if (dot != std::string::npos && dot < eq) {
      if (item.substr(0, dot) != id) continue;
      out.push_back(item.substr(dot + 1));
      continue;
    }
    for (const ParamSpec& spec : info.params) {
      if (spec.name == key) out.push_back(item);
    }
  }
  return out;
}

// Every (policy, sparsity) pair, each checked before anything is loaded or run. Dense is the
// reference: one row at sparsity 0 whatever the list says.
std::vector<PolicyConfig> resolve_runs() {
  std::vector<double> sparsities;
  for (const std::string& item : split_list(flags.sparsities, "--sparsity", "numbers in [0, 1)")) {
    sparsities.push_back(parse_sparsity(item));
  }
  const std::vector<std::string> ids = split_list(flags.policies, "--policies", "policy ids");
  for (const std::string& id : ids) {
    try {
      policy_info(id);
    } catch (const Error& error) {
      throw Error("--policies", error.field(), error.expected(), error.found());
    }
  }
  for (const std::string& item : flags.policy_args) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw Error("--policy-arg", "parameter", "key=value or policy.key=value", "'" + item + "'");
    }
    bool used = false;
    for (const std::string& id : ids) used = used || !args_for(id).empty();
    if (!used) {
      throw Error("--policy-arg", item.substr(0, eq), "a parameter of one of the policies run",
                  "'" + item + "'");
    }
  }
  std::vector<PolicyConfig> runs;
  for (const std::string& id : ids) {
    for (const double sparsity : sparsities) {
      PolicyOptions requested{id, id == "dense" ? 0.0 : sparsity, {}};
      try {
        requested.policy_args = args_for(id);
        runs.push_back(resolve_policy(requested));
      } catch (const Error& error) {
        // The single-policy commands name --policy; here the list is --policies.
        if (error.file() != "--policy") throw;
        throw Error("--policies", error.field(), error.expected(), error.found());
      }
      if (id == "dense") break;
    }
  }
  return runs;
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

// One line per (policy, sparsity): the sweep format for plotting tools.
constexpr const char* kCsvHeader =
    "policy,sparsity,effective_sparsity,accuracy,coverage,ppl,samples";

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
  const char* keys[] = {"policy", "sparsity", "effective_sparsity", "accuracy", "coverage",
                        "ppl",    "samples"};
  for (size_t i = 0; i < std::size(keys); ++i) {
    out << (i ? "," : "") << csv_value(row[keys[i]]);
  }
  out << '\n';
}

Json result_row(const PolicyConfig& run) {
  return {{"policy", run.id},    {"sparsity", run.sparsity}, {"effective_sparsity", 0.0},
          {"accuracy", nullptr}, {"coverage", nullptr},      {"ppl", nullptr},
          {"samples", nullptr}};
}

int run_eval(const CommonOptions& common) {
  if (flags.task != "coref" && flags.task != "ppl") {
    throw Error("--task", "task", "coref or ppl", "'" + flags.task + "'");
  }
  check_task_flags();
  if (flags.task == "ppl" && !*options.text_file) {
    throw Error("eval", "--text-file", "a text file to compute the perplexity of with --task ppl");
  }
  const std::vector<PolicyConfig> runs = resolve_runs();

  // Opened before any compute, so a bad output path fails at once.
  std::optional<AtomicOutputFile> json_out, per_sample_out;
  if (!flags.json_path.empty()) json_out.emplace(flags.json_path, "--json");
  if (!flags.per_sample_path.empty()) per_sample_out.emplace(flags.per_sample_path, "--per-sample");
  std::optional<AtomicOutputFile> csv_out;
  if (!flags.csv_path.empty()) {
    csv_out.emplace(flags.csv_path, "--csv");
    csv_out->stream() << kCsvHeader << '\n';
  }

  const auto model = Model::load(flags.model_dir);
  const Tokenizer& tokenizer = model->require_tokenizer();
  std::optional<CorefPools> pools;
  std::vector<int32_t> text_tokens;
  int64_t window = 0;
  if (flags.task == "coref") {
    pools =
        flags.pools_path.empty() ? load_bundled_coref_pools() : load_coref_pools(flags.pools_path);
    validate_pool_integrity(*pools, nullptr);
  } else {
    text_tokens = tokenizer.encode(read_text_file(flags.text_file), true);
    if (flags.max_tokens > 0 && int64_t(text_tokens.size()) > flags.max_tokens) {
      text_tokens.resize(size_t(flags.max_tokens));
    }
    window = *options.window ? flags.window : model->config.max_position_embeddings;
  }
  const auto backend = make_backend(common);
  const auto resident = BackendModel::upload(model, *backend);

  Json results = Json::array();
  std::printf("eval %s  model %s  backend %s\n", flags.task.c_str(), flags.model_dir.c_str(),
              backend->name().c_str());
  if (flags.task == "coref") {
    std::printf("%-12s %8s %9s %9s %9s %8s %9s\n", "policy", "sparsity", "effective", "accuracy",
                "coverage", "samples", "seconds");
  } else {
    std::printf("%-12s %8s %9s %10s %8s %9s %9s\n", "policy", "sparsity", "effective", "ppl",
                "windows", "tokens", "seconds");
  }
  for (const PolicyConfig& run : runs) {
    char label[128];
    std::snprintf(label, sizeof label, "eval %s %g", run.id.c_str(), run.sparsity);
    Json row = result_row(run);
    const auto start = std::chrono::steady_clock::now();
    if (flags.task == "coref") {
      ProgressBar bar(common.progress, label, "samples");
      const CorefEvalResult result = evaluate_coref(
          resident, *pools, tokenizer, flags.seed, flags.first_index, flags.samples, flags.hard,
          [&bar](int64_t done, int64_t total) { bar.update(done, total); }, run);
      const double seconds = seconds_since(start);
      row["accuracy"] = result.accuracy;
      row["coverage"] = result.coverage;
      row["samples"] = result.samples;
      row["answer_tokens"] = result.answer_tokens;
      const double effective = set_sparsity(row, result.sparsity);
      std::printf("%-12s %8.3f %9.3f %9.4f %9.4f %8lld %9.1f\n", run.id.c_str(), run.sparsity,
                  effective, result.accuracy, result.coverage, (long long)result.samples, seconds);
      if (per_sample_out) {
        for (const CorefSampleResult& s : result.per_sample) {
          const Json line = {{"policy", run.id},
                             {"sparsity", run.sparsity},
                             {"index", s.index},
                             {"answer", s.answer},
                             {"tokens", s.tokens},
                             {"answer_token_begin", s.answer_token_begin},
                             {"answer_token_end", s.answer_token_end},
                             {"correct_tokens", s.correct_tokens},
                             {"all_correct", s.all_correct},
                             {"canonical", s.canonical},
                             {"answer_nll", s.answer_nll}};
          per_sample_out->stream() << line.dump() << '\n';
        }
      }
    } else {
      ProgressBar bar(common.progress, label);
      const PerplexityResult result = evaluate_perplexity(
          resident, text_tokens, window, kPerplexityChunk,
          [&bar](int64_t done, int64_t total) { bar.update(done, total); }, run);
      const double seconds = seconds_since(start);
      row["ppl"] = null_if_not_finite(result.ppl);
      row["samples"] = result.windows;
      row["tokens_scored"] = result.tokens_scored;
      row["window"] = result.window;
      const double effective = set_sparsity(row, result.sparsity);
      std::printf("%-12s %8.3f %9.3f %10.3f %8lld %9lld %9.1f\n", run.id.c_str(), run.sparsity,
                  effective, result.ppl, (long long)result.windows, (long long)result.tokens_scored,
                  seconds);
    }
    std::fflush(stdout);
    if (csv_out) write_csv_row(csv_out->stream(), row);
    results.push_back(row);
  }

  if (json_out) {
    const Json out = {{"task", flags.task}, {"model", flags.model_dir}, {"results", results}};
    json_out->stream() << out.dump(2) << '\n';
    json_out->commit();
  }
  if (per_sample_out) per_sample_out->commit();
  if (csv_out) csv_out->commit();
  return 0;
}

}  // namespace

void add_eval_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command = app.add_subcommand(
      "eval", "Co-reference accuracy/coverage or perplexity per (policy, sparsity) pair");
  command->add_option("--model", flags.model_dir, "Hugging Face checkpoint folder")->required();
  command->add_option("--task", flags.task, "coref or ppl")->required();
  command
      ->add_option("--policies", flags.policies,
                   "Comma-separated policy ids (kvlens-cli policies lists them)")
      ->capture_default_str();
  command
      ->add_option("--sparsity", flags.sparsities,
                   "Comma-separated sparsities in [0,1); one result per (policy, sparsity)")
      ->capture_default_str();
  command->add_option("--json", flags.json_path, "Write the results as JSON to this file");
  command->add_option("--csv", flags.csv_path,
                      "Also write one CSV line per (policy, sparsity): a sweep for plotting");
  command->add_option("--policy-arg", flags.policy_args,
                      "Policy parameter key=value for every policy that has it, or "
                      "policy.key=value for one (repeatable)");
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
  add_common_options(*command, common);
  command->callback([&run, &common] { run = [&common] { return run_eval(common); }; });
}

}  // namespace kvlens::cli
