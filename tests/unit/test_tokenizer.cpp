// Tokenizer tests: every Hugging Face reference case of the Llama 2, Llama 3 and GPT-2 vocabularies
// (ids with and without special tokens, decoded text), llama.cpp's extra vectors, the pipeline
// features no shipped vocabulary exercises, and one clear kvlens::Error per kind of bad input.
#include <catch2/catch.hpp>

#include "engine/common/error.h"
#include "engine/model/tokenizer.h"
#include "tests/support/test_paths.h"
#include "tests/support/tokenizer_cases.h"
#include "tests/support/tokenizer_errors.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using kvlens::Tokenizer;
using kvlens::test::expect_tokenizer_parse_error;
using kvlens::test::ids_text;
using kvlens::test::shared_path;
using Ids = std::vector<int32_t>;

std::string tokenizer_path(const std::string& name) {
  return shared_path("data/tokenizers/" + name);
}

const Tokenizer& shared_tokenizer(const std::string& file) {
  return kvlens::test::loaded_tokenizer(tokenizer_path(file));
}

// Checks every case of cases-<name>.json: ids, ids with special tokens, decoded text.
void check_reference_cases(const std::string& name, const std::string& tokenizer_file) {
  const Tokenizer& tok = shared_tokenizer(tokenizer_file);
  const auto cases = nlohmann::json::parse(
      kvlens::read_maybe_gzipped(tokenizer_path("cases-" + name + ".json")))["cases"];
  REQUIRE(cases.size() > 50);
  size_t passed = 0;
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const Ids ids = c["ids"].get<Ids>();
    const Ids with_special = c["ids_with_special"].get<Ids>();
    const std::string decoded = c["decoded"];
    INFO(name << " case text: \"" << text << "\"");
    const Ids got = tok.encode(text, false);
    const Ids got_special = tok.encode(text, true);
    const std::string got_decoded = tok.decode(ids);
    CHECK(ids_text(got) == ids_text(ids));
    CHECK(ids_text(got_special) == ids_text(with_special));
    CHECK(got_decoded == decoded);
    if (got == ids && got_special == with_special && got_decoded == decoded) ++passed;
  }
  INFO(name << ": " << passed << " of " << cases.size() << " reference cases match");
  CHECK(passed == cases.size());
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// llama.cpp's vocab test vectors: each input is followed by "\n__ggml_vocab_test__\n"; the .out
// file has one line per input with the expected ids (no BOS), space separated.
void check_vectors(const std::string& name, const std::string& tokenizer_file) {
  const Tokenizer& tok = shared_tokenizer(tokenizer_file);
  const std::string inp = read_text(tokenizer_path("vectors-" + name + ".inp"));
  const std::string out = read_text(tokenizer_path("vectors-" + name + ".out"));
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  for (size_t from = 0, at; (at = inp.find(separator, from)) != std::string::npos;
       from = at + separator.size()) {
    inputs.push_back(inp.substr(from, at - from));
  }
  std::vector<std::string> expected;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) expected.push_back(line);
  REQUIRE(inputs.size() > 40);
  REQUIRE(expected.size() == inputs.size());
  size_t passed = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Ids want;
    std::istringstream words(expected[i]);
    for (int32_t id; words >> id;) want.push_back(id);
    INFO(name << " vector " << i << ": \"" << inputs[i] << "\"");
    const Ids got = tok.encode(inputs[i], false);
    CHECK(ids_text(got) == ids_text(want));
    if (got == want) ++passed;
  }
  INFO(name << ": " << passed << " of " << inputs.size() << " vectors match");
  CHECK(passed == inputs.size());
}

// A tiny tokenizer.json around a BPE model with the given extra top-level members.
std::string mini_tokenizer(const std::string& model, const std::string& extra = "") {
  return R"({"model": )" + model + (extra.empty() ? "" : ", " + extra) + "}";
}

const char* const kMiniBpe = R"({"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3},
  "merges": ["a b"]})";

}  // namespace

