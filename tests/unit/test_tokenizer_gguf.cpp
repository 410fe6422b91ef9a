// GGUF tokenizer tests: the ids llama.cpp's llama-tokenize gives (tests/fixtures/gguf_tokenizer,
// made by tools/gguf_reference_ids.sh) for the texts of ../shared/data with SmolLM2-135M's
// byte-level vocabulary and a SentencePiece-style vocabulary built from the Llama 2 tokenizer.json,
// hand-worked cases on small vocabularies, and every error path of tokenizer_from_gguf.
#include <catch2/catch.hpp>

#include "engine/common/error.h"
#include "engine/model/tokenizer.h"
#include "engine/model/tokenizer_gguf.h"
#include "tests/support/test_paths.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

using kvlens::GgufTokenizerData;
using kvlens::Tokenizer;
using kvlens::tokenizer_from_gguf;
using Ids = std::vector<int32_t>;
using Json = nlohmann::json;

std::string fixture_path(const std::string& name) {
  return kvlens::test::source_path("tests/fixtures/gguf_tokenizer/" + name);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The tokenizer.* metadata as gguf-py reads it (key -> value) into the reader-independent struct,
// as the GGUF reader's adapter fills it.
GgufTokenizerData data_from_metadata(const Json& meta) {
  GgufTokenizerData d;
  auto str = [&](const char* key) {
    return meta.contains(key) ? meta[key].get<std::string>() : "";
  };
  auto id = [&](const char* key) { return meta.contains(key) ? meta[key].get<int32_t>() : -1; };
  auto flag = [&](const char* key) -> std::optional<bool> {
    if (!meta.contains(key)) return std::nullopt;
    return meta[key].get<bool>();
  };
  d.model = str("tokenizer.ggml.model");
  d.pre = str("tokenizer.ggml.pre");
  d.general_name = str("general.name");
  if (meta.contains("tokenizer.ggml.tokens"))
    d.tokens = meta["tokenizer.ggml.tokens"].get<std::vector<std::string>>();
  if (meta.contains("tokenizer.ggml.scores"))
    d.scores = meta["tokenizer.ggml.scores"].get<std::vector<float>>();
  if (meta.contains("tokenizer.ggml.token_type"))
    d.token_types = meta["tokenizer.ggml.token_type"].get<std::vector<int32_t>>();
  if (meta.contains("tokenizer.ggml.merges"))
    d.merges = meta["tokenizer.ggml.merges"].get<std::vector<std::string>>();
  d.bos = id("tokenizer.ggml.bos_token_id");
  d.eos = id("tokenizer.ggml.eos_token_id");
  d.unk = id("tokenizer.ggml.unknown_token_id");
  d.pad = id("tokenizer.ggml.padding_token_id");
  d.add_bos = flag("tokenizer.ggml.add_bos_token");
  d.add_eos = flag("tokenizer.ggml.add_eos_token");
  d.add_space_prefix = flag("tokenizer.ggml.add_space_prefix");
  return d;
}

const GgufTokenizerData& smollm2_data() {
  static const GgufTokenizerData data = data_from_metadata(
      Json::parse(kvlens::read_maybe_gzipped(fixture_path("smollm2-135m-tokenizer.json.gz"))));
  return data;
}

const Tokenizer& smollm2() {
  static const std::unique_ptr<Tokenizer> tokenizer =
      tokenizer_from_gguf(smollm2_data(), "SmolLM2-135M-Instruct.Q4_1.gguf");
  return *tokenizer;
}

// The SentencePiece-style vocabulary tools/gguf_reference_ids.py writes into a GGUF for
// llama.cpp: the Llama 2 tokenizer.json's tokens by id, scores -id, types by token text.
GgufTokenizerData llama2_spm_data() {
  const Json tj =
      Json::parse(read_file(kvlens::test::shared_path("data/tokenizers/llama2-tokenizer.json")));
  const Json& vocab = tj["model"]["vocab"];
  GgufTokenizerData d;
  d.model = "llama";
  d.tokens.resize(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it)
    d.tokens[it.value().get<size_t>()] = it.key();
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    const std::string& t = d.tokens[i];
    int32_t type = 1;
    if (t == "<unk>") type = 2;
    if (t == "<s>" || t == "</s>") type = 3;
    if (t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>') type = 6;
    d.token_types.push_back(type);
    d.scores.push_back(-static_cast<float>(i));
  }
  d.bos = 1;
  d.eos = 2;
  d.unk = 0;
  d.add_bos = true;
  d.add_eos = false;
  return d;
}

const Tokenizer& llama2_spm() {
  static const std::unique_ptr<Tokenizer> tokenizer =
      tokenizer_from_gguf(llama2_spm_data(), "llama2-spm-vocab.gguf");
  return *tokenizer;
}

// The text a fixture entry was made from, read again from ../shared/data.
std::string entry_text(const Json& source) {
  if (source.contains("text")) return source["text"].get<std::string>();
  const std::string file = source["file"].get<std::string>();
  const std::string path = kvlens::test::shared_path("data/" + file);
  if (source.contains("bytes")) return read_file(path).substr(0, source["bytes"].get<size_t>());
  if (source.contains("case"))
    return Json::parse(read_file(path))["cases"][source["case"].get<size_t>()]["text"];
  const std::string all = read_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  size_t begin = 0;
  for (size_t at; (at = all.find(sep, begin)) != std::string::npos; begin = at + sep.size())
    inputs.push_back(all.substr(begin, at - begin));
  inputs.push_back(all.substr(begin));
  return inputs.at(source["vector"].get<size_t>());
}

struct Comparison {
  int entries = 0, mismatches = 0, round_trip_failures = 0;
};

// Every entry of ids-<name>.json: encode without and with special tokens; decode(encode(x)) == x
// for the texts where `round_trips` says llama.cpp's detokenizer gives the text back.
Comparison compare_with_llama_cpp(const Tokenizer& tokenizer, const std::string& name,
                                  bool (*round_trips)(const std::string&)) {
  const Json doc = Json::parse(read_file(fixture_path("ids-" + name + ".json")));
  Comparison c;
  for (const Json& entry : doc["entries"]) {
    const std::string text = entry_text(entry["source"]);
    INFO(name << " " << entry["source"].dump() << " text: " << text.substr(0, 200));
    ++c.entries;
    const Ids ids = tokenizer.encode(text, false);
    const Ids expected = entry["ids"].get<Ids>();
    CHECK(ids == expected);
    if (ids != expected) ++c.mismatches;
    if (entry.contains("ids_with_special")) {
      CHECK(tokenizer.encode(text, true) == entry["ids_with_special"].get<Ids>());
    }
    if (round_trips(text)) {
      const std::string decoded = tokenizer.decode(expected, false);
      CHECK(decoded == text);
      if (decoded != text) ++c.round_trip_failures;
    }
  }
  return c;
}

bool always(const std::string&) {
  return true;
}

// SentencePiece text round-trips unless a special token is followed by text (the space prefix
// added after it is decoded) or the text starts with one.
bool spm_round_trips(const std::string& text) {
  return text.find("<s>") == std::string::npos && text.find("</s>") == std::string::npos &&
         text.find("<unk>") == std::string::npos;
}

std::vector<std::string> pieces(const Tokenizer& t, const Ids& ids) {
  std::vector<std::string> out;
  for (const int32_t id : ids) out.push_back(t.token_text(id));
  return out;
}

void expect_error(const GgufTokenizerData& data, const std::string& field,
                  const std::string& expected_part, const std::string& found_part = "") {
  try {
    tokenizer_from_gguf(data, "bad.gguf");
    FAIL("no kvlens::Error thrown");
  } catch (const kvlens::Error& e) {
    INFO("message: " << e.what());
    CHECK(e.file() == "bad.gguf");
    CHECK(e.field() == field);
    CHECK_THAT(e.expected(), Catch::Matchers::Contains(expected_part));
    CHECK_THAT(e.found(), Catch::Matchers::Contains(found_part));
    CHECK(std::string(e.what()).find('\n') == std::string::npos);
  }
}

// A small SentencePiece-style vocabulary for hand-worked cases.
GgufTokenizerData tiny_spm() {
  GgufTokenizerData d;
  d.model = "llama";
  const std::vector<std::pair<std::string, float>> vocab = {
      {"<unk>", 0},
      {"<s>", 0},
      {"</s>", 0},
      {"<0xC3>", 0},
      {"<0xA9>", 0},
      {"\xE2\x96\x81", -1},
      {"a", -1},
      {"b", -1},
      {"c", -1},
      {"ab", -3},
      {"bc", -2},
      {"\xE2\x96\x81"
       "a",
       -2.5f},
      {"<|user|>", 0},
      {"x", -1},
      {"unused", 0},
  };
  for (const auto& [text, score] : vocab) {
    d.tokens.push_back(text);
    d.scores.push_back(score);
  }
  d.token_types = {2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1, 3, 1, 5};
  d.bos = 1;
  d.eos = 2;
  d.unk = 0;
  return d;
}

}  // namespace

