// Hand-written matchers for the GPT-2, Llama-3 (cl100k), Qwen2 and o200k split regexes. Each
// alternative of the regex is tried in order at the current position, reproducing the choices a
// backtracking engine makes (including the (?!\S) lookahead, which gives trailing whitespace back
// to the next word).
#include "engine/model/tokenizer_split.h"

#include "engine/model/tokenizer_unicode.h"

#include <cstdint>

namespace kvlens::tok {

const std::string_view kGpt2PatternText =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

constexpr std::string_view kLlama3PatternText =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2PatternText =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// tiktoken's o200k_base (GPT-4o, Phi-4-mini): letter runs split by case, contractions as suffixes.
constexpr std::string_view kO200kPatternText =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// kO200kLlamaCpp's case classes (see tokenizer_split.h).
uint8_t ascii_case_class(char32_t cp) {
  if (char_class(cp) != CharClass::kLetter) return 0;
  if (cp >= 'a' && cp <= 'z') return kCaseLower;
  if (cp >= 'A' && cp <= 'Z') return kCaseUpper;
  return kCaseUpper | kCaseLower;
}

// The text decoded once: code point, class and byte offset per character (offsets has n + 1
// entries so offsets[n] is the end of the text).
struct Chars {
  std::vector<char32_t> cp;
  std::vector<CharClass> cls;
  std::vector<uint8_t> cases;  // case_class() per char, only for the o200k pattern
  std::vector<size_t> offsets;

