// Normalizer and pre-tokenizer steps: SentencePiece-style Prepend/Replace normalization and NFC
// (Qwen2), and the ByteLevel, Split, Metaspace and Digits pre-tokenizers that cut normalized text
// into BPE words.
#include "engine/common/error.h"
#include "engine/model/tokenizer_pipeline.h"
#include "engine/model/tokenizer_unicode.h"

namespace kvlens::tok {

namespace {

// Replace patterns are {"String": s} (supported) or {"Regex": r} (not).
std::string string_pattern(const Json& object, const JsonPath& path) {
  const JsonPath pattern_path = path.child("pattern");
  const Json& pattern = required_member(object, "pattern", path);
  const Json* text = optional_member(expect_object(pattern, pattern_path), "String", pattern_path);
  if (!text) pattern_path.fail("{\"String\": ...} (regex patterns are not supported)", &pattern);
  const std::string& s = expect_string(*text, pattern_path.child("String"));
  if (s.empty()) pattern_path.child("String").fail("a non-empty string", text);
  return s;
}

PrependScheme parse_prepend_scheme(const Json& object, const JsonPath& path) {
  if (const Json* scheme = optional_member(object, "prepend_scheme", path)) {
    const std::string& name = expect_string(*scheme, path.child("prepend_scheme"));
    if (name == "always") return PrependScheme::kAlways;
    if (name == "first") return PrependScheme::kFirst;
    if (name == "never") return PrependScheme::kNever;
    path.child("prepend_scheme").fail("\"always\", \"first\" or \"never\"", scheme);
  }
  // Files written before prepend_scheme existed only say add_prefix_space.
  return bool_or(object, "add_prefix_space", true, path) ? PrependScheme::kAlways
                                                         : PrependScheme::kNever;
}

}  // namespace

// ---- Normalizer ----

Normalizer Normalizer::parse(const Json* value, const JsonPath& path) {
  Normalizer n;
  if (value) n.parse_into(*value, path, 0);
  return n;
}

void Normalizer::parse_into(const Json& value, const JsonPath& path, int depth) {
  if (depth > kMaxNesting) path.fail("at most " + std::to_string(kMaxNesting) + " nested levels");
  const std::string& type = type_field(value, path);
  if (type == "Sequence") {
    const JsonPath list_path = path.child("normalizers");
    const Json& list = expect_array(required_member(value, "normalizers", path), list_path);
    for (size_t i = 0; i < list.size(); ++i) parse_into(list[i], list_path.index(i), depth + 1);
  } else if (type == "Prepend") {
    steps_.push_back({Kind::kPrepend,
                      expect_string(required_member(value, "prepend", path), path.child("prepend")),
                      {}});
  } else if (type == "Replace") {
    std::string pattern = string_pattern(value, path);
    steps_.push_back(
        {Kind::kReplace, std::move(pattern),
         expect_string(required_member(value, "content", path), path.child("content"))});
  } else if (type == "NFC") {
    steps_.push_back({Kind::kNfc, {}, {}});
  } else {
    path.child("type").fail("a supported normalizer (Sequence, Prepend, Replace, NFC)",
                            &value.at("type"));
  }
}

std::string Normalizer::apply(std::string_view text) const {
  std::string s(text);
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kPrepend:
        if (!s.empty()) s.insert(0, step.text);
        break;
      case Kind::kReplace:
        replace_all(s, step.text, step.content);
        break;
      case Kind::kNfc:
        s = nfc(s);
        break;
    }
  }
  return s;
}

// ---- PreTokenizer ----

PreTokenizer PreTokenizer::parse(const Json* value, const JsonPath& path) {
  PreTokenizer p;
  if (value) p.parse_into(*value, path, 0);
  return p;
}

