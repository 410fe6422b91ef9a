// BPE model: parsing of vocab/merges and the merge loop. The loop follows HF tokenizers' order
// exactly (lowest merge rank first, leftmost position on ties, stale candidates re-validated),
// since a different but "equivalent" order can change ids on rare words.
#include "engine/model/tokenizer_bpe.h"

#include "engine/common/error.h"
#include "engine/model/tokenizer_unicode.h"

#include <algorithm>
#include <cstdio>
#include <queue>

namespace kvlens::tok {

namespace {

constexpr size_t kMaxCachedWordBytes = 256;
constexpr size_t kMaxCacheEntries = size_t{1} << 18;
constexpr size_t kChunkingMinSymbols = 64;  // shorter words are merged in one piece
constexpr uint64_t kEmptyKey = ~uint64_t{0};

uint64_t pair_key(uint32_t left, uint32_t right) {
  return (static_cast<uint64_t>(left) << 32) | right;
}

uint64_t mix(uint64_t key) {
  key ^= key >> 31;
  key *= 0x9E3779B97F4A7C15ull;
  key ^= key >> 29;
  return key;
}

uint32_t hash_string(std::string_view s) {
  return static_cast<uint32_t>(mix(std::hash<std::string_view>{}(s)));
}

size_t table_capacity(size_t entries) {
  size_t capacity = 16;
  while (capacity < entries * 2) capacity <<= 1;
  return capacity;
}

std::string quote_token(std::string_view s) {
  std::string out = Json(std::string(s)).dump(-1, ' ', false, Json::error_handler_t::replace);
  return out.size() > 60 ? out.substr(0, 57) + "..." : out;
}

char32_t first_char(const std::string& s) {
  return utf8_step(s, 0).cp;
}

char32_t last_char(const std::string& s) {
  size_t begin = s.size() - 1;
  while (begin > 0 && s.size() - begin < 4 &&
         (static_cast<unsigned char>(s[begin]) & 0xC0) == 0x80) {
    --begin;
  }
  return utf8_step(s, begin).cp;
}

}  // namespace

BpeModel::BpeModel() : lazy_(std::make_unique<Lazy>()) {
  std::fill_n(byte_ids_, 256, -1);
}
BpeModel::BpeModel(BpeModel&&) noexcept = default;
BpeModel& BpeModel::operator=(BpeModel&&) noexcept = default;
BpeModel::~BpeModel() = default;

void BpeModel::insert_token(std::string token, int32_t id) {
  const uint32_t hash = hash_string(token);
  const size_t mask = vocab_slots_.size() - 1;
  for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
    VocabSlot& s = vocab_slots_[slot];
    if (s.index < 0) {
      s = VocabSlot{hash, static_cast<int32_t>(vocab_tokens_.size())};
      vocab_tokens_.push_back(std::move(token));
      vocab_ids_.push_back(id);
      return;
    }
    if (s.hash == hash && vocab_tokens_[static_cast<size_t>(s.index)] == token) {
      vocab_ids_[static_cast<size_t>(s.index)] = id;  // last one wins, as in a JSON object
      return;
    }
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  if (vocab_slots_.empty()) return std::nullopt;
  const uint32_t hash = hash_string(token);
  const size_t mask = vocab_slots_.size() - 1;
  for (size_t slot = hash & mask;; slot = (slot + 1) & mask) {
    const VocabSlot& s = vocab_slots_[slot];
    if (s.index < 0) return std::nullopt;
    if (s.hash == hash && vocab_tokens_[static_cast<size_t>(s.index)] == token) {
      return vocab_ids_[static_cast<size_t>(s.index)];
    }
  }
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_by_id_.size()) return nullptr;
  return tokens_by_id_[static_cast<size_t>(id)];
}

