// GGUF tokenizer tests: the ids llama.cpp's llama-tokenize gives (tests/fixtures/gguf_tokenizer,
// made by tools/gguf_reference_ids.py) for the texts of ../shared/data with SmolLM2-135M's
// byte-level vocabulary and a SentencePiece-style vocabulary built from the Llama 2 tokenizer.json,
// hand-worked cases on small vocabularies, and every error path of tokenizer_from_gguf.
#include <catch2/catch.hpp>

#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/model/tokenizer.h"
#include "engine/model/tokenizer_gguf.h"
#include "tests/support/llama_cpp_ids.h"
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
using kvlens::test::compare_with_llama_cpp;
using Ids = std::vector<int32_t>;
using Json = nlohmann::json;

std::string fixture_path(const std::string& name) {
  return kvlens::test::source_path("tests/fixtures/gguf_tokenizer/" + name);
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

// A vocabulary-only GGUF that tools/gguf_reference_ids.py builds from a tokenizer.json (its BUILT
// table), by the same rules: tokens by id (added tokens included, holes "[PAD<id>]" unused), types
// (added: control if special, else user-defined; "<unk>" unknown; <0xNN> bytes in SentencePiece
// vocabularies; the rest normal), scores -id, merges "left right".
struct BuiltVocab {
  const char* name;
  const char* path;  // "shared:..." (../shared) or "repo:..." (this repository)
  const char* model;
  const char* pre;
  const char* general_name;
  int32_t bos, eos, unk;
  bool add_bos;
  std::optional<bool> add_space_prefix = std::nullopt;
};

constexpr BuiltVocab kBuilt[] = {
    {"llama2-spm", "shared:data/tokenizers/llama2-tokenizer.json", "llama", "", "llama2", 1, 2, 0,
     true},
    {"llama2-spm-noprefix", "shared:data/tokenizers/llama2-tokenizer.json", "llama", "",
     "gemma-style", 1, 2, 0, true, false},
    {"phi3-spm", "repo:tests/fixtures/tokenizers/phi3-mini-tokenizer.json.gz", "llama", "",
     "Phi-3-mini-4k-instruct", 1, 32000, 0, true},
    {"gpt2", "shared:data/tokenizers/gpt2-tokenizer.json", "gpt2", "gpt-2", "gpt2", 50256, 50256,
     -1, false},
    {"gpt2-default", "shared:data/tokenizers/gpt2-tokenizer.json", "gpt2", "default", "gpt2", 50256,
     50256, -1, false},
    {"phi4-mini-gpt4o", "repo:tests/fixtures/tokenizers/phi4-mini-style-tokenizer.json.gz", "gpt2",
     "gpt-4o", "phi4-mini-style", -1, -1, -1, false},
    {"llama3", "shared:data/tokenizers/llama3-tokenizer.json.gz", "gpt2", "llama-bpe", "llama3", -1,
     -1, -1, false},
    {"qwen2", "repo:tests/fixtures/tokenizers/qwen2.5-tokenizer.json.gz", "gpt2", "qwen2",
     "qwen2.5", -1, 151645, -1, false},
};

const BuiltVocab& built(const std::string& name) {
  for (const BuiltVocab& b : kBuilt) {
    if (name == b.name) return b;
  }
  FAIL("no built vocabulary " << name);
  throw 0;
}

GgufTokenizerData data_from_tokenizer_json(const BuiltVocab& b) {
  const std::string where = b.path;
  const std::string rel = where.substr(where.find(':') + 1);
  const std::string path = where.rfind("shared:", 0) == 0 ? kvlens::test::shared_path(rel)
                                                          : kvlens::test::source_path(rel);
  const Json tj = Json::parse(kvlens::read_maybe_gzipped(path));
  const bool spm = std::string(b.model) == "llama";
  std::map<int64_t, std::pair<std::string, int32_t>> by_id;  // id -> (text, type)
  for (auto it = tj["model"]["vocab"].begin(); it != tj["model"]["vocab"].end(); ++it) {
    const std::string& t = it.key();
    int32_t type = 1;
    if (t == "<unk>") type = 2;
    if (spm && t.size() == 6 && t.rfind("<0x", 0) == 0 && t.back() == '>') type = 6;
    by_id[it.value().get<int64_t>()] = {t, type};
  }
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const Json& a : tj["added_tokens"])
      by_id[a["id"].get<int64_t>()] = {a["content"], a["special"].get<bool>() ? 3 : 4};
  }
  GgufTokenizerData d;
  d.model = b.model;
  d.pre = b.pre;
  d.general_name = b.general_name;
  const int64_t n = by_id.rbegin()->first + 1;
  for (int64_t i = 0; i < n; ++i) {
    const auto it = by_id.find(i);
    d.tokens.push_back(it == by_id.end() ? "[PAD" + std::to_string(i) + "]" : it->second.first);
    d.token_types.push_back(it == by_id.end() ? 5 : it->second.second);
    if (spm) d.scores.push_back(-static_cast<float>(i));
  }
  if (!spm) {
    for (const Json& m : tj["model"]["merges"]) {
      d.merges.push_back(m.is_string() ? m.get<std::string>()
                                       : m[0].get<std::string>() + " " + m[1].get<std::string>());
    }
  }
  d.bos = b.bos;
  d.eos = b.eos;
  d.unk = b.unk;
  d.add_bos = b.add_bos;
  d.add_eos = false;
  d.add_space_prefix = b.add_space_prefix;
  return d;
}

