// Text helpers for the tokenizer: UTF-8 stepping that accepts any bytes, the character classes the
// split patterns need (\p{L}, \p{N}, \s, \w via ICU), GPT-2's byte <-> printable-char map, and
// plain substring replacement.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvlens::tok {

inline constexpr char32_t kReplacementChar = 0xFFFD;

struct Utf8Step {
  char32_t cp;   // the code point, or U+FFFD for an ill-formed sequence
  uint32_t len;  // bytes consumed (>= 1 whenever i < s.size())
  bool valid;
};
// Decodes the sequence at s[i]. An ill-formed sequence consumes its maximal valid prefix (at least
// one byte), the unit Unicode and Rust's from_utf8_lossy replace with one U+FFFD.
Utf8Step utf8_step(std::string_view s, size_t i);

void append_utf8(std::string& out, char32_t cp);
// Rust's String::from_utf8_lossy: every maximal ill-formed subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);
bool is_valid_utf8(std::string_view bytes);

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };
// \s (White_Space) first, then \p{L}, then \p{N}; everything else is kOther.
CharClass char_class(char32_t cp);
bool is_word_char(char32_t cp);  // regex \w: Alphabetic, marks, Nd, Pc, Join_Control
bool is_white_space(char32_t cp);

// Letter-case classes of the o200k split regex: [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] ("upper") and
// [\p{Ll}\p{Lm}\p{Lo}\p{M}] ("lower"); modifier and other letters and marks are in both.
inline constexpr uint8_t kCaseUpper = 1;
inline constexpr uint8_t kCaseLower = 2;
uint8_t case_class(char32_t cp);

// Unicode NFC of valid UTF-8 runs; ill-formed bytes pass through unchanged (HF only ever sees
// valid text, so there is nothing to match there).
std::string nfc(std::string_view text);

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the rest to U+0100 onwards.
std::string_view byte_to_unicode(uint8_t byte);  // the mapped char as UTF-8
int unicode_to_byte(char32_t cp);                // -1 for chars outside the map

// Replaces every non-overlapping occurrence of `pattern` (non-empty), left to right.
void replace_all(std::string& text, std::string_view pattern, std::string_view content);

}  // namespace kvlens::tok
