// GGUF tokenizer: llama.cpp's algorithms over tokenizer.ggml.* metadata. Special tokens are cut
// out of the text longest first; the rest goes to byte-level BPE (pre-tokenizer regexes as
// hand-written matchers, byte-mapped words, rank-ordered merges) or SentencePiece-style BPE
// (score-ordered merges of adjacent symbols, <0xNN> bytes for what forms no token).
#include "engine/model/tokenizer_gguf.h"

#include "engine/common/error.h"
#include "engine/model/tokenizer_split.h"
#include "engine/model/tokenizer_unicode.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <cctype>
#include <mutex>
#include <queue>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace kvlens {

namespace {

// Token attributes as llama.cpp derives them from token types (a bit set, so specials can be
// tested together).
enum Attr : uint16_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1 << 0,
  kAttrUnused = 1 << 1,
  kAttrNormal = 1 << 2,
  kAttrControl = 1 << 3,
  kAttrUserDefined = 1 << 4,
  kAttrByte = 1 << 5,
  kAttrLstrip = 1 << 7,
  kAttrRstrip = 1 << 8,
};

uint16_t attr_of_type(int32_t type) {
  switch (static_cast<GgufTokenType>(type)) {
    case GgufTokenType::kUnknown:
      return kAttrUnknown;
    case GgufTokenType::kUnused:
      return kAttrUnused;
    case GgufTokenType::kNormal:
      return kAttrNormal;
    case GgufTokenType::kControl:
      return kAttrControl;
    case GgufTokenType::kUserDefined:
      return kAttrUserDefined;
    case GgufTokenType::kByte:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

// How a "gpt2" vocabulary splits text into words before merging.
enum class PreSplit {
  kDefault,     // punctuation runs, GPT-2 regex, number runs, 3-digit groups (llama.cpp's default)
  kGpt2,        // the GPT-2 regex
  kDigitsGpt2,  // every \p{N} char alone, then the GPT-2 regex in each piece (smollm, starcoder)
  kLlama3,      // the Llama-3 (cl100k) regex
  kQwen2,       // the Llama-3 regex with single digits
  kGpt4o,       // the o200k regex as llama.cpp runs it (Phi-4-mini's "gpt-4o")
};

struct PreTokenizerSpec {
  const char* name;
  PreSplit split;
  bool clean_spaces;
  bool ignore_merges;
  bool add_bos;  // the default when tokenizer.ggml.add_bos_token is absent
};

// The names llama.cpp maps to each behaviour (llama-vocab.cpp), for the families kvlens runs.
constexpr PreTokenizerSpec kPreTokenizers[] = {
    {"default", PreSplit::kDefault, true, false, false},
    {"gpt-2", PreSplit::kGpt2, true, false, false},
    {"phi-2", PreSplit::kGpt2, true, false, false},
    {"smollm", PreSplit::kDigitsGpt2, false, false, false},
    {"starcoder", PreSplit::kDigitsGpt2, true, false, false},
    {"refact", PreSplit::kDigitsGpt2, true, false, false},
    {"codeshell", PreSplit::kDigitsGpt2, true, false, false},
    {"llama-bpe", PreSplit::kLlama3, true, true, true},
    {"llama3", PreSplit::kLlama3, true, true, true},
    {"llama-v3", PreSplit::kLlama3, true, true, true},
    {"qwen2", PreSplit::kQwen2, false, false, false},
    {"deepseek-r1-qwen", PreSplit::kQwen2, false, false, false},
    {"stablelm2", PreSplit::kQwen2, true, false, false},
    {"gpt-4o", PreSplit::kGpt4o, false, false, false},
    {"llama4", PreSplit::kGpt4o, false, false, false},
};

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out;
}

bool c_isspace(char c) {
  return std::isspace(static_cast<unsigned char>(c)) != 0;
}

// llama.cpp's UTF-8 reading of raw text before the BPE split: a byte that does not start a
// well-formed sequence (by lead-byte pattern and continuation bytes only) becomes U+FFFD.
std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  auto cont = [&](size_t k) {
    return k < text.size() && (static_cast<unsigned char>(text[k]) & 0xC0) == 0x80;
  };
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    size_t len = 0;
    if (!(b & 0x80)) {
      len = 1;
    } else if (!(b & 0x40)) {
      len = 0;
    } else if (!(b & 0x20)) {
      len = cont(i + 1) ? 2 : 0;
    } else if (!(b & 0x10)) {
      len = cont(i + 1) && cont(i + 2) ? 3 : 0;
    } else if (!(b & 0x08)) {
      len = cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    }
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(text.substr(i, len));
      i += len;
    }
  }
  return out;
}

