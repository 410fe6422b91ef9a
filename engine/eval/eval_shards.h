// An eval cut into work units, a shard's share of them, and the partial result a shard writes
// (issue 44 item 4). A unit is one (item, run) pair, item = a coref sample (its offset from the
// first index) or a perplexity window; units are numbered item-major, u = item * runs + run.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/eval/coref_eval.h"
#include "engine/eval/perplexity.h"

namespace kvlens {

// Shard `index` of `count`, 0-based (as SLURM_ARRAY_TASK_ID and OMPI_COMM_WORLD_RANK count).
struct ShardSpec {
  int64_t index = 0;
  int64_t count = 1;
};

// "I/N" with 0 <= I < N; throws kvlens::Error naming `flag` and the expected form otherwise.
ShardSpec parse_shard(const std::string& text, const std::string& flag = "--shard");

// Units [begin, end) of an eval.
struct UnitRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Shard i of n takes [floor(i*U/n), floor((i+1)*U/n)): contiguous (so a shard reads most of its
// samples once for all runs, in lockstep) and even (sizes differ by at most one).
UnitRange shard_units(int64_t units, const ShardSpec& shard);

// One item's units in a range: the runs of that item the range holds, ascending. A task of the
// workers (eval_workers.h) scores the item once with those runs in lockstep.
struct EvalTask {
  int64_t item = 0;
  std::vector<size_t> runs;
};
std::vector<EvalTask> group_units(const UnitRange& range, int64_t runs);

// The partial result of one shard. `parameters`: everything that decides the results (the CLI's
// task, model, runs, sample and window settings, backend and dtypes), compared whole by
// merge_partials; `rows`: the runs' row heads in run order, opaque here. Exactly one of
// `coref` and `perplexity` holds the range's unit results, in unit order.
struct EvalPartial {
  nlohmann::ordered_json parameters;
  nlohmann::ordered_json rows;
  ShardSpec shard;
  int64_t units_total = 0;
  UnitRange range;
  std::vector<CorefSampleResult> coref;
  std::vector<PerplexityWindow> perplexity;
};

// The partial as JSON (doubles exactly, non-finite ones as "nan"/"inf"/"-inf"), and back: a
// malformed file is a kvlens::Error naming `source` and the field.
nlohmann::ordered_json partial_to_json(const EvalPartial& partial);
EvalPartial partial_from_json(const nlohmann::ordered_json& json, const std::string& source);

// The shards of one run joined into the whole run's units (shard.count = 1, range = all). Every
// part must have the same parameters, rows, shard count and unit total, and every shard must be
// there exactly once; kvlens::Error names the file (`sources[i]` for parts[i]) and the field.
EvalPartial merge_partials(std::vector<EvalPartial> parts, const std::vector<std::string>& sources);

// Per-run results of a whole run's units (item-major, `runs` runs): result[r] summarizes run r's
// items in item order, with the same bits as evaluate_coref_lockstep / _perplexity_lockstep.
std::vector<CorefEvalResult> summarize_coref_units(std::vector<CorefSampleResult> units,
                                                   size_t runs);
std::vector<PerplexityResult> summarize_perplexity_units(const std::vector<PerplexityWindow>& units,
                                                         size_t runs, int64_t window);

}  // namespace kvlens
