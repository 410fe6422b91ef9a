// The stages of a tokenizer.json around its model: normalizer, pre-tokenizer, decoder and
// post-processor, each parsed from JSON into a flat list of steps. Only the step kinds that
// Llama-, Qwen- and Phi-family tokenizers use are supported; any other kind is a kvlens::Error at
// parse time.
#pragma once

#include "engine/model/tokenizer_json.h"
#include "engine/model/tokenizer_split.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvlens::tok {

// A piece of text between pipeline stages. at_start: the piece begins at offset 0 of the
// caller's text (Metaspace's prepend_scheme "first" only prefixes that piece).
struct Piece {
  std::string text;
  bool at_start;
};

enum class PrependScheme { kAlways, kFirst, kNever };

class Normalizer {
 public:
  static Normalizer parse(const Json* value, const JsonPath& path);  // null: no normalizer
  bool empty() const { return steps_.empty(); }
  std::string apply(std::string_view text) const;

 private:
  enum class Kind { kPrepend, kReplace, kNfc };
  struct Step {
    Kind kind;
    std::string text;     // Prepend: the prefix; Replace: the pattern
    std::string content;  // Replace: the replacement
  };
  void parse_into(const Json& value, const JsonPath& path, int depth);
  std::vector<Step> steps_;
};

class PreTokenizer {
 public:
  static PreTokenizer parse(const Json* value, const JsonPath& path);  // null: one word per piece
  // Splits every piece into words (in place); empty words are dropped.
  void apply(std::vector<Piece>* pieces) const;

 private:
  enum class Kind { kByteLevel, kSplit, kMetaspace, kDigits };
  struct Step {
    Kind kind = Kind::kByteLevel;
    bool flag = false;  // ByteLevel: add_prefix_space; Metaspace: split; Digits: individual
    bool use_regex = true;
    SplitPattern pattern = SplitPattern::kGpt2;
    std::string replacement;
    PrependScheme scheme = PrependScheme::kAlways;
  };
  void parse_into(const Json& value, const JsonPath& path, int depth);
  void apply_step(const Step& step, const Piece& piece, std::vector<Piece>* out) const;
  std::vector<Step> steps_;
};

class Decoder {
 public:
  static Decoder parse(const Json* value, const JsonPath& path);  // null: tokens joined by " "
  std::string decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip, kByteLevel, kMetaspace };
  struct Step {
    Kind kind = Kind::kFuse;
    std::string pattern;  // Replace: pattern; Strip: the char; Metaspace: the replacement
    std::string content;  // Replace: the replacement
    size_t start = 0, stop = 0;
    bool prepend = true;  // Metaspace: prepend_scheme != never
  };
  void parse_into(const Json& value, const JsonPath& path, int depth);
  std::vector<Step> steps_;
  bool present_ = false;
};

class PostProcessor {
 public:
  static PostProcessor parse(const Json* value, const JsonPath& path);  // null: no change
  // Wraps the ids of one sequence in the template's special tokens.
  std::vector<int32_t> apply(std::vector<int32_t> ids) const;
  // The first special token placed before the sequence (BOS), if any.
  std::optional<int32_t> bos_id() const;
  // (id, token) of every special token the template can emit, so they can be decoded.
  const std::vector<std::pair<int32_t, std::string>>& special_tokens() const { return specials_; }

 private:
  struct Item {
    bool is_sequence;
    std::vector<int32_t> ids;
  };
  void parse_into(const Json& value, const JsonPath& path, int depth);
  std::vector<Item> items_{Item{true, {}}};
  std::vector<std::pair<int32_t, std::string>> specials_;
};

}  // namespace kvlens::tok