size_t utf8_lead_len(char c) {
  static constexpr size_t kLookup[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLookup[static_cast<unsigned char>(c) >> 4];
}

// Distinct words whose ids are remembered; real text needs far fewer, and a text of random
// words cannot grow the cache without bound.
constexpr size_t kMaxCachedWords = 1 << 17;

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <typename V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// A symbol of a word being merged: a byte range of the word, linked to its neighbours.
struct Symbol {
  int prev;
  int next;
  size_t begin;
  size_t size;
};

// `text` as a doubly linked list of UTF-8 characters, the start of both BPE flavours' merging.
std::vector<Symbol> utf8_symbols(const std::string& text) {
  std::vector<Symbol> symbols;
  for (size_t offset = 0; offset < text.size();) {
    const size_t len = std::min(text.size() - offset, utf8_lead_len(text[offset]));
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, offset + len == text.size() ? -1 : index + 1, offset, len});
    offset += len;
  }
  return symbols;
}

class GgufTokenizer final : public tok::TokenizerEngine {
 public:
  GgufTokenizer(const GgufTokenizerData& data, const std::string& source);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const auto it = ids_.find(token);
    if (it == ids_.end()) return std::nullopt;
    return it->second;
  }
  // The BOS that encode() adds (Tokenizer::bos_id's meaning), not merely the one the file names.
  std::optional<int32_t> bos_id() const override {
    if (!add_bos_ || bos_ < 0) return std::nullopt;
    return bos_;
  }
  const std::string& source() const override { return source_; }

 private:
  struct Fragment {
    size_t begin;
    size_t size;
    int32_t token;  // -1: raw text
  };
  [[noreturn]] void fail(const std::string& field, const std::string& expected,
                         const std::string& found = {}) const {
    throw Error(source_, field, expected, found);
  }
  void mark_tokens_by_text(const GgufTokenizerData& data);
  std::vector<Fragment> partition(std::string_view text) const;
  void bpe_text(std::string_view text, std::vector<int32_t>* out) const;
  void bpe_word(const std::string& word, std::vector<int32_t>* out) const;
  void spm_text(const std::string& text, std::vector<int32_t>* out) const;
  int32_t rank(std::string_view left, std::string_view right) const;
  int32_t byte_token(uint8_t byte) const;
  std::string piece(int32_t id, bool render_special) const;

  std::string source_;
  bool spm_ = false;
  PreSplit split_ = PreSplit::kGpt2;
  bool clean_spaces_ = false;
  bool ignore_merges_ = false;
  bool add_space_prefix_ = false;
  bool add_bos_ = false;
  bool add_eos_ = false;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;
  std::vector<std::string> tokens_;
  std::vector<uint16_t> attrs_;
  std::vector<float> scores_;
  StringMap<int32_t> ids_;
  StringMap<int32_t> ranks_;       // "<left size> left right" -> merge rank
  std::vector<int32_t> specials_;  // matched in the text, longest first
  int32_t byte_ids_[256];

  // Words repeat: their ids are cached (behind a pointer so encode() stays const and the
  // tokenizer movable).
  struct Cache {
    std::mutex mutex;
    StringMap<std::vector<int32_t>> words;
  };
  std::unique_ptr<Cache> cache_ = std::make_unique<Cache>();
};

std::string rank_key(std::string_view left, std::string_view right) {
  std::string key = std::to_string(left.size());
  key += ' ';
  key += left;
  key += right;
  return key;
}

