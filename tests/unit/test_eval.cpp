// Evaluation: windowed perplexity against hand-made windows over score_tokens, co-reference
// accuracy/coverage against a step-by-step recomputation, and kvlens-cli eval's JSON and errors.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/common/mapped_file.h"
#include "engine/eval/coref_eval.h"
#include "engine/eval/perplexity.h"
#include "engine/session/scoring.h"
#include "tests/support/cpu_model.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using Json = nlohmann::json;

namespace {

// A random tiny Llama with the real Llama 2 vocabulary (32000 ids, BOS 1, as the tiny config
// says), so samples can be tokenized; its predictions are noise, which the tests work around.
std::string tiny_model_with_tokenizer(int64_t max_positions = 512) {
  test::TinyLlamaSpec spec;
  spec.vocab = 32000;
  spec.tied = true;
  spec.max_positions = max_positions;
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("eval-model"), spec);
  std::filesystem::copy_file(test::shared_path("data/tokenizers/llama2-tokenizer.json"),
                             dir + "/tokenizer.json");
  return dir;
}

// The bundled demo model: trained on co-reference samples, so on hard samples some answers are
// right and some wrong, which exercises both branches of the metric.
std::string demo_model() {
  return test::source_path("assets/models/demo");
}

std::vector<int32_t> seeded_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> tokens;
  uint64_t state = seed;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    tokens.push_back(int32_t((state >> 33) % uint64_t(vocab)));
  }
  return tokens;
}

ScoreResult step_by_step(const test::CpuModel& loaded, std::span<const int32_t> tokens) {
  return score_tokens(loaded.resident, tokens, ScoreOptions{1, {}});
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// What evaluate_coref must report for one sample, recomputed from a step-by-step score.
struct Expected {
  int64_t correct = 0;
  double nll = 0.0;
};
Expected recompute(const test::CpuModel& loaded, const CorefTokens& marked) {
  const ScoreResult scored = step_by_step(loaded, marked.tokens);
  Expected expected;
  for (int64_t t = marked.answer_token_begin; t < marked.answer_token_end; ++t) {
    expected.correct += scored.argmax[size_t(t - 1)] == marked.tokens[size_t(t)];
    expected.nll += scored.nll[size_t(t - 1)];
  }
  return expected;
}

void check_against_recomputation(const test::CpuModel& loaded, uint64_t seed, int64_t first,
                                 int64_t count, bool hard) {
  const CorefPools pools = load_bundled_coref_pools();
  const Tokenizer& tokenizer = loaded.model->require_tokenizer();
  std::vector<std::pair<int64_t, int64_t>> progress;
  const CorefEvalResult result =
      evaluate_coref(loaded.resident, pools, tokenizer, seed, first, count, hard,
                     [&](int64_t done, int64_t total) { progress.emplace_back(done, total); });
  REQUIRE(result.samples == count);
  REQUIRE(result.per_sample.size() == size_t(count));
  CHECK(progress.back() == std::make_pair(count, count));

  int64_t all_right = 0, right = 0, answer_tokens = 0;
  for (int64_t i = 0; i < count; ++i) {
    const CorefSample sample = generate_coref_sample(pools, seed, first + i, hard);
    const CorefTokens marked = mark_answer_tokens(sample, tokenizer);
    const Expected expected = recompute(loaded, marked);
    const CorefSampleResult& got = result.per_sample[size_t(i)];
    INFO("sample " << first + i);
    CHECK(got.index == first + i);
    CHECK(got.answer == sample.answer);
    CHECK(got.tokens == int64_t(marked.tokens.size()));
    CHECK(got.answer_token_begin == marked.answer_token_begin);
    CHECK(got.answer_token_end == marked.answer_token_end);
    CHECK(got.canonical == marked.canonical);
    CHECK(got.correct_tokens == expected.correct);
    CHECK(got.all_correct == (expected.correct == marked.answer_token_count()));
    CHECK(got.answer_nll == Approx(expected.nll).epsilon(1e-5));
    all_right += got.all_correct;
    right += expected.correct;
    answer_tokens += marked.answer_token_count();
  }
  CHECK(result.answer_tokens == answer_tokens);
  CHECK(result.accuracy == double(all_right) / double(count));
  CHECK(result.coverage == double(right) / double(answer_tokens));
}

// Runs the CLI and checks it failed with one message naming each of `parts`.
void require_failure(const std::string& args, const std::vector<std::string>& parts) {
  const test::CommandResult result = test::run_command(test::cli_path() + " " + args);
  INFO("args: " << args << "\nstderr: " << result.err);
  REQUIRE(result.exit_code != 0);
  REQUIRE(result.exit_code < 128);
  REQUIRE(contains(result.err, "kvlens-cli: error:"));
  for (const std::string& part : parts) CHECK(contains(result.err, part));
}

std::set<std::string> keys(const Json& object) {
  std::set<std::string> out;
  for (const auto& item : object.items()) out.insert(item.key());
  return out;
}

}  // namespace

