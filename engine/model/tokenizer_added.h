// Added tokens (tokenizer.json "added_tokens"): matched in the text before the model sees it, with
// HF's leftmost-longest rule and the single_word / lstrip / rstrip options.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvlens::tok {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// A run of text: either an added token (id >= 0) or plain text to tokenize (id == -1).
struct Segment {
  size_t begin;
  size_t end;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text that stands for `tokens[i]` (its content, normalized when the token
  // is matched against normalized text). Earlier tokens win ties between equal patterns.
  void build(std::vector<const AddedToken*> tokens, std::vector<std::string> patterns);
  bool empty() const { return patterns_.empty(); }
  // Covers `text` with segments; empty text gives no segments.
  void split(std::string_view text, std::vector<Segment>* out) const;

 private:
  std::vector<const AddedToken*> tokens_;
  std::vector<std::string> patterns_;
  std::vector<std::vector<uint32_t>> by_first_byte_;  // pattern indexes, longest first
};

}  // namespace kvlens::tok