TEST_CASE("GGUF SmolLM2: ids identical to llama.cpp on the texts of ../shared/data",
          "[tokenizer][gguf]") {
  const Comparison c = compare_with_llama_cpp(smollm2(), "smollm2", always);
  CHECK(c.entries > 100);
  CHECK(c.mismatches == 0);
  CHECK(c.round_trip_failures == 0);
}

TEST_CASE("GGUF SentencePiece (Llama 2 vocabulary): ids identical to llama.cpp",
          "[tokenizer][gguf]") {
  const Comparison c = compare_with_llama_cpp(llama2_spm(), "llama2-spm", spm_round_trips);
  CHECK(c.entries > 100);
  CHECK(c.mismatches == 0);
  CHECK(c.round_trip_failures == 0);
}

TEST_CASE("GGUF SmolLM2: metadata says no BOS, digits split one by one", "[tokenizer][gguf]") {
  const Tokenizer& t = smollm2();
  REQUIRE(smollm2_data().add_bos == false);
  CHECK(t.encode("Hi", true) == t.encode("Hi", false));
  CHECK(t.bos_id() == 1);
  // smollm splits every digit off before the GPT-2 regex, so whitespace before a number ends a
  // piece and stays one word ("  " is a token); the plain GPT-2 regex gives its last space to the
  // number (" 1"), which SmolLM2's merges never join.
  CHECK(pieces(t, t.encode("x 123", false)) == std::vector<std::string>{"x", " ", "1", "2", "3"});
  CHECK(pieces(t, t.encode("x  1", false)) == std::vector<std::string>{"x", "  ", "1"});
  GgufTokenizerData gpt2 = smollm2_data();
  gpt2.pre = "gpt-2";
  const auto plain = tokenizer_from_gguf(gpt2, "gpt2-pre.gguf");
  CHECK(pieces(*plain, plain->encode("x  1", false)) ==
        std::vector<std::string>{"x", " ", " ", "1"});
}

