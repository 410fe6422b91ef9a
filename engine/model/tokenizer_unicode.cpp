// Unicode helpers for the tokenizer. Character classes and NFC come from ICU; the Basic
// Multilingual Plane is tabulated once because the split patterns classify every character of
// every input.
#include "engine/model/tokenizer_unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <array>
#include <vector>

namespace kvlens::tok {

Utf8Step utf8_step(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return {b0, 1, true};
  uint32_t need = 0;
  char32_t cp = 0;
  // The allowed range of the second byte depends on the lead byte (Unicode table 3-7); this is
  // what rules out overlongs, surrogates and values above U+10FFFF.
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {kReplacementChar, 1, false};
  }
  uint32_t len = 1;
  for (uint32_t k = 0; k < need; ++k) {
    if (i + len >= s.size()) return {kReplacementChar, len, false};
    const unsigned char b = byte(i + len);
    if (k == 0 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return {kReplacementChar, len, false};
    cp = (cp << 6) | (b & 0x3F);
    ++len;
  }
  return {cp, len, true};
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = kReplacementChar;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const Utf8Step step = utf8_step(bytes, i);
    if (step.valid) {
      out.append(bytes.substr(i, step.len));
    } else {
      append_utf8(out, kReplacementChar);
    }
    i += step.len;
  }
  return out;
}

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Step step = utf8_step(bytes, i);
    if (!step.valid) return false;
    i += step.len;
  }
  return true;
}

namespace {

CharClass classify_with_icu(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) return CharClass::kSpace;
  switch (u_charType(c)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
}

const std::vector<CharClass>& bmp_classes() {
  static const std::vector<CharClass> table = [] {
    std::vector<CharClass> t(0x10000);
    for (char32_t cp = 0; cp < 0x10000; ++cp) t[cp] = classify_with_icu(cp);
    return t;
  }();
  return table;
}

uint8_t case_class_with_icu(char32_t cp) {
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_UPPERCASE_LETTER:
    case U_TITLECASE_LETTER:
      return kCaseUpper;
    case U_LOWERCASE_LETTER:
      return kCaseLower;
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
      return kCaseUpper | kCaseLower;
    default:
      return 0;
  }
}

const std::vector<uint8_t>& bmp_case_classes() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(0x10000);
    for (char32_t cp = 0; cp < 0x10000; ++cp) t[cp] = case_class_with_icu(cp);
    return t;
  }();
  return table;
}

struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 512> from_unicode;  // every mapped char is below U+0200
};

const ByteMap& byte_map() {
  static const ByteMap map = [] {
    ByteMap m;
    m.from_unicode.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      append_utf8(m.to_unicode[b], cp);
      m.from_unicode[cp] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return map;
}

}  // namespace

CharClass char_class(char32_t cp) {
  if (cp < 0x10000) return bmp_classes()[cp];
  if (cp > 0x10FFFF) return CharClass::kOther;
  return classify_with_icu(cp);
}

uint8_t case_class(char32_t cp) {
  if (cp < 0x10000) return bmp_case_classes()[cp];
  if (cp > 0x10FFFF) return 0;
  return case_class_with_icu(cp);
}

std::string nfc(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status)) return std::string(text);  // no ICU data: leave the text as it is
  std::string out;
  out.reserve(text.size());
  // Normalize each maximal run of well-formed UTF-8 on its own.
  size_t i = 0;
  while (i < text.size()) {
    size_t end = i;
    while (end < text.size()) {
      const Utf8Step step = utf8_step(text, end);
      if (!step.valid) break;
      end += step.len;
    }
    if (end > i) {
      const icu::StringPiece run(text.data() + i, static_cast<int32_t>(end - i));
      status = U_ZERO_ERROR;
      if (normalizer->isNormalizedUTF8(run, status) && U_SUCCESS(status)) {
        out.append(text.substr(i, end - i));
      } else {
        status = U_ZERO_ERROR;
        icu::StringByteSink<std::string> sink(&out);
        normalizer->normalizeUTF8(0, run, sink, nullptr, status);
      }
      i = end;
    }
    if (i < text.size()) {  // an ill-formed sequence: copied byte for byte
      const Utf8Step step = utf8_step(text, i);
      out.append(text.substr(i, step.len));
      i += step.len;
    }
  }
  return out;
}

bool is_white_space(char32_t cp) {
  return char_class(cp) == CharClass::kSpace;
}

bool is_word_char(char32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  if (u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  switch (u_charType(c)) {
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

std::string_view byte_to_unicode(uint8_t byte) {
  return byte_map().to_unicode[byte];
}

int unicode_to_byte(char32_t cp) {
  if (cp >= 512) return -1;
  return byte_map().from_unicode[cp];
}

void replace_all(std::string& text, std::string_view pattern, std::string_view content) {
  if (pattern.empty()) return;
  size_t at = text.find(pattern);
  if (at == std::string::npos) return;
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t from = 0;
  for (; at != std::string::npos; at = text.find(pattern, from)) {
    out.append(text, from, at - from);
    out.append(content);
    from = at + pattern.size();
  }
  out.append(text, from, std::string::npos);
  text = std::move(out);
}

}  // namespace kvlens::tok
