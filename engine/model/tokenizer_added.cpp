// Added-token matching. Added tokens are few and mostly start with '<', so bucketing them by first
// byte (longest first) finds the leftmost-longest match without building an automaton.
#include "engine/model/tokenizer_added.h"

#include "engine/model/tokenizer_unicode.h"

#include <algorithm>

namespace kvlens::tok {

namespace {

// Where the character ending at text[end] begins (a lone continuation byte is its own char).
size_t char_start_before(std::string_view text, size_t end) {
  size_t begin = end - 1;
  while (begin > 0 && end - begin < 4 && (static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) {
    --begin;
  }
  return begin + utf8_step(text, begin).len == end ? begin : end - 1;
}

// The code point that ends text[0, end), end > 0.
char32_t last_char(std::string_view text, size_t end) {
  const size_t begin = char_start_before(text, end);
  const Utf8Step step = utf8_step(text, begin);
  return step.valid ? step.cp : kReplacementChar;
}

}  // namespace

void AddedTokenMatcher::build(std::vector<const AddedToken*> tokens,
                              std::vector<std::string> patterns) {
  tokens_ = std::move(tokens);
  patterns_ = std::move(patterns);
  by_first_byte_.assign(256, {});
  for (uint32_t i = 0; i < patterns_.size(); ++i) {
    if (patterns_[i].empty()) continue;
    by_first_byte_[static_cast<unsigned char>(patterns_[i][0])].push_back(i);
  }
  for (auto& bucket : by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [&](uint32_t a, uint32_t b) {
      return patterns_[a].size() > patterns_[b].size();
    });
  }
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>* out) const {
  if (text.empty()) return;
  size_t emitted = 0;  // text before this offset is already covered by segments
  size_t pos = 0;
  while (pos < text.size() && !patterns_.empty()) {
    // Leftmost start first, then the longest pattern there.
    size_t start = text.size();
    int match = -1;
    for (size_t i = pos; i < text.size() && match < 0; ++i) {
      for (const uint32_t k : by_first_byte_[static_cast<unsigned char>(text[i])]) {
        if (text.compare(i, patterns_[k].size(), patterns_[k]) == 0) {
          start = i;
          match = static_cast<int>(k);
          break;
        }
      }
    }
    if (match < 0) break;
    const AddedToken& token = *tokens_[static_cast<size_t>(match)];
    size_t stop = start + patterns_[static_cast<size_t>(match)].size();
    pos = stop;
    if (token.single_word) {
      const bool space_before = start == 0 || !is_word_char(last_char(text, start));
      const bool space_after = stop == text.size() || !is_word_char(utf8_step(text, stop).cp);
      if (!space_before || !space_after) continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > emitted && is_white_space(last_char(text, s))) s = char_start_before(text, s);
      start = std::max(s, emitted);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        const Utf8Step step = utf8_step(text, stop);
        if (!step.valid || !is_white_space(step.cp)) break;
        stop += step.len;
      }
      pos = stop;
    }
    if (emitted < start) out->push_back(Segment{emitted, start, -1});
    out->push_back(Segment{start, stop, token.id});
    emitted = stop;
  }
  if (emitted < text.size()) out->push_back(Segment{emitted, text.size(), -1});
}

}  // namespace kvlens::tok
