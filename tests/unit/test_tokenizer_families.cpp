// Tokenizer tests for the Qwen2/2.5/3 and Phi-3/Phi-4 families: every Hugging Face reference case
// under tests/fixtures/tokenizers (ids, decoded text, decodes of chosen id sequences, made by
// tools/make_tokenizer_fixtures.py), the features behind them one by one, and their error paths.
#include <catch2/catch.hpp>

#include "engine/common/error.h"
#include "engine/model/tokenizer.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"
#include "tests/support/tokenizer_cases.h"
#include "tests/support/tokenizer_errors.h"

#include <nlohmann/json.hpp>

#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using kvlens::Tokenizer;
using kvlens::test::expect_tokenizer_parse_error;
using kvlens::test::ids_text;
using Ids = std::vector<int32_t>;

std::string fixture_path(const std::string& name) {
  return kvlens::test::source_path("tests/fixtures/tokenizers/" + name);
}

std::string tokenizer_file(const std::string& family) {
  return fixture_path(family + "-tokenizer.json.gz");
}

const Tokenizer& family_tokenizer(const std::string& family) {
  return kvlens::test::loaded_tokenizer(tokenizer_file(family));
}

// Every case and decode of cases-<family>.json: encode with and without special tokens, decode
// with and without skip_special_tokens.
void check_family(const std::string& family) {
  const Tokenizer& tok = family_tokenizer(family);
  const auto doc =
      nlohmann::json::parse(kvlens::read_maybe_gzipped(fixture_path("cases-" + family + ".json")));
  CHECK(tok.vocab_size() == doc["vocab_size"].get<int64_t>());
  const auto& cases = doc["cases"];
  const auto& decodes = doc["decodes"];
  REQUIRE(cases.size() > 80);
  REQUIRE(decodes.size() > 60);
  size_t passed = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const Ids ids = c["ids"].get<Ids>();
    const Ids with_special =
        c.contains("ids_with_special") ? c["ids_with_special"].get<Ids>() : ids;
    INFO(family << " case text: " << nlohmann::json(text).dump());
    const Ids got = tok.encode(text, false);
    const Ids got_special = tok.encode(text, true);
    const std::string decoded = tok.decode(ids, false);
    const std::string decoded_skip = tok.decode(ids, true);
    CHECK(ids_text(got) == ids_text(ids));
    CHECK(ids_text(got_special) == ids_text(with_special));
    CHECK(decoded == c["decoded"].get<std::string>());
    CHECK(decoded_skip == c["decoded_skip_special"].get<std::string>());
    if (got == ids && got_special == with_special && decoded == c["decoded"].get<std::string>() &&
        decoded_skip == c["decoded_skip_special"].get<std::string>()) {
      ++passed;
    }
  }
  for (const auto& d : decodes) {
    const Ids ids = d["ids"].get<Ids>();
    INFO(family << " decode of ids: " << ids_text(ids));
    const std::string text = tok.decode(ids, false);
    const std::string text_skip = tok.decode(ids, true);
    CHECK(text == d["text"].get<std::string>());
    CHECK(text_skip == d["text_skip_special"].get<std::string>());
    if (text == d["text"].get<std::string>() &&
        text_skip == d["text_skip_special"].get<std::string>())
      ++passed;
  }
  INFO(family << ": " << passed << " of " << cases.size() + decodes.size() << " references match");
  CHECK(passed == cases.size() + decodes.size());
}

const char* const kMiniBpe = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3},
  "merges": ["a b"]})";

std::string mini_tokenizer(const std::string& extra) {
  return std::string(R"({"model": )") + kMiniBpe + ", " + extra + "}";
}

std::string split_pre_tokenizer(const std::string& regex, const std::string& behavior,
                                bool invert) {
  return R"("pre_tokenizer": {"type": "Split", "pattern": {"Regex": )" +
         nlohmann::json(regex).dump() + R"(}, "behavior": ")" + behavior + R"(", "invert": )" +
         (invert ? "true" : "false") + "}";
}

constexpr const char* kO200kRegex =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

TEST_CASE("Qwen2.5 tokenizer matches Hugging Face on every reference case", "[tokenizer]") {
  check_family("qwen2.5");
}

TEST_CASE("Phi-3-mini tokenizer matches Hugging Face on every reference case", "[tokenizer]") {
  check_family("phi3-mini");
}

TEST_CASE("Phi-4-style tokenizer (cl100k, constructed) matches Hugging Face on every case",
          "[tokenizer]") {
  check_family("phi4-style");
}

