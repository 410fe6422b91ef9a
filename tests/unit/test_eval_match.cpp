// Matched effective sparsity (engine/eval/sparsity_match.h, kvlens-cli eval --match): the search
// on made-up curves (linear, stepped, capped), matched coref runs of several policies on the demo
// model, the CLI's rows and warnings, and the warnings of nominal budgets that are not token
// shares.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "engine/common/mapped_file.h"
#include "engine/eval/coref_eval.h"
#include "engine/eval/sparsity_match.h"
#include "engine/policy/sparsity_stats.h"
#include "tests/support/cpu_model.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"

using namespace kvlens;
using Json = nlohmann::json;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A search against effective = curve(nominal), every candidate logged.
struct CurveSearch {
  std::vector<std::vector<double>> tried;
  std::vector<MatchOutcome> run(const std::vector<PolicyConfig>& runs,
                                const std::function<double(size_t, double)>& curve,
                                const MatchOptions& options = {}) {
    tried.assign(runs.size(), {});
    return match_effective_sparsity(
        runs,
        [&](std::span<const size_t> which, std::span<const PolicyConfig> configs) {
          std::vector<double> effective;
          for (size_t k = 0; k < which.size(); ++k) {
            tried[which[k]].push_back(configs[k].sparsity);
            effective.push_back(curve(which[k], configs[k].sparsity));
          }
          return effective;
        },
        options);
  }
};

PolicyConfig run_of(const std::string& id, double sparsity, std::vector<std::string> args = {}) {
  PolicyConfig config;
  config.id = id;
  config.sparsity = sparsity;
  config.args = std::move(args);
  return config;
}

std::string demo_model() {
  return test::source_path("assets/models/demo");
}

}  // namespace

TEST_CASE("the search meets the target on linear and stepped curves", "[eval][match]") {
  const std::vector<PolicyConfig> runs = {run_of("h2o", 0.5), run_of("quest", 0.3),
                                          run_of("snapkv", 0.7)};
  // Below the nominal (a dense layer), stepped in 1/64 (whole tokens), and above the nominal.
  const auto curve = [](size_t run, double x) {
    if (run == 0) return 0.85 * x;
    if (run == 1) return std::floor(0.8 * x * 64.0) / 64.0;
    return std::min(1.0, 1.1 * x);
  };
  CurveSearch search;
  const std::vector<MatchOutcome> outcomes = search.run(runs, curve);
  REQUIRE(outcomes.size() == 3);
  for (size_t i = 0; i < runs.size(); ++i) {
    INFO("run " << i);
    CHECK(outcomes[i].matched);
    CHECK(outcomes[i].warning.empty());
    CHECK(outcomes[i].target == runs[i].sparsity);
    CHECK(std::abs(outcomes[i].effective - runs[i].sparsity) <= 0.005);
    CHECK(outcomes[i].effective == curve(i, outcomes[i].nominal));
    CHECK(outcomes[i].evaluations == int(search.tried[i].size()));
    CHECK(outcomes[i].evaluations <= 6);
    CHECK(search.tried[i].front() == runs[i].sparsity);  // the nominal as given comes first
  }
  CHECK(outcomes[0].nominal > 0.5);
  CHECK(outcomes[2].nominal < 0.7);

  SECTION("deterministic: the same candidates and outcomes again") {
    const std::vector<std::vector<double>> first = search.tried;
    const std::vector<MatchOutcome> again = search.run(runs, curve);
    CHECK(search.tried == first);
    for (size_t i = 0; i < runs.size(); ++i) CHECK(again[i].nominal == outcomes[i].nominal);
  }
  SECTION("a tighter tolerance than the steps: met where the curve allows, said where not") {
    MatchOptions options;
    options.tolerance = 0.001;
    const std::vector<MatchOutcome> tight = search.run(runs, curve, options);
    CHECK(std::abs(tight[0].effective - 0.5) <= 0.001);
    CHECK(std::abs(tight[2].effective - 0.7) <= 0.001);
    // 0.3 lies between the steps 19/64 and 20/64: the closer one, with the reason.
    CHECK_FALSE(tight[1].matched);
    CHECK(tight[1].effective == 19.0 / 64.0);
    CHECK(contains(tight[1].warning, "between two budgets"));
  }
}