TEST_CASE("perplexity windows start every W-1 tokens and score each token once", "[eval]") {
  test::TinyLlamaSpec spec;
  spec.max_positions = 16;
  const test::CpuModel loaded =
      test::load_on_cpu(test::write_tiny_llama(test::make_temp_dir("eval"), spec));
  const std::vector<int32_t> tokens = seeded_tokens(10, spec.vocab, 3);
  const std::span<const int32_t> all(tokens);

  // Window 4 over 10 tokens: [0,4), [3,7), [6,10), each from an empty cache.
  double total = 0.0;
  for (const int64_t begin : {0, 3, 6}) {
    for (const double nll : step_by_step(loaded, all.subspan(size_t(begin), 4)).nll) total += nll;
  }
  for (const int64_t chunk : {1, 3, 4, 100}) {
    INFO("chunk " << chunk);
    std::pair<int64_t, int64_t> last{0, 0};
    const PerplexityResult result =
        evaluate_perplexity(loaded.resident, tokens, 4, chunk, [&](int64_t done, int64_t n) {
          last = {done, n};
        });
    CHECK(result.windows == 3);
    CHECK(result.window == 4);
    CHECK(result.tokens_scored == 9);
    CHECK(result.mean_nll == Approx(total / 9).epsilon(1e-6));
    CHECK(result.ppl == Approx(std::exp(total / 9)).epsilon(1e-6));
    CHECK(last == std::make_pair(int64_t(12), int64_t(12)));  // 3 windows of 4 tokens fed
  }

  SECTION("a short last window still counts; a window of one token is not formed") {
    const std::vector<int32_t> eleven = seeded_tokens(11, spec.vocab, 4);
    const std::span<const int32_t> s(eleven);
    double sum = 0.0;
    for (const auto& [begin, length] : {std::pair{0, 4}, {3, 4}, {6, 4}, {9, 2}}) {
      for (const double nll : step_by_step(loaded, s.subspan(size_t(begin), size_t(length))).nll)
        sum += nll;
    }
    const PerplexityResult r = evaluate_perplexity(loaded.resident, eleven, 4, 1, {});
    CHECK(r.windows == 4);
    CHECK(r.tokens_scored == 10);
    CHECK(r.mean_nll == Approx(sum / 10).epsilon(1e-6));
  }
  SECTION("one window holding the whole text is score_tokens' perplexity") {
    const PerplexityResult r = evaluate_perplexity(loaded.resident, tokens, 10, 1, {});
    CHECK(r.windows == 1);
    CHECK(r.ppl == Approx(step_by_step(loaded, tokens).ppl).epsilon(1e-9));
    CHECK(evaluate_perplexity(loaded.resident, tokens, 16, 1, {}).ppl == Approx(r.ppl));
  }
  SECTION("bad windows, chunks and inputs name the field") {
    const auto message = [&](int64_t window, int64_t chunk, size_t n) {
      return test::error_message(
          [&] { evaluate_perplexity(loaded.resident, all.subspan(0, n), window, chunk, {}); });
    };
    CHECK(contains(message(1, 1, 10), "window"));
    const std::string too_long = message(17, 1, 10);
    CHECK(contains(too_long, "window"));
    CHECK(contains(too_long, "max_position_embeddings"));
    CHECK(contains(too_long, "17"));
    CHECK(contains(message(4, 0, 10), "chunk"));
    CHECK(contains(message(4, 1, 1), "at least 2 tokens"));
  }
}

