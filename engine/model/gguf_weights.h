// A GGUF file's tensors under the Hugging Face names ModelWeights resolves ("blk.3.attn_q.weight"
// -> "model.layers.3.self_attn.q_proj.weight"), with what llama.cpp's converter changed undone:
// the q/k row permutation of llama weights, gemma3's +1 on norm weights. Quantized tensors are
// dequantized to F32 buffers; F32, F16 and BF16 ones are used in place from the map.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "engine/model/config.h"
#include "engine/model/gguf.h"
#include "engine/model/safetensors.h"

namespace kvlens {

// The Hugging Face name of a GGUF tensor of a model of `model_type` (ModelConfig's: llama,
// qwen2, qwen3, phi3, gemma3_text), or nullopt for tensors the engine does not use.
std::optional<std::string> hf_tensor_name(std::string_view gguf_name, std::string_view model_type);

// What quantized matrices become: F32 (exact: every dequantized value is representable, and
// logits match transformers' GGUF loading) while that takes at most kGgufF32Limit bytes, about
// 1B parameters; BF16 above, so that a 7B file from Ollama fits a desktop's memory (rounding to
// 8 significant bits is below the quantization step of every supported type but Q8_0).
constexpr uint64_t kGgufF32Limit = uint64_t(4) << 30;
DType gguf_dequantized_dtype(const GgufFile& file, uint64_t f32_limit = kGgufF32Limit);

// The engine's tensors of `file`: HF names, dequantized (or in place), checked for a known
// name of each needed tensor; the returned set keeps `file` and the buffers alive. Quantized
// matrices become `matrix_dtype` (F32 or BF16); vectors (norms, biases) always F32. Throws
// kvlens::Error naming the file and tensor for a type that cannot be dequantized.
std::shared_ptr<SafetensorsSet> load_gguf_tensors(std::shared_ptr<const GgufFile> file,
                                                  const ModelConfig& config,
                                                  DType matrix_dtype = DType::F32);

}  // namespace kvlens