TEST_CASE("Phi-4-mini-style tokenizer (o200k, constructed) matches Hugging Face on every case",
          "[tokenizer]") {
  check_family("phi4-mini-style");
}

TEST_CASE("Qwen and Phi tokenizer features, one at a time", "[tokenizer]") {
  SECTION("Qwen2.5: NFC before the split, chat tokens, no BOS") {
    const Tokenizer& qwen = family_tokenizer("qwen2.5");
    CHECK(qwen.vocab_size() == 151665);
    CHECK_FALSE(qwen.bos_id().has_value());
    CHECK(qwen.token_to_id("<|im_start|>") == 151644);
    CHECK(qwen.token_to_id("<|file_sep|>") == 151664);
    // "e" + COMBINING ACUTE encodes as the precomposed "é"; so does the Angstrom sign as "Å".
    CHECK(qwen.encode("Cafe\xCC\x81", false) == qwen.encode("Caf\xC3\xA9", false));
    CHECK(qwen.encode("\xE2\x84\xAB", false) == qwen.encode("\xC3\x85", false));
    // Ill-formed bytes pass NFC untouched and the text around them is still normalized.
    CHECK(qwen.encode("\xFF"
                      "e\xCC\x81",
                      false) == qwen.encode("\xFF\xC3\xA9", false));
    // Digits split one by one (\p{N}, not \p{N}{1,3}).
    CHECK(qwen.encode("2024", false).size() == 4);
    const Ids chat = qwen.encode("<|im_start|>user\nHi<|im_end|>", true);
    REQUIRE(chat.size() >= 3);
    CHECK(chat.front() == 151644);
    CHECK(chat.back() == 151645);
    CHECK(qwen.decode(chat, true) == "user\nHi");
  }
  SECTION("Phi-3: SentencePiece-style BPE, byte fallback, rstrip added tokens") {
    const Tokenizer& phi3 = family_tokenizer("phi3-mini");
    CHECK(phi3.vocab_size() == 32011);
    CHECK(phi3.token_to_id("<|end|>") == 32007);
    CHECK(phi3.token_to_id("<|assistant|>") == 32001);
    // <|end|> has rstrip: the newline after it is absorbed, so both texts encode alike.
    CHECK(phi3.encode("<|end|>\n", false) == Ids{32007});
    // A character outside the vocabulary falls back to its UTF-8 bytes (<0xF0> = id 243 ...).
    const Ids llama = phi3.encode("\xF0\x9F\xA6\x99", false);
    REQUIRE(llama.size() >= 4);
    CHECK(llama[llama.size() - 4] == 0xF0 + 3);
    CHECK(phi3.decode(llama) == "\xF0\x9F\xA6\x99");
    // A lone byte token decodes to U+FFFD, as HF's ByteFallback does.
    CHECK(phi3.decode({0xF0 + 3}) == "\xEF\xBF\xBD");
  }
  SECTION("Split with Removed + invert keeps the matches, like Isolated") {
    const std::string llama3 =
        R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
    const Tokenizer isolated =
        Tokenizer::parse(mini_tokenizer(split_pre_tokenizer(llama3, "Isolated", false)), "i.json");
    const Tokenizer removed =
        Tokenizer::parse(mini_tokenizer(split_pre_tokenizer(llama3, "Removed", true)), "r.json");
    CHECK(removed.encode("ab ab\ncab", false) == isolated.encode("ab ab\ncab", false));
  }
  SECTION("o200k split: case runs, contraction suffixes, slashes after punctuation") {
    // Word-level vocab: every piece the pattern cuts is one token, so ids show the split.
    const std::string json = R"({"model": {"type": "BPE", "ignore_merges": true, "vocab": {
        "Hello": 0, "World": 1, "HTTPServer": 2, "i": 3, "Phone": 4, "DON'T": 5, " stop": 6,
        "!\n/": 7, "x": 8, "123": 9, "4": 10, "  ": 11, " y": 12}, "merges": []}, )" +
                             split_pre_tokenizer(kO200kRegex, "Isolated", false) + "}";
    const Tokenizer tok = Tokenizer::parse(json, "o200k.json");
    CHECK(tok.encode("HelloWorld", false) == Ids{0, 1});
    CHECK(tok.encode("HTTPServer", false) == Ids{2});
    CHECK(tok.encode("iPhone", false) == Ids{3, 4});
    CHECK(tok.encode("DON'T stop", false) == Ids{5, 6});
    CHECK(tok.encode("!\n/x", false) == Ids{7, 8});
    CHECK(tok.encode("1234", false) == Ids{9, 10});
    CHECK(tok.encode("   y", false) == Ids{11, 12});
  }
  SECTION("added tokens take the ids HF gives them, not the ids the file lists") {
    // HF numbers a token that is not in the model vocab after the vocab (4 entries here) or
    // after the largest added id, in file order; a repeated content keeps its id and takes the
    // later flags. Expected values are what tokenizers 0.23.1 gives for these files.
    const Tokenizer tok = Tokenizer::parse(mini_tokenizer(R"("added_tokens": [
        {"id": 10, "content": "<m>", "special": true, "normalized": false, "lstrip": true,
         "rstrip": true},
        {"id": 11, "content": "cc", "special": false, "normalized": false, "single_word": true}],
        "decoder": {"type": "Fuse"})"),
                                           "renumbered.json");
    CHECK(tok.vocab_size() == 6);
    CHECK(tok.token_to_id("<m>") == 4);
    CHECK(tok.encode("ab  <m>  a", false) == Ids{2, 4, 0});
    CHECK(tok.encode("a cc a", false) == Ids{0, 5, 0});
    CHECK(tok.decode({2, 4, 5}, false) == "ab<m>cc");
    const Tokenizer repeated = Tokenizer::parse(
        R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
            "added_tokens": [{"id": 7, "content": "<x>", "special": true, "normalized": false},
                             {"id": 8, "content": "<x>", "special": false, "normalized": false,
                              "rstrip": true},
                             {"id": 9, "content": "a", "special": true, "normalized": false},
                             {"id": 1, "content": "<y>", "special": false, "normalized": false}],
            "decoder": {"type": "Fuse"}})",
        "repeated.json");
    CHECK(repeated.vocab_size() == 4);
    CHECK(repeated.encode("<x>  a<y>b", false) == Ids{2, 0, 3, 1});
    CHECK(repeated.decode({2, 0, 3, 1}, true) == "<y>b");
  }
}

