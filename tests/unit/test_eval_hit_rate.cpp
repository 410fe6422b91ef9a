// The top-50% hit rate of `kvlens-cli eval --hit-rate` (ScoreOptions::hit_rate): per run the mean
// over its scored (step, layer, head) rows of top_half_agreement(scores, true logits), the same
// rows and values a recorded trace's head_summary gives, and nothing else about the run changes.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/common/mapped_file.h"
#include "engine/eval/coref_eval.h"
#include "engine/eval/perplexity.h"
#include "engine/session/scoring.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/cpu_model.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using Json = nlohmann::json;

namespace {

const std::vector<int32_t> kTokens = {1, 5, 9, 2, 33, 7, 7, 12, 40, 3, 8, 61, 17, 4};

// The mean of head_summary's hit_rate over every (step, layer, head) of a trace run where it is
// defined, and how many rows that is.
std::pair<double, int64_t> trace_hit_rate(const Trace& trace, int64_t run) {
  double sum = 0.0;
  int64_t rows = 0;
  for (int64_t step = 0; step < trace.step_count(); ++step) {
    for (const double value : head_summary(trace, run, step).hit_rate) {
      if (std::isnan(value)) continue;
      sum += value;
      ++rows;
    }
  }
  return {rows > 0 ? sum / double(rows) : NAN, rows};
}

}  // namespace

TEST_CASE("hit rate: the oracle's scores are the true logits, dense scores nothing", "[eval]") {
  // The tiny model has 2 layers of 4 heads; the oracle leaves layer 0 dense (dense_layers=1) and
  // masks layer 1 at each of the 14 steps: 14 * 1 * 4 rows, each in full agreement.
  const test::CpuModel loaded = test::load_on_cpu(
      test::write_tiny_llama(test::make_temp_dir("hit-oracle"), test::TinyLlamaSpec{}));
  const std::vector<PolicyConfig> policies = {{"dense", 0.0, {}}, {"oracle", 0.5, {}}};
  ScoreOptions options;
  options.hit_rate = true;
  const std::vector<ScoreResult> scored =
      score_tokens_lockstep(loaded.resident, kTokens, policies, options);
  CHECK(scored[0].hit_rate.rows == 0);
  CHECK(std::isnan(scored[0].hit_rate.mean()));
  CHECK(scored[1].hit_rate.rows == 14 * 4);
  CHECK(scored[1].hit_rate.mean() == 1.0);
  // With a dense prefill (chunks, cut short while recording) only the steps after it count, and
  // the scores are those of the same prefill without the hit rate.
  ScoreOptions prefilled = options;
  prefilled.prefill = 5;
  prefilled.chunk = 64;
  const ScoreResult after_prefill =
      score_tokens_lockstep(loaded.resident, kTokens, policies, prefilled)[1];
  CHECK(after_prefill.hit_rate.rows == (14 - 5) * 4);
  CHECK(after_prefill.hit_rate.mean() == 1.0);
  prefilled.hit_rate = false;
  CHECK(after_prefill.nll ==
        score_tokens_lockstep(loaded.resident, kTokens, policies, prefilled)[1].nll);
  // Two layers left dense: nothing scored.
  const std::vector<PolicyConfig> all_dense = {{"oracle", 0.5, {"dense_layers=2"}}};
  CHECK(score_tokens_lockstep(loaded.resident, kTokens, all_dense, options)[0].hit_rate.rows == 0);
}

TEST_CASE("hit rate: HitRateStats merges sums and rows", "[eval]") {
  HitRateStats a{1.5, 2}, b{0.25, 1};
  a.merge(b);
  CHECK(a.rows == 3);
  CHECK(a.mean() == Approx(1.75 / 3.0).epsilon(1e-15));
  CHECK(std::isnan(HitRateStats{}.mean()));
}