GgufTokenizer::GgufTokenizer(const GgufTokenizerData& data, const std::string& source)
    : source_(source) {
  const PreTokenizerSpec* pre = nullptr;
  if (data.model == "llama") {
    spm_ = true;
  } else if (data.model == "gpt2") {
    const std::string name = data.pre.empty() ? "default" : data.pre;
    for (const PreTokenizerSpec& spec : kPreTokenizers) {
      if (name == spec.name) pre = &spec;
    }
    if (!pre) {
      fail("tokenizer.ggml.pre", "one of " + join_names(supported_gguf_pre_tokenizers()),
           "\"" + data.pre + "\"");
    }
    split_ = pre->split;
    clean_spaces_ = pre->clean_spaces;
    ignore_merges_ = pre->ignore_merges;
  } else {
    fail("tokenizer.ggml.model", "\"gpt2\" (byte-level BPE) or \"llama\" (SentencePiece-style BPE)",
         "\"" + data.model + "\"");
  }

  const size_t n = data.tokens.size();
  if (n == 0) fail("tokenizer.ggml.tokens", "a non-empty list of tokens");
  if (n > static_cast<size_t>(INT32_MAX)) fail("tokenizer.ggml.tokens", "at most 2^31-1 tokens");
  if (!data.scores.empty() && data.scores.size() < n) {
    fail("tokenizer.ggml.scores", "one score per token (" + std::to_string(n) + ")",
         std::to_string(data.scores.size()));
  }
  if (!data.token_types.empty() && data.token_types.size() < n) {
    fail("tokenizer.ggml.token_type", "one type per token (" + std::to_string(n) + ")",
         std::to_string(data.token_types.size()));
  }
  tokens_.resize(n);
  attrs_.resize(n);
  scores_.resize(n);
  ids_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    // llama.cpp keeps an empty token distinct under a placeholder text; the last of equal texts
    // owns the text.
    tokens_[i] = data.tokens[i].empty() ? "[EMPTY_" + std::to_string(i) + "]" : data.tokens[i];
    ids_[tokens_[i]] = static_cast<int32_t>(i);
    attrs_[i] =
        data.token_types.empty() ? uint16_t{kAttrNormal} : attr_of_type(data.token_types[i]);
    scores_[i] = data.scores.empty() ? 0.0f : data.scores[i];
  }

  if (!spm_) {
    if (data.merges.empty()) fail("tokenizer.ggml.merges", "the merges of a \"gpt2\" vocabulary");
    ranks_.reserve(data.merges.size());
    for (size_t i = 0; i < data.merges.size(); ++i) {
      const std::string& merge = data.merges[i];
      const size_t space = merge.find(' ', 1);
      std::string_view left, right;
      if (space != std::string::npos) {
        left = std::string_view(merge).substr(0, space);
        right = std::string_view(merge).substr(space + 1);
      }
      ranks_.emplace(rank_key(left, right), static_cast<int32_t>(i));  // the first one wins
    }
  }

  // Special ids: llama.cpp's defaults for SentencePiece vocabularies, then the metadata's; an id
  // outside the vocabulary is ignored, as llama.cpp ignores it.
  auto in_vocab = [&](int32_t id) { return id >= 0 && static_cast<size_t>(id) < n ? id : -1; };
  bos_ = in_vocab(spm_ ? 1 : -1);
  eos_ = in_vocab(spm_ ? 2 : -1);
  unk_ = in_vocab(spm_ ? 0 : -1);
  if (data.bos >= 0 && in_vocab(data.bos) >= 0) bos_ = data.bos;
  if (data.eos >= 0 && in_vocab(data.eos) >= 0) eos_ = data.eos;
  if (data.unk >= 0 && in_vocab(data.unk) >= 0) unk_ = data.unk;

  add_space_prefix_ = data.add_space_prefix.value_or(spm_);
  add_bos_ = data.add_bos.value_or(spm_ || (pre && pre->add_bos));
  add_eos_ = data.add_eos.value_or(false);
  if (add_bos_ && bos_ < 0) {
    fail("tokenizer.ggml.bos_token_id",
         "a token id in [0, " + std::to_string(n - 1) + "] (tokenizer.ggml.add_bos_token is set)");
  }
  if (add_eos_ && eos_ < 0) {
    fail("tokenizer.ggml.eos_token_id",
         "a token id in [0, " + std::to_string(n - 1) + "] (tokenizer.ggml.add_eos_token is set)");
  }

  mark_tokens_by_text(data);
  for (size_t i = 0; i < n; ++i) {
    if (attrs_[i] & (kAttrControl | kAttrUserDefined | kAttrUnknown))
      specials_.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(specials_.begin(), specials_.end(), [&](int32_t a, int32_t b) {
    return tokens_[static_cast<size_t>(a)].size() > tokens_[static_cast<size_t>(b)].size();
  });

  // Phi-3's files name no strip flags; llama.cpp recognises the model by name and drops the
  // whitespace after its chat tokens.
  std::string name = data.general_name;
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (const int32_t id : specials_) attrs_[static_cast<size_t>(id)] |= kAttrRstrip;
    auto set_rstrip = [&](const char* text, bool on) {
      if (const auto id = token_to_id(text)) {
        uint16_t& attr = attrs_[static_cast<size_t>(*id)];
        attr = on ? (attr | kAttrRstrip) : (attr & ~kAttrRstrip);
      }
    };
    set_rstrip("</s>", true);
    for (const char* text : {"<unk>", "<s>", "<|endoftext|>"}) set_rstrip(text, false);
  }

  for (int b = 0; b < 256; ++b) {
    byte_ids_[b] = -1;
    if (spm_) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      const std::string hex = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      if (const auto id = token_to_id(hex)) {
        byte_ids_[b] = *id;
      } else if (const auto raw = token_to_id(std::string(1, static_cast<char>(b)))) {
        byte_ids_[b] = *raw;
      }
    } else if (const auto id = token_to_id(tok::byte_to_unicode(static_cast<uint8_t>(b)))) {
      byte_ids_[b] = *id;
    }
  }
}