const Tokenizer& built_tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) slot = tokenizer_from_gguf(data_from_tokenizer_json(built(name)), name + ".gguf");
  return *slot;
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

TEST_CASE("GGUF SmolLM2: ids and decoded text identical to llama.cpp on ../shared/data",
          "[tokenizer][gguf]") {
  const kvlens::test::LlamaCppComparison c = compare_with_llama_cpp(smollm2(), "smollm2");
  CHECK(c.entries > 300);
  CHECK(c.mismatches == 0);
}

TEST_CASE("GGUF vocabularies built from tokenizer.json files: identical to llama.cpp",
          "[tokenizer][gguf]") {
  for (const BuiltVocab& b : kBuilt) {
    SECTION(b.name) {
      const kvlens::test::LlamaCppComparison c =
          compare_with_llama_cpp(built_tokenizer(b.name), b.name);
      CHECK(c.entries > 300);
      CHECK(c.mismatches == 0);
    }
  }
}

TEST_CASE("GGUF GPT-2 vocabulary: the llama.cpp test vectors in ../shared/data",
          "[tokenizer][gguf]") {
  const Tokenizer& t = built_tokenizer("gpt2");
  const std::string inputs =
      kvlens::read_text_file(kvlens::test::shared_path("data/tokenizers/vectors-gpt-2.inp"));
  std::istringstream outputs(
      kvlens::read_text_file(kvlens::test::shared_path("data/tokenizers/vectors-gpt-2.out")));
  const std::string sep = "\n__ggml_vocab_test__\n";
  size_t begin = 0, count = 0;
  for (size_t at; (at = inputs.find(sep, begin)) != std::string::npos; begin = at + sep.size()) {
    const std::string text = inputs.substr(begin, at - begin);
    std::string line;
    REQUIRE(std::getline(outputs, line));
    Ids expected;
    std::istringstream fields(line);
    for (int32_t id; fields >> id;) expected.push_back(id);
    INFO("input " << count << ": " << text);
    CHECK(t.encode(text, false) == expected);
    ++count;
  }
  CHECK(count == 46);
}

TEST_CASE("GGUF SmolLM2: metadata says no BOS, digits split one by one", "[tokenizer][gguf]") {
  const Tokenizer& t = smollm2();
  REQUIRE(smollm2_data().add_bos == false);
  CHECK(t.encode("Hi", true) == t.encode("Hi", false));
  CHECK_FALSE(t.bos_id());  // the file names BOS 1 but says not to add it
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
  CHECK(tokenizer_from_gguf(spm, "x.gguf")->bos_id() == 1);
}

TEST_CASE("GGUF: special tokens are matched in the text, and decode renders or skips them",
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
  // Unused tokens decode to nothing; a byte token alone is no text, so its label is U+FFFD.
  CHECK(t->decode({14}, false).empty());
  CHECK(t->decode({3}, false) == "\xC3");
  CHECK(t->token_text(3) == "\xEF\xBF\xBD");
}

TEST_CASE("GGUF: arbitrary bytes encode, and any ids decode, without failing",
          "[tokenizer][gguf]") {
  // A fixed pseudo-random stream: bytes biased towards the ones tokenizers treat specially.
  uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
  };
  const std::string alphabet = std::string("<|>/ \n\t'sa1\xC3\xA9\xE2\x96\x81\xFF\x80") + '\0';
  const auto tiny = tokenizer_from_gguf(tiny_spm(), "tiny.gguf");
  for (const Tokenizer* t : std::vector<const Tokenizer*>{&smollm2(), tiny.get()}) {
    for (int round = 0; round < 200; ++round) {
      std::string text;
      const size_t length = next() % 40;
      for (size_t i = 0; i < length; ++i) {
        text +=
            next() % 3 == 0 ? static_cast<char>(next() & 0xFF) : alphabet[next() % alphabet.size()];
      }
      INFO("text bytes: " << text.size());
      const Ids ids = t->encode(text, true);
      for (const int32_t id : ids) REQUIRE((id >= 0 && id < t->vocab_size()));
      Ids random_ids;
      for (size_t i = 0; i < length; ++i)
        random_ids.push_back(static_cast<int32_t>(next() % t->vocab_size()));
      CHECK_NOTHROW(t->decode(random_ids, false));
      CHECK_NOTHROW(t->decode(random_ids, true));
    }
  }
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
