// Work units, shards and partial results of an eval (eval_shards.h). A partial records every
// number its units produced exactly, so the merged run adds the same doubles in the same order
// as an unsharded one.
#include "engine/eval/eval_shards.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <map>

#include "engine/common/error.h"

namespace kvlens {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kPartialFormat = 1;
constexpr const char* kFormatKey = "kvlens_eval_partial";

// nlohmann writes doubles in their shortest form that reads back to the same bits; NaN and the
// infinities (an answer no policy can predict) have no JSON number, so they go as strings.
Json exact_double(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return value;
}

// Field access of a partial file, each error naming the file and the field's path.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  const Json& at(const Json& object, const std::string& key, const std::string& path) const {
    if (!object.is_object() || !object.contains(key)) {
      throw Error(source_, path + key, "a field '" + key + "' (a kvlens eval --shard partial)");
    }
    return object.at(key);
  }
  int64_t integer(const Json& object, const std::string& key, const std::string& path = "") const {
    const Json& value = at(object, key, path);
    if (!value.is_number_integer()) throw Error(source_, path + key, "an integer", value.dump());
    return value.get<int64_t>();
  }
  bool boolean(const Json& object, const std::string& key, const std::string& path) const {
    const Json& value = at(object, key, path);
    if (!value.is_boolean()) throw Error(source_, path + key, "true or false", value.dump());
    return value.get<bool>();
  }
  double number(const Json& object, const std::string& key, const std::string& path) const {
    return number_value(at(object, key, path), path + key);
  }
  double number_value(const Json& value, const std::string& field) const {
    if (value.is_number()) return value.get<double>();
    if (value == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (value == "inf") return std::numeric_limits<double>::infinity();
    if (value == "-inf") return -std::numeric_limits<double>::infinity();
    throw Error(source_, field, "a number (or \"nan\", \"inf\", \"-inf\")", value.dump());
  }
  const std::string& source() const { return source_; }

 private:
  std::string source_;
};

Json sparsity_to_json(const SparsityStats& stats) {
  Json hidden = Json::array();
  for (const double value : stats.hidden_sum) hidden.push_back(exact_double(value));
  return {{"layers", stats.layers},
          {"heads", stats.heads},
          {"steps", stats.steps},
          {"hidden_sum", hidden}};
}

SparsityStats sparsity_from_json(const Reader& in, const Json& json, const std::string& path) {
  SparsityStats stats;
  stats.layers = in.integer(json, "layers", path);
  stats.heads = in.integer(json, "heads", path);
  stats.steps = in.integer(json, "steps", path);
  const Json& hidden = in.at(json, "hidden_sum", path);
  if (!hidden.is_array() ||
      (!hidden.empty() && int64_t(hidden.size()) != stats.layers * stats.heads)) {
    throw Error(in.source(), path + "hidden_sum", "an array of layers x heads numbers",
                hidden.is_array() ? std::to_string(hidden.size()) + " values" : hidden.dump());
  }
  for (size_t i = 0; i < hidden.size(); ++i) {
    stats.hidden_sum.push_back(
        in.number_value(hidden[i], path + "hidden_sum[" + std::to_string(i) + "]"));
  }
  return stats;
}

Json hit_rate_to_json(const HitRateStats& stats) {
  return {{"sum", exact_double(stats.sum)}, {"rows", stats.rows}};
}

HitRateStats hit_rate_from_json(const Reader& in, const Json& json, const std::string& path) {
  HitRateStats stats;
  stats.sum = in.number(json, "sum", path);
  stats.rows = in.integer(json, "rows", path);
  return stats;
}

Json coref_to_json(const CorefSampleResult& s) {
  return {{"index", s.index},
          {"answer", s.answer},
          {"tokens", s.tokens},
          {"answer_token_begin", s.answer_token_begin},
          {"answer_token_end", s.answer_token_end},
          {"correct_tokens", s.correct_tokens},
          {"all_correct", s.all_correct},
          {"canonical", s.canonical},
          {"answer_nll", exact_double(s.answer_nll)},
          {"sparsity", sparsity_to_json(s.sparsity)},
          {"hit_rate", hit_rate_to_json(s.hit_rate)}};
}