BpeModel BpeModel::parse(const Json& model, const JsonPath& path) {
  expect_object(model, path);
  if (const Json* type = optional_member(model, "type", path)) {
    const std::string& name = expect_string(*type, path.child("type"));
    if (name != "BPE") path.child("type").fail("\"BPE\" (the only model type supported)", type);
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!string_or(model, key, "", path).empty()) {
      path.child(key).fail("null (BPE with subword prefixes/suffixes is not supported)",
                           optional_member(model, key, path));
    }
  }
  if (const Json* dropout = optional_member(model, "dropout", path)) {
    // Dropout only randomises training-time segmentation; inference encodes without it.
    if (!dropout->is_number()) path.child("dropout").fail("null or a number", dropout);
  }

  BpeModel bpe;
  bpe.fuse_unk_ = bool_or(model, "fuse_unk", false, path);
  bpe.byte_fallback_ = bool_or(model, "byte_fallback", false, path);
  bpe.ignore_merges_ = bool_or(model, "ignore_merges", false, path);

  const JsonPath vocab_path = path.child("vocab");
  const Json& vocab = required_member(model, "vocab", path);
  if (!vocab.is_object()) vocab_path.fail("an object mapping token strings to ids", &vocab);
  bpe.vocab_tokens_.reserve(vocab.size());
  bpe.vocab_ids_.reserve(vocab.size());
  bpe.vocab_slots_.assign(table_capacity(vocab.size()), VocabSlot{0, -1});
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    // The error path (and its string building) only for values that are not plain ids.
    const Json& value = it.value();
    const auto id = static_cast<int32_t>(
        value.is_number_unsigned() && value.get<uint64_t>() <= uint64_t{kMaxTokenId}
            ? static_cast<int64_t>(value.get<uint64_t>())
            : expect_int(value, vocab_path.child(it.key()), 0, kMaxTokenId));
    bpe.insert_token(it.key(), id);
    max_id = std::max<int64_t>(max_id, id);
  }
  bpe.tokens_by_id_.assign(static_cast<size_t>(max_id + 1), nullptr);
  for (size_t i = 0; i < bpe.vocab_tokens_.size(); ++i) {
    // Two strings sharing an id: decode the smaller one, so the choice is deterministic.
    const std::string*& slot = bpe.tokens_by_id_[static_cast<size_t>(bpe.vocab_ids_[i])];
    if (slot) bpe.duplicate_ids_ = true;
    if (!slot || bpe.vocab_tokens_[i] < *slot) slot = &bpe.vocab_tokens_[i];
  }

  if (const Json* unk = optional_member(model, "unk_token", path)) {
    const std::string& unk_token = expect_string(*unk, path.child("unk_token"));
    // An unk_token missing from the vocab behaves like none: unknown chars are dropped.
    bpe.unk_id_ = bpe.token_to_id(unk_token);
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    if (auto id = bpe.token_to_id(name)) bpe.byte_ids_[b] = *id;
  }

  const JsonPath merges_path = path.child("merges");
  const Json* merges = optional_member(model, "merges", path);
  if (!merges) return bpe;
  expect_array(*merges, merges_path);
  bpe.merges_.assign(table_capacity(merges->size()), MergeSlot{kEmptyKey, 0, 0});
  bpe.merge_mask_ = bpe.merges_.size() - 1;
  std::string joined;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const Json& merge = (*merges)[rank];
    std::string_view left, right;
    if (merge.is_string()) {
      const std::string& line = merge.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos) {
        merges_path.index(rank).fail("\"left right\" (two tokens)", &merge);
      }
      left = std::string_view(line).substr(0, space);
      right = std::string_view(line).substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get_ref<const std::string&>();
      right = merge[1].get_ref<const std::string&>();
    } else {
      merges_path.index(rank).fail("\"left right\" or [left, right]", &merge);
    }
    joined.assign(left).append(right);
    const auto left_id = bpe.token_to_id(left);
    const auto right_id = bpe.token_to_id(right);
    const auto merged_id = bpe.token_to_id(joined);
    if (!left_id || !right_id || !merged_id) {
      const std::string_view missing = !left_id ? left : !right_id ? right : joined;
      throw Error(*path.source, merges_path.index(rank).field, "tokens present in model.vocab",
                  quote_token(missing) + " is not in the vocab");
    }
    // Later duplicates overwrite earlier ones, as HF's map construction does.
    const uint64_t key =
        pair_key(static_cast<uint32_t>(*left_id), static_cast<uint32_t>(*right_id));
    uint64_t slot = mix(key) & bpe.merge_mask_;
    while (bpe.merges_[slot].key != kEmptyKey && bpe.merges_[slot].key != key) {
      slot = (slot + 1) & bpe.merge_mask_;
    }
    bpe.merges_[slot] = MergeSlot{key, static_cast<int32_t>(rank), *merged_id};
  }
  return bpe;
}

