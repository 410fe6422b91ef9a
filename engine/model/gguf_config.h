// The model configuration of a GGUF file: its metadata ("<arch>.embedding_length", ...) turned
// into the config.json a Hugging Face checkpoint of the same model carries, then validated by
// ModelConfig::parse. Architectures: llama, qwen2, qwen3, phi3 and gemma3 (as gemma3_text).
#pragma once

#include <nlohmann/json.hpp>

#include "engine/model/config.h"
#include "engine/model/gguf.h"

namespace kvlens {

// The architectures gguf_config_json maps, for messages: "llama, qwen2, qwen3, phi3 or gemma3".
extern const char* const kGgufArchitectures;

// config.json's fields from the metadata (and, for rope factors stored as tensors, those
// tensors). Throws kvlens::Error naming the file and the metadata key that is missing, of the
// wrong type or unsupported (general.architecture outside the list above).
nlohmann::json gguf_config_json(const GgufFile& file);

// gguf_config_json, parsed and validated; source is the file's path.
ModelConfig gguf_model_config(const GgufFile& file);

}  // namespace kvlens
