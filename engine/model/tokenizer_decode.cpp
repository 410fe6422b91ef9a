// Decoder steps (Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace) turning token strings
// back into text, and the post-processor (TemplateProcessing, ByteLevel, Sequence) that adds
// special tokens such as BOS around an encoded sequence.
#include "engine/common/error.h"
#include "engine/model/tokenizer_pipeline.h"
#include "engine/model/tokenizer_unicode.h"

#include <map>

namespace kvlens::tok {

namespace {

// "<0xAB>" -> 0xAB; -1 for anything else.
int byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (int k = 3; k < 5; ++k) {
    const char c = token[static_cast<size_t>(k)];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

void byte_fallback(std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string bytes;
  size_t byte_count = 0;
  const auto flush = [&] {
    if (byte_count == 0) return;
    if (is_valid_utf8(bytes)) {
      out.push_back(bytes);
    } else {
      // Invalid byte runs decode to one U+FFFD per byte token, as HF's ByteFallback does.
      for (size_t i = 0; i < byte_count; ++i) out.emplace_back("\xEF\xBF\xBD");
    }
    bytes.clear();
    byte_count = 0;
  };
  for (std::string& token : tokens) {
    const int value = byte_token_value(token);
    if (value >= 0) {
      bytes += static_cast<char>(value);
      ++byte_count;
    } else {
      flush();
      out.push_back(std::move(token));
    }
  }
  flush();
  tokens = std::move(out);
}

void byte_level(std::vector<std::string>& tokens) {
  std::string bytes;
  for (const std::string& token : tokens) {
    // A token with any char outside the byte map (e.g. an added token) contributes its raw bytes.
    const size_t mark = bytes.size();
    bool mapped = true;
    for (size_t i = 0; i < token.size();) {
      const Utf8Step step = utf8_step(token, i);
      const int b = step.valid ? unicode_to_byte(step.cp) : -1;
      if (b < 0) {
        mapped = false;
        break;
      }
      bytes += static_cast<char>(b);
      i += step.len;
    }
    if (!mapped) {
      bytes.resize(mark);
      bytes += token;
    }
  }
  tokens.assign(1, utf8_lossy(bytes));
}

}  // namespace

// ---- Decoder ----

Decoder Decoder::parse(const Json* value, const JsonPath& path) {
  Decoder d;
  if (value) {
    d.present_ = true;
    d.parse_into(*value, path, 0);
  }
  return d;
}

void Decoder::parse_into(const Json& value, const JsonPath& path, int depth) {
  if (depth > kMaxNesting) path.fail("at most " + std::to_string(kMaxNesting) + " nested levels");
  const std::string& type = type_field(value, path);
  Step step;
  if (type == "Sequence") {
    const JsonPath list_path = path.child("decoders");
    const Json& list = expect_array(required_member(value, "decoders", path), list_path);
    for (size_t i = 0; i < list.size(); ++i) parse_into(list[i], list_path.index(i), depth + 1);
    return;
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    const JsonPath pattern_path = path.child("pattern");
    const Json& pattern = expect_object(required_member(value, "pattern", path), pattern_path);
    const Json* text = optional_member(pattern, "String", pattern_path);
    if (!text) pattern_path.fail("{\"String\": ...} (regex patterns are not supported)", &pattern);
    step.pattern = expect_string(*text, pattern_path.child("String"));
    step.content = expect_string(required_member(value, "content", path), path.child("content"));
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    step.pattern = char_or(value, "content", " ", path);
    step.start = static_cast<size_t>(int_or(value, "start", 0, path, 0, 1 << 20));
    step.stop = static_cast<size_t>(int_or(value, "stop", 0, path, 0, 1 << 20));
  } else if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    step.pattern = char_or(value, "replacement", "\xE2\x96\x81", path);
    std::string scheme = string_or(value, "prepend_scheme", "", path);
    if (scheme.empty()) {
      step.prepend = bool_or(value, "add_prefix_space", true, path);
    } else if (scheme == "always" || scheme == "first" || scheme == "never") {
      step.prepend = scheme != "never";
    } else {
      path.child("prepend_scheme")
          .fail("\"always\", \"first\" or \"never\"",
                optional_member(value, "prepend_scheme", path));
    }
  } else {
    path.child("type").fail(
        "a supported decoder (Sequence, Replace, ByteFallback, Fuse, Strip, ByteLevel, Metaspace)",
        &value.at("type"));
  }
  steps_.push_back(std::move(step));
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (!present_) {
    std::string joined;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) joined += ' ';
      joined += tokens[i];
    }
    return joined;
  }
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kReplace:
        for (std::string& t : tokens) replace_all(t, step.pattern, step.content);
        break;
      case Kind::kByteFallback:
        byte_fallback(tokens);
        break;
      case Kind::kFuse: {
        std::string fused;
        for (const std::string& t : tokens) fused += t;
        tokens.assign(1, std::move(fused));
        break;
      }
      case Kind::kStrip:
        for (std::string& t : tokens) {
          const std::string& c = step.pattern;
          size_t cut = 0;
          for (size_t k = 0; k < step.start && t.compare(cut, c.size(), c) == 0; ++k) {
            cut += c.size();
          }
          t.erase(0, cut);
          for (size_t k = 0; k < step.stop && t.size() >= c.size() &&
                             t.compare(t.size() - c.size(), c.size(), c) == 0;
               ++k) {
            t.resize(t.size() - c.size());
          }
        }
        break;
      case Kind::kByteLevel:
        byte_level(tokens);
        break;
      case Kind::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          // HF drops every replacement char of the first token (not just a leading one) when a
          // prefix was prepended at encode time.
          replace_all(tokens[i], step.pattern, i == 0 && step.prepend ? "" : " ");
        }
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

