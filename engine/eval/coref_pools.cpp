// Loading and validation of the co-reference benchmark pools (JSON object of five lists).
// Schema errors name file, key[index] and what was expected, like every other kvlens input.
#include "engine/eval/coref_pools.h"

#include <cctype>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>

#include "engine/common/bundled_assets.h"
#include "engine/common/error.h"
#include "engine/common/json_describe.h"
#include "engine/common/mapped_file.h"
#include "engine/model/tokenizer.h"

namespace kvlens {
namespace {

using Json = nlohmann::json;

std::string indexed(const std::string& key, size_t index) {
  return key + "[" + std::to_string(index) + "]";
}

const Json& require_list(const Json& root, const std::string& source, const std::string& key) {
  const auto it = root.find(key);
  if (it == root.end()) throw Error(source, key, "a list (the key is missing)");
  if (!it->is_array()) throw Error(source, key, "a list", describe_json(*it));
  if (it->empty()) throw Error(source, key, "a non-empty list", "an empty list");
  return *it;
}

std::string require_text(const Json& value, const std::string& source, const std::string& field) {
  if (!value.is_string()) throw Error(source, field, "a string", describe_json(value));
  std::string text = value.get<std::string>();
  // Blank entries would make samples with "  " holes; a name must be something to retrieve.
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw Error(source, field, "a non-blank string", describe_json(value));
  }
  return text;
}

std::vector<std::string> string_list(const Json& root, const std::string& source,
                                     const std::string& key) {
  const Json& list = require_list(root, source, key);
  std::vector<std::string> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i)
    out.push_back(require_text(list[i], source, indexed(key, i)));
  return out;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// Function words and the template's own words: sharing only these with the lead would not make
// the question point back at it.
const std::set<std::string>& stop_words() {
  static const std::set<std::string> words = {
      "about", "also",  "been",  "being", "called", "does",  "each",  "even", "from",    "have",
      "here",  "into",  "just",  "known", "like",   "more",  "most",  "much", "name",    "named",
      "only",  "over",  "place", "same",  "some",   "such",  "than",  "that", "their",   "them",
      "then",  "there", "these", "they",  "this",   "those", "very",  "were", "what",    "when",
      "where", "which", "while", "whose", "will",   "with",  "would", "your", "remember"};
  return words;
}

// Duplicate names would make a hard sample's question ambiguous and inflate accuracy.
void check_unique_names(const std::vector<std::string>& names, const std::string& source) {
  std::set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!seen.insert(names[i]).second) {
      throw Error(source, indexed("location_names", i), "a name not listed before",
                  "duplicate \"" + names[i] + "\"");
    }
  }
}

// Appends "key[i] "text" (as [j])" to `repeated` for each entry equal to an earlier one.
void note_repeats(const std::vector<std::string>& entries, const std::string& key,
                  std::vector<std::string>& repeated) {
  std::map<std::string, size_t> first;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto [it, inserted] = first.emplace(entries[i], i);
    if (inserted) continue;
    std::string text = entries[i].size() > 40 ? entries[i].substr(0, 37) + "..." : entries[i];
    repeated.push_back(indexed(key, i) + " \"" + text + "\" (as [" + std::to_string(it->second) +
                       "])");
  }
}

}  // namespace