TEST_CASE("Llama 2 tokenizer matches Hugging Face on every reference case", "[tokenizer]") {
  check_reference_cases("llama2", "llama2-tokenizer.json");
}

TEST_CASE("Llama 3 tokenizer (gzipped) matches Hugging Face on every reference case",
          "[tokenizer]") {
  check_reference_cases("llama3", "llama3-tokenizer.json.gz");
}

TEST_CASE("GPT-2 tokenizer matches Hugging Face on every reference case", "[tokenizer]") {
  check_reference_cases("gpt2", "gpt2-tokenizer.json");
}

TEST_CASE("Llama 2 tokenizer matches the llama-spm vocab vectors", "[tokenizer]") {
  check_vectors("llama-spm", "llama2-tokenizer.json");
}

TEST_CASE("GPT-2 tokenizer matches the gpt-2 vocab vectors", "[tokenizer]") {
  check_vectors("gpt-2", "gpt2-tokenizer.json");
}

TEST_CASE("Tokenizer metadata of the real vocabularies", "[tokenizer]") {
  const Tokenizer& llama2 = shared_tokenizer("llama2-tokenizer.json");
  CHECK(llama2.vocab_size() == 32000);
  CHECK(llama2.bos_id() == 1);
  CHECK(llama2.token_to_id("<s>") == 1);
  CHECK(llama2.token_to_id("▁Hello") == 15043);
  CHECK_FALSE(llama2.token_to_id("no such token").has_value());
  CHECK(llama2.token_text(15043) == "Hello");
  CHECK(llama2.decode({1, 15043, 3186}, true) == "Hello world");
  CHECK(llama2.decode({1, 15043, 3186, 2}, false) == "<s> Hello world </s>");

  const Tokenizer& llama3 = shared_tokenizer("llama3-tokenizer.json.gz");
  CHECK(llama3.bos_id() == 128000);
  CHECK(llama3.vocab_size() == 128001);  // the file lists BOS only in its post-processor
  CHECK(llama3.decode({128000, 9906, 1917}, false) == "<|begin_of_text|>Hello world");
  CHECK(llama3.decode({128000, 9906, 1917}, true) == "Hello world");

  const Tokenizer& gpt2 = shared_tokenizer("gpt2-tokenizer.json");
  CHECK(gpt2.vocab_size() == 50257);
  CHECK_FALSE(gpt2.bos_id().has_value());
  CHECK(gpt2.encode("Hi<|endoftext|>", false) == Ids{17250, 50256});
  CHECK(gpt2.decode({17250, 50256}, true) == "Hi");
  CHECK(gpt2.token_text(18435) == " Hello");
  // Ids that split a multi-byte character decode to U+FFFD, never to invalid UTF-8.
  CHECK(gpt2.decode({12520}, false) == " \xEF\xBF\xBD");
}

TEST_CASE("Tokenizer encodes a large text and handles odd input", "[tokenizer]") {
  const Tokenizer& gpt2 = shared_tokenizer("gpt2-tokenizer.json");
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "The quick brown fox jumps over the lazy dog. ";
  const Ids ids = gpt2.encode(text, false);
  CHECK(gpt2.decode(ids) == text);
  // Invalid UTF-8 still encodes (byte-level covers every byte) and decodes losslessly in bytes.
  const std::string bad = "a\xFF\xC3(b";
  CHECK(gpt2.decode(gpt2.encode(bad, false)) == "a\xEF\xBF\xBD\xEF\xBF\xBD(b");
  const Tokenizer& llama2 = shared_tokenizer("llama2-tokenizer.json");
  CHECK_FALSE(llama2.encode(bad, false).empty());
  CHECK(llama2.encode("", true) == Ids{1});
}