void PreTokenizer::parse_into(const Json& value, const JsonPath& path, int depth) {
  if (depth > kMaxNesting) path.fail("at most " + std::to_string(kMaxNesting) + " nested levels");
  const std::string& type = type_field(value, path);
  Step step;
  if (type == "Sequence") {
    const JsonPath list_path = path.child("pretokenizers");
    const Json& list = expect_array(required_member(value, "pretokenizers", path), list_path);
    for (size_t i = 0; i < list.size(); ++i) parse_into(list[i], list_path.index(i), depth + 1);
    return;
  } else if (type == "ByteLevel") {
    step.flag = bool_or(value, "add_prefix_space", true, path);
    step.use_regex = bool_or(value, "use_regex", true, path);
  } else if (type == "Split") {
    step.kind = Kind::kSplit;
    const JsonPath pattern_path = path.child("pattern");
    const Json& pattern = expect_object(required_member(value, "pattern", path), pattern_path);
    const Json* regex = optional_member(pattern, "Regex", pattern_path);
    const std::string expected =
        "a supported Split regex (the GPT-2, Llama-3/cl100k, Qwen2 or o200k pattern)";
    if (!regex) pattern_path.fail(expected, &pattern);
    const auto recognized =
        recognize_split_pattern(expect_string(*regex, pattern_path.child("Regex")));
    if (!recognized) pattern_path.child("Regex").fail(expected, regex);
    step.pattern = *recognized;
    // These patterns tile the text with matches, so keeping the matches as words is all there is:
    // "Isolated" keeps them and the (empty) gaps, "Removed" with invert keeps the matches and
    // drops the gaps (tiktoken-converted files such as cl100k/o200k ones use the latter). The
    // other behaviors would glue matches together.
    const std::string behavior = string_or(value, "behavior", "Isolated", path);
    const bool invert = bool_or(value, "invert", false, path);
    const bool keeps_matches =
        (behavior == "Isolated" && !invert) || (behavior == "Removed" && invert);
    if (!keeps_matches) {
      path.child("behavior")
          .fail("\"Isolated\" with invert false, or \"Removed\" with invert true (found invert " +
                    std::string(invert ? "true" : "false") + ")",
                optional_member(value, "behavior", path));
    }
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.replacement = char_or(value, "replacement", "\xE2\x96\x81", path);
    step.scheme = parse_prepend_scheme(value, path);
    step.flag = bool_or(value, "split", true, path);
  } else if (type == "Digits") {
    step.kind = Kind::kDigits;
    step.flag = bool_or(value, "individual_digits", false, path);
  } else {
    path.child("type").fail(
        "a supported pre_tokenizer (Sequence, ByteLevel, Split, Metaspace, Digits)",
        &value.at("type"));
  }
  steps_.push_back(std::move(step));
}

void PreTokenizer::apply(std::vector<Piece>* pieces) const {
  std::vector<Piece> next;
  for (const Step& step : steps_) {
    next.clear();
    next.reserve(pieces->size());
    for (const Piece& piece : *pieces) apply_step(step, piece, &next);
    pieces->swap(next);
  }
  std::erase_if(*pieces, [](const Piece& p) { return p.text.empty(); });
}

void PreTokenizer::apply_step(const Step& step, const Piece& piece, std::vector<Piece>* out) const {
  const auto emit = [&](std::string text, bool at_start) {
    if (!text.empty()) out->push_back(Piece{std::move(text), at_start});
  };
  switch (step.kind) {
    case Kind::kByteLevel: {
      std::string text = piece.text;
      if (step.flag && (text.empty() || text[0] != ' ')) text.insert(0, 1, ' ');
      std::vector<std::pair<size_t, size_t>> ranges;
      if (step.use_regex) {
        split_matches(SplitPattern::kGpt2, text, &ranges);
      } else {
        ranges.emplace_back(0, text.size());
      }
      for (const auto& [begin, end] : ranges) {
        std::string mapped;
        mapped.reserve((end - begin) * 2);
        for (size_t i = begin; i < end; ++i) {
          mapped += byte_to_unicode(static_cast<uint8_t>(text[i]));
        }
        emit(std::move(mapped), piece.at_start && begin == 0);
      }
      break;
    }
    case Kind::kSplit: {
      std::vector<std::pair<size_t, size_t>> ranges;
      split_matches(step.pattern, piece.text, &ranges);
      for (const auto& [begin, end] : ranges) {
        emit(piece.text.substr(begin, end - begin), piece.at_start && begin == 0);
      }
      break;
    }
    case Kind::kMetaspace: {
      std::string text = piece.text;
      replace_all(text, " ", step.replacement);
      const bool starts = text.compare(0, step.replacement.size(), step.replacement) == 0;
      if (!starts && (step.scheme == PrependScheme::kAlways ||
                      (step.scheme == PrependScheme::kFirst && piece.at_start))) {
        text.insert(0, step.replacement);
      }
      if (!step.flag) {
        emit(std::move(text), piece.at_start);
        break;
      }
      // Split before every replacement char, keeping it at the start of the next word.
      size_t begin = 0;
      for (size_t at = text.find(step.replacement, 1); at != std::string::npos;
           at = text.find(step.replacement, at + 1)) {
        emit(text.substr(begin, at - begin), piece.at_start && begin == 0);
        begin = at;
      }
      emit(text.substr(begin), piece.at_start && begin == 0);
      break;
    }
    case Kind::kDigits: {
      const std::string& text = piece.text;
      size_t begin = 0;
      bool in_digits = false;
      for (size_t i = 0; i < text.size();) {
        const Utf8Step s = utf8_step(text, i);
        const bool digit = char_class(s.cp) == CharClass::kNumber;
        if (i > begin && (digit != in_digits || (digit && step.flag))) {
          emit(text.substr(begin, i - begin), piece.at_start && begin == 0);
          begin = i;
        }
        in_digits = digit;
        i += s.len;
      }
      emit(text.substr(begin), piece.at_start && begin == 0);
      break;
    }
  }
}

}  // namespace kvlens::tok
