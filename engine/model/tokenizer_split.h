// The pre-tokenizer split regexes that Llama-, Qwen- and Phi-family tokenizer.json files use,
// hand-written as matchers (no std::regex: it has no \p{..} classes and is far too slow for this).
// A pattern is recognised by its exact source text; anything else is rejected by the parser.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace kvlens::tok {

enum class SplitPattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|...
  kQwen2,   // the Llama-3 pattern with \p{N} instead of \p{N}{1,3}
  kO200k,   // [^\r\n\p{L}\p{N}]?[\p{Lu}..\p{M}]*[\p{Ll}..\p{M}]+(?i:'s|..)?|...|[\r\n/]*|...
  // o200k as llama.cpp matches it for the GPT-4o pre-tokenizer (its regex runs on text with every
  // non-ASCII letter collapsed to one byte): a letter is "upper" unless a-z and "lower" unless
  // A-Z, so other letters are both, and marks are neither.
  kO200kLlamaCpp,
};

// The regex source text of the GPT-2 pattern (ByteLevel's use_regex uses it implicitly).
extern const std::string_view kGpt2PatternText;

std::optional<SplitPattern> recognize_split_pattern(std::string_view regex);

// Byte ranges [begin, end) of the successive matches of `pattern` in `text`, as a leftmost-first
// backtracking engine (Oniguruma, which HF tokenizers uses) finds them. For these patterns every
// character belongs to some match, so the ranges tile the text.
void split_matches(SplitPattern pattern, std::string_view text,
                   std::vector<std::pair<size_t, size_t>>* out);

}  // namespace kvlens::tok