TEST_CASE("GGUF: add_bos from the metadata, or the model's default", "[tokenizer][gguf]") {
  GgufTokenizerData d = smollm2_data();
  d.add_bos = true;
  CHECK(tokenizer_from_gguf(d, "x.gguf")->encode("Hi", true).front() == 1);
  d.add_bos.reset();
  d.pre = "llama-bpe";  // llama.cpp adds BOS for Llama 3 vocabularies unless told otherwise
  CHECK(tokenizer_from_gguf(d, "x.gguf")->encode("Hi", true).front() == 1);
  d.pre = "smollm";
  CHECK(tokenizer_from_gguf(d, "x.gguf")->encode("Hi", true).front() != 1);
  d.add_eos = true;
  CHECK(tokenizer_from_gguf(d, "x.gguf")->encode("Hi", true).back() == 2);
  GgufTokenizerData spm = tiny_spm();  // SentencePiece vocabularies add BOS by default
  CHECK(tokenizer_from_gguf(spm, "x.gguf")->encode("a", true) == Ids{1, 11});
}

TEST_CASE("GGUF: special tokens are matched in the text; decode renders or skips them",
          "[tokenizer][gguf]") {
  const Tokenizer& t = smollm2();
  const auto start = t.token_to_id("<|im_start|>");
  const auto end = t.token_to_id("<|im_end|>");
  REQUIRE(start);
  REQUIRE(end);
  const Ids ids = t.encode("<|im_start|>user<|im_end|>", false);
  REQUIRE(ids.size() == 3);
  CHECK(ids.front() == *start);
  CHECK(ids.back() == *end);
  CHECK(t.decode(ids, false) == "<|im_start|>user<|im_end|>");
  CHECK(t.decode(ids, true) == "user");
  CHECK(t.token_text(*start) == "<|im_start|>");
  CHECK(t.token_text(-3) == "<id -3>");
  CHECK(t.token_text(static_cast<int32_t>(t.vocab_size())) ==
        "<id " + std::to_string(t.vocab_size()) + ">");
}

TEST_CASE("GGUF: the gpt-2 pre-tokenizer cleans spaces on decode as llama.cpp does",
          "[tokenizer][gguf]") {
  GgufTokenizerData d = smollm2_data();
  d.pre = "gpt-2";
  const auto t = tokenizer_from_gguf(d, "gpt2-pre.gguf");
  // " ," loses its space, " ' " both, " 's" its space; smollm leaves text as it is.
  const std::string text = "a , b ' c 's d 't";
  CHECK(t->decode(t->encode(text, false), false) == "a, b'c's d 't");
  CHECK(smollm2().decode(smollm2().encode(text, false), false) == text);
}

