// kvlens-cli merge: joins the partial results of `eval --shard I/N` (one file per shard, any
// order) into the result one unsharded eval writes: the same table, --out JSON, --csv and
// --per-sample, after checking that the parts are every shard of one run, each once.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "app/cli/cli_common.h"
#include "app/cli/eval_report.h"
#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/eval/eval_shards.h"

namespace kvlens::cli {
namespace {

struct MergeFlags {
  std::vector<std::string> parts;
  std::string out_path, csv_path, per_sample_path;
};
MergeFlags merge_flags;

EvalPartial read_partial(const std::string& path) {
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& error) {
    throw Error(path, "JSON", "a partial result of kvlens-cli eval --shard", error.what());
  }
  return partial_from_json(json, path);
}

int run_merge() {
  std::optional<AtomicOutputFile> json_out, csv_out, per_sample_out;
  if (!merge_flags.out_path.empty()) json_out.emplace(merge_flags.out_path, "--out");
  if (!merge_flags.csv_path.empty()) csv_out.emplace(merge_flags.csv_path, "--csv");
  std::vector<EvalPartial> parts;
  for (const std::string& path : merge_flags.parts) parts.push_back(read_partial(path));
  EvalPartial whole = merge_partials(std::move(parts), merge_flags.parts);

  const nlohmann::ordered_json& parameters = whole.parameters;
  EvalReport report;
  report.task = parameters.at("task").get<std::string>();
  if (!merge_flags.per_sample_path.empty()) {
    if (report.task != "coref") {
      throw Error("merge", "--per-sample", "partials of --task coref", "--task " + report.task);
    }
    per_sample_out.emplace(merge_flags.per_sample_path, "--per-sample");
  }
  const auto field = [&](const char* key) -> const nlohmann::ordered_json& {
    if (!parameters.contains(key)) {
      throw Error(merge_flags.parts.front(), std::string("parameters.") + key,
                  "a field '" + std::string(key) + "'");
    }
    return parameters.at(key);
  };
  report.model = field("model").get<std::string>();
  report.hit_rate = field("hit_rate").get<bool>();
  for (const auto& row : whole.rows) report.rows.push_back(row);
  const size_t runs = report.rows.size();
  std::printf("merge %s  model %s  %zu shards  runs %zu\n", report.task.c_str(),
              report.model.c_str(), merge_flags.parts.size(), runs);
  if (report.task == "coref") {
    report.coref = summarize_coref_units(std::move(whole.coref), runs);
  } else {
    report.perplexity =
        summarize_perplexity_units(whole.perplexity, runs, field("window").get<int64_t>());
  }
  write_eval_report(report, json_out ? &*json_out : nullptr, csv_out ? &*csv_out : nullptr,
                    per_sample_out ? &*per_sample_out : nullptr);
  return 0;
}

}  // namespace

void add_merge_command(CLI::App& app, CommonOptions& /*common*/, CommandFn& run) {
  auto* command = app.add_subcommand(
      "merge", "Join the partial results of eval --shard I/N into the result of one eval run");
  command
      ->add_option("parts", merge_flags.parts,
                   "The shards' partial result files (eval --shard I/N --json FILE), every shard "
                   "of one run once, in any order")
      ->required()
      ->check(CLI::ExistingFile);
  command->add_option("--out", merge_flags.out_path,
                      "Write the run's result JSON (as eval --json) to this file");
  command->add_option("--csv", merge_flags.csv_path, "Also write the CSV of eval --csv");
  command->add_option("--per-sample", merge_flags.per_sample_path,
                      "coref: write eval --per-sample's lines to this file");
  command->callback([&run] { run = [] { return run_merge(); }; });
}

}  // namespace kvlens::cli
