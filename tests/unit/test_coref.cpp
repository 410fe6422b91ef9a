// Co-reference benchmark: pools (bundled file integrity, each schema error), the generator
// (determinism, template, hard variant) and answer-token marking on the real GPT-2 tokenizer.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "engine/common/bundled_assets.h"
#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/eval/coref_benchmark.h"
#include "engine/eval/coref_pools.h"
#include "engine/model/tokenizer.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using Json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string bundled_path() {
  return test::source_path("assets/benchmarks/coref/pools.json");
}

const CorefPools& bundled() {
  static const CorefPools pools = load_coref_pools(bundled_path());
  return pools;
}

const Tokenizer& gpt2() {
  static const Tokenizer tokenizer =
      Tokenizer::load(test::shared_path("data/tokenizers/gpt2-tokenizer.json"));
  return tokenizer;
}

Json bundled_json() {
  return Json::parse(read_text_file(bundled_path()));
}

std::string strip_leading_space(const std::string& text) {
  return !text.empty() && text[0] == ' ' ? text.substr(1) : text;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("bundled pools load, are large enough and pass integrity with GPT-2", "[coref]") {
  const CorefPools& pools = bundled();
  CHECK(pools.location_names.size() >= 100);
  CHECK(pools.intros.size() >= 100);
  CHECK(pools.philosophy_statements.size() >= 100);
  CHECK(pools.food_descriptions.size() >= 100);
  CHECK(pools.math_problems.size() >= 100);
  REQUIRE_NOTHROW(validate_pool_integrity(pools, &gpt2()));
  for (const std::string& name : pools.location_names) {
    INFO(name);
    CHECK(gpt2().encode(" " + name, false).size() >= 2);
  }
  for (const CorefIntro& intro : pools.intros) {
    INFO(intro.tieback_question);
    const std::vector<std::string> lead = coref_content_words(intro.location_intro);
    bool shared = false;
    for (const std::string& word : coref_content_words(intro.tieback_question)) {
      shared = shared || std::find(lead.begin(), lead.end(), word) != lead.end();
    }
    CHECK(shared);
  }
  // The math pool's equations are right (tools/make_coref_pools.py checks this too).
  const std::regex equation(R"((\d+) (\+|-|×|÷) (\d+) = (\d+))");
  for (const std::string& problem : pools.math_problems) {
    std::smatch m;
    INFO(problem);
    REQUIRE(std::regex_search(problem, m, equation));
    const long a = std::stol(m[1]), b = std::stol(m[3]), c = std::stol(m[4]);
    const std::string op = m[2];
    if (op == "+") CHECK(a + b == c);
    if (op == "-") CHECK(a - b == c);
    if (op == "×") CHECK(a * b == c);
    if (op == "÷") CHECK((a % b == 0 && a / b == c));
  }
}

TEST_CASE("the bundled pools are found from the executable", "[coref]") {
  CHECK(load_bundled_coref_pools().location_names == bundled().location_names);
}

TEST_CASE("bundled assets: $KVLENS_ASSETS_DIR first, then above the executable", "[coref]") {
  // The demo model the app opens is found like the pools (the test binary sits in a build tree:
  // inside the source tree, found above the executable, or anywhere else, through the build
  // tree's fallback on the source tree's assets/).
  CHECK(fs::equivalent(bundled_asset_path("models/demo/config.json", "demo"),
                       test::source_path("assets/models/demo/config.json")));
  const std::string dir = test::make_temp_dir("assets");
  fs::create_directories(dir + "/models/demo");
  std::ofstream(dir + "/models/demo/config.json") << "{}";
  ::setenv("KVLENS_ASSETS_DIR", dir.c_str(), 1);
  CHECK(bundled_asset_path("models/demo/config.json", "demo") == dir + "/models/demo/config.json");
  const std::string missing =
      test::error_message([] { bundled_asset_path("models/none/config.json", "a model"); });
  ::unsetenv("KVLENS_ASSETS_DIR");
  CHECK(contains(missing, "assets/models/none/config.json: (a model): expected the file under"));
  CHECK(contains(missing, dir + "/models/none/config.json"));  // where it looked, first
}

TEST_CASE("content words skip short and stop words", "[coref]") {
  CHECK(coref_content_words("The town with the red Lighthouse is called") ==
        std::vector<std::string>{"town", "lighthouse"});
}

TEST_CASE("integrity rejects one-token names and unrelated tie-backs", "[coref]") {
  CorefPools pools = bundled();
  pools.location_names.push_back("the");
  CHECK(contains(test::error_message([&] { validate_pool_integrity(pools, &gpt2()); }),
                 "location_names[" + std::to_string(pools.location_names.size() - 1) + "]"));
  REQUIRE_NOTHROW(validate_pool_integrity(pools, nullptr));  // token count needs a tokenizer
  pools = bundled();
  pools.intros[3].tieback_question = "The spot asked about is named";
  const std::string message = test::error_message([&] { validate_pool_integrity(pools, nullptr); });
  CHECK(contains(message, "loc_intro_tieback_list[3].tieback_question"));
  CHECK(contains(message, "content word"));
}

TEST_CASE("generated samples are deterministic per seed and index", "[coref]") {
  for (const bool hard : {false, true}) {
    const CorefSample a = generate_coref_sample(bundled(), 7, 3, hard);
    const CorefSample b = generate_coref_sample(bundled(), 7, 3, hard);
    CHECK(a.text == b.text);
    CHECK(generate_coref_sample(bundled(), 7, 4, hard).text != a.text);
    CHECK(generate_coref_sample(bundled(), 8, 3, hard).text != a.text);
  }
  std::set<std::string> texts;
  for (int64_t i = 0; i < 200; ++i)
    texts.insert(generate_coref_sample(bundled(), 0, i, false).text);
  CHECK(texts.size() == 200);
  CHECK_THROWS_AS(generate_coref_sample(bundled(), 0, -1, false), Error);
}

TEST_CASE("the generator's draws are pinned", "[coref]") {
  // A change in the PRNG or the draw order would silently change every benchmark number, on one
  // platform or all; small synthetic pools pin it independently of the bundled text.
  CorefPools pools;
  pools.source = "pinned";
  for (int i = 0; i < 10; ++i) {
    const std::string n = std::to_string(i);
    pools.location_names.push_back("N" + n);
    pools.intros.push_back({"L" + n + " The place is:", "Q" + n});
    pools.philosophy_statements.push_back("P" + n + ".");
    pools.food_descriptions.push_back("F" + n + ".");
    pools.math_problems.push_back("M" + n + ".");
  }
  CHECK(generate_coref_sample(pools, 42, 7, false).text ==
        "L5 The place is: N4. P9. F7. M8. Q5: N4");
  CHECK(generate_coref_sample(pools, 42, 7, true).text ==
        "L7 The place is: N9. F1. L8 The place is: N7. M6. F5. Q8: N7");
}

TEST_CASE("a sample follows the template and ends with its answer", "[coref]") {
  for (int64_t i = 0; i < 50; ++i) {
    const CorefSample s = generate_coref_sample(bundled(), 1, i, false);
    INFO(s.text);
    REQUIRE(s.locations.size() == 1);
    CHECK(s.answer == s.locations[0]);
    CHECK(contains(s.text, "The place is: " + s.answer + ". "));
    CHECK(s.answer_char_end == static_cast<int64_t>(s.text.size()));
    CHECK(s.text.substr(s.answer_char_begin) == s.answer);
    CHECK(s.text.substr(s.answer_char_begin - 2, 2) == ": ");
    // The question is the tie-back of the lead that was used.
    bool matched = false;
    for (const CorefIntro& intro : bundled().intros) {
      matched = matched || (s.text.rfind(intro.location_intro, 0) == 0 &&
                            contains(s.text, ". " + intro.tieback_question + ": " + s.answer));
    }
    CHECK(matched);
  }
}

TEST_CASE("the hard variant introduces 2-3 distinct locations and asks about one", "[coref]") {
  std::set<size_t> counts;
  for (int64_t i = 0; i < 100; ++i) {
    const CorefSample s = generate_coref_sample(bundled(), 2, i, true);
    INFO(s.text);
    REQUIRE(s.locations.size() >= 2);
    REQUIRE(s.locations.size() <= 3);
    counts.insert(s.locations.size());
    CHECK(std::set<std::string>(s.locations.begin(), s.locations.end()).size() ==
          s.locations.size());
    for (const std::string& name : s.locations) {
      CHECK(contains(s.text, "The place is: " + name + ". "));
    }
    CHECK(std::find(s.locations.begin(), s.locations.end(), s.answer) != s.locations.end());
    CHECK(s.text.substr(s.answer_char_begin) == s.answer);
    CHECK(s.answer_char_end == static_cast<int64_t>(s.text.size()));
  }
  CHECK(counts == std::set<size_t>{2, 3});
}

void check_answer_tokens(const Tokenizer& tokenizer) {
  for (const bool hard : {false, true}) {
    for (int64_t i = 0; i < 40; ++i) {
      const CorefSample s = generate_coref_sample(bundled(), 5, i, hard);
      const CorefTokens t = mark_answer_tokens(s, tokenizer);
      INFO(s.text);
      CHECK(t.canonical);
      CHECK(t.tokens == tokenizer.encode(s.text, true));
      CHECK(t.answer_token_end == static_cast<int64_t>(t.tokens.size()));
      CHECK(t.answer_token_count() >= 2);
      const std::vector<int32_t> answer(t.tokens.begin() + t.answer_token_begin,
                                        t.tokens.begin() + t.answer_token_end);
      CHECK(strip_leading_space(tokenizer.decode(answer, true)) == s.answer);
      // The scored positions are those whose next token is an answer token.
      CHECK(t.first_scored_position() == t.answer_token_begin - 1);
      CHECK(t.scored_position_end() - t.first_scored_position() == t.answer_token_count());
    }
  }
}

TEST_CASE("answer tokens decode to the answer under GPT-2", "[coref]") {
  check_answer_tokens(gpt2());
}

TEST_CASE("answer tokens decode to the answer under a SentencePiece tokenizer", "[coref]") {
  // Llama 2: BOS is prepended and the space before the answer becomes part of its first piece.
  const Tokenizer llama2 =
      Tokenizer::load(test::shared_path("data/tokenizers/llama2-tokenizer.json"));
  check_answer_tokens(llama2);
  const CorefTokens t = mark_answer_tokens(generate_coref_sample(bundled(), 0, 0, false), llama2);
  CHECK(t.tokens.front() == llama2.bos_id());
}

TEST_CASE("pool schema errors name the file, key, index and expectation", "[coref]") {
  struct Case {
    std::string what;
    std::function<void(Json&)> edit;
    std::vector<std::string> parts;
  };
  const std::vector<Case> cases = {
      {"missing key", [](Json& j) { j.erase("math_problems"); }, {"math_problems", "missing"}},
      {"wrong type",
       [](Json& j) { j["food_descriptions"] = "soup"; },
       {"food_descriptions", "a list"}},
      {"empty list",
       [](Json& j) { j["philosophy_statements"] = Json::array(); },
       {"philosophy_statements", "non-empty"}},
      {"entry type",
       [](Json& j) { j["location_names"][4] = 12; },
       {"location_names[4]", "a string", "12"}},
      {"intro shape",
       [](Json& j) { j["loc_intro_tieback_list"][2] = "x"; },
       {"loc_intro_tieback_list[2]", "an object"}},
      {"intro key",
       [](Json& j) { j["loc_intro_tieback_list"][5].erase("tieback_question"); },
       {"loc_intro_tieback_list[5].tieback_question", "missing"}},
      {"intro ending",
       [](Json& j) { j["loc_intro_tieback_list"][1]["location_intro"] = "A town. The place:"; },
       {"loc_intro_tieback_list[1].location_intro", "The place is:"}},
      {"not an object", [](Json& j) { j = Json::array(); }, {"a JSON object"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    Json j = bundled_json();
    c.edit(j);
    const std::string message =
        test::error_message([&] { parse_coref_pools(j.dump(), "bad-pools.json"); });
    INFO(message);
    CHECK(message.rfind("bad-pools.json: ", 0) == 0);
    for (const std::string& part : c.parts) CHECK(contains(message, part));
  }
  CHECK(contains(test::error_message([] { parse_coref_pools("{", "broken.json"); }), "valid JSON"));
}

TEST_CASE("coref-samples writes JSON lines with the answer's token span", "[coref]") {
  const std::string dir = test::make_temp_dir("coref");
  const std::string out = dir + "/samples.jsonl";
  const auto result =
      test::run_command(test::cli_path() + " coref-samples --count 6 --seed 3 --first-index 10 " +
                        "--hard --tokenizer " +
                        test::shared_path("data/tokenizers/gpt2-tokenizer.json") + " --out " + out);
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  std::ifstream in(out);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    const Json j = Json::parse(line);
    const CorefSample s = generate_coref_sample(bundled(), 3, 10 + n, true);
    CHECK(j["index"] == 10 + n);
    CHECK(j["seed"] == 3);
    CHECK(j["hard"] == true);
    CHECK(j["text"] == s.text);
    CHECK(j["answer"] == s.answer);
    CHECK(j["answer_char_begin"] == s.answer_char_begin);
    CHECK(j["answer_char_end"] == s.answer_char_end);
    const CorefTokens t = mark_answer_tokens(s, gpt2());
    CHECK(j["tokens"].get<std::vector<int32_t>>() == t.tokens);
    CHECK(j["answer_token_begin"] == t.answer_token_begin);
    CHECK(j["answer_token_end"] == t.answer_token_end);
    ++n;
  }
  CHECK(n == 6);

  // Without --tokenizer there are no token fields.
  const std::string plain = dir + "/plain.jsonl";
  REQUIRE(
      test::run_command(test::cli_path() + " coref-samples --count 2 --out " + plain).exit_code ==
      0);
  std::ifstream plain_in(plain);
  REQUIRE(std::getline(plain_in, line));
  CHECK_FALSE(Json::parse(line).contains("tokens"));
}

TEST_CASE("coref-samples reports a bad --coref-pools file and writes nothing", "[coref]") {
  const std::string dir = test::make_temp_dir("coref-bad");
  Json j = bundled_json();
  j["loc_intro_tieback_list"][7]["location_intro"] = "A quiet town by the sea.";
  const std::string pools = dir + "/pools.json";
  std::ofstream(pools) << j.dump();
  const std::string out = dir + "/samples.jsonl";
  const auto result = test::run_command(test::cli_path() + " coref-samples --coref-pools " + pools +
                                        " --out " + out);
  INFO(result.err);
  CHECK(result.exit_code != 0);
  CHECK(result.exit_code < 128);
  CHECK(contains(result.err, "kvlens-cli: error: " + pools));
  CHECK(contains(result.err, "loc_intro_tieback_list[7].location_intro"));
  CHECK(contains(result.err, "The place is:"));
  CHECK_FALSE(std::ifstream(out).good());
}

TEST_CASE("published pools that repeat entries load, are listed once and run", "[coref]") {
  // The TokenButler repository's pools repeat three location names and three math problems.
  Json j = bundled_json();
  j["location_names"][9] = j["location_names"][0];
  j["math_problems"][7] = j["math_problems"][2];
  const CorefPools pools = parse_coref_pools(j.dump(), "published-pools.json");
  CHECK(pools.location_names.size() == j["location_names"].size());  // kept as they are
  REQUIRE(pools.repeated.size() == 2);
  CHECK(contains(pools.repeated[0], "location_names[9]"));
  CHECK(contains(pools.repeated[0], "(as [0])"));
  CHECK(contains(pools.repeated[1], "math_problems[7]"));
  const std::string warning = repeated_entries_warning(pools);
  CHECK(contains(warning, "published-pools.json repeats 2 entries (kept as they are)"));
  CHECK(contains(warning, "location_names[9]"));
  // Strict for the bundled pools (tools/make_coref_pools.py keeps them free of repeats), lenient
  // for a published file.
  CHECK(contains(test::error_message([&] { validate_pool_integrity(pools, nullptr); }),
                 "location_names[9]"));
  REQUIRE_NOTHROW(validate_pool_integrity(pools, nullptr, true));
  REQUIRE_NOTHROW(generate_coref_sample(pools, 0, 3, true));
  CHECK(repeated_entries_warning(load_coref_pools(bundled_path())).empty());

  // Through kvlens-cli: one warning naming the repeats, and results.
  const std::string dir = test::make_temp_dir("published_pools");
  test::write_file(dir + "/pools.json", j.dump());
  const test::CommandResult result =
      test::run_command(test::cli_path() + " coref-samples --count 3 --coref-pools " + dir +
                        "/pools.json --out " + dir + "/samples.jsonl");
  INFO(result.err);
  CHECK(result.exit_code == 0);
  CHECK(contains(result.err, "kvlens: warning: " + dir + "/pools.json repeats 2 entries"));
  size_t warnings = 0;
  for (size_t at = result.err.find("warning:"); at != std::string::npos;
       at = result.err.find("warning:", at + 1))
    ++warnings;
  CHECK(warnings == 1);
}