TEST_CASE("a coref sample's score uses the positions that predict the answer", "[eval]") {
  const test::CpuModel loaded = test::load_on_cpu(tiny_model_with_tokenizer());
  const CorefPools pools = load_bundled_coref_pools();
  const CorefSample sample = generate_coref_sample(pools, 5, 2, false);
  CorefTokens marked = mark_answer_tokens(sample, loaded.model->require_tokenizer());

  // A random model gets nothing right, so the answer tokens are replaced by what it predicts:
  // first only the first one, then all of them (each prediction depends only on earlier tokens).
  const int64_t begin = marked.answer_token_begin, end = marked.answer_token_end;
  REQUIRE(end - begin >= 2);
  for (int64_t t = begin; t < end; ++t) {
    marked.tokens[size_t(t)] =
        step_by_step(loaded, std::span<const int32_t>(marked.tokens).first(size_t(t)))
            .argmax.back();
    const CorefSampleResult got = score_coref_sample(loaded.resident, sample, marked);
    const Expected expected = recompute(loaded, marked);
    INFO("answer tokens replaced up to " << t);
    CHECK(got.correct_tokens >= t - begin + 1);
    CHECK(got.correct_tokens == expected.correct);
    CHECK(got.answer_nll == Approx(expected.nll).epsilon(1e-5));
    CHECK(got.all_correct == (got.correct_tokens == end - begin));
  }
  CHECK(score_coref_sample(loaded.resident, sample, marked).all_correct);
}

TEST_CASE("coref accuracy and coverage equal a step-by-step recomputation", "[eval]") {
  SECTION("random tiny model") {
    check_against_recomputation(test::load_on_cpu(tiny_model_with_tokenizer()), 0, 0, 3, false);
  }
  SECTION("demo model, hard samples") {
    check_against_recomputation(test::load_on_cpu(demo_model()), 0, 0, 6, true);
  }
}

TEST_CASE("coref samples scored side by side give the results of scoring each alone", "[eval]") {
  // evaluate_coref_lockstep scores its samples as tasks of the backend (two CPU threads here, each
  // sample's ops inline on its thread); score_coref_sample_lockstep on this thread spreads each
  // op over both. The results must not depend on that: every figure is compared exactly.
  const test::CpuModel loaded = test::load_on_cpu(demo_model());
  const CorefPools pools = load_bundled_coref_pools();
  const Tokenizer& tokenizer = loaded.model->require_tokenizer();
  const std::vector<PolicyConfig> policies = {
      {"dense", 0.0, {}}, {"h2o", 0.5, {}}, {"streaming", 0.5, {}}, {"tokenfilter", 0.5, {}}};
  const int64_t first = 3, count = 5;
  std::vector<int64_t> progress;
  const std::vector<CorefEvalResult> results = evaluate_coref_lockstep(
      loaded.resident, pools, tokenizer, 0, first, count, false,
      [&](int64_t done, int64_t total) {
        CHECK(total == count);
        progress.push_back(done);
      },
      policies);
  CHECK(progress == std::vector<int64_t>{1, 2, 3, 4, 5});
  REQUIRE(results.size() == policies.size());
  for (int64_t i = 0; i < count; ++i) {
    const CorefSample sample = generate_coref_sample(pools, 0, first + i, false);
    const CorefTokens marked = mark_answer_tokens(sample, tokenizer);
    const std::vector<CorefSampleResult> alone =
        score_coref_sample_lockstep(loaded.resident, sample, marked, policies);
    for (size_t p = 0; p < policies.size(); ++p) {
      INFO("sample " << first + i << ", policy " << policies[p].id);
      const CorefSampleResult& got = results[p].per_sample.at(size_t(i));
      CHECK(got.index == first + i);
      CHECK(got.correct_tokens == alone[p].correct_tokens);
      CHECK(got.answer_nll == alone[p].answer_nll);
      CHECK(got.sparsity.steps == alone[p].sparsity.steps);
      CHECK(got.sparsity.hidden_sum == alone[p].sparsity.hidden_sum);
    }
  }
  CHECK(results[1].sparsity.overall() > 0.0);  // h2o hid something: the runs were sparse
}

