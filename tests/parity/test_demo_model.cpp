// The bundled demo model against what transformers computed for it (tests/fixtures/
// demo_reference.json, written by tools/eval_demo_model.py --reference-out on the GPU machine in
// F32): greedy continuations, per-token NLL and the first co-reference samples; plus the issue's
// accuracy bar on a seeded subset through kvlens-cli, and the README's demo commands.
//
// Tolerance: both sides widen the same BF16 weights to F32 and differ only in accumulation order
// over 8 layers of 256-688 term dot products; at build time the largest NLL gap over the 200
// evaluation samples was 3e-6. 1e-4 * max(1, |nll|) leaves 30x headroom while a real mistake
// (tokenizer, RoPE, GQA mapping, tied head) moves NLLs by 1e-2 or more.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/common/mapped_file.h"
#include "engine/eval/coref_eval.h"
#include "engine/eval/coref_pools.h"
#include "engine/model/model.h"
#include "engine/model/tokenizer.h"
#include "engine/session/scoring.h"
#include "engine/trace/trace.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

namespace {

constexpr double kNllTolerance = 1e-4;

struct DemoModel {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::shared_ptr<const Model> model = Model::load(test::source_path("assets/models/demo"));
  std::shared_ptr<const BackendModel> resident = upload_model(model, *backend);
};

DemoModel& demo() {
  static DemoModel loaded;
  return loaded;
}

nlohmann::json reference() {
  return nlohmann::json::parse(
      read_text_file(test::source_path("tests/fixtures/demo_reference.json")));
}

}  // namespace

TEST_CASE("demo model: prompts encode, continue and score as in transformers", "[parity][demo]") {
  const auto ref = reference();
  REQUIRE(ref["prompts"].size() == 3);
  for (const auto& case_ : ref["prompts"]) {
    const std::string prompt = case_["prompt"];
    INFO(prompt);
    const auto expected_prompt = case_["prompt_tokens"].get<std::vector<int32_t>>();
    const std::vector<int32_t> prompt_tokens =
        demo().model->require_tokenizer().encode(prompt, true);
    REQUIRE(prompt_tokens == expected_prompt);

    const auto expected_generated = case_["generated"].get<std::vector<int32_t>>();
    GenerateOptions options;
    options.max_new = 48;  // what the reference asked transformers for; it stops at </s> too
    const std::vector<int32_t> generated = generate_greedy(demo().resident, prompt_tokens, options);
    CHECK(generated == expected_generated);

    std::vector<int32_t> whole = expected_prompt;
    whole.insert(whole.end(), expected_generated.begin(), expected_generated.end());
    const ScoreResult scored = score_tokens(demo().resident, whole);
    const auto expected_nll = case_["nll"].get<std::vector<double>>();
    REQUIRE(scored.nll.size() == expected_nll.size());
    for (size_t i = 0; i < expected_nll.size(); ++i) {
      INFO("position " << i);
      CHECK(std::abs(scored.nll[i] - expected_nll[i]) <=
            kNllTolerance * std::max(1.0, std::abs(expected_nll[i])));
    }
  }
}

TEST_CASE("demo model: first co-reference samples match transformers sample by sample",
          "[parity][demo][coref]") {
  const auto ref = reference()["coref"];
  REQUIRE(ref.size() == 20);
  const CorefEvalResult result =
      evaluate_coref(demo().resident, load_bundled_coref_pools(), demo().model->require_tokenizer(),
                     0, 0, int64_t(ref.size()), false, {});
  REQUIRE(result.per_sample.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    const CorefSampleResult& got = result.per_sample[i];
    const auto& want = ref[i];
    INFO("sample " << i << ": " << got.answer);
    CHECK(got.index == want["index"].get<int64_t>());
    CHECK(got.answer == want["answer"].get<std::string>());
    CHECK(got.tokens == want["tokens"].get<int64_t>());
    CHECK(got.answer_token_begin == want["answer_token_begin"].get<int64_t>());
    CHECK(got.answer_token_end == want["answer_token_end"].get<int64_t>());
    CHECK(got.correct_tokens == want["correct_tokens"].get<int64_t>());
    CHECK(got.all_correct == want["all_correct"].get<bool>());
    CHECK(got.canonical == want["canonical"].get<bool>());
    const double want_nll = want["answer_nll"];
    CHECK(std::abs(got.answer_nll - want_nll) <= kNllTolerance * std::max(1.0, want_nll));
  }
}

TEST_CASE("demo model: reaches the co-reference bar on a seeded subset via kvlens-cli",
          "[parity][demo][coref]") {
  // The bar (accuracy >= 0.90, coverage >= 0.97) was measured on 200 samples of seed 0;
  // CI runs 50 of a different seed, which training never saw either (it used seeds 1000/2000).
  const std::string dir = test::make_temp_dir("demo-coref");
  const auto result = test::run_command(
      test::cli_path() + " eval --model " + test::source_path("assets/models/demo") +
      " --task coref --policies dense --sparsity 0 --samples 50 --seed 7 --json " + dir +
      "/coref.json");
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  const auto out = nlohmann::json::parse(read_text_file(dir + "/coref.json"));
  const auto& row = out["results"].at(0);
  CHECK(row["samples"] == 50);
  CHECK(row["accuracy"].get<double>() >= 0.90);
  CHECK(row["coverage"].get<double>() >= 0.97);
}

TEST_CASE("demo model: the README's demo commands run", "[parity][demo]") {
  const std::string dir = test::source_path("assets/models/demo");
  const auto result = test::run_command(test::cli_path() + " score --model " + dir +
                                        " --text-file " + dir + "/sample.txt --json");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto out = nlohmann::json::parse(result.out);
  // sample.txt is a story written for kvlens (never trained on). The model's held-back corpus
  // perplexity is 44 and simple stories are its easiest text (13.5 at build time): a broken
  // tokenizer or model lands in the hundreds or thousands.
  CHECK(out["ppl"].get<double>() > 5.0);
  CHECK(out["ppl"].get<double>() < 25.0);
  CHECK(out["tokens"].size() == 145);  // BOS + 144 BPE tokens
}

TEST_CASE("demo model: a recording keeps the text of every top-k token", "[parity][demo]") {
  // kvlens-cli trace on a prompt, read back: each step's top-k ids come with the tokenizer's text
  // of each id, so the logits view can label tokens that are not in the text.
  const std::string dir = test::make_temp_dir("demo-trace");
  const auto result = test::run_command(
      test::cli_path() + " trace --model " + test::source_path("assets/models/demo") +
      " --prompt 'Once upon a time' --policies dense,h2o --out " + dir + "/run.kvtrace");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const Trace trace = load_trace(dir + "/run.kvtrace");
  const Tokenizer& tokenizer = demo().model->require_tokenizer();
  REQUIRE(trace.step_count() > 2);
  for (const auto& step : trace.steps()) {
    for (const StepRecord& record : step) {
      REQUIRE(record.top.texts.size() == record.top.ids.size());
      for (size_t k = 0; k < record.top.ids.size(); ++k)
        CHECK(record.top.texts[k] == tokenizer.token_text(record.top.ids[k]));
    }
  }
}