// ---- PostProcessor ----

PostProcessor PostProcessor::parse(const Json* value, const JsonPath& path) {
  PostProcessor p;
  if (value) p.parse_into(*value, path, 0);
  return p;
}

void PostProcessor::parse_into(const Json& value, const JsonPath& path, int depth) {
  if (depth > kMaxNesting) path.fail("at most " + std::to_string(kMaxNesting) + " nested levels");
  const std::string& type = type_field(value, path);
  if (type == "Sequence") {
    const JsonPath list_path = path.child("processors");
    const Json& list = expect_array(required_member(value, "processors", path), list_path);
    for (size_t i = 0; i < list.size(); ++i) parse_into(list[i], list_path.index(i), depth + 1);
    return;
  }
  if (type == "ByteLevel") return;  // only adjusts offsets, which kvlens does not track
  if (type != "TemplateProcessing") {
    path.child("type").fail("a supported post_processor (TemplateProcessing, ByteLevel, Sequence)",
                            &value.at("type"));
  }

  // special_tokens: {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}, ...}
  const JsonPath specials_path = path.child("special_tokens");
  std::map<std::string, std::vector<int32_t>, std::less<>> specials;
  if (const Json* list = optional_member(value, "special_tokens", path)) {
    expect_object(*list, specials_path);
    for (auto it = list->begin(); it != list->end(); ++it) {
      const JsonPath entry_path = specials_path.child(it.key());
      const Json& entry = expect_object(it.value(), entry_path);
      const Json& ids =
          expect_array(required_member(entry, "ids", entry_path), entry_path.child("ids"));
      const Json* tokens = optional_member(entry, "tokens", entry_path);
      if (tokens) expect_array(*tokens, entry_path.child("tokens"));
      std::vector<int32_t>& out = specials[it.key()];
      for (size_t i = 0; i < ids.size(); ++i) {
        const auto id = static_cast<int32_t>(
            expect_int(ids[i], entry_path.child("ids").index(i), 0, kMaxTokenId));
        out.push_back(id);
        std::string token = it.key();
        if (tokens && i < tokens->size()) {
          token = expect_string((*tokens)[i], entry_path.child("tokens").index(i));
        }
        specials_.emplace_back(id, std::move(token));
      }
    }
  }

  const JsonPath single_path = path.child("single");
  const Json& single = expect_array(required_member(value, "single", path), single_path);
  std::vector<Item> items;
  for (size_t i = 0; i < single.size(); ++i) {
    const JsonPath item_path = single_path.index(i);
    const Json& item = expect_object(single[i], item_path);
    if (const Json* special = optional_member(item, "SpecialToken", item_path)) {
      const JsonPath special_path = item_path.child("SpecialToken");
      const std::string& name =
          expect_string(required_member(expect_object(*special, special_path), "id", special_path),
                        special_path.child("id"));
      const auto found = specials.find(name);
      if (found == specials.end()) {
        special_path.child("id").fail("a token listed in special_tokens", &special->at("id"));
      }
      items.push_back(Item{false, found->second});
    } else if (const Json* sequence = optional_member(item, "Sequence", item_path)) {
      const JsonPath sequence_path = item_path.child("Sequence");
      const std::string& id = expect_string(
          required_member(expect_object(*sequence, sequence_path), "id", sequence_path),
          sequence_path.child("id"));
      if (id != "A")
        sequence_path.child("id").fail("\"A\" in the single template", &sequence->at("id"));
      // Wrapping what earlier processors of a Sequence produced, as applying them in turn would.
      items.insert(items.end(), items_.begin(), items_.end());
    } else {
      item_path.fail("{\"SpecialToken\": ...} or {\"Sequence\": ...}", &item);
    }
  }
  items_ = std::move(items);
}

std::vector<int32_t> PostProcessor::apply(std::vector<int32_t> ids) const {
  if (items_.size() == 1 && items_[0].is_sequence) return ids;
  std::vector<int32_t> out;
  for (const Item& item : items_) {
    if (item.is_sequence) {
      out.insert(out.end(), ids.begin(), ids.end());
    } else {
      out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
  }
  return out;
}

std::optional<int32_t> PostProcessor::bos_id() const {
  for (const Item& item : items_) {
    if (item.is_sequence) break;
    if (!item.ids.empty()) return item.ids.front();
  }
  return std::nullopt;
}

}  // namespace kvlens::tok