TEST_CASE("coref evaluation rejects samples past the model's positions", "[eval]") {
  const test::CpuModel loaded = test::load_on_cpu(tiny_model_with_tokenizer(16));
  const CorefPools pools = load_bundled_coref_pools();
  const std::string message = test::error_message([&] {
    evaluate_coref(loaded.resident, pools, loaded.model->require_tokenizer(), 0, 7, 2, false, {});
  });
  CHECK(contains(message, "coref sample 7"));
  CHECK(contains(message, "max_position_embeddings"));
  CHECK(contains(test::error_message([&] {
                   evaluate_coref(loaded.resident, pools, loaded.model->require_tokenizer(), 0, 0,
                                  0, false, {});
                 }),
                 "samples"));
}

TEST_CASE("eval --task coref writes the documented JSON and per-sample lines", "[eval][cli]") {
  const std::string model = tiny_model_with_tokenizer();
  const std::string dir = test::make_temp_dir("eval-cli");
  const std::string json_path = dir + "/out.json", lines_path = dir + "/per-sample.jsonl";
  const auto result = test::run_command(
      test::cli_path() + " eval --model " + model + " --task coref --samples 3" +
      " --seed 4 --threads 2 --json " + json_path + " --per-sample " + lines_path);
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(contains(result.out, "accuracy"));
  CHECK(contains(result.out, "dense"));

  const Json out = Json::parse(read_text_file(json_path));
  CHECK(keys(out) == std::set<std::string>{"task", "model", "results"});
  CHECK(out["task"] == "coref");
  CHECK(out["model"] == model);
  REQUIRE(out["results"].size() == 1);
  const Json& row = out["results"][0];
  CHECK(keys(row) == std::set<std::string>{"policy", "sparsity", "run", "effective_sparsity",
                                           "accuracy", "coverage", "ppl", "samples",
                                           "answer_tokens", "hit_rate"});
  CHECK(row["policy"] == "dense");
  CHECK(row["run"] == "dense");
  CHECK(row["sparsity"] == 0.0);
  CHECK(row["effective_sparsity"] == 0.0);
  CHECK(row["ppl"].is_null());
  CHECK(row["samples"] == 3);

  const test::CpuModel loaded = test::load_on_cpu(model);
  const CorefEvalResult expected =
      evaluate_coref(loaded.resident, load_bundled_coref_pools(), loaded.model->require_tokenizer(),
                     4, 0, 3, false, {});
  CHECK(row["accuracy"].get<double>() == expected.accuracy);
  CHECK(row["coverage"].get<double>() == expected.coverage);
  CHECK(row["answer_tokens"] == expected.answer_tokens);

  std::ifstream lines(lines_path);
  std::string line;
  size_t n = 0;
  for (; std::getline(lines, line); ++n) {
    REQUIRE(n < expected.per_sample.size());
    const Json j = Json::parse(line);
    const CorefSampleResult& s = expected.per_sample[n];
    CHECK(keys(j) == std::set<std::string>{"policy", "sparsity", "run", "index", "answer", "tokens",
                                           "answer_token_begin", "answer_token_end",
                                           "correct_tokens", "all_correct", "canonical",
                                           "answer_nll"});
    CHECK(j["index"] == s.index);
    CHECK(j["answer"] == s.answer);
    CHECK(j["tokens"] == s.tokens);
    CHECK(j["answer_token_begin"] == s.answer_token_begin);
    CHECK(j["answer_token_end"] == s.answer_token_end);
    CHECK(j["correct_tokens"] == s.correct_tokens);
    CHECK(j["all_correct"] == s.all_correct);
    CHECK(j["canonical"] == s.canonical);
  }
  CHECK(n == 3);
  CHECK_FALSE(std::filesystem::exists(json_path + ".partial"));
}