TEST_CASE("Tokenizer pipeline features beyond the shipped vocabularies", "[tokenizer]") {
  SECTION("Metaspace pre-tokenizer and decoder, prepend_scheme first") {
    const std::string json = mini_tokenizer(
        R"({"type": "BPE", "vocab": {"▁": 0, "a": 1, "b": 2, "▁a": 3, "<s>": 4},
            "merges": [["▁", "a"]]})",
        R"("pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                             "split": true},
           "decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first"},
           "added_tokens": [{"id": 4, "content": "<s>", "special": true, "normalized": false}])");
    const Tokenizer tok = Tokenizer::parse(json, "metaspace.json");
    CHECK(tok.encode("a b", false) == Ids{3, 0, 2});
    CHECK(tok.encode("<s>a", false) == Ids{4, 1});  // only the text start gets the prefix
    CHECK(tok.decode({3, 0, 2}) == "a b");
  }
  SECTION("Metaspace always / never and no split") {
    const std::string model = R"({"type": "BPE", "vocab": {"▁": 0, "a": 1, "▁a": 2},
                                 "merges": [["▁", "a"]]})";
    const Tokenizer always = Tokenizer::parse(
        mini_tokenizer(model, R"("pre_tokenizer": {"type": "Metaspace", "add_prefix_space": true,
                                                   "split": false})"),
        "always.json");
    CHECK(always.encode("a a", false) == Ids{2, 2});
    const Tokenizer never =
        Tokenizer::parse(mini_tokenizer(model, R"("pre_tokenizer": {"type": "Metaspace",
                                                   "prepend_scheme": "never"})"),
                         "never.json");
    CHECK(never.encode("a a", false) == Ids{1, 2});
  }
  SECTION("added tokens: lstrip, rstrip, single_word, non-special") {
    const std::string json = mini_tokenizer(kMiniBpe,
                                            R"("added_tokens": [
             {"id": 10, "content": "<m>", "lstrip": true, "rstrip": true, "normalized": false,
              "special": true},
             {"id": 11, "content": "cc", "single_word": true, "normalized": false,
              "special": false}],
           "decoder": {"type": "Fuse"})");
    const Tokenizer tok = Tokenizer::parse(json, "added.json");
    // HF numbers added tokens after the 4 vocab entries, whatever ids the file lists.
    CHECK(tok.vocab_size() == 6);
    CHECK(tok.encode("ab  <m>  a", false) == Ids{2, 4, 0});
    CHECK(tok.encode("a cc a", false) == Ids{0, 5, 0});
    CHECK(tok.encode("acc", false) == Ids{0, 3, 3});  // not a single word: plain text
    CHECK(tok.decode({2, 4, 5}, true) == "abcc");
    CHECK(tok.decode({2, 4, 5}, false) == "ab<m>cc");
  }
  SECTION("unk_token with and without fuse_unk, byte_fallback") {
    const auto make = [](bool fuse) {
      return Tokenizer::parse(
          mini_tokenizer(std::string(R"({"type": "BPE", "unk_token": "<unk>", "fuse_unk": )") +
                         (fuse ? "true" : "false") +
                         R"(, "vocab": {"<unk>": 0, "a": 1}, "merges": []})"),
          "unk.json");
    };
    CHECK(make(true).encode("axya", false) == Ids{1, 0, 1});
    CHECK(make(false).encode("axya", false) == Ids{1, 0, 0, 1});
    const Tokenizer bytes = Tokenizer::parse(
        mini_tokenizer(R"({"type": "BPE", "byte_fallback": true,
                           "vocab": {"a": 0, "<0xC3>": 1, "<0xA9>": 2}, "merges": []})",
                       R"("decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"},
                                                                        {"type": "Fuse"}]})"),
        "bytes.json");
    CHECK(bytes.encode("aé", false) == Ids{0, 1, 2});
    CHECK(bytes.decode({0, 1, 2}) == "aé");
    CHECK(bytes.decode({1, 0}) ==
          "\xEF\xBF\xBD"
          "a");                               // a lone lead byte becomes U+FFFD
    CHECK(bytes.encode("b", false).empty());  // no unk token: unknown chars vanish
  }
  SECTION("Digits pre-tokenizer, ByteLevel with add_prefix_space, no decoder") {
    const Tokenizer tok = Tokenizer::parse(
        mini_tokenizer(R"({"type": "BPE", "vocab": {"1": 0, "2": 1, "12": 2, "a": 3},
                           "merges": ["1 2"]})",
                       R"("pre_tokenizer": {"type": "Digits", "individual_digits": true})"),
        "digits.json");
    CHECK(tok.encode("a12", false) == Ids{3, 0, 1});
    CHECK(tok.decode({3, 0, 1}) == "a 1 2");  // without a decoder HF joins tokens with spaces
    const Tokenizer prefix = Tokenizer::parse(
        mini_tokenizer(R"({"type": "BPE", "vocab": {"Ġ": 0, "a": 1, "Ġa": 2}, "merges": ["Ġ a"]})",
                       R"("pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": true},
                          "decoder": {"type": "ByteLevel"})"),
        "prefix.json");
    CHECK(prefix.encode("a", false) == Ids{2});
    CHECK(prefix.decode({2}) == " a");
  }
  SECTION("post-processor Sequence of ByteLevel and TemplateProcessing with a suffix") {
    const Tokenizer tok = Tokenizer::parse(
        mini_tokenizer(kMiniBpe, R"("post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel"},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                        {"Sequence": {"id": "A", "type_id": 0}},
                        {"SpecialToken": {"id": "</s>", "type_id": 0}}],
             "special_tokens": {"<s>": {"id": "<s>", "ids": [7], "tokens": ["<s>"]},
                                "</s>": {"id": "</s>", "ids": [8], "tokens": ["</s>"]}}}]})"),
        "template.json");
    CHECK(tok.encode("ab", true) == Ids{7, 2, 8});
    CHECK(tok.bos_id() == 7);
    CHECK(tok.token_to_id("</s>") == 8);
  }
}

