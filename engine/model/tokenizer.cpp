// Tokenizer: ties the tokenizer.json stages together in HF tokenizers' order (added tokens out of
// the raw text, normalize, normalized added tokens, pre-tokenize, BPE, post-process) and reads
// plain or gzipped files.
#include "engine/model/tokenizer.h"

#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/model/tokenizer_added.h"
#include "engine/model/tokenizer_bpe.h"
#include "engine/model/tokenizer_pipeline.h"
#include "engine/model/tokenizer_unicode.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kvlens {

using tok::Json;
using tok::JsonPath;

struct Tokenizer::Impl {
  std::string source;
  tok::BpeModel model;
  tok::Normalizer normalizer;
  tok::PreTokenizer pre_tokenizer;
  tok::Decoder decoder;
  tok::PostProcessor post_processor;
  std::vector<tok::AddedToken> added;      // never resized after parse: matchers point into it
  std::vector<std::string> added_decoded;  // what each added token decodes to
  tok::StringIdMap added_ids;
  tok::AddedTokenMatcher raw_matcher;         // normalized == false: matched in the raw text
  tok::AddedTokenMatcher normalized_matcher;  // normalized == true: matched after normalizing

  struct IdEntry {
    const std::string* text = nullptr;
    bool special = false;
  };
  std::vector<IdEntry> by_id;