TEST_CASE("eval runs several policies and sparsities, with effective sparsity and a CSV sweep",
          "[eval][cli]") {
  const std::string model = tiny_model_with_tokenizer();
  const std::string dir = test::make_temp_dir("eval-sweep");
  const auto result = test::run_command(
      test::cli_path() + " eval --model " + model +
      " --task coref --samples 2 --policies dense,streaming --sparsity 0.25,0.75" +
      " --policy-arg sinks=2 --json " + dir + "/out.json --csv " + dir + "/sweep.csv");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const Json out = Json::parse(read_text_file(dir + "/out.json"));
  REQUIRE(out["results"].size() == 3);  // dense once, streaming at both sparsities
  CHECK(out["results"][0]["policy"] == "dense");
  CHECK(out["results"][0]["effective_sparsity"] == 0.0);
  const double low = out["results"][1]["effective_sparsity"];
  const double high = out["results"][2]["effective_sparsity"];
  // Layer 0 stays dense and early steps keep the sinks, so the measured value sits below the
  // nominal one; more sparsity must hide more.
  CHECK(low > 0.05);
  CHECK(low < 0.25);
  CHECK(high > low);
  CHECK(high < 0.75);
  CHECK(out["results"][1]["effective_sparsity_per_layer"].size() == 2);
  CHECK(out["results"][1]["effective_sparsity_per_layer"][0] == 0.0);

  std::istringstream csv(read_text_file(dir + "/sweep.csv"));
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  REQUIRE(lines.size() == 4);
  CHECK(lines[0] == "policy,sparsity,effective_sparsity,accuracy,coverage,ppl,samples,hit_rate");
  CHECK(lines[1].rfind("dense,0,0,", 0) == 0);
  CHECK(lines[2].rfind("streaming,0.25,", 0) == 0);
  CHECK(lines[3].rfind("streaming,0.75,", 0) == 0);
}

TEST_CASE("eval --task ppl reports windows and tokens scored", "[eval][cli]") {
  const std::string model = tiny_model_with_tokenizer(64);
  const std::string dir = test::make_temp_dir("eval-ppl");
  const std::string text_path = dir + "/text.txt", json_path = dir + "/out.json";
  std::string text;
  for (int i = 0; i < 20; ++i)
    text += "The lighthouse keeper counted " + std::to_string(i) + " ships. ";
  test::write_file(text_path, text);
  const auto result = test::run_command(test::cli_path() + " eval --model " + model +
                                        " --task ppl --policies dense,h2o@0" +
                                        " --sparsity 0 --threads 2 --text-file " + text_path +
                                        " --window 16 --max-tokens 100 --json " + json_path);
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const Json out = Json::parse(read_text_file(json_path));
  CHECK(out["task"] == "ppl");
  // One per run (the same run twice is refused): h2o at sparsity 0 sees what dense sees.
  REQUIRE(out["results"].size() == 2);

  const test::CpuModel loaded = test::load_on_cpu(model);
  std::vector<int32_t> tokens =
      loaded.model->require_tokenizer().encode(read_text_file(text_path), true);
  REQUIRE(tokens.size() > 100);
  tokens.resize(100);
  const PerplexityResult expected = evaluate_perplexity(loaded.resident, tokens, 16, 1, {});
  for (const Json& row : out["results"]) {
    std::set<std::string> expected_keys{
        "policy",        "sparsity", "run",     "effective_sparsity",
        "accuracy",      "coverage", "ppl",     "samples",
        "tokens_scored", "window",   "hit_rate"};
    if (row["policy"] != "dense") {  // a policy's steps have per-layer and per-head sparsities
      expected_keys.insert({"effective_sparsity_per_layer", "effective_sparsity_per_head"});
    }
    CHECK(keys(row) == expected_keys);
    CHECK(row["accuracy"].is_null());
    CHECK(row["coverage"].is_null());
    CHECK(row["samples"] == expected.windows);
    CHECK(row["tokens_scored"] == 99);
    CHECK(row["window"] == 16);
    CHECK(row["ppl"].get<double>() == Approx(expected.ppl).epsilon(1e-6));
  }

  // Without --window the model's whole context is one window.
  const auto whole =
      test::run_command(test::cli_path() + " eval --model " + model + " --task ppl --text-file " +
                        text_path + " --max-tokens 64 --json " + json_path);
  REQUIRE(whole.exit_code == 0);
  const Json row = Json::parse(read_text_file(json_path))["results"][0];
  CHECK(row["window"] == 64);
  CHECK(row["samples"] == 1);
}

