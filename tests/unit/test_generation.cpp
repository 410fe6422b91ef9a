// Free generation under several policies (app/session/generation.h): each run's continuation is
// what generate_greedy gives it alone, dense is the reference of the departure marks, and a
// cancel stops after the current step.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "app/session/generation.h"
#include "app/session/policy_runs.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/session/scoring.h"
#include "tests/support/test_paths.h"

using namespace kvlens;
using session::first_departure;
using session::generate_runs;
using session::GeneratedText;
using session::GenerationOptions;

namespace {

struct Demo {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  std::shared_ptr<const BackendModel> model =
      upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  std::vector<int32_t> prompt =
      // A short co-reference prompt: dense answers "Mirewick" and ends with EOS (the demo
      // model's training samples end so), which the lockstep tests below need.
      model->model->require_tokenizer().encode(
          "A town by the river. The place is: Mirewick. The town by the river is called:", true);
};

std::vector<int32_t> greedy(const Demo& demo, const PolicyConfig& policy, int64_t max_new) {
  GenerateOptions options;
  options.max_new = max_new;
  options.policy = policy;
  return generate_greedy(demo.model, demo.prompt, options);
}

}  // namespace

TEST_CASE("first_departure: the first differing index, the shorter end, or -1", "[generation]") {
  using Ids = std::vector<int32_t>;
  CHECK(first_departure(Ids{5, 6, 7}, Ids{5, 6, 7}) == -1);
  CHECK(first_departure(Ids{5, 6, 8}, Ids{5, 6, 7}) == 2);
  CHECK(first_departure(Ids{4, 6, 7}, Ids{5, 6, 7}) == 0);
  CHECK(first_departure(Ids{5, 6}, Ids{5, 6, 7}) == 2);
  CHECK(first_departure(Ids{5, 6, 7, 1}, Ids{5, 6, 7}) == 3);
  CHECK(first_departure(Ids{}, Ids{}) == -1);
}

TEST_CASE("each run generates what generate_greedy gives it alone", "[generation]") {
  const Demo demo;
  const int64_t max_new = 24;
  const auto runs =
      session::resolve_policy_runs("dense,h2o@0,h2o@0.8,quest@0.9:page_size=4", "0.5", {});
  const std::vector<GeneratedText> texts =
      generate_runs(demo.model, demo.prompt, runs, GenerationOptions{.max_new = max_new});
  REQUIRE(texts.size() == runs.size());
  for (size_t r = 0; r < runs.size(); ++r) {
    INFO(texts[r].spec);
    CHECK(texts[r].spec == session::run_spec(runs[r]));
    CHECK(texts[r].ids == greedy(demo, runs[r], max_new));
    CHECK(texts[r].first_departure == first_departure(texts[r].ids, texts[0].ids));
  }
  CHECK(texts[0].first_departure == -1);
  // Dense ends this prompt with EOS before max_new; the runs that left its path go on (one run's
  // end does not stop the others' lockstep steps).
  const std::vector<int64_t>& eos = demo.model->config().eos_token_ids;
  REQUIRE(texts[0].ids.size() < size_t(max_new));
  CHECK(std::count(eos.begin(), eos.end(), int64_t(texts[0].ids.back())) == 1);
  CHECK(texts[2].ids.size() == size_t(max_new));
  // Sparsity 0 hides nothing: the same text as dense.
  CHECK(texts[1].ids == texts[0].ids);
  CHECK(texts[1].first_departure == -1);
  // The text is the tokenizer's decode of the continuation (after the prompt), and the pieces
  // add up to it.
  const Tokenizer& tokenizer = demo.model->model->require_tokenizer();
  std::vector<int32_t> all = demo.prompt;
  all.insert(all.end(), texts[2].ids.begin(), texts[2].ids.end());
  CHECK(tokenizer.decode(demo.prompt, true) + texts[2].text == tokenizer.decode(all, true));
  std::string joined;
  for (const std::string& piece : texts[2].pieces) joined += piece;
  CHECK(joined == texts[2].text);
  CHECK(texts[2].pieces.size() == texts[2].ids.size());
}

TEST_CASE("dense is the departure reference even when it is not listed", "[generation]") {
  const Demo demo;
  const auto runs = session::resolve_policy_runs("random@0.9", "0.5", {});
  const auto texts = generate_runs(demo.model, demo.prompt, runs, {.max_new = 16});
  REQUIRE(texts.size() == 1);
  const std::vector<int32_t> dense = greedy(demo, PolicyConfig{}, 16);
  CHECK(texts[0].ids == greedy(demo, runs[0], 16));
  CHECK(texts[0].first_departure == first_departure(texts[0].ids, dense));
  // Random selection at 90% sparsity on this prompt leaves dense's path at some point.
  CHECK(texts[0].first_departure >= 0);
  CHECK(texts[0].ids[size_t(texts[0].first_departure)] != dense[size_t(texts[0].first_departure)]);
}

TEST_CASE("a cancel stops generation after the current step with what was made", "[generation]") {
  const Demo demo;
  const auto runs = session::resolve_policy_runs("dense,h2o@0.5", "0.5", {});
  std::atomic<bool> cancel{false};
  GenerationOptions options{.max_new = 30};
  options.cancel = &cancel;
  int64_t steps = 0;
  options.on_step = [&](const std::vector<GeneratedText>& so_far) {
    ++steps;
    CHECK(so_far.size() == 2);
    CHECK(so_far[0].ids.size() == size_t(steps));
    if (steps == 3) cancel = true;
  };
  const auto texts = generate_runs(demo.model, demo.prompt, runs, options);
  CHECK(steps == 3);
  CHECK(texts[0].ids.size() == 3);
  const std::vector<int32_t> dense = greedy(demo, PolicyConfig{}, 30);
  CHECK(texts[0].ids == std::vector<int32_t>(dense.begin(), dense.begin() + 3));

  // Cancelled before it starts: nothing generated, no error.
  const auto none = generate_runs(demo.model, demo.prompt, runs, options);
  CHECK(none[0].ids.empty());
  CHECK(none[1].ids.empty());
}

TEST_CASE("generate_runs refuses an empty prompt or run list", "[generation][errors]") {
  const Demo demo;
  CHECK_THROWS_WITH(generate_runs(demo.model, {}, {PolicyConfig{}}),
                    Catch::Contains("prompt") && Catch::Contains("at least one token"));
  CHECK_THROWS_WITH(generate_runs(demo.model, demo.prompt, {}),
                    Catch::Contains("runs") && Catch::Contains("at least one policy run"));
}
