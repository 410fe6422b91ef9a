// Sample generator of the synthetic co-reference benchmark and the answer-span marking the
// accuracy/coverage metrics use. A sample is "<lead> The place is: <name>. <philosophy> <food>
// <math> <tie-back>: <name>"; the answer is the final <name>, always at the very end of the text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/eval/coref_pools.h"

namespace kvlens {

class Tokenizer;

struct CorefSample {
  uint64_t seed = 0;
  int64_t index = 0;
  bool hard = false;
  std::string text;
  std::string answer;  // the location name asked about
  // Byte offsets of the final mention of the answer in `text` ([begin, end), end == text.size()).
  int64_t answer_char_begin = 0;
  int64_t answer_char_end = 0;
  // Every location introduced, in order of introduction (one, or two to three when hard).
  std::vector<std::string> locations;
};

// Deterministic in (pools, seed, index) on every platform: it draws from splitmix64 with its own
// bounded-integer reduction, never from std:: distributions (whose output differs between standard
// libraries). `hard`: 2-3 distinct locations, each with its own lead and "The place is: X.",
// interleaved with distractor sentences; the question is the tie-back of one of them. Leads whose
// text would also answer the asked tie-back are not used as its companions. Throws kvlens::Error
// when index < 0 or a pool is too small for the variant.
CorefSample generate_coref_sample(const CorefPools& pools, uint64_t seed, int64_t index, bool hard);

// The sample tokenized as the model sees it, with the tokens of the final mention located.
struct CorefTokens {
  std::vector<int32_t> tokens;  // whole text, with special tokens (e.g. BOS)
  // tokens[answer_token_begin, answer_token_end) spell the answer (decoding them gives the answer,
  // possibly with the leading space that byte-level and SentencePiece BPE attach to a word).
  int64_t answer_token_begin = 0;
  int64_t answer_token_end = 0;
  // False when a BPE merge crossed the answer boundary and the tokens are the prefix and the
  // answer encoded separately and concatenated (see mark_answer_tokens).
  bool canonical = true;

  // The metrics' positions (POLICIES.md, co-reference accuracy/coverage): the logits at position
  // p predict tokens[p + 1], so the positions scored are [answer_token_begin - 1,
  // answer_token_end - 1), i.e. answer_token_begin - 1 .. answer_token_end - 2 inclusive.
  int64_t first_scored_position() const { return answer_token_begin - 1; }
  int64_t scored_position_end() const { return answer_token_end - 1; }  // exclusive
  int64_t answer_token_count() const { return answer_token_end - answer_token_begin; }
};

// Tokenizes the whole text with special tokens and finds the answer's tokens. The boundary is put
// before the whitespace preceding the answer (BPE tokenizers glue a leading space to the word), the
// prefix is encoded alone and must be a token-prefix of the whole text's encoding. When it is not
// (a merge crossed the boundary), the tokens returned are encode(prefix, special) followed by
// encode(answer part, no special) and `canonical` is false: the answer then has tokens of its own,
// which is what the metric needs, at the cost of a tokenization the tokenizer would not produce.
CorefTokens mark_answer_tokens(const CorefSample& sample, const Tokenizer& tokenizer);

}  // namespace kvlens