TEST_CASE("eval: bad flags get one message naming the flag", "[eval][cli][errors]") {
  const std::string model = tiny_model_with_tokenizer(64);
  const std::string text = test::make_temp_dir("eval-err") + "/text.txt";
  test::write_file(text, "Once upon a time there was a model that had to be evaluated.");
  const std::string base = "eval --model " + model + " ";
  SECTION("ppl without --text-file") {
    require_failure(base + "--task ppl", {"--text-file", "ppl"});
  }
  SECTION("window of one token") {
    require_failure(base + "--task ppl --text-file " + text + " --window 1", {"window", "1"});
  }
  SECTION("window past the model's positions") {
    require_failure(base + "--task ppl --text-file " + text + " --window 65",
                    {"window", "max_position_embeddings", "65"});
  }
  SECTION("an unknown policy") {
    require_failure(base + "--task coref --policies dense,nosuch", {"--policies", "nosuch", "h2o"});
  }
  SECTION("a policy parameter no policy run has") {
    require_failure(base + "--task coref --policies dense,streaming --policy-arg heavy_frac=0.2",
                    {"--policy-arg", "heavy_frac"});
  }
  SECTION("an unknown parameter beside a known one") {
    // Each --policy-arg is checked on its own: a valid one must not hide a typo next to it.
    require_failure(base + "--task coref --policies h2o,streaming --policy-arg sinks=2 " +
                        "--policy-arg heavy_fraction=0.2",
                    {"--policy-arg", "heavy_fraction"});
  }
  SECTION("a bad value of a policy parameter") {
    require_failure(base + "--task coref --policies h2o --policy-arg h2o.heavy_frac=2",
                    {"--policy-arg", "heavy_frac", "[0, 1]"});
  }
  SECTION("malformed sparsity list") {
    require_failure(base + "--task coref --sparsity 0,,0.5", {"--sparsity"});
    require_failure(base + "--task coref --sparsity 1.5", {"--sparsity", "1.5"});
  }
  SECTION("unknown task") {
    require_failure(base + "--task bogus", {"--task", "bogus", "coref or ppl"});
  }
  SECTION("a flag of the other task") {
    require_failure(base + "--task ppl --text-file " + text + " --hard", {"--hard", "coref"});
    require_failure(base + "--task coref --window 8", {"--window", "ppl"});
  }
  SECTION("unwritable --json path") {
    require_failure(base + "--task coref --samples 1 --json /nonexistent-dir/out.json",
                    {"--json", "/nonexistent-dir/out.json"});
  }
  SECTION("a failed run leaves no output behind") {
    const std::string out = test::make_temp_dir("eval-err") + "/out.json";
    require_failure(base + "--task ppl --text-file " + text + " --window 65 --json " + out,
                    {"window"});
    CHECK_FALSE(std::filesystem::exists(out));
    CHECK_FALSE(std::filesystem::exists(out + ".partial"));
  }
}