// Converters leave end-of-turn and fill-in-the-middle tokens typed as they found them; llama.cpp
// recognises them by their text and makes them control tokens (skipped when decoding without
// specials), with a few model-specific exceptions. The same rules, in the same order.
void GgufTokenizer::mark_tokens_by_text(const GgufTokenizerData& data) {
  auto mark_control = [&](int32_t id) { attrs_[static_cast<size_t>(id)] |= kAttrControl; };
  // Fill-in-the-middle: of each kind, the metadata's id or else the first token with one of these
  // texts (llama.cpp takes whichever its hash map yields first; here, the lowest id).
  static const std::vector<std::vector<std::string_view>> kFimTexts = {
      {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",
       "<\xEF\xBD\x9C"
       "fim\xE2\x96\x81"
       "begin\xEF\xBD\x9C>",
       "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"},
      {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",
       "<\xEF\xBD\x9C"
       "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
       "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"},
      {"<|fim_middle|>", "<fim-middle>", "<fim_middle>",
       "<\xEF\xBD\x9C"
       "fim\xE2\x96\x81"
       "end\xEF\xBD\x9C>",
       "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"},
      {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
      {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
      {"<|file_sep|>"},
  };
  const int32_t fim_given[] = {data.fim_pre, data.fim_suf, data.fim_mid,
                               data.fim_pad, data.fim_rep, data.fim_sep};
  const int32_t n = static_cast<int32_t>(tokens_.size());
  std::vector<int32_t> eog;  // end-of-generation ids, as llama.cpp collects them
  for (size_t kind = 0; kind < kFimTexts.size(); ++kind) {
    int32_t id = fim_given[kind] >= 0 && fim_given[kind] < n ? fim_given[kind] : -1;
    if (id < 0) {
      for (int32_t i = 0; i < n && id < 0; ++i) {
        for (const std::string_view text : kFimTexts[kind]) {
          if (tokens_[static_cast<size_t>(i)] == text && token_to_id(text) == i) id = i;
        }
      }
      if (id >= 0) mark_control(id);
    }
    if (id >= 0 && kind >= 3) eog.push_back(id);  // pad, repo and file separators end generation
  }
  static const std::vector<std::string_view> kEogTexts = {
      "<|eot_id|>",
      "<|im_end|>",
      "<|end|>",
      "<|return|>",
      "<|call|>",
      "<|flush|>",
      "<|calls|>",
      "<end_of_turn>",
      "<|endoftext|>",
      "</s>",
      "<|eom_id|>",
      "<EOT>",
      "_<EOT>",
      "[EOT]",
      "[EOS]",
      "<|end_of_text|>",
      "<end_of_utterance>",
      "<eos>",
      "<turn|>",
      "<|tool_response>",
      "<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
      "[e~["};
  for (const std::string_view text : kEogTexts) {
    if (const auto id = token_to_id(text)) {
      eog.push_back(*id);
      mark_control(*id);
    }
  }
  // gpt-oss: these always render.
  for (const char* text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    if (const auto id = token_to_id(text)) attrs_[static_cast<size_t>(*id)] = kAttrUserDefined;
  }
  if (eos_ >= 0) eog.push_back(eos_);
  auto eog_has = [&](std::string_view text) -> int32_t {
    for (const int32_t id : eog) {
      if (tokens_[static_cast<size_t>(id)] == text) return id;
    }
    return -1;
  };
  // o200k-harmony and solar-open: "<|end|>" is text there, not an end of turn.
  const int32_t end = eog_has("<|end|>");
  const bool has_call = eog_has("<|call|>") >= 0 || eog_has("<|calls|>") >= 0;
  if (end >= 0 && has_call && (eog_has("<|return|>") >= 0 || eog_has("<|flush|>") >= 0))
    attrs_[static_cast<size_t>(end)] = kAttrUserDefined;
  // Gemma 4 and PLaMo: "</s>" is an ordinary token.
  const int32_t s_end = eog_has("</s>");
  if (s_end >= 0 && (eog_has("<|tool_response>") >= 0 || eog_has("<|plamo:eos|>") >= 0))
    attrs_[static_cast<size_t>(s_end)] = kAttrNormal;
}

int32_t GgufTokenizer::rank(std::string_view left, std::string_view right) const {
  const auto it = ranks_.find(rank_key(left, right));
  return it == ranks_.end() ? -1 : it->second;
}

int32_t GgufTokenizer::byte_token(uint8_t byte) const {
  return byte_ids_[byte];
}

// llama.cpp's tokenizer_st_partition: each special token in turn (longest first) is cut out of
// every raw fragment, all occurrences, with its lstrip/rstrip trimming the neighbouring text.
std::vector<GgufTokenizer::Fragment> GgufTokenizer::partition(std::string_view text) const {
  std::vector<Fragment> fragments;
  if (!text.empty()) fragments.push_back({0, text.size(), -1});
  std::vector<Fragment> next;
  for (const int32_t id : specials_) {
    const std::string& special = tokens_[static_cast<size_t>(id)];
    const uint16_t attr = attrs_[static_cast<size_t>(id)];
    // Fragments are pieces of the text: a token absent from the text is in none of them (most of
    // a large special vocabulary, such as Gemma's, never occurs in a given text).
    if (text.find(special) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      size_t begin = f.begin, size = f.size;
      while (true) {
        const size_t match = text.substr(0, begin + size).find(special, begin);
        if (match == std::string_view::npos) {
          if (size > 0) next.push_back({begin, size, -1});
          break;
        }
        size_t left = match - begin;
        if (attr & kAttrLstrip) {
          while (left > 0 && c_isspace(text[begin + left - 1])) --left;
        }
        if (left > 0) next.push_back({begin, left, -1});
        next.push_back({match, special.size(), id});
        size_t right_begin = match + special.size();
        size_t right = begin + size - right_begin;
        if (attr & kAttrRstrip) {
          while (right > 0 && c_isspace(text[right_begin])) {
            ++right_begin;
            --right;
          }
        }
        begin = right_begin;
        size = right;
        if (size == 0) break;
      }
    }
    fragments.swap(next);
  }
  return fragments;
}

std::vector<int32_t> GgufTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  const std::vector<Fragment> fragments = partition(text);
  if (add_special_tokens && add_bos_) ids.push_back(bos_);
  bool after_special = true;  // SentencePiece prefixes a space at the start and after specials
  for (const Fragment& f : fragments) {
    if (f.token >= 0) {
      ids.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::string_view raw = text.substr(f.begin, f.size);
    if (spm_) {
      std::string spaced = add_space_prefix_ && after_special ? " " : "";
      spaced += raw;
      tok::replace_all(spaced, " ", "\xE2\x96\x81");
      spm_text(spaced, &ids);
    } else {
      bpe_text(raw, &ids);
    }
    after_special = false;
  }
  if (add_special_tokens && add_eos_) ids.push_back(eos_);
  return ids;
}

using Ranges = std::vector<std::pair<size_t, size_t>>;

// One stage of llama.cpp's regex chain: every range is cut into the matches `match_end` finds
// (the end of a match starting at i, or i for none) and the text between them, each a range of its
// own; later stages never join ranges again.
template <typename MatchEnd>
Ranges isolate(const std::string& text, const Ranges& ranges, MatchEnd match_end) {
  Ranges out;
  for (const auto& [b, e] : ranges) {
    size_t rest = b;
    for (size_t i = b; i < e;) {
      const size_t end = match_end(i, e);
      if (end > i) {
        if (i > rest) out.emplace_back(rest, i);
        out.emplace_back(i, end);
        i = rest = end;
      } else {
        i += tok::utf8_step(text, i).len;
      }
    }
    if (e > rest) out.emplace_back(rest, e);
  }
  return out;
}

// The GPT-2 regex inside every range (its \s+(?!\S) sees a range's end, not the next range).
Ranges gpt2_words(const std::string& text, const Ranges& ranges) {
  Ranges out, words;
  for (const auto& [b, e] : ranges) {
    words.clear();
    tok::split_matches(tok::SplitPattern::kGpt2, std::string_view(text).substr(b, e - b), &words);
    for (const auto& [wb, we] : words) out.emplace_back(b + wb, b + we);
  }
  return out;
}

// [\p{P}$+<=>^~|] as llama.cpp matches it: every ASCII punctuation or symbol char but '`', and
// beyond ASCII the Unicode punctuation categories.
bool is_default_punct(char32_t cp) {
  if (cp < 128) return cp != '`' && std::ispunct(static_cast<int>(cp));
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_CONNECTOR_PUNCTUATION:
    case U_OTHER_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

void GgufTokenizer::bpe_text(std::string_view raw, std::vector<int32_t>* out) const {
  const std::string text = sanitize_utf8(raw);
  const Ranges whole = {{0, text.size()}};
  auto run_of = [&](auto in_class) {
    return [&text, in_class](size_t i, size_t e) {
      while (i < e) {
        const tok::Utf8Step step = tok::utf8_step(text, i);
        if (!in_class(step.cp)) break;
        i += step.len;
      }
      return i;
    };
  };
  auto is_number = [](char32_t cp) { return tok::char_class(cp) == tok::CharClass::kNumber; };
  Ranges words;
  switch (split_) {
    case PreSplit::kGpt2:
      tok::split_matches(tok::SplitPattern::kGpt2, text, &words);
      break;
    case PreSplit::kLlama3:
      tok::split_matches(tok::SplitPattern::kLlama3, text, &words);
      break;
    case PreSplit::kQwen2:
      tok::split_matches(tok::SplitPattern::kQwen2, text, &words);
      break;
    case PreSplit::kGpt4o:
      tok::split_matches(tok::SplitPattern::kO200kLlamaCpp, text, &words);
      break;
    case PreSplit::kDigitsGpt2: {
      // Every digit alone first, so whitespace before a digit stays one word.
      const auto one_digit = [&](size_t i, size_t) {
        const tok::Utf8Step step = tok::utf8_step(text, i);
        return is_number(step.cp) ? i + step.len : i;
      };
      words = gpt2_words(text, isolate(text, whole, one_digit));
      break;
    }
    case PreSplit::kDefault: {
      // llama.cpp's chain for "default": punctuation runs, the GPT-2 regex, number runs, then
      // ASCII digits three at a time.
      words = isolate(text, whole, run_of(is_default_punct));
      words = gpt2_words(text, words);
      words = isolate(text, words, run_of(is_number));
      const auto three_digits = [&](size_t i, size_t e) {
        auto digit = [&](size_t k) { return k < e && text[k] >= '0' && text[k] <= '9'; };
        return digit(i) && digit(i + 1) && digit(i + 2) ? i + 3 : i;
      };
      words = isolate(text, words, three_digits);
      break;
    }
  }
  std::string word;
  for (const auto& [b, e] : words) {
    word.clear();
    for (size_t i = b; i < e; ++i) word += tok::byte_to_unicode(static_cast<uint8_t>(text[i]));
    bpe_word(word, out);
  }
}

// One byte-mapped word: merges by rank (ties: leftmost), as llama.cpp's BPE session.
void GgufTokenizer::bpe_word(const std::string& word, std::vector<int32_t>* out) const {
  {
    std::lock_guard<std::mutex> lock(cache_->mutex);
    if (const auto it = cache_->words.find(word); it != cache_->words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t> ids;
  std::vector<Symbol> symbols;
  if (ignore_merges_ && token_to_id(word)) {
    symbols.push_back({-1, -1, 0, word.size()});
  } else {
    symbols = utf8_symbols(word);
  }
  struct Bigram {
    int left, right;
    int32_t rank;
    std::string text;
  };
  auto worse = [](const Bigram& l, const Bigram& r) {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  const std::string_view w(word);
  auto text_of = [&](const Symbol& s) { return w.substr(s.begin, s.size); };
  auto add_bigram = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view l = text_of(symbols[static_cast<size_t>(left)]);
    const std::string_view r = text_of(symbols[static_cast<size_t>(right)]);
    const int32_t found = rank(l, r);
    if (found < 0) return;
    queue.push({left, right, found, std::string(l) + std::string(r)});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_bigram(i - 1, i);
  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(bigram.left)];
    Symbol& right = symbols[static_cast<size_t>(bigram.right)];
    if (left.size == 0 || right.size == 0) continue;
    if (std::string(text_of(left)) + std::string(text_of(right)) != bigram.text) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = bigram.left;
    add_bigram(left.prev, bigram.left);
    add_bigram(bigram.left, left.next);
  }
  for (const Symbol& s : symbols) {
    if (s.size == 0) continue;
    const std::string_view text = text_of(s);
    if (const auto id = token_to_id(text)) {
      ids.push_back(*id);
      continue;
    }
    // No token for the merged text: llama.cpp emits the single-byte tokens of its bytes that
    // exist (the mapped chars are looked up one byte at a time, so only ASCII ones can match).
    for (const char c : text) {
      if (const auto id = token_to_id(std::string(1, c))) ids.push_back(*id);
    }
  }
  out->insert(out->end(), ids.begin(), ids.end());
  std::lock_guard<std::mutex> lock(cache_->mutex);
  if (cache_->words.size() >= kMaxCachedWords) cache_->words.clear();  // bounded memory
  cache_->words.emplace(word, std::move(ids));
}

// SentencePiece-style BPE over the whole (escaped) text: the adjacent pair whose concatenation is
// the best-scoring token merges first (ties: leftmost); what forms no token becomes bytes.
void GgufTokenizer::spm_text(const std::string& text, std::vector<int32_t>* out) const {
  std::vector<Symbol> symbols = utf8_symbols(text);
  struct Bigram {
    int left, right;
    float score;
    size_t size;
  };
  auto worse = [](const Bigram& l, const Bigram& r) {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> queue(worse);
  const std::string_view t(text);
  auto add_bigram = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const auto id = token_to_id(t.substr(l.begin, l.size + r.size));
    if (!id) return;
    queue.push({left, right, scores_[static_cast<size_t>(*id)], l.size + r.size});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_bigram(i - 1, i);
  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(bigram.left)];
    Symbol& right = symbols[static_cast<size_t>(bigram.right)];
    // llama.cpp recognises a stale pair by its size alone.
    if (left.size == 0 || right.size == 0 || left.size + right.size != bigram.size) continue;
    left.size += right.size;
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = bigram.left;
    add_bigram(left.prev, bigram.left);
    add_bigram(bigram.left, left.next);
  }
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& s = symbols[static_cast<size_t>(i)];
    const std::string_view piece = t.substr(s.begin, s.size);
    if (const auto id = token_to_id(piece)) {
      out->push_back(*id);
      continue;
    }
    for (const char c : piece) {
      const int32_t id = byte_token(static_cast<uint8_t>(c));
      // A vocabulary without this byte: llama.cpp would abort; the unknown token stands for it.
      if (id >= 0) {
        out->push_back(id);
      } else if (unk_ >= 0) {
        out->push_back(unk_);
      }
    }
  }
}

// llama.cpp's token_to_piece: what one token contributes to the decoded text.
std::string GgufTokenizer::piece(int32_t id, bool render_special) const {
  const uint16_t attr = attrs_[static_cast<size_t>(id)];
  const std::string& text = tokens_[static_cast<size_t>(id)];
  if (!render_special && (attr & (kAttrUnknown | kAttrControl))) return {};
  if (attr & (kAttrUnknown | kAttrControl | kAttrUserDefined)) return text;
  if (attr & kAttrNormal) {
    if (spm_) {
      std::string result = text;
      tok::replace_all(result, "\xE2\x96\x81", " ");
      return result;
    }
    std::string result;
    for (size_t i = 0; i < text.size();) {
      const tok::Utf8Step step = tok::utf8_step(text, i);
      const int byte = tok::unicode_to_byte(step.cp);
      if (byte >= 0) {
        result += static_cast<char>(byte);
      } else {
        // A char outside GPT-2's byte map (a hand-made vocabulary): llama.cpp writes it out.
        result += "[UNK_BYTE_0x";
        static constexpr char kHex[] = "0123456789abcdef";
        for (size_t k = i; k < i + step.len; ++k) {
          const auto b = static_cast<unsigned char>(text[k]);
          result += kHex[b >> 4];
          result += kHex[b & 15];
        }
        result += text + "]";
      }
      i += step.len;
    }
    return result;
  }
  if (attr & kAttrByte) {
    // "<0xNN>": the two hex digits at [3, 5).
    if (text.size() >= 5) {
      const std::string hex = text.substr(3, 2);
      char* end = nullptr;
      const long value = std::strtol(hex.c_str(), &end, 16);
      return std::string(1, static_cast<char>(value));
    }
    return std::string(1, '\0');
  }
  return {};  // unused and undefined tokens decode to nothing
}

// llama.cpp's detokenize, with remove_special = skip_special_tokens and unparse_special its
// negation.
std::string GgufTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= static_cast<int32_t>(tokens_.size())) {
      throw Error(source_, "ids[" + std::to_string(i) + "]",
                  "a token id in [0, " + std::to_string(tokens_.size() - 1) + "]",
                  std::to_string(ids[i]));
    }
  }
  size_t first = 0, last = ids.size();
  bool remove_space = add_space_prefix_;
  if (skip_special_tokens && add_bos_ && last > first && ids[first] == bos_) {
    remove_space = false;
    ++first;
  }
  if (skip_special_tokens && add_eos_ && last > first && ids[last - 1] == eos_) --last;
  std::string text;
  for (size_t i = first; i < last; ++i) {
    std::string p = piece(ids[i], !skip_special_tokens);
    if (remove_space && !p.empty() && p[0] == ' ') p.erase(0, 1);
    remove_space = false;
    text += p;
  }
  if (!clean_spaces_ || text.empty()) return text;

  // llama.cpp's clean-up passes, in place as it does them (the second pass writes a NUL over the
  // space it drops, which the checks after it can see): " ?" " !" " ." " ," lose the space,
  // " ' " loses both spaces, " 's" " 'm" " 're" " 've" lose the space.
  size_t total = text.size();
  size_t kept = 1;
  for (size_t i = 1; i < total; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --kept;
    text[kept++] = x;
  }
  total = kept;
  kept = 1;
  for (size_t i = 1; i < total; ++i) {
    const char x = text[i];
    if (x == '\'' && i + 1 < total && text[i - 1] == ' ' && text[i + 1] == ' ') {
      --kept;
      text[++i] = '\0';
    }
    text[kept++] = x;
  }
  total = kept;
  kept = 1;
  for (size_t i = 1; i < total; ++i) {
    const char x = text[i];
    if (text[i - 1] == ' ' && x == '\'' && i + 1 < total) {
      const char x1 = text[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --kept;
      } else if (i + 2 < total) {
        const char x2 = text[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --kept;
      }
    }
    text[kept++] = x;
  }
  text.resize(kept);
  return text;
}

}  // namespace

const std::vector<std::string>& supported_gguf_pre_tokenizers() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const PreTokenizerSpec& spec : kPreTokenizers) out.emplace_back(spec.name);
    return out;
  }();
  return names;
}

std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufTokenizerData& data,
                                               const std::string& source_name) {
  return std::make_unique<Tokenizer>(
      Tokenizer::from_engine(std::make_unique<GgufTokenizer>(data, source_name)));
}

}  // namespace kvlens
