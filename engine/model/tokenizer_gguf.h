// The tokenizer of a GGUF file, built from its tokenizer.ggml.* metadata so that it encodes and
// decodes as llama.cpp does with the same file: byte-level BPE ("gpt2", with the pre-tokenizer
// named by tokenizer.ggml.pre) or SentencePiece-style BPE ("llama": score-ordered merges, space
// prefix, <0xNN> byte fallback), special tokens matched in the text before either.
#pragma once

#include "engine/model/tokenizer.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvlens {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class GgufTokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The tokenizer.ggml.* metadata of a GGUF file, as the reader found it. Absent keys stay at their
// defaults (empty, -1 or nullopt); the model's defaults (e.g. a "llama" vocabulary adds BOS) are
// applied by tokenizer_from_gguf, as llama.cpp applies them.
struct GgufTokenizerData {
  std::string model;  // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre;    // tokenizer.ggml.pre: the pre-tokenizer of a "gpt2" vocabulary
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens, indexed by id
  std::vector<float> scores;         // tokenizer.ggml.scores (empty: all 0)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (empty: all normal)
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right", best first
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;  // tokenizer.ggml.*_token_id; -1: absent
  // tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id (older files: prefix/suffix/middle);
  // when absent, llama.cpp finds these tokens by their text.
  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  std::optional<bool> add_bos;           // tokenizer.ggml.add_bos_token
  std::optional<bool> add_eos;           // tokenizer.ggml.add_eos_token
  std::optional<bool> add_space_prefix;  // tokenizer.ggml.add_space_prefix
  std::string general_name;  // general.name: llama.cpp strips spaces after Phi-3's specials
};

// The pre-tokenizer names (tokenizer.ggml.pre) this reader supports, for messages and docs.
const std::vector<std::string>& supported_gguf_pre_tokenizers();

// Builds the tokenizer. encode(text, add_special_tokens) always matches control, user-defined and
// unknown tokens written in the text (as llama-tokenize does by default; so `kvlens-cli tokenize
// --special` means "add BOS/EOS as the metadata says", nothing more). decode(ids,
// skip_special_tokens) is llama.cpp's detokenizer: true is llama_detokenize(remove_special true,
// unparse_special false) (a leading BOS / trailing EOS the model adds is dropped and control
// tokens give no text), false is (false, true) (control tokens written out). Unsupported or
// inconsistent metadata raises a one-line kvlens::Error naming `source_name`, the key, the value
// and what is supported.
std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufTokenizerData& data,
                                               const std::string& source_name);

}  // namespace kvlens