  explicit Impl(tok::BpeModel m) : model(std::move(m)) {}
  void encode_text(std::string_view text, bool at_start, std::vector<int32_t>* ids) const;
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(std::unique_ptr<tok::TokenizerEngine> engine) : engine_(std::move(engine)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

namespace {

// The added tokens with the ids HF gives them. HF does not trust the "id" of an entry: a token
// whose content is in the model vocab takes that id, any other takes the next free id after the
// vocab (or after the largest added id), in file order. For files HF wrote these are the ids the
// file lists; for edited files (a trimmed vocab, hand-made lists) they differ, and HF's win.
std::vector<tok::AddedToken> parse_added_tokens(const Json& root, const JsonPath& root_path,
                                                const tok::BpeModel& model) {
  std::vector<tok::AddedToken> added;
  const Json* list = tok::optional_member(root, "added_tokens", root_path);
  if (!list) return added;
  const JsonPath path = root_path.child("added_tokens");
  tok::expect_array(*list, path);
  tok::StringIdMap index_of;  // content -> index into `added`
  int64_t max_id = -1;
  const int64_t vocab_count = model.vocab_count();
  for (size_t i = 0; i < list->size(); ++i) {
    const JsonPath item_path = path.index(i);
    const Json& item = tok::expect_object((*list)[i], item_path);
    tok::AddedToken t;
    tok::expect_int(tok::required_member(item, "id", item_path), item_path.child("id"), 0,
                    tok::kMaxTokenId);
    t.content = tok::expect_string(tok::required_member(item, "content", item_path),
                                   item_path.child("content"));
    t.special = tok::bool_or(item, "special", false, item_path);
    t.single_word = tok::bool_or(item, "single_word", false, item_path);
    t.lstrip = tok::bool_or(item, "lstrip", false, item_path);
    t.rstrip = tok::bool_or(item, "rstrip", false, item_path);
    t.normalized = tok::bool_or(item, "normalized", !t.special, item_path);
    if (t.content.empty()) continue;  // HF ignores empty added tokens
    if (const auto it = index_of.find(t.content); it != index_of.end()) {
      // A repeated content keeps its id and takes the later flags; it stays special for
      // skip_special_tokens once any entry said so.
      tok::AddedToken& old = added[static_cast<size_t>(it->second)];
      t.id = old.id;
      t.special = t.special || old.special;
      old = std::move(t);
      continue;
    }
    if (const auto id = model.token_to_id(t.content)) {
      t.id = *id;
    } else if (max_id < 0) {
      t.id = static_cast<int32_t>(vocab_count);
    } else {
      t.id = static_cast<int32_t>(max_id >= vocab_count || vocab_count == 0 ? max_id + 1
                                                                            : vocab_count);
    }
    if (t.id > tok::kMaxTokenId)
      item_path.fail("at most " + std::to_string(tok::kMaxTokenId) + " tokens in all");
    max_id = std::max<int64_t>(max_id, t.id);
    index_of.emplace(t.content, static_cast<int32_t>(added.size()));
    added.push_back(std::move(t));
  }
  return added;
}

}  // namespace

Tokenizer Tokenizer::parse(std::string_view json_text, const std::string& source) {
  Json root;
  try {
    root = Json::parse(json_text.begin(), json_text.end());
  } catch (const Json::exception& e) {
    throw Error(source, "json", "a valid JSON document (tokenizer.json)", e.what());
  }
  const JsonPath root_path{&source, ""};
  if (!root.is_object()) root_path.fail("a JSON object (tokenizer.json)", &root);

  const Json& model_json = tok::required_member(root, "model", root_path);
  auto impl = std::make_unique<Impl>(tok::BpeModel::parse(model_json, root_path.child("model")));
  Impl& t = *impl;
  t.source = source;
  t.normalizer = tok::Normalizer::parse(tok::optional_member(root, "normalizer", root_path),
                                        root_path.child("normalizer"));
  t.pre_tokenizer = tok::PreTokenizer::parse(tok::optional_member(root, "pre_tokenizer", root_path),
                                             root_path.child("pre_tokenizer"));
  t.decoder = tok::Decoder::parse(tok::optional_member(root, "decoder", root_path),
                                  root_path.child("decoder"));
  t.post_processor = tok::PostProcessor::parse(
      tok::optional_member(root, "post_processor", root_path), root_path.child("post_processor"));

  // Added tokens: specials first, as HF registers them, so they win ties between equal patterns.
  t.added = parse_added_tokens(root, root_path, t.model);
  std::stable_partition(t.added.begin(), t.added.end(),
                        [](const tok::AddedToken& a) { return a.special; });
  std::vector<const tok::AddedToken*> raw_tokens, normalized_tokens;
  std::vector<std::string> raw_patterns, normalized_patterns;
  t.added_decoded.reserve(t.added.size());
  for (const tok::AddedToken& a : t.added) {
    t.added_ids.emplace(a.content, a.id);
    if (a.normalized) {
      // A normalized token is looked for in normalized text, so its pattern is its normalized
      // content (with a Prepend normalizer "<unk>" becomes "▁<unk>", absorbing the space before
      // it), and decoding gives that form back.
      std::string pattern = t.normalizer.apply(a.content);
      t.added_decoded.push_back(pattern);
      normalized_tokens.push_back(&a);
      normalized_patterns.push_back(std::move(pattern));
    } else {
      t.added_decoded.push_back(a.content);
      raw_tokens.push_back(&a);
      raw_patterns.push_back(a.content);
    }
  }
  t.raw_matcher.build(std::move(raw_tokens), std::move(raw_patterns));
  t.normalized_matcher.build(std::move(normalized_tokens), std::move(normalized_patterns));

  // The id table for decoding: added tokens override the model vocab (as in HF); special tokens
  // known only to the post-processor (Llama 3 files may list BOS nowhere else) come last.
  int64_t limit = t.model.id_limit();
  for (const tok::AddedToken& a : t.added) limit = std::max<int64_t>(limit, a.id + 1);
  for (const auto& special : t.post_processor.special_tokens()) {
    limit = std::max<int64_t>(limit, special.first + 1);
  }
  t.by_id.assign(static_cast<size_t>(limit), {});
  for (const auto& [id, text] : t.post_processor.special_tokens()) {
    t.by_id[static_cast<size_t>(id)] = {&text, true};
  }
  for (int32_t id = 0; id < t.model.id_limit(); ++id) {
    if (const std::string* text = t.model.id_to_token(id))
      t.by_id[static_cast<size_t>(id)] = {text, false};
  }
  for (size_t i = 0; i < t.added.size(); ++i) {
    t.by_id[static_cast<size_t>(t.added[i].id)] = {&t.added_decoded[i], t.added[i].special};
  }
  return Tokenizer(std::move(impl));
}

Tokenizer Tokenizer::load(const std::string& path) {
  return parse(read_maybe_gzipped(path), path);
}

Tokenizer Tokenizer::from_engine(std::unique_ptr<tok::TokenizerEngine> engine) {
  return Tokenizer(std::move(engine));
}

void Tokenizer::Impl::encode_text(std::string_view text, bool at_start,
                                  std::vector<int32_t>* ids) const {
  const std::string normalized = normalizer.apply(text);
  std::vector<tok::Segment> segments;
  normalized_matcher.split(normalized, &segments);
  std::vector<tok::Piece> pieces;
  for (const tok::Segment& s : segments) {
    if (s.id >= 0) {
      ids->push_back(s.id);
      continue;
    }
    pieces.clear();
    pieces.push_back(
        tok::Piece{normalized.substr(s.begin, s.end - s.begin), at_start && s.begin == 0});
    pre_tokenizer.apply(&pieces);
    for (const tok::Piece& word : pieces) model.tokenize(word.text, ids);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (engine_) return engine_->encode(text, add_special_tokens);
  std::vector<int32_t> ids;
  std::vector<tok::Segment> segments;
  impl_->raw_matcher.split(text, &segments);
  for (const tok::Segment& s : segments) {
    if (s.id >= 0) {
      ids.push_back(s.id);
    } else {
      impl_->encode_text(text.substr(s.begin, s.end - s.begin), s.begin == 0, &ids);
    }
  }
  if (add_special_tokens) ids = impl_->post_processor.apply(std::move(ids));
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  if (engine_) return engine_->decode(ids, skip_special_tokens);
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    const bool in_range = id >= 0 && static_cast<size_t>(id) < impl_->by_id.size();
    const Impl::IdEntry* entry = in_range ? &impl_->by_id[static_cast<size_t>(id)] : nullptr;
    if (!entry || !entry->text) {
      const size_t size = impl_->by_id.size();
      std::string expected = size == 0 ? std::string("no ids (the vocabulary is empty)")
                                       : "a token id in [0, " + std::to_string(size - 1) + "]";
      if (in_range) expected += " that the vocabulary assigns to a token";
      throw Error(impl_->source, "ids[" + std::to_string(i) + "]", expected, std::to_string(id));
    }
    if (skip_special_tokens && entry->special) continue;
    tokens.push_back(*entry->text);
  }
  return impl_->decoder.decode(std::move(tokens));
}

std::string Tokenizer::token_text(int32_t id) const {
  if (engine_) {
    if (id < 0 || id >= engine_->vocab_size()) return "<id " + std::to_string(id) + ">";
    // A byte token alone is not text (llama.cpp's pieces can be part of a character): labels get
    // U+FFFD for it, as tokenizer.json's decoders give.
    return tok::utf8_lossy(engine_->decode({id}, false));
  }
  const bool known = id >= 0 && static_cast<size_t>(id) < impl_->by_id.size() &&
                     impl_->by_id[static_cast<size_t>(id)].text;
  // A model may predict ids its tokenizer lacks (research and random checkpoints often pair a
  // tokenizer smaller than the model's vocabulary): a label names the id instead of failing.
  if (!known) return "<id " + std::to_string(id) + ">";
  return decode({id}, false);
}

int64_t Tokenizer::vocab_size() const {
  if (engine_) return engine_->vocab_size();
  return static_cast<int64_t>(impl_->by_id.size());
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (engine_) return engine_->token_to_id(token);
  if (const auto it = impl_->added_ids.find(token); it != impl_->added_ids.end()) {
    return it->second;
  }
  if (auto id = impl_->model.token_to_id(token)) return id;
  for (const auto& [id, text] : impl_->post_processor.special_tokens()) {
    if (text == token) return id;
  }
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::bos_id() const {
  if (engine_) return engine_->bos_id();
  return impl_->post_processor.bos_id();
}

const std::string& Tokenizer::source() const {
  if (engine_) return engine_->source();
  return impl_->source;
}

namespace {

constexpr size_t kMaxInflatedBytes = size_t{1} << 30;  // far above any real tokenizer.json

std::string gunzip(const std::string& data, const std::string& path) {
  z_stream zs{};
  // 16 + MAX_WBITS: gzip framing only, so a plain file named .gz is reported, not passed through.
  if (inflateInit2(&zs, 16 + MAX_WBITS) != Z_OK) {
    throw Error(path, "gzip", "a working zlib inflater", zs.msg ? zs.msg : "inflateInit2 failed");
  }
  std::string out;
  char buffer[1 << 16];
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  int rc = Z_OK;
  while (true) {
    zs.next_out = reinterpret_cast<Bytef*>(buffer);
    zs.avail_out = sizeof buffer;
    rc = inflate(&zs, Z_NO_FLUSH);
    out.append(buffer, sizeof buffer - zs.avail_out);
    if (out.size() > kMaxInflatedBytes) {
      inflateEnd(&zs);
      throw Error(path, "gzip", "at most 1 GiB of decompressed data");
    }
    if (rc == Z_STREAM_END) {
      if (zs.avail_in == 0) break;
      inflateReset(&zs);  // concatenated gzip members, as gzip -d accepts
      continue;
    }
    if (rc != Z_OK) break;
  }
  const std::string message = zs.msg ? zs.msg : (rc == Z_BUF_ERROR ? "truncated data" : "");
  inflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    throw Error(path, "gzip", "a complete, valid gzip stream",
                message.empty() ? "zlib error " + std::to_string(rc) : message);
  }
  return out;
}

}  // namespace

std::string read_maybe_gzipped(const std::string& path) {
  std::string data = read_text_file(path);
  const bool gz = path.size() >= 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  return gz ? gunzip(data, path) : data;
}

}  // namespace kvlens