TEST_CASE("Tokenizer rejects malformed tokenizer.json with a clear error", "[tokenizer]") {
  expect_tokenizer_parse_error("this is not json", "json", "valid JSON");
  expect_tokenizer_parse_error("[1, 2]", "(root)", "JSON object");
  expect_tokenizer_parse_error(R"({"version": "1.0"})", "model", "missing");
  expect_tokenizer_parse_error(R"({"model": {"type": "WordPiece", "vocab": {}}})", "model.type",
                               "BPE");
  expect_tokenizer_parse_error(R"({"model": {"type": "BPE", "vocab": [1, 2]}})", "model.vocab",
                               "an object");
  expect_tokenizer_parse_error(R"({"model": {"type": "BPE", "vocab": {"a": "x"}}})",
                               "model.vocab.a", "integer");
  expect_tokenizer_parse_error(R"({"model": {"type": "BPE", "vocab": {"a": -1}}})", "model.vocab.a",
                               "integer");
  expect_tokenizer_parse_error(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a z"]}})", "model.merges[0]",
      "in model.vocab");
  expect_tokenizer_parse_error(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1},
                                   "merges": [["a", "b"]]}})",
                               "model.merges[0]", "in model.vocab");  // "ab" is not in the vocab
  expect_tokenizer_parse_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]}})",
                               "model.merges[0]", "two tokens");
  expect_tokenizer_parse_error(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [3]}})",
                               "model.merges[0]", "[left, right]");
  expect_tokenizer_parse_error(
      mini_tokenizer(kMiniBpe, R"("pre_tokenizer": {"type": "Whitespace"})"), "pre_tokenizer.type",
      "supported pre_tokenizer");
  expect_tokenizer_parse_error(mini_tokenizer(kMiniBpe, R"("pre_tokenizer": {"type": "Split",
                                  "pattern": {"Regex": "\\w+"}, "behavior": "Isolated"})"),
                               "pre_tokenizer.pattern.Regex", "a supported Split regex");
  expect_tokenizer_parse_error(mini_tokenizer(kMiniBpe, R"("normalizer": {"type": "Sequence",
                                    "normalizers": [{"type": "Prepend", "prepend": "x"},
                                                    {"type": "NFKC"}]})"),
                               "normalizer.normalizers[1].type", "supported normalizer");
  expect_tokenizer_parse_error(mini_tokenizer(kMiniBpe, R"("decoder": {"type": "WordPiece"})"),
                               "decoder.type", "supported decoder");
  expect_tokenizer_parse_error(mini_tokenizer(kMiniBpe, R"("decoder": {"type": "Sequence",
                                    "decoders": [{"type": "Strip", "content": "ab"}]})"),
                               "decoder.decoders[0].content", "single character");
  expect_tokenizer_parse_error(
      mini_tokenizer(kMiniBpe, R"("post_processor": {"type": "BertProcessing"})"),
      "post_processor.type", "supported post_processor");
  expect_tokenizer_parse_error(
      mini_tokenizer(kMiniBpe, R"("post_processor": {"type": "TemplateProcessing",
                     "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}],
                     "special_tokens": {}})"),
      "post_processor.single[0].SpecialToken.id", "special_tokens");
  expect_tokenizer_parse_error(mini_tokenizer(kMiniBpe, R"("added_tokens": [{"id": 3}])"),
                               "added_tokens[0].content", "missing");
  expect_tokenizer_parse_error(mini_tokenizer(kMiniBpe, R"("added_tokens": [{"id": 99999999999,
                                    "content": "x"}])"),
                               "added_tokens[0].id", "integer");
}