TEST_CASE("the search says when a target cannot be reached", "[eval][match]") {
  CurveSearch search;
  SECTION("capped below the target: the closest, with a warning") {
    const auto outcomes = search.run({run_of("tokenfilter", 0.7)},
                                     [](size_t, double x) { return std::min(0.41, x); });
    CHECK_FALSE(outcomes[0].matched);
    CHECK(outcomes[0].effective == 0.41);
    CHECK(contains(outcomes[0].warning, "cannot reach"));
    CHECK(contains(outcomes[0].warning, "0.700"));
    CHECK(contains(outcomes[0].warning, "0.410"));
    CHECK(contains(outcomes[0].warning, "tail_frac"));
    // The lowest nominal that gives the cap, not the last one tried.
    CHECK(outcomes[0].nominal == 0.7);
    CHECK(outcomes[0].evaluations <= 3);
    // Just above the cap the secant creeps; a flat step sends the next try to the top at once:
    // 0.45, the secant's 0.494, then 0.999.
    const auto near = search.run({run_of("tokenfilter", 0.45)},
                                 [](size_t, double x) { return std::min(0.41, x); });
    CHECK_FALSE(near[0].matched);
    CHECK(search.tried[0].size() == 3);
    CHECK(search.tried[0].back() == MatchOptions{}.max_nominal);
  }
  SECTION("above the target even at nominal 0") {
    const auto outcomes = search.run({run_of("h2o", 0.1)}, [](size_t, double) { return 0.3; });
    CHECK_FALSE(outcomes[0].matched);
    CHECK(contains(outcomes[0].warning, "at nominal 0"));
  }
  SECTION("a jump over the target") {
    const auto jump = [](size_t, double x) { return x < 0.42 ? 0.4 : 0.6; };
    MatchOptions hasty;
    hasty.max_evaluations = 4;
    const auto limited = search.run({run_of("h2o", 0.5)}, jump, hasty);
    CHECK_FALSE(limited[0].matched);
    CHECK(limited[0].evaluations == 4);
    CHECK(contains(limited[0].warning, "after 4 evaluations"));
    const auto outcomes = search.run({run_of("h2o", 0.5)}, jump);
    CHECK_FALSE(outcomes[0].matched);
    CHECK(contains(outcomes[0].warning, "between two budgets"));
    // Both sides miss by 0.1: the lower nominal is kept.
    CHECK(outcomes[0].effective == 0.4);
    CHECK(outcomes[0].evaluations < 30);
  }
  SECTION("a run the search does not move stays matched at once") {
    const auto outcomes = search.run({run_of("dense", 0.0)}, [](size_t, double) { return 0.0; });
    CHECK(outcomes[0].matched);
    CHECK(outcomes[0].evaluations == 1);
  }
}

TEST_CASE("matched sparsity: bad values get a message naming the field", "[eval][match][errors]") {
  const auto flat = [](std::span<const size_t> which, std::span<const PolicyConfig>) {
    return std::vector<double>(which.size(), 0.0);
  };
  CHECK(contains(test::error_message([] { parse_sparsity_match("exact"); }), "effective or none"));
  CHECK(parse_sparsity_match("effective") == SparsityMatch::Effective);
  CHECK(parse_sparsity_match("none") == SparsityMatch::None);
  const std::vector<PolicyConfig> beyond = {run_of("h2o", 1.2)};
  CHECK(contains(test::error_message([&] { match_effective_sparsity(beyond, flat); }), "target"));
  MatchOptions bad;
  bad.tolerance = 0.0;
  const std::vector<PolicyConfig> runs = {run_of("h2o", 0.5)};
  CHECK(contains(test::error_message([&] { match_effective_sparsity(runs, flat, bad); }),
                 "tolerance"));
}

TEST_CASE("nominal budgets that are not token shares are named", "[eval][match]") {
  SECTION("tokenfilter: a share of attention computations, capped past its tail") {
    const auto half = nominal_budget_warnings(run_of("tokenfilter", 0.3), 8);
    REQUIRE(half.size() == 1);
    CHECK(contains(half[0], "not of tokens"));
    CHECK(contains(half[0], "layers 4..7"));
    CHECK_FALSE(contains(half[0], "capped"));
    const auto high = nominal_budget_warnings(run_of("tokenfilter", 0.7), 8);
    REQUIRE(high.size() == 1);
    CHECK(contains(high[0], "capped"));
    CHECK(contains(high[0], "at most 0.5"));
    // A longer tail takes 0.7 without a cap.
    CHECK_FALSE(contains(
        nominal_budget_warnings(run_of("tokenfilter", 0.7, {"tail_frac=0.875"}), 8)[0], "capped"));
  }
  SECTION("lazyllm: capped where its dense layers keep more") {
    CHECK(nominal_budget_warnings(run_of("lazyllm", 0.5), 8).empty());
    const auto capped = nominal_budget_warnings(run_of("lazyllm", 0.95), 8);
    REQUIRE(capped.size() == 1);
    CHECK(contains(capped[0], "capped"));
  }
  SECTION("a fixed budget_tokens does not use the sparsity") {
    const auto fixed = nominal_budget_warnings(run_of("h2o", 0.5, {"budget_tokens=32"}), 8);
    REQUIRE(fixed.size() == 1);
    CHECK(contains(fixed[0], "budget_tokens=32"));
  }
  SECTION("token-share budgets have none") {
    for (const char* id : {"dense", "h2o", "snapkv", "quest", "tova", "streaming"}) {
      CHECK(nominal_budget_warnings(run_of(id, std::string(id) == "dense" ? 0.0 : 0.5), 8).empty());
    }
  }
}