CorefSampleResult coref_from_json(const Reader& in, const Json& json, const std::string& path) {
  CorefSampleResult s;
  s.index = in.integer(json, "index", path);
  const Json& answer = in.at(json, "answer", path);
  if (!answer.is_string()) throw Error(in.source(), path + "answer", "a string", answer.dump());
  s.answer = answer.get<std::string>();
  s.tokens = in.integer(json, "tokens", path);
  s.answer_token_begin = in.integer(json, "answer_token_begin", path);
  s.answer_token_end = in.integer(json, "answer_token_end", path);
  s.correct_tokens = in.integer(json, "correct_tokens", path);
  s.all_correct = in.boolean(json, "all_correct", path);
  s.canonical = in.boolean(json, "canonical", path);
  s.answer_nll = in.number(json, "answer_nll", path);
  s.sparsity = sparsity_from_json(in, in.at(json, "sparsity", path), path + "sparsity.");
  s.hit_rate = hit_rate_from_json(in, in.at(json, "hit_rate", path), path + "hit_rate.");
  return s;
}

Json window_to_json(const PerplexityWindow& w) {
  return {{"nll_sum", exact_double(w.nll_sum)},
          {"tokens_scored", w.tokens_scored},
          {"sparsity", sparsity_to_json(w.sparsity)},
          {"hit_rate", hit_rate_to_json(w.hit_rate)}};
}

PerplexityWindow window_from_json(const Reader& in, const Json& json, const std::string& path) {
  PerplexityWindow w;
  w.nll_sum = in.number(json, "nll_sum", path);
  w.tokens_scored = in.integer(json, "tokens_scored", path);
  w.sparsity = sparsity_from_json(in, in.at(json, "sparsity", path), path + "sparsity.");
  w.hit_rate = hit_rate_from_json(in, in.at(json, "hit_rate", path), path + "hit_rate.");
  return w;
}

std::string shard_name(const ShardSpec& shard) {
  return std::to_string(shard.index) + "/" + std::to_string(shard.count);
}

// The first key (in a's order, then b's) where two parameter objects differ, for the error.
std::string first_difference(const Json& a, const Json& b) {
  if (!a.is_object() || !b.is_object()) return "";
  for (const auto& [key, value] : a.items()) {
    if (!b.contains(key) || b.at(key) != value) return key;
  }
  for (const auto& [key, value] : b.items()) {
    if (!a.contains(key)) return key;
  }
  return "";
}

std::string short_value(const Json& object, const std::string& key) {
  if (!object.is_object() || !object.contains(key)) return "(absent)";
  std::string text = object.at(key).dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

}  // namespace

ShardSpec parse_shard(const std::string& text, const std::string& flag) {
  const std::string expected =
      "I/N with 0 <= I < N, 0-based (shard 0/4 is the first of 4, as SLURM_ARRAY_TASK_ID and "
      "OMPI_COMM_WORLD_RANK count)";
  const size_t slash = text.find('/');
  ShardSpec shard;
  const auto parse_part = [&](const std::string& part, int64_t& out) {
    const char* end = part.data() + part.size();
    const auto [ptr, ec] = std::from_chars(part.data(), end, out);
    return !part.empty() && ec == std::errc() && ptr == end;
  };
  if (slash == std::string::npos || !parse_part(text.substr(0, slash), shard.index) ||
      !parse_part(text.substr(slash + 1), shard.count)) {
    throw Error(flag, "shard", expected, "'" + text + "'");
  }
  if (shard.count < 1 || shard.index < 0 || shard.index >= shard.count) {
    throw Error(flag, "shard", expected, "'" + text + "'");
  }
  return shard;
}

UnitRange shard_units(int64_t units, const ShardSpec& shard) {
  // floor(units * i / count) without forming the product, which could pass int64 for large
  // sweeps split many ways: units = q * count + r.
  const int64_t q = units / shard.count, r = units % shard.count;
  const auto bound = [&](int64_t i) { return q * i + r * i / shard.count; };
  return {bound(shard.index), bound(shard.index + 1)};
}