TEST_CASE("hit rate: measuring it changes no score, and equals the trace's head summaries",
          "[eval]") {
  const test::CpuModel loaded = test::load_on_cpu(
      test::write_tiny_llama(test::make_temp_dir("hit-trace"), test::TinyLlamaSpec{}));
  const std::vector<PolicyConfig> policies = {
      {"dense", 0.0, {}},
      {"h2o", 0.5, {"sinks=1"}},
      {"quest", 0.5, {"sinks=1", "page_size=2", "dense_layers=1"}},
      {"streaming", 0.5, {"sinks=1"}},
      {"random", 0.5, {}}};
  const std::vector<ScoreResult> plain = score_tokens_lockstep(loaded.resident, kTokens, policies);
  ScoreOptions options;
  options.hit_rate = true;
  const std::vector<ScoreResult> measured =
      score_tokens_lockstep(loaded.resident, kTokens, policies, options);
  TraceRecorder recorder(loaded.resident, nullptr, kTokens, policies);
  while (recorder.step()) {
  }
  for (size_t r = 0; r < policies.size(); ++r) {
    INFO("run " << policies[r].id);
    CHECK(measured[r].nll == plain[r].nll);
    CHECK(measured[r].argmax == plain[r].argmax);
    CHECK(plain[r].hit_rate.rows == 0);  // not asked for
    const auto [mean, rows] = trace_hit_rate(recorder.trace(), int64_t(r));
    CHECK(measured[r].hit_rate.rows == rows);
    if (rows > 0) CHECK(measured[r].hit_rate.mean() == Approx(mean).margin(1e-12));
  }
  CHECK(measured[1].hit_rate.rows > 0);
}

TEST_CASE("hit rate: a text past the first read-back buffer (1024 columns) still agrees",
          "[eval]") {
  test::TinyLlamaSpec spec;
  spec.max_positions = 1300;
  const test::CpuModel loaded =
      test::load_on_cpu(test::write_tiny_llama(test::make_temp_dir("hit-long"), spec));
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < 1200; ++i) tokens.push_back(int32_t((i * 37 + i / 7) % spec.vocab));
  const std::vector<PolicyConfig> policies = {{"h2o", 0.5, {"sinks=1"}}};
  ScoreOptions options;
  options.hit_rate = true;
  const ScoreResult measured = score_tokens_lockstep(loaded.resident, tokens, policies, options)[0];
  TraceRecorder recorder(loaded.resident, nullptr, tokens, policies);
  while (recorder.step()) {
  }
  const auto [mean, rows] = trace_hit_rate(recorder.trace(), 0);
  CHECK(rows == 1200 * 4);  // layer 1's 4 heads at every step
  CHECK(measured.hit_rate.rows == rows);
  CHECK(measured.hit_rate.mean() == Approx(mean).margin(1e-12));
}

TEST_CASE("hit rate: perplexity windows add up", "[eval]") {
  const test::CpuModel loaded = test::load_on_cpu(
      test::write_tiny_llama(test::make_temp_dir("hit-ppl"), test::TinyLlamaSpec{}));
  const std::vector<PolicyConfig> policies = {{"h2o", 0.5, {"sinks=1"}}};
  const std::vector<PerplexityResult> windows =
      evaluate_perplexity_lockstep(loaded.resident, kTokens, 8, 1, {}, policies, true);
  // Windows [0, 8) and [7, 14), each scored from an empty cache.
  ScoreOptions options;
  options.hit_rate = true;
  const std::span<const int32_t> tokens(kTokens);
  const ScoreResult first = score_tokens_lockstep(loaded.resident, tokens.subspan(0, 8), policies,
                                                  options)[0],
                    second = score_tokens_lockstep(loaded.resident, tokens.subspan(7), policies,
                                                   options)[0];
  CHECK(windows[0].hit_rate.rows == first.hit_rate.rows + second.hit_rate.rows);
  CHECK(windows[0].hit_rate.sum == Approx(first.hit_rate.sum + second.hit_rate.sum));
  CHECK(
      evaluate_perplexity_lockstep(loaded.resident, kTokens, 8, 1, {}, policies)[0].hit_rate.rows ==
      0);
}