CorefPools parse_coref_pools(const std::string& json_text, const std::string& source) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::parse_error& error) {
    throw Error(source, "(document)", "valid JSON", error.what());
  }
  if (!root.is_object()) throw Error(source, "(document)", "a JSON object", describe_json(root));
  CorefPools pools;
  pools.source = source;
  pools.location_names = string_list(root, source, "location_names");
  const Json& intros = require_list(root, source, "loc_intro_tieback_list");
  for (size_t i = 0; i < intros.size(); ++i) {
    const std::string field = indexed("loc_intro_tieback_list", i);
    if (!intros[i].is_object()) throw Error(source, field, "an object", describe_json(intros[i]));
    CorefIntro intro;
    for (const char* key : {"location_intro", "tieback_question"}) {
      const auto it = intros[i].find(key);
      if (it == intros[i].end()) {
        throw Error(source, field + "." + key, "a string (the key is missing)");
      }
      (std::string_view(key) == "location_intro" ? intro.location_intro : intro.tieback_question) =
          require_text(*it, source, field + "." + key);
    }
    if (!ends_with(intro.location_intro, kCorefPlaceMarker)) {
      throw Error(source, field + ".location_intro",
                  std::string("text ending in \"") + kCorefPlaceMarker + "\"",
                  describe_json(intros[i]["location_intro"]));
    }
    pools.intros.push_back(std::move(intro));
  }
  pools.philosophy_statements = string_list(root, source, "philosophy_statements");
  pools.food_descriptions = string_list(root, source, "food_descriptions");
  pools.math_problems = string_list(root, source, "math_problems");
  note_repeats(pools.location_names, "location_names", pools.repeated);
  std::vector<std::string> intro_texts;
  for (const CorefIntro& intro : pools.intros)
    intro_texts.push_back(intro.location_intro + "\n" + intro.tieback_question);
  note_repeats(intro_texts, "loc_intro_tieback_list", pools.repeated);
  note_repeats(pools.philosophy_statements, "philosophy_statements", pools.repeated);
  note_repeats(pools.food_descriptions, "food_descriptions", pools.repeated);
  note_repeats(pools.math_problems, "math_problems", pools.repeated);
  return pools;
}

CorefPools load_coref_pools(const std::string& path) {
  return parse_coref_pools(read_text_file(path), path);
}

std::string bundled_coref_pools_path() {
  return bundled_asset_path("benchmarks/coref/pools.json", "bundled pools");
}

CorefPools load_bundled_coref_pools() {
  return load_coref_pools(bundled_coref_pools_path());
}

std::vector<std::string> coref_content_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  auto flush = [&] {
    if (word.size() >= 4 && !stop_words().count(word)) {
      bool seen = false;
      for (const std::string& w : words) seen = seen || w == word;
      if (!seen) words.push_back(word);
    }
    word.clear();
  };
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (std::isalpha(byte) && byte < 0x80) {
      word += static_cast<char>(std::tolower(byte));
    } else {
      flush();
    }
  }
  flush();
  return words;
}

std::string repeated_entries_warning(const CorefPools& pools) {
  if (pools.repeated.empty()) return {};
  std::string text = pools.source + " repeats " + std::to_string(pools.repeated.size()) +
                     " entries (kept as they are):";
  for (size_t i = 0; i < pools.repeated.size(); ++i) text += (i ? "; " : " ") + pools.repeated[i];
  return text;
}

void validate_pool_integrity(const CorefPools& pools, const Tokenizer* tokenizer,
                             bool allow_repeats) {
  if (!allow_repeats) check_unique_names(pools.location_names, pools.source);
  if (tokenizer) {
    for (size_t i = 0; i < pools.location_names.size(); ++i) {
      // Encoded as it appears in samples, after a space, since that is the text the model sees.
      const size_t count = tokenizer->encode(" " + pools.location_names[i], false).size();
      if (count < 2) {
        throw Error(pools.source, indexed("location_names", i),
                    "a name of at least 2 tokens under " + tokenizer->source(),
                    "\"" + pools.location_names[i] + "\" (" + std::to_string(count) + " token)");
      }
    }
  }
  for (size_t i = 0; i < pools.intros.size(); ++i) {
    const std::vector<std::string> lead = coref_content_words(pools.intros[i].location_intro);
    bool shared = false;
    for (const std::string& word : coref_content_words(pools.intros[i].tieback_question)) {
      for (const std::string& other : lead) shared = shared || word == other;
    }
    if (!shared) {
      throw Error(pools.source, indexed("loc_intro_tieback_list", i) + ".tieback_question",
                  "a question sharing a content word (4+ letters, not a stop word) with its lead",
                  "\"" + pools.intros[i].tieback_question + "\"");
    }
  }
}

}  // namespace kvlens