TEST_CASE("a skipped attention counts as every candidate hidden, as a token policy's row does",
          "[eval][match]") {
  // tokenfilter's effective sparsity is the share of (query, key) computations it skips: one
  // skipped layer at a step must weigh what a layer hiding all its candidates weighs.
  SparsityStats skipped, hidden;
  skipped.reset(2, 2);
  hidden.reset(2, 2);
  skipped.add_dense_layer(0);
  skipped.add_skipped_layer(1);
  skipped.end_step();
  hidden.add_layer(0, {5, 5}, 5);
  hidden.add_layer(1, {0, 0}, 5);
  hidden.end_step();
  CHECK(skipped.overall() == hidden.overall());
  CHECK(skipped.per_layer() == hidden.per_layer());
}

TEST_CASE("matched coref runs land within the tolerance on the demo model", "[eval][match]") {
  const test::CpuModel loaded = test::load_on_cpu(demo_model());
  const CorefPools pools = load_bundled_coref_pools();
  const Tokenizer& tokenizer = loaded.model->require_tokenizer();
  const std::vector<PolicyConfig> runs = {run_of("dense", 0.0),  run_of("h2o", 0.5),
                                          run_of("snapkv", 0.5), run_of("quest", 0.5),
                                          run_of("tova", 0.3),   run_of("streaming", 0.7)};
  const std::function<std::vector<CorefEvalResult>(std::span<const PolicyConfig>)> evaluate =
      [&](std::span<const PolicyConfig> configs) {
        return evaluate_coref_lockstep(loaded.resident, pools, tokenizer, 0, 0, 3, false, {},
                                       configs);
      };
  std::vector<MatchOutcome> outcomes;
  const std::vector<CorefEvalResult> matched =
      evaluate_matched<CorefEvalResult>(runs, evaluate, MatchOptions{}, outcomes);
  REQUIRE(matched.size() == runs.size());
  const std::vector<CorefEvalResult> nominal = evaluate(runs);
  for (size_t i = 0; i < runs.size(); ++i) {
    INFO(runs[i].id << " target " << runs[i].sparsity << " nominal " << outcomes[i].nominal
                    << " effective " << outcomes[i].effective);
    CHECK(outcomes[i].matched);
    CHECK(std::abs(effective_of(matched[i].sparsity) - runs[i].sparsity) <= 0.005);
    // The result kept is the evaluation at the chosen nominal, not the last one tried.
    CHECK(effective_of(matched[i].sparsity) == outcomes[i].effective);
    if (i == 0) continue;
    // Dense layer 0 and the early steps' sinks keep the nominal figure's effective below it.
    CHECK(effective_of(nominal[i].sparsity) < runs[i].sparsity - 0.005);
    CHECK(outcomes[i].nominal > runs[i].sparsity);
  }
  // Rerun at the chosen nominal: the same effective sparsity (deterministic calibration).
  std::vector<PolicyConfig> chosen;
  for (size_t i = 0; i < runs.size(); ++i) chosen.push_back(matched_config(runs[i], outcomes[i]));
  const std::vector<CorefEvalResult> again = evaluate(chosen);
  for (size_t i = 0; i < runs.size(); ++i) {
    CHECK(effective_of(again[i].sparsity) == outcomes[i].effective);
    CHECK(again[i].accuracy == matched[i].accuracy);
  }
}

