// Text pools of the synthetic co-reference benchmark (TokenButler section 4.2): invented location
// names, lead/tie-back pairs and three kinds of distractor sentences, loaded from one JSON file.
// Shapes: every pool is a list of >= 1 entries; the bundled file has >= 100 of each.
#pragma once

#include <string>
#include <vector>

namespace kvlens {

class Tokenizer;

// A lead that describes a place and the question that asks about one of its features again.
struct CorefIntro {
  std::string location_intro;    // ends in "The place is:"
  std::string tieback_question;  // e.g. "The town with the red lighthouse is called"
};

struct CorefPools {
  std::string source;  // the file the pools came from, for error messages
  std::vector<std::string> location_names;
  std::vector<CorefIntro> intros;  // JSON key "loc_intro_tieback_list"
  std::vector<std::string> philosophy_statements;
  std::vector<std::string> food_descriptions;
  std::vector<std::string> math_problems;
};

// The suffix every location_intro must end with: the sample appends " <name>." to it.
inline constexpr const char* kCorefPlaceMarker = "The place is:";

// Parses pools JSON text. Schema problems (missing key, wrong type, empty list, an intro not
// ending in "The place is:", a duplicate location name) raise kvlens::Error naming `source`, the
// key with its index and what was expected.
CorefPools parse_coref_pools(const std::string& json_text, const std::string& source);
CorefPools load_coref_pools(const std::string& path);

// The bundled pools file (assets/benchmarks/coref/pools.json, found by bundled_asset_path).
// Throws kvlens::Error listing where it looked when none exists.
std::string bundled_coref_pools_path();
CorefPools load_bundled_coref_pools();

// Lower-cased words of >= 4 ASCII letters that are not stop words ("with", "called", "place"...),
// in order of appearance, without repeats. What the tie-back check compares.
std::vector<std::string> coref_content_words(const std::string& text);

// Checks the pools make a fair benchmark: no duplicate names; with a tokenizer, each name is at
// least two tokens (so the answer has a position that is pure retrieval, not first-token
// guessing); each tie-back shares a content word with its own lead. Throws kvlens::Error naming
// the pool, the index and the offending text.
void validate_pool_integrity(const CorefPools& pools, const Tokenizer* tokenizer);

}  // namespace kvlens