  Chars(std::string_view text, bool with_cases, bool ascii_cases = false) {
    cp.reserve(text.size());
    cls.reserve(text.size());
    offsets.reserve(text.size() + 1);
    for (size_t i = 0; i < text.size();) {
      const Utf8Step step = utf8_step(text, i);
      cp.push_back(step.cp);
      cls.push_back(char_class(step.cp));
      if (with_cases)
        cases.push_back(ascii_cases ? ascii_case_class(step.cp) : case_class(step.cp));
      offsets.push_back(i);
      i += step.len;
    }
    offsets.push_back(text.size());
  }
  size_t size() const { return cp.size(); }
  size_t run_end(size_t i, CharClass c) const {
    while (i < size() && cls[i] == c) ++i;
    return i;
  }
  bool is(size_t i, CharClass c) const { return i < size() && cls[i] == c; }
  bool has_case(size_t i, uint8_t bit) const { return i < size() && (cases[i] & bit) != 0; }
  size_t case_run_end(size_t i, uint8_t bit) const {
    while (has_case(i, bit)) ++i;
    return i;
  }
};

bool is_newline(char32_t c) {
  return c == '\r' || c == '\n';
}

// 's 't 're 've 'm 'll 'd; returns the match length in chars or 0.
size_t contraction(const Chars& t, size_t i, bool ignore_case) {
  if (t.cp[i] != '\'' || i + 1 >= t.size()) return 0;
  auto fold = [&](char32_t c) -> char32_t {
    if (!ignore_case) return c;
    if (c >= 'A' && c <= 'Z') return c - 'A' + 'a';
    if (c == 0x17F) return 's';  // LATIN SMALL LETTER LONG S case-folds to 's'
    return c;
  };
  const char32_t a = fold(t.cp[i + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= t.size()) return 0;
  const char32_t b = fold(t.cp[i + 2]);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// \s+(?!\S) then \s+, at a whitespace character i.
size_t whitespace_tail(const Chars& t, size_t i) {
  const size_t end = t.run_end(i, CharClass::kSpace);
  // With text after the run, the lookahead fails at `end`; backtracking one char leaves the last
  // space for the next match (" word"). A single space cannot give one back, so \s+ takes it.
  if (end < t.size() && end - i >= 2) return end - 1;
  return end;
}

size_t gpt2_match(const Chars& t, size_t i) {
  if (const size_t len = contraction(t, i, false)) return i + len;
  const bool space = t.cp[i] == ' ';
  for (const CharClass c : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {
    if (space && t.is(i + 1, c)) return t.run_end(i + 1, c);
    if (t.cls[i] == c) return t.run_end(i, c);
  }
  return whitespace_tail(t, i);  // only whitespace is left
}

// The alternatives the Llama-3 (cl100k), Qwen2 and o200k patterns share after their letter ones,
// at i: \p{N}{1,max_digits}, then ' ?[^\s\p{L}\p{N}]+[\r\n]*' (o200k: [\r\n/]*), then
// \s*[\r\n]+, \s+(?!\S) and \s+.
size_t numbers_symbols_spaces(const Chars& t, size_t i, size_t max_digits, bool slash) {
  const CharClass c = t.cls[i];
  if (c == CharClass::kNumber) {
    size_t j = i;
    while (j < t.size() && j - i < max_digits && t.cls[j] == CharClass::kNumber) ++j;
    return j;
  }
  size_t other = t.size();
  if (t.cp[i] == ' ' && t.is(i + 1, CharClass::kOther)) {
    other = i + 1;
  } else if (c == CharClass::kOther) {
    other = i;
  }
  if (other < t.size()) {
    size_t j = t.run_end(other, CharClass::kOther);
    while (j < t.size() && (is_newline(t.cp[j]) || (slash && t.cp[j] == '/'))) ++j;
    return j;
  }
  // \s*[\r\n]+ : the whitespace run up to and including its last newline.
  const size_t end = t.run_end(i, CharClass::kSpace);
  for (size_t k = end; k > i; --k) {
    if (is_newline(t.cp[k - 1])) return k;
  }
  return whitespace_tail(t, i);
}

size_t llama3_match(const Chars& t, size_t i, size_t max_digits) {
  if (const size_t len = contraction(t, i, true)) return i + len;
  const CharClass c = t.cls[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c == CharClass::kLetter) return t.run_end(i, CharClass::kLetter);
  if (c != CharClass::kNumber && !is_newline(t.cp[i]) && t.is(i + 1, CharClass::kLetter)) {
    return t.run_end(i + 1, CharClass::kLetter);
  }
  return numbers_symbols_spaces(t, i, max_digits, false);
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ from s: the end, or 0 for no match.
// The greedy upper run gives chars back one at a time until a lower-class char can start the
// lower run; only chars in both classes (Lm, Lo, marks) can, inside the upper run.
size_t upper_star_lower_plus(const Chars& t, size_t s) {
  const size_t upper_end = t.case_run_end(s, kCaseUpper);
  for (size_t k = upper_end + 1; k-- > s;) {
    if (t.has_case(k, kCaseLower)) return t.case_run_end(k, kCaseLower);
  }
  return 0;
}

// [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* from s: the end, or 0.
size_t upper_plus_lower_star(const Chars& t, size_t s) {
  if (!t.has_case(s, kCaseUpper)) return 0;
  return t.case_run_end(t.case_run_end(s, kCaseUpper), kCaseLower);
}

// [^\r\n\p{L}\p{N}]: marks count (they are not \p{L}), whitespace other than CR/LF too.
bool is_letter_prefix(const Chars& t, size_t i) {
  return i < t.size() && t.cls[i] != CharClass::kLetter && t.cls[i] != CharClass::kNumber &&
         !is_newline(t.cp[i]);
}

size_t o200k_match(const Chars& t, size_t i) {
  // The two letter alternatives, each tried with the optional prefix char first, then without.
  for (const auto letters : {upper_star_lower_plus, upper_plus_lower_star}) {
    size_t end = 0;
    if (is_letter_prefix(t, i)) end = letters(t, i + 1);
    if (end == 0) end = letters(t, i);
    if (end > i) return end + (end < t.size() ? contraction(t, end, true) : 0);
  }
  return numbers_symbols_spaces(t, i, 3, true);
}

}  // namespace

std::optional<SplitPattern> recognize_split_pattern(std::string_view regex) {
  if (regex == kGpt2PatternText) return SplitPattern::kGpt2;
  if (regex == kLlama3PatternText) return SplitPattern::kLlama3;
  if (regex == kQwen2PatternText) return SplitPattern::kQwen2;
  if (regex == kO200kPatternText) return SplitPattern::kO200k;
  return std::nullopt;
}

void split_matches(SplitPattern pattern, std::string_view text,
                   std::vector<std::pair<size_t, size_t>>* out) {
  const bool llama_cpp_cases = pattern == SplitPattern::kO200kLlamaCpp;
  const Chars t(text, pattern == SplitPattern::kO200k || llama_cpp_cases, llama_cpp_cases);
  size_t i = 0;
  while (i < t.size()) {
    size_t end = 0;
    switch (pattern) {
      case SplitPattern::kGpt2:
        end = gpt2_match(t, i);
        break;
      case SplitPattern::kLlama3:
        end = llama3_match(t, i, 3);
        break;
      case SplitPattern::kQwen2:
        end = llama3_match(t, i, 1);
        break;
      case SplitPattern::kO200k:
      case SplitPattern::kO200kLlamaCpp:
        end = o200k_match(t, i);
        break;
    }
    if (end <= i) end = i + 1;  // defensive: always make progress
    out->emplace_back(t.offsets[i], t.offsets[end]);
    i = end;
  }
}

}  // namespace kvlens::tok