std::vector<EvalTask> group_units(const UnitRange& range, int64_t runs) {
  std::vector<EvalTask> tasks;
  for (int64_t u = range.begin; u < range.end; ++u) {
    const int64_t item = u / runs;
    if (tasks.empty() || tasks.back().item != item) tasks.push_back({item, {}});
    tasks.back().runs.push_back(size_t(u % runs));
  }
  return tasks;
}

Json partial_to_json(const EvalPartial& partial) {
  Json units = Json::array();
  for (const CorefSampleResult& s : partial.coref) units.push_back(coref_to_json(s));
  for (const PerplexityWindow& w : partial.perplexity) units.push_back(window_to_json(w));
  return {{kFormatKey, kPartialFormat},
          {"parameters", partial.parameters},
          {"rows", partial.rows},
          {"shard", {{"index", partial.shard.index}, {"count", partial.shard.count}}},
          {"units",
           {{"total", partial.units_total},
            {"begin", partial.range.begin},
            {"end", partial.range.end}}},
          {"unit_results", units}};
}

EvalPartial partial_from_json(const Json& json, const std::string& source) {
  const Reader in(source);
  if (!json.is_object() || !json.contains(kFormatKey)) {
    throw Error(source, kFormatKey,
                "a partial result of kvlens-cli eval --shard (its first field is " +
                    std::string(kFormatKey) + ")");
  }
  const int64_t format = in.integer(json, kFormatKey);
  if (format != kPartialFormat) {
    throw Error(source, kFormatKey, "format " + std::to_string(kPartialFormat),
                std::to_string(format));
  }
  EvalPartial partial;
  partial.parameters = in.at(json, "parameters", "");
  if (!partial.parameters.is_object()) {
    throw Error(source, "parameters", "an object", partial.parameters.dump());
  }
  partial.rows = in.at(json, "rows", "");
  if (!partial.rows.is_array() || partial.rows.empty()) {
    throw Error(source, "rows", "a non-empty array (one per run)", partial.rows.dump());
  }
  const Json& shard = in.at(json, "shard", "");
  partial.shard.index = in.integer(shard, "index", "shard.");
  partial.shard.count = in.integer(shard, "count", "shard.");
  if (partial.shard.count < 1 || partial.shard.index < 0 ||
      partial.shard.index >= partial.shard.count) {
    throw Error(source, "shard", "0 <= index < count", shard.dump());
  }
  const Json& units = in.at(json, "units", "");
  partial.units_total = in.integer(units, "total", "units.");
  partial.range.begin = in.integer(units, "begin", "units.");
  partial.range.end = in.integer(units, "end", "units.");
  const auto runs = int64_t(partial.rows.size());
  if (partial.units_total < 0 || partial.units_total % runs != 0) {
    throw Error(source, "units.total", "a multiple of the " + std::to_string(runs) + " runs",
                std::to_string(partial.units_total));
  }
  const UnitRange expected = shard_units(partial.units_total, partial.shard);
  if (partial.range.begin != expected.begin || partial.range.end != expected.end) {
    throw Error(
        source, "units",
        "units [" + std::to_string(expected.begin) + ", " + std::to_string(expected.end) +
            ") for shard " + shard_name(partial.shard) + " of " +
            std::to_string(partial.units_total),
        "[" + std::to_string(partial.range.begin) + ", " + std::to_string(partial.range.end) + ")");
  }
  const Json& results = in.at(json, "unit_results", "");
  if (!results.is_array() || int64_t(results.size()) != partial.range.size()) {
    throw Error(source, "unit_results",
                "an array of " + std::to_string(partial.range.size()) + " unit results",
                results.is_array() ? std::to_string(results.size()) : results.dump());
  }
  const Json& task = in.at(partial.parameters, "task", "parameters.");
  const bool coref = task == "coref";
  if (!coref && task != "ppl") throw Error(source, "parameters.task", "coref or ppl", task.dump());
  for (size_t i = 0; i < results.size(); ++i) {
    const std::string path = "unit_results[" + std::to_string(i) + "].";
    if (coref) {
      partial.coref.push_back(coref_from_json(in, results[i], path));
    } else {
      partial.perplexity.push_back(window_from_json(in, results[i], path));
    }
  }
  return partial;
}