TEST_CASE("Qwen and Phi tokenizer options kvlens refuses get a clear error", "[tokenizer]") {
  expect_tokenizer_parse_error(mini_tokenizer(R"("normalizer": {"type": "NFKC"})"),
                               "normalizer.type", "Sequence, Prepend, Replace, NFC");
  expect_tokenizer_parse_error(
      mini_tokenizer(split_pre_tokenizer(kO200kRegex, "MergedWithPrevious", false)),
      "pre_tokenizer.behavior", "\"Removed\" with invert true");
  expect_tokenizer_parse_error(mini_tokenizer(split_pre_tokenizer(kO200kRegex, "Removed", false)),
                               "pre_tokenizer.behavior", "invert false");
  expect_tokenizer_parse_error(mini_tokenizer(split_pre_tokenizer(kO200kRegex, "Isolated", true)),
                               "pre_tokenizer.behavior", "\"Isolated\" with invert false");
  // One character off the o200k pattern (no '/' after punctuation) is a different regex.
  std::string almost = kO200kRegex;
  almost.erase(almost.find("/]*"), 1);
  expect_tokenizer_parse_error(mini_tokenizer(split_pre_tokenizer(almost, "Isolated", false)),
                               "pre_tokenizer.pattern.Regex", "o200k");
}

TEST_CASE("kvlens-cli tokenize reads the gzipped Qwen and Phi tokenizers", "[cli][tokenizer]") {
  for (const char* family : {"qwen2.5", "phi3-mini"}) {
    INFO("family " << family);
    const auto doc = nlohmann::json::parse(
        kvlens::read_maybe_gzipped(fixture_path(std::string("cases-") + family + ".json")));
    // The chat-template edge case: added tokens, newlines and text in one line.
    const nlohmann::json* sample = nullptr;
    for (const auto& c : doc["cases"]) {
      if (c["text"].get<std::string>().rfind("<|im_start|>system", 0) == 0) sample = &c;
    }
    REQUIRE(sample);
    const std::string file = kvlens::test::make_temp_dir("tok") + "/text.txt";
    kvlens::test::write_file(file, (*sample)["text"].get<std::string>());
    const auto result =
        kvlens::test::run_command(kvlens::test::cli_path() + " tokenize --tokenizer " +
                                  tokenizer_file(family) + " --file " + file);
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    std::istringstream in(result.out);
    Ids ids;
    for (int32_t id; in >> id;) ids.push_back(id);
    CHECK(ids_text(ids) == ids_text((*sample)["ids"].get<Ids>()));
  }
}
