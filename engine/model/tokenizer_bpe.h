// The BPE model of tokenizer.json ("model": {"type": "BPE", ...}): vocab, merge ranks keyed by id
// pairs, byte_fallback, unk_token/fuse_unk and ignore_merges, with a per-word cache so repeated
// words (most of any real text) cost one hash lookup.
#pragma once

#include "engine/model/tokenizer_json.h"

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvlens::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // Parses the "model" object; `path` names it in errors.
  static BpeModel parse(const Json& model, const JsonPath& path);

  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;
  ~BpeModel();

  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>* out) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  // nullptr when no vocab entry has this id.
  const std::string* id_to_token(int32_t id) const;
  int64_t id_limit() const { return static_cast<int64_t>(tokens_by_id_.size()); }  // max id + 1
  // Distinct token strings in the vocab (HF's get_vocab_size, which numbers new added tokens).
  int64_t vocab_count() const { return static_cast<int64_t>(vocab_tokens_.size()); }

 private:
  BpeModel();
  void insert_token(std::string token, int32_t id);
  void initial_symbols(std::string_view word, std::vector<int32_t>* ids) const;
  void merge_word(std::string_view word, std::vector<int32_t>* out) const;
  void merge_range(const int32_t* ids, size_t count, std::vector<int32_t>* out) const;
  bool boundary_can_merge(int32_t left, int32_t right) const;
  std::optional<std::pair<int32_t, int32_t>> find_merge(int32_t left, int32_t right) const;

  // Vocab: open addressing over token strings (a flat table is much faster to build and probe
  // than a node-based map for 100k+ entries).
  struct VocabSlot {
    uint32_t hash;
    int32_t index;  // into vocab_tokens_, -1 when empty
  };
  std::vector<std::string> vocab_tokens_;
  std::vector<int32_t> vocab_ids_;
  std::vector<VocabSlot> vocab_slots_;
  bool duplicate_ids_ = false;
  std::vector<const std::string*> tokens_by_id_;  // into vocab_tokens_, which no longer grows

  // Merges: key (left << 32 | right) -> (rank, merged id), open addressing.
  struct MergeSlot {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  std::vector<MergeSlot> merges_;
  uint64_t merge_mask_ = 0;

  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int32_t byte_ids_[256];  // <0xXX> ids for byte_fallback, -1 when absent

  // Mutable state behind a pointer so the model stays movable and encode() stays const.
  struct Lazy {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> words;
    // Every pair of adjacent code points inside some vocab token, built on the first long word:
    // a boundary between two chars that never sit side by side in a token is never merged
    // across, so long words (SentencePiece feeds whole texts) are merged in independent chunks.
    std::once_flag bigrams_once;
    std::vector<uint64_t> bigrams;
    uint64_t bigram_mask = 0;
  };
  std::unique_ptr<Lazy> lazy_;
};

}  // namespace kvlens::tok
