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
  // Entries that repeat an earlier one of their pool, e.g. "location_names[44] \"frostwhisper\"
  // (as [12])": kept as they are (the TokenButler repository's pools repeat some), listed so a
  // front end can warn; validate_pool_integrity refuses repeated names.
  std::vector<std::string> repeated;
};

// The suffix every location_intro must end with: the sample appends " <name>." to it.
inline constexpr const char* kCorefPlaceMarker = "The place is:";

// Parses pools JSON text. Schema problems (missing key, wrong type, empty list, an intro not
// ending in "The place is:") raise kvlens::Error naming `source`, the key with its index and what
// was expected; repeated entries are kept and listed in `repeated`.
CorefPools parse_coref_pools(const std::string& json_text, const std::string& source);
CorefPools load_coref_pools(const std::string& path);

// The bundled pools file (assets/benchmarks/coref/pools.json, found by bundled_asset_path).
// Throws kvlens::Error listing where it looked when none exists.
std::string bundled_coref_pools_path();
CorefPools load_bundled_coref_pools();

// Lower-cased words of >= 4 ASCII letters that are not stop words ("with", "called", "place"...),
// in order of appearance, without repeats. What the tie-back check compares.
std::vector<std::string> coref_content_words(const std::string& text);

// Checks the pools make a fair benchmark: no duplicate names (unless allow_repeats: published
// pools that repeat entries still run, with a warning from the caller); with a tokenizer, each
// name is at least two tokens (so the answer has a position that is pure retrieval, not
// first-token guessing); each tie-back shares a content word with its own lead. Throws
// kvlens::Error naming the pool, the index and the offending text.
void validate_pool_integrity(const CorefPools& pools, const Tokenizer* tokenizer,
                             bool allow_repeats = false);
// One line naming the repeated entries of `pools` ("FILE repeats entries (kept): ..."), empty
// when none.
std::string repeated_entries_warning(const CorefPools& pools);

}  // namespace kvlens