std::optional<std::pair<int32_t, int32_t>> BpeModel::find_merge(int32_t left, int32_t right) const {
  if (merges_.empty()) return std::nullopt;
  const uint64_t key = pair_key(static_cast<uint32_t>(left), static_cast<uint32_t>(right));
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    const MergeSlot& s = merges_[slot];
    if (s.key == key) return std::pair{s.rank, s.merged};
    if (s.key == kEmptyKey) return std::nullopt;
  }
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (auto id = token_to_id(word)) {
      out->push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard lock(lazy_->mutex);
    const auto it = lazy_->words.find(word);
    if (it != lazy_->words.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out->size();
  merge_word(word, out);
  if (cacheable) {
    std::lock_guard lock(lazy_->mutex);
    if (lazy_->words.size() >= kMaxCacheEntries) lazy_->words.clear();
    lazy_->words.emplace(
        std::string(word),
        std::vector<int32_t>(out->begin() + static_cast<ptrdiff_t>(first), out->end()));
  }
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>* ids) const {
  bool unk_pending = false;
  const auto flush_unk = [&] {
    if (unk_pending) ids->push_back(*unk_id_);
    unk_pending = false;
  };
  for (size_t i = 0; i < word.size();) {
    const Utf8Step step = utf8_step(word, i);
    const std::string_view piece = word.substr(i, step.len);
    i += step.len;
    if (auto id = token_to_id(piece)) {
      flush_unk();
      ids->push_back(*id);
      continue;
    }
    if (byte_fallback_) {
      const bool all_bytes = std::all_of(piece.begin(), piece.end(), [&](char c) {
        return byte_ids_[static_cast<unsigned char>(c)] >= 0;
      });
      if (all_bytes) {
        flush_unk();
        for (const char c : piece) ids->push_back(byte_ids_[static_cast<unsigned char>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (!fuse_unk_) flush_unk();  // fuse_unk: consecutive unknown chars share one <unk>
      unk_pending = true;
    }
  }
  flush_unk();
}

bool BpeModel::boundary_can_merge(int32_t left, int32_t right) const {
  const std::string* l = id_to_token(left);
  const std::string* r = id_to_token(right);
  if (duplicate_ids_ || !l || !r || l->empty() || r->empty()) return true;
  const uint64_t key = pair_key(last_char(*l), first_char(*r));
  const Lazy& z = *lazy_;
  for (uint64_t slot = mix(key) & z.bigram_mask;; slot = (slot + 1) & z.bigram_mask) {
    if (z.bigrams[slot] == key) return true;
    if (z.bigrams[slot] == kEmptyKey) return false;
  }
}

void BpeModel::merge_word(std::string_view word, std::vector<int32_t>* out) const {
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  initial_symbols(word, &ids);
  if (ids.size() < kChunkingMinSymbols || merges_.empty()) {
    merge_range(ids.data(), ids.size(), out);
    return;
  }
  std::call_once(lazy_->bigrams_once, [this] {
    std::vector<uint64_t> pairs;
    for (const std::string& token : vocab_tokens_) {
      char32_t prev = 0;
      for (size_t i = 0; i < token.size();) {
        const Utf8Step step = utf8_step(token, i);
        if (i > 0) pairs.push_back(pair_key(prev, step.cp));
        prev = step.cp;
        i += step.len;
      }
    }
    std::sort(pairs.begin(), pairs.end());
    pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
    lazy_->bigrams.assign(table_capacity(pairs.size()), kEmptyKey);
    lazy_->bigram_mask = lazy_->bigrams.size() - 1;
    for (const uint64_t key : pairs) {
      uint64_t slot = mix(key) & lazy_->bigram_mask;
      while (lazy_->bigrams[slot] != kEmptyKey) slot = (slot + 1) & lazy_->bigram_mask;
      lazy_->bigrams[slot] = key;
    }
  });
  size_t start = 0;
  for (size_t i = 1; i < ids.size(); ++i) {
    if (!boundary_can_merge(ids[i - 1], ids[i])) {
      merge_range(ids.data() + start, i - start, out);
      start = i;
    }
  }
  merge_range(ids.data() + start, ids.size() - start, out);
}

void BpeModel::merge_range(const int32_t* ids, size_t count, std::vector<int32_t>* out) const {
  if (count == 0) return;
  if (count == 1) {
    out->push_back(ids[0]);
    return;
  }
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols(count);
  for (size_t i = 0; i < count; ++i) {
    const auto index = static_cast<int32_t>(i);
    symbols[i] = Symbol{ids[i], index - 1, i + 1 < count ? index + 1 : -1, true};
  }

  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t next = symbols[static_cast<size_t>(pos)].next;
    if (next < 0) return;
    if (auto m = find_merge(symbols[static_cast<size_t>(pos)].id,
                            symbols[static_cast<size_t>(next)].id)) {
      queue.push(Candidate{m->first, pos, m->second});
    }
  };
  for (size_t i = 0; i + 1 < count; ++i) consider(static_cast<int32_t>(i));

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    // The pair may have changed since this candidate was queued; only merge what still applies.
    const auto current = find_merge(left.id, right.id);
    if (!current || current->second != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = top.pos;
    consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    out->push_back(symbols[static_cast<size_t>(i)].id);
  }
}

}  // namespace kvlens::tok