TEST_CASE("GGUF SentencePiece: score-ordered merges, space prefix, byte fallback (hand-worked)",
          "[tokenizer][gguf]") {
  const auto t = tokenizer_from_gguf(tiny_spm(), "tiny.gguf");
  // "abc" -> "▁abc": pairs ▁a (-2.5), ab (-3), bc (-2): bc merges first, then ▁a; "▁abc" is no
  // token, so [▁a, bc].
  CHECK(t->encode("abc", false) == Ids{11, 10});
  // "ab" -> "▁ab": ▁a (-2.5) beats ab (-3): [▁a, b].
  CHECK(t->encode("ab", false) == Ids{11, 7});
  // é is no token: its UTF-8 bytes.
  CHECK(t->encode("x\xC3\xA9", false) == Ids{5, 13, 3, 4});
  CHECK(t->decode({5, 13, 3, 4}, false) == "x\xC3\xA9");  // the prefix space is removed
  // Text after a special token gets the space prefix again.
  CHECK(t->encode("a<|user|>a", false) == Ids{11, 12, 11});
  CHECK(t->decode({11, 12, 11}, false) == "a<|user|> a");
  CHECK(t->decode({11, 12, 11}, true) == "a a");
  // A leading BOS that skip_special_tokens drops keeps the first word's space (llama.cpp strips
  // the prefix space only when no BOS was removed).
  CHECK(t->decode({1, 11}, true) == " a");
  CHECK(t->decode({1, 11}, false) == "<s> a");
  // Unused tokens decode to nothing.
  CHECK(t->decode({14}, false).empty());
}

TEST_CASE("GGUF SentencePiece: equal scores merge leftmost first", "[tokenizer][gguf]") {
  GgufTokenizerData d = tiny_spm();
  d.add_space_prefix = false;
  // "abc" without the prefix: ab (-3) and bc (-3) tie, and ab is leftmost.
  d.scores[10] = -3;
  CHECK(tokenizer_from_gguf(d, "tie.gguf")->encode("abc", false) == Ids{9, 8});
  d.scores[10] = -2;
  CHECK(tokenizer_from_gguf(d, "tie.gguf")->encode("abc", false) == Ids{6, 10});
}

TEST_CASE("GGUF: Phi-3 files drop the whitespace after chat tokens (by model name)",
          "[tokenizer][gguf]") {
  GgufTokenizerData d = tiny_spm();
  CHECK(tokenizer_from_gguf(d, "x.gguf")->encode("<|user|>  a", false) == Ids{12, 5, 5, 11});
  d.general_name = "Phi-3-mini-4k-instruct";
  CHECK(tokenizer_from_gguf(d, "x.gguf")->encode("<|user|>  a", false) == Ids{12, 11});
}

TEST_CASE("GGUF tokenizer errors name the key, the value and what is supported",
          "[tokenizer][gguf]") {
  GgufTokenizerData d = tiny_spm();
  d.model = "bert";
  expect_error(d, "tokenizer.ggml.model", "\"gpt2\" (byte-level BPE) or \"llama\"", "\"bert\"");

  d = smollm2_data();
  d.pre = "falcon";
  expect_error(d, "tokenizer.ggml.pre", "smollm", "\"falcon\"");

  d = tiny_spm();
  d.tokens.clear();
  expect_error(d, "tokenizer.ggml.tokens", "a non-empty list");

  d = tiny_spm();
  d.scores.pop_back();
  expect_error(d, "tokenizer.ggml.scores", "one score per token (15)", "14");

  d = tiny_spm();
  d.token_types.resize(3);
  expect_error(d, "tokenizer.ggml.token_type", "one type per token (15)", "3");

  d = smollm2_data();
  d.merges.clear();
  expect_error(d, "tokenizer.ggml.merges", "the merges of a \"gpt2\" vocabulary");

  d = smollm2_data();
  d.bos = -1;
  d.add_bos = true;
  expect_error(d, "tokenizer.ggml.bos_token_id", "add_bos_token is set");

  d = smollm2_data();
  d.eos = 999999;  // outside the vocabulary: ignored, as llama.cpp ignores it, so none is left
  d.add_eos = true;
  expect_error(d, "tokenizer.ggml.eos_token_id", "add_eos_token is set");

  const auto t = tokenizer_from_gguf(tiny_spm(), "tiny.gguf");
  try {
    t->decode({1, 15}, false);
    FAIL("no kvlens::Error thrown");
  } catch (const kvlens::Error& e) {
    CHECK(e.field() == "ids[1]");
    CHECK(e.expected() == "a token id in [0, 14]");
    CHECK(e.found() == "15");
  }
}

TEST_CASE("GGUF: supported pre-tokenizers are listed", "[tokenizer][gguf]") {
  const auto& names = kvlens::supported_gguf_pre_tokenizers();
  for (const char* name : {"smollm", "llama-bpe", "llama3", "qwen2", "gpt-2", "default"}) {
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
  }
}
