// The bundled demo model through kvlens-cli: its greedy continuation of "Once upon a time" is
// the one transformers' generate() produced when the model was trained (train_log.json
// "sample"), and the README's demo runs.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "engine/common/mapped_file.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

TEST_CASE("demo model: greedy continuation equals transformers' generate", "[parity][demo]") {
  const std::string dir = test::source_path("assets/models/demo");
  const auto log = nlohmann::json::parse(read_text_file(dir + "/train_log.json"));
  const std::string expected = log["sample"].get<std::string>();
  REQUIRE(expected.rfind("Once upon a time", 0) == 0);
  // transformers stopped at </s>; generate the same budget and compare the text.
  const auto result = test::run_command(test::cli_path() + " generate --model " + dir +
                                        " --prompt 'Once upon a time' --max-new 200");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  REQUIRE(result.out == expected + "\n");
}

TEST_CASE("demo model: the README's score demo reports a sane perplexity", "[parity][demo]") {
  const std::string dir = test::source_path("assets/models/demo");
  const auto result = test::run_command(test::cli_path() + " score --model " + dir +
                                        " --text-file " + dir + "/sample.txt --json");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto out = nlohmann::json::parse(result.out);
  // A byte-level model trained to 1.18 nats/byte held out: plain English text it has never seen
  // must land well below uniform (258) and near exp(1.18) = 3.3.
  CHECK(out["ppl"].get<double>() > 1.5);
  CHECK(out["ppl"].get<double>() < 5.0);
  CHECK(out["tokens"].size() == 543);  // 542 bytes plus BOS
}
