// The tokenizer.ggml.* metadata of a GGUF file gathered into GgufTokenizerData, from which
// tokenizer_from_gguf (tokenizer_gguf.h) builds the tokenizer llama.cpp would use for the file.
#pragma once

#include <memory>
#include <string>

#include "engine/model/gguf.h"
#include "engine/model/tokenizer_gguf.h"

namespace kvlens {

// Throws kvlens::Error naming the file and key for a key of the wrong type; absent keys keep the
// struct's defaults (llama.cpp's for the model), and a file without tokenizer.ggml.model has no
// tokenizer (has_gguf_tokenizer is false).
bool has_gguf_tokenizer(const GgufFile& file);
GgufTokenizerData gguf_tokenizer_data(const GgufFile& file);

// A tokenizer from a tokenizer.json (or .json.gz) or from a GGUF file's metadata (a path ending
// in .gguf, or a file starting with the GGUF magic: Ollama's blobs have no extension).
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path);

}  // namespace kvlens
