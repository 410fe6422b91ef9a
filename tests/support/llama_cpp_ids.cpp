// compare_with_llama_cpp (llama_cpp_ids.h).
#include "tests/support/llama_cpp_ids.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/common/mapped_file.h"
#include "tests/support/test_paths.h"

namespace kvlens::test {
namespace {

using Ids = std::vector<int32_t>;
using Json = nlohmann::json;

std::string fixture_path(const std::string& name) {
  return source_path("tests/fixtures/gguf_tokenizer/" + name);
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// The text a fixture entry was made from, read again from ../shared/data.
std::string entry_text(const Json& source) {
  if (source.contains("text")) return source["text"].get<std::string>();
  if (source.contains("text_hex")) return from_hex(source["text_hex"].get<std::string>());
  const std::string file = source["file"].get<std::string>();
  const std::string path = shared_path("data/" + file);
  if (source.contains("bytes"))
    return kvlens::read_text_file(path).substr(0, source["bytes"].get<size_t>());
  if (source.contains("case"))
    return Json::parse(kvlens::read_text_file(path))["cases"][source["case"].get<size_t>()]["text"];
  const std::string all = kvlens::read_text_file(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> inputs;
  size_t begin = 0;
  for (size_t at; (at = all.find(sep, begin)) != std::string::npos; begin = at + sep.size())
    inputs.push_back(all.substr(begin, at - begin));
  inputs.push_back(all.substr(begin));
  return inputs.at(source["vector"].get<size_t>());
}

std::string expected_text(const Json& entry, const std::string& key, const std::string& text) {
  if (entry.contains(key)) return entry[key].get<std::string>();
  if (entry.contains(key + "_hex")) return from_hex(entry[key + "_hex"].get<std::string>());
  return text;
}

}  // namespace

LlamaCppComparison compare_with_llama_cpp(const Tokenizer& tokenizer, const std::string& name) {
  const Json doc =
      Json::parse(kvlens::read_maybe_gzipped(fixture_path("ids-" + name + ".json.gz")));
  const Ids prefix = doc["added_prefix"].get<Ids>();
  LlamaCppComparison c;
  for (const Json& entry : doc["entries"]) {
    const std::string text = entry_text(entry["source"]);
    INFO(name << " " << entry["source"].dump() << " text: " << text.substr(0, 300));
    ++c.entries;
    const Ids expected = entry["ids"].get<Ids>();
    Ids expected_special = prefix;
    expected_special.insert(expected_special.end(), expected.begin(), expected.end());
    if (entry.contains("ids_with_special")) expected_special = entry["ids_with_special"].get<Ids>();
    const Ids ids = tokenizer.encode(text, false);
    const Ids ids_special = tokenizer.encode(text, true);
    const std::string decoded = tokenizer.decode(expected, false);
    const std::string decoded_skip = tokenizer.decode(expected_special, true);
    CHECK(ids == expected);
    CHECK(ids_special == expected_special);
    CHECK(decoded == expected_text(entry, "decoded", text));
    CHECK(decoded_skip == expected_text(entry, "decoded_skip_special", text));
    if (ids != expected || ids_special != expected_special ||
        decoded != expected_text(entry, "decoded", text) ||
        decoded_skip != expected_text(entry, "decoded_skip_special", text)) {
      ++c.mismatches;
    }
  }
  return c;
}

}  // namespace kvlens::test
