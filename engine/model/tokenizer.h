// Tokenizer: Hugging Face tokenizer.json BPE models of the two kinds Llama-, Qwen- and Phi-family
// checkpoints use: byte-level (GPT-2, Llama-3/cl100k, Qwen2 or o200k split regex, optional NFC,
// ByteLevel decoder) and SentencePiece-style (Prepend/Replace normalizer or Metaspace
// pre-tokenizer, byte_fallback, Replace/ByteFallback/Fuse/Strip decoder), with added/special tokens
// (numbered as HF numbers them) and the TemplateProcessing post-processor. A GGUF file's vocabulary
// (tokenizer_gguf.h) sits behind the same interface as a tok::TokenizerEngine.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvlens {

namespace tok {
// Another implementation behind Tokenizer's interface (the GGUF vocabularies, which follow
// llama.cpp rather than a tokenizer.json pipeline). Errors are kvlens::Error as for tokenizer.json.
class TokenizerEngine {
 public:
  virtual ~TokenizerEngine() = default;
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual const std::string& source() const = 0;
};
}  // namespace tok

class Tokenizer {
 public:
  // Parses tokenizer.json text; unsupported or malformed parts raise kvlens::Error naming
  // `source`, the JSON field and what was expected.
  static Tokenizer parse(std::string_view json_text, const std::string& source);
  // Loads a tokenizer.json file; a path ending in .gz is decompressed with zlib.
  static Tokenizer load(const std::string& path);
  // Wraps another implementation (see tok::TokenizerEngine).
  static Tokenizer from_engine(std::unique_ptr<tok::TokenizerEngine> engine);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // add_special_tokens applies the post-processor (e.g. prepends BOS), like HF encode().
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  // Like HF decode(ids, skip_special_tokens). Throws kvlens::Error for ids out of range.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
  // The text of one token as a user would read it (for labels): decode of that id alone, or
  // "<id N>" for an id the vocabulary has no token for (never throws).
  std::string token_text(int32_t id) const;

  int64_t vocab_size() const;  // including added tokens (max id + 1)
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<int32_t> bos_id() const;  // from the post-processor, if any
  const std::string& source() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  explicit Tokenizer(std::unique_ptr<tok::TokenizerEngine> engine);
  std::unique_ptr<Impl> impl_;                    // tokenizer.json, or null with an engine
  std::unique_ptr<tok::TokenizerEngine> engine_;  // null for tokenizer.json
};

// Reads a whole file, gunzipping it when it ends in .gz. Throws kvlens::Error naming the path.
std::string read_maybe_gzipped(const std::string& path);

}  // namespace kvlens