TEST_CASE("eval --match effective reports target, nominal and effective, and warns",
          "[eval][match][cli]") {
  const std::string dir = test::make_temp_dir("eval-match");
  const std::string base = test::cli_path() + " eval --model " + demo_model() +
                           " --task coref --samples 2 --threads 2 --policies dense,h2o,tokenfilter"
                           " --sparsity 0.6";
  const auto result = test::run_command(base + " --match effective --json " + dir +
                                        "/out.json --csv " + dir + "/out.csv");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(contains(result.out, "target"));
  CHECK(contains(result.out, "nominal"));
  CHECK(contains(result.err, "warning: tokenfilter at nominal sparsity 0.600"));
  CHECK(contains(result.err, "capped"));
  CHECK(contains(result.err, "cannot reach"));

  const Json out = Json::parse(read_text_file(dir + "/out.json"));
  CHECK(out["match"]["mode"] == "effective");
  CHECK(out["match"]["tolerance"] == 0.005);
  CHECK(contains(out["match"]["holds"].get<std::string>(), "on average"));
  REQUIRE(out["warnings"].size() == 2);
  CHECK(contains(out["warnings"][0].get<std::string>(), "not of tokens"));
  CHECK(contains(out["warnings"][1].get<std::string>(), "tokenfilter@0.6: cannot reach"));
  REQUIRE(out["results"].size() == 3);
  const Json& h2o = out["results"][1];
  CHECK(h2o["target_sparsity"] == 0.6);
  CHECK(h2o["matched"] == true);
  CHECK(h2o["sparsity"].get<double>() > 0.6);  // the nominal found
  CHECK(std::abs(h2o["effective_sparsity"].get<double>() - 0.6) <= 0.005);
  // The run spec reads back as the run that was measured.
  const std::string spec = h2o["run"].get<std::string>();
  REQUIRE(spec.rfind("h2o@", 0) == 0);
  CHECK(std::stod(spec.substr(4)) == h2o["sparsity"].get<double>());
  CHECK(out["results"][2]["matched"] == false);
  CHECK(out["results"][2]["effective_sparsity"].get<double>() < 0.55);

  std::ifstream csv(dir + "/out.csv");
  std::string header;
  std::getline(csv, header);
  CHECK(header ==
        "policy,sparsity,effective_sparsity,accuracy,coverage,ppl,samples,hit_rate,"
        "target_sparsity");

  SECTION("the same command without --match: nominal rows, the warning, no match block") {
    const auto plain = test::run_command(base + " --json " + dir + "/plain.json");
    REQUIRE(plain.exit_code == 0);
    CHECK(contains(plain.err, "warning: tokenfilter"));
    const Json nominal = Json::parse(read_text_file(dir + "/plain.json"));
    CHECK_FALSE(nominal.contains("match"));
    CHECK(nominal["warnings"].size() == 1);
    CHECK(nominal["results"][1]["sparsity"] == 0.6);
    CHECK_FALSE(nominal["results"][1].contains("target_sparsity"));
  }
  SECTION("bad values") {
    for (const auto& [flags, parts] : std::vector<std::pair<std::string, std::vector<std::string>>>{
             {"--match exact", {"--match", "effective or none", "exact"}},
             {"--match effective --match-tolerance 0", {"--match-tolerance", "(0, 0.5]"}},
             {"--match effective --match-tolerance 0.7", {"--match-tolerance", "0.7"}},
             {"--match-tolerance 0.01", {"--match-tolerance", "only with --match effective"}}}) {
      const auto failed = test::run_command(base + " " + flags);
      INFO(flags << "\n" << failed.err);
      CHECK(failed.exit_code != 0);
      CHECK(failed.exit_code < 128);
      for (const std::string& part : parts) CHECK(contains(failed.err, part));
    }
  }
}

TEST_CASE("matching on one text: the recording's steps, prefill included", "[eval][match]") {
  const test::CpuModel loaded = test::load_on_cpu(demo_model());
  const CorefTokens marked =
      mark_answer_tokens(generate_coref_sample(load_bundled_coref_pools(), 0, 0, false),
                         loaded.model->require_tokenizer());
  const std::vector<PolicyConfig> runs = {run_of("h2o", 0.5), run_of("quest", 0.4)};
  for (const int64_t prefill : {int64_t(0), int64_t(40)}) {
    INFO("prefill " << prefill);
    const std::vector<MatchOutcome> outcomes =
        match_on_tokens(loaded.resident, marked.tokens, runs, prefill);
    std::vector<PolicyConfig> chosen;
    for (size_t i = 0; i < runs.size(); ++i) {
      CHECK(outcomes[i].matched);
      chosen.push_back(matched_config(runs[i], outcomes[i]));
    }
    ScoreOptions options;
    options.prefill = prefill;
    const std::vector<ScoreResult> scored =
        score_tokens_lockstep(loaded.resident, marked.tokens, chosen, options);
    for (size_t i = 0; i < runs.size(); ++i) {
      CHECK(effective_of(scored[i].sparsity) == outcomes[i].effective);
      CHECK(std::abs(outcomes[i].effective - runs[i].sparsity) <= 0.005);
    }
  }
}