TEST_CASE("hit rate: the demo model's tokenbutler in eval equals its trace's head summaries",
          "[eval][demo]") {
  const test::CpuModel loaded = test::load_on_cpu(test::source_path("assets/models/demo"));
  const CorefPools pools = load_bundled_coref_pools();
  const CorefSample sample = generate_coref_sample(pools, 0, 0, false);
  const CorefTokens marked = mark_answer_tokens(sample, loaded.model->require_tokenizer());
  REQUIRE(marked.tokens.size() == 111);
  const std::vector<PolicyConfig> policies = {{"dense", 0.0, {}}, {"tokenbutler", 0.5, {}}};
  const CorefEvalResult result =
      evaluate_coref_lockstep(loaded.resident, pools, loaded.model->require_tokenizer(), 0, 0, 1,
                              false, {}, policies, true)[1];
  TraceRecorder recorder(loaded.resident, nullptr, marked.tokens, policies);
  while (recorder.step()) {
  }
  const auto [mean, rows] = trace_hit_rate(recorder.trace(), 1);
  REQUIRE(rows > 0);
  CHECK(result.hit_rate.rows == rows);
  CHECK(std::abs(result.hit_rate.mean() - mean) <= 1e-9);
  // A trained predictor ranks better than chance.
  CHECK(result.hit_rate.mean() > 0.55);
}

TEST_CASE("eval --hit-rate: a JSON field, a CSV column and a table column", "[eval][cli]") {
  const std::string dir = test::make_temp_dir("eval-hit-cli");
  const std::string model = test::source_path("assets/models/demo");
  const auto run = [&](const std::string& extra) {
    return test::run_command(test::cli_path() + " eval --model " + model +
                             " --task coref --samples 2 --policies dense,oracle,tokenbutler" +
                             " --sparsity 0.5 --threads 2 --json " + dir + "/out.json --csv " +
                             dir + "/out.csv" + extra);
  };
  const auto with = run(" --hit-rate --per-sample " + dir + "/samples.jsonl");
  INFO(with.err);
  REQUIRE(with.exit_code == 0);
  CHECK(with.out.find("hit rate") != std::string::npos);
  Json out = Json::parse(read_text_file(dir + "/out.json"));
  REQUIRE(out["results"].size() == 3);
  CHECK(out["results"][0]["hit_rate"].is_null());  // dense
  CHECK(out["results"][1]["hit_rate"] == 1.0);     // oracle
  const double butler = out["results"][2]["hit_rate"];
  CHECK(butler > 0.5);
  CHECK(butler < 1.0);
  std::istringstream csv(read_text_file(dir + "/out.csv"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == "policy,sparsity,effective_sparsity,accuracy,coverage,ppl,samples,hit_rate");
  CHECK(lines[1].back() == ',');  // dense: empty
  CHECK(lines[2].substr(lines[2].size() - 2) == ",1");

  // Each sample's own hit rate: their mean over the two samples weighs them by their rows.
  std::istringstream samples(read_text_file(dir + "/samples.jsonl"));
  int64_t butler_lines = 0;
  for (std::string line; std::getline(samples, line);) {
    const Json j = Json::parse(line);
    REQUIRE(j.contains("hit_rate"));
    if (j["policy"] == "dense") CHECK(j["hit_rate"].is_null());
    if (j["policy"] == "oracle") CHECK(j["hit_rate"] == 1.0);
    if (j["policy"] != "tokenbutler") continue;
    ++butler_lines;
    CHECK(j["hit_rate"].get<double>() > 0.5);
  }
  CHECK(butler_lines == 2);

  const auto without = run("");
  REQUIRE(without.exit_code == 0);
  CHECK(without.out.find("hit rate") == std::string::npos);
  out = Json::parse(read_text_file(dir + "/out.json"));
  for (const Json& row : out["results"]) CHECK(row["hit_rate"].is_null());
}