TEST_CASE("Tokenizer reports unreadable and corrupt files", "[tokenizer]") {
  const std::string dir = kvlens::test::make_temp_dir("tokenizer");
  SECTION("missing file") {
    try {
      Tokenizer::load(dir + "/nope.json");
      FAIL("no error");
    } catch (const kvlens::Error& e) {
      CHECK(e.file() == dir + "/nope.json");
      CHECK(e.field() == "file");
    }
  }
  SECTION("a .gz file that is not gzip, and a truncated one") {
    const std::string plain = dir + "/plain.json.gz";
    std::ofstream(plain, std::ios::binary) << R"({"model": {}})";
    try {
      kvlens::read_maybe_gzipped(plain);
      FAIL("no error");
    } catch (const kvlens::Error& e) {
      CHECK(e.file() == plain);
      CHECK(e.field() == "gzip");
      CHECK_THAT(e.expected(), Catch::Matchers::Contains("gzip"));
    }
    const std::string whole = read_text(tokenizer_path("llama3-tokenizer.json.gz"));
    const std::string cut = dir + "/cut.json.gz";
    std::ofstream(cut, std::ios::binary) << whole.substr(0, whole.size() / 2);
    CHECK_THROWS_AS(Tokenizer::load(cut), kvlens::Error);
  }
}

TEST_CASE("Tokenizer decode rejects ids out of range", "[tokenizer]") {
  const Tokenizer tok = Tokenizer::parse(mini_tokenizer(kMiniBpe), "mini.json");
  for (const int32_t id : {-1, 4, 1 << 30}) {
    try {
      tok.decode({0, id});
      FAIL("no error for id " << id);
    } catch (const kvlens::Error& e) {
      CHECK(e.file() == "mini.json");
      CHECK(e.field() == "ids[1]");
      CHECK(e.found() == std::to_string(id));
      CHECK_THAT(e.expected(), Catch::Matchers::Contains("token id"));
    }
  }
  // A gap in the id space is not a token either.
  const Tokenizer gap = Tokenizer::parse(
      mini_tokenizer(R"({"type": "BPE", "vocab": {"a": 0, "b": 5}, "merges": []})"), "gap.json");
  CHECK(gap.vocab_size() == 6);
  CHECK_THROWS_AS(gap.decode({3}), kvlens::Error);
  // Labels name ids the vocabulary lacks instead of failing (a model may predict them).
  CHECK(gap.token_text(7) == "<id 7>");
  CHECK(gap.token_text(3) == "<id 3>");
  CHECK(gap.token_text(-1) == "<id -1>");
  CHECK(gap.token_text(5) == "b");
}
