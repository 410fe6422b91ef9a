// The committed llama.cpp reference ids of tests/fixtures/gguf_tokenizer
// (tools/gguf_reference_ids.py): each entry's text read again from ../shared/data, encoded and
// decoded by a tokenizer under test and checked (Catch2 CHECKs) against what llama.cpp gave for the
// same vocabulary.
#pragma once

#include <string>

#include "engine/model/tokenizer.h"

namespace kvlens::test {

struct LlamaCppComparison {
  int entries = 0, mismatches = 0;
};

// Every entry of tests/fixtures/gguf_tokenizer/ids-<name>.json.gz: encode without and with
// special tokens, and decode both id lists (rendering specials / skipping them).
LlamaCppComparison compare_with_llama_cpp(const Tokenizer& tokenizer, const std::string& name);

}  // namespace kvlens::test