EvalPartial merge_partials(std::vector<EvalPartial> parts,
                           const std::vector<std::string>& sources) {
  if (parts.empty()) throw Error("merge", "parts", "at least one partial result file");
  const EvalPartial& first = parts.front();
  // Checked against the first part, each mismatch naming the later file and the field.
  std::map<int64_t, size_t> by_index;
  for (size_t i = 0; i < parts.size(); ++i) {
    const EvalPartial& part = parts[i];
    const std::string& source = sources[i];
    if (part.parameters != first.parameters) {
      const std::string key = first_difference(first.parameters, part.parameters);
      throw Error(source, "parameters." + key,
                  short_value(first.parameters, key) + " as in " + sources.front() +
                      " (every shard of one run has the same parameters)",
                  short_value(part.parameters, key));
    }
    if (part.rows != first.rows) {
      throw Error(source, "rows", "the runs of " + sources.front() + " (one run's shards)");
    }
    if (part.shard.count != first.shard.count) {
      throw Error(source, "shard.count",
                  std::to_string(first.shard.count) + " as in " + sources.front(),
                  std::to_string(part.shard.count));
    }
    if (part.units_total != first.units_total) {
      throw Error(source, "units.total",
                  std::to_string(first.units_total) + " as in " + sources.front(),
                  std::to_string(part.units_total));
    }
    const auto [it, inserted] = by_index.emplace(part.shard.index, i);
    if (!inserted) {
      throw Error(source, "shard.index",
                  "each shard once (shard " + shard_name(part.shard) + " is also " +
                      sources[it->second] + ")",
                  std::to_string(part.shard.index));
    }
  }
  std::string missing;
  for (int64_t s = 0; s < first.shard.count; ++s) {
    if (by_index.count(s) == 0) missing += (missing.empty() ? "" : ", ") + std::to_string(s);
  }
  if (!missing.empty()) {
    throw Error("merge", "shard.index",
                "every shard 0.." + std::to_string(first.shard.count - 1) + " of " +
                    std::to_string(first.shard.count) + " once",
                "missing shard " + missing);
  }
  EvalPartial whole;
  whole.parameters = first.parameters;
  whole.rows = first.rows;
  whole.units_total = first.units_total;
  whole.range = {0, first.units_total};
  for (const auto& [index, part] : by_index) {
    EvalPartial& p = parts[part];
    std::move(p.coref.begin(), p.coref.end(), std::back_inserter(whole.coref));
    std::move(p.perplexity.begin(), p.perplexity.end(), std::back_inserter(whole.perplexity));
  }
  return whole;
}

std::vector<CorefEvalResult> summarize_coref_units(std::vector<CorefSampleResult> units,
                                                   size_t runs) {
  std::vector<std::vector<CorefSampleResult>> per_run(runs);
  for (size_t u = 0; u < units.size(); ++u) per_run[u % runs].push_back(std::move(units[u]));
  std::vector<CorefEvalResult> results;
  for (std::vector<CorefSampleResult>& run : per_run) {
    results.push_back(summarize_coref(std::move(run)));
  }
  return results;
}

std::vector<PerplexityResult> summarize_perplexity_units(const std::vector<PerplexityWindow>& units,
                                                         size_t runs, int64_t window) {
  std::vector<std::vector<PerplexityWindow>> per_run(runs);
  for (size_t u = 0; u < units.size(); ++u) per_run[u % runs].push_back(units[u]);
  std::vector<PerplexityResult> results;
  for (const std::vector<PerplexityWindow>& run : per_run) {
    results.push_back(summarize_perplexity(run, window));
  }
  return results;
}

}  // namespace kvlens
