// Metadata -> config.json for GGUF files. llama.cpp's converter writes "<arch>.<field>" keys
// (convert_hf_to_gguf.py); a few facts it does not store are the values llama.cpp itself assumes
// for the architecture (gemma3: the 5-local-1-global layer pattern, the local rope base 10000).
#include "engine/model/gguf_config.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "engine/common/error.h"
#include "engine/model/dequantize.h"

namespace kvlens {

const char* const kGgufArchitectures = "llama, qwen2, qwen3, phi3 or gemma3";

namespace {

using Json = nlohmann::json;

// Per-frequency rope divisors stored as a tensor (llama3 scaling in rope_freqs.weight, phi3's
// longrope in rope_factors_long/short.weight): F32 or F16, one per rotated channel pair.
std::vector<double> rope_factor_tensor(const GgufFile& file, const GgufTensorInfo& info,
                                       int64_t pairs) {
  if (info.elements != uint64_t(pairs)) {
    throw Error(file.source(), "tensor \"" + info.name + "\"",
                std::to_string(pairs) + " values (one per rotated channel pair)",
                std::to_string(info.elements));
  }
  std::vector<float> values(static_cast<size_t>(pairs));
  dequantize_to_f32(info.type, info.data, pairs, values.data(),
                    file.source() + ": tensor \"" + info.name + "\"");
  return std::vector<double>(values.begin(), values.end());
}

// A number as config.json had it: llama.cpp's converter stores floats as f32, so 1e-5 reads back
// as 9.99999974e-06; the shortest decimal that gives the same f32 is the value that was written.
double written_number(const GgufFile& file, const std::string& key, double fallback) {
  const GgufValue* value = file.find(key);
  if (value == nullptr) return fallback;
  const double number = file.number(key);
  if (value->type != GgufType::kF32) return number;
  char text[32];
  const auto result = std::to_chars(text, text + sizeof(text) - 1, float(number));
  *result.ptr = '\0';
  return std::strtod(text, nullptr);
}

double written_number(const GgufFile& file, const std::string& key) {
  file.number(key);  // the error for a missing key or a non-number
  return written_number(file, key, 0.0);
}

}  // namespace

Json gguf_config_json(const GgufFile& file) {
  const std::string arch = file.string("general.architecture");
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "phi3" && arch != "gemma3") {
    throw Error(file.source(), "metadata \"general.architecture\"", kGgufArchitectures,
                "\"" + arch + "\"");
  }
  // Split files (name-00001-of-00003.gguf) hold a part of the tensors each.
  if (const uint32_t parts = file.u32("split.count", 1); parts > 1) {
    throw Error(file.source(), "metadata \"split.count\"",
                "a single-file GGUF (join the parts with llama-gguf-split --merge)",
                std::to_string(parts) + " parts");
  }
  const std::string p = arch + ".";
  Json config;
  config["model_type"] = arch == "gemma3" ? "gemma3_text" : arch;
  const uint64_t hidden = file.u32(p + "embedding_length");
  const uint64_t heads = file.u32(p + "attention.head_count");
  config["hidden_size"] = hidden;
  config["num_hidden_layers"] = file.u32(p + "block_count");
  config["intermediate_size"] = file.u32(p + "feed_forward_length");
  config["num_attention_heads"] = heads;
  config["num_key_value_heads"] = file.u32(p + "attention.head_count_kv", uint32_t(heads));
  config["rms_norm_eps"] = written_number(file, p + "attention.layer_norm_rms_epsilon");
  config["rope_theta"] = written_number(file, p + "rope.freq_base", 10000.0);
  config["max_position_embeddings"] = file.u32(p + "context_length");
  config["dtype"] = "float32";  // quantized weights are dequantized to F32

  uint64_t head_dim = heads > 0 ? hidden / heads : 0;
  if (file.has(p + "attention.key_length")) {
    head_dim = file.u32(p + "attention.key_length");
    const uint64_t value_length = file.u32(p + "attention.value_length", uint32_t(head_dim));
    if (value_length != head_dim) {
      throw Error(file.source(), "metadata \"" + p + "attention.value_length\"",
                  "the key length " + std::to_string(head_dim), std::to_string(value_length));
    }
    config["head_dim"] = head_dim;
  }
  // Rotary channels: every one of a head's except phi3's partial rotation.
  const uint64_t rotary = file.u32(p + "rope.dimension_count", uint32_t(head_dim));
  if (arch == "phi3" && rotary != head_dim && head_dim > 0) {
    config["partial_rotary_factor"] = double(rotary) / double(head_dim);
  } else if (rotary != head_dim) {
    throw Error(
        file.source(), "metadata \"" + p + "rope.dimension_count\"",
        "the head dimension " + std::to_string(head_dim) + " (" + arch + " rotates whole heads)",
        std::to_string(rotary));
  }

  // Vocabulary: the explicit size, else the tokenizer's, else the embedding's rows.
  if (file.has(p + "vocab_size")) {
    config["vocab_size"] = file.u32(p + "vocab_size");
  } else if (file.has("tokenizer.ggml.tokens")) {
    config["vocab_size"] = file.array_size("tokenizer.ggml.tokens");
  } else if (const GgufTensorInfo* embed = file.tensor("token_embd.weight");
             embed != nullptr && embed->dims.size() == 2) {
    config["vocab_size"] = embed->dims[1];
  } else {
    throw Error(file.source(), "metadata \"" + p + "vocab_size\"",
                "a vocabulary size (or tokenizer.ggml.tokens, or a token_embd.weight tensor)",
                "none");
  }
  // llama.cpp uses the embedding as output matrix when output.weight is absent.
  config["tie_word_embeddings"] = file.tensor("output.weight") == nullptr;
  if (file.has("tokenizer.ggml.bos_token_id")) {
    config["bos_token_id"] = file.u32("tokenizer.ggml.bos_token_id");
  }
  if (file.has("tokenizer.ggml.eos_token_id")) {
    config["eos_token_id"] = file.u32("tokenizer.ggml.eos_token_id");
  }

  // Rope scaling: the metadata's type and factor; llama3's per-frequency factors come as the
  // rope_freqs.weight tensor and phi3's longrope as rope_factors_long/short.weight, which are
  // the longrope divisors transformers computes (with no attention factor for llama3).
  const int64_t pairs = int64_t(rotary / 2);
  const std::string scaling = file.optional_string(p + "rope.scaling.type").value_or("none");
  const uint64_t context = file.u32(p + "context_length");
  const uint64_t original = file.u32(p + "rope.scaling.original_context_length", uint32_t(context));
  if (const GgufTensorInfo* freqs = file.tensor("rope_freqs.weight"); freqs && arch == "llama") {
    const std::vector<double> factors = rope_factor_tensor(file, *freqs, pairs);
    config["rope_scaling"] = {
        {"rope_type", "longrope"}, {"short_factor", factors},
        {"long_factor", factors},  {"factor", 1.0},
        {"attention_factor", 1.0}, {"original_max_position_embeddings", context}};
  } else if (const GgufTensorInfo* long_factors = file.tensor("rope_factors_long.weight");
             long_factors && arch == "phi3") {
    const GgufTensorInfo* short_factors = file.tensor("rope_factors_short.weight");
    if (short_factors == nullptr) {
      throw Error(file.source(), "tensor \"rope_factors_short.weight\"",
                  "beside rope_factors_long.weight (phi3 longrope)", "none");
    }
    Json rope = {{"rope_type", "longrope"},
                 {"short_factor", rope_factor_tensor(file, *short_factors, pairs)},
                 {"long_factor", rope_factor_tensor(file, *long_factors, pairs)}};
    if (file.has(p + "rope.scaling.attn_factor")) {
      rope["attention_factor"] = written_number(file, p + "rope.scaling.attn_factor");
    }
    config["rope_scaling"] = rope;
    config["original_max_position_embeddings"] = original;
  } else if (scaling == "linear") {
    config["rope_scaling"] = {{"rope_type", "linear"},
                              {"factor", written_number(file, p + "rope.scaling.factor")}};
  } else if (scaling == "yarn") {
    config["rope_scaling"] = {{"rope_type", "yarn"},
                              {"factor", written_number(file, p + "rope.scaling.factor")},
                              {"original_max_position_embeddings", original}};
  } else if (scaling != "none") {
    throw Error(file.source(), "metadata \"" + p + "rope.scaling.type\"",
                "\"none\", \"linear\" or \"yarn\"", "\"" + scaling + "\"");
  } else if (file.has(p + "rope.scale_linear")) {  // older files
    const double factor = written_number(file, p + "rope.scale_linear");
    if (factor != 1.0) config["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
  }

  if (arch == "phi3" && file.has(p + "attention.sliding_window")) {
    config["sliding_window"] = file.u32(p + "attention.sliding_window");
  }
  if (arch == "gemma3") {
    // llama.cpp's gemma3: every sixth layer global, the others sliding-window with rope base
    // 10000; queries scaled by 1/sqrt(head_dim) except for the 62-layer 27B, which uses
    // hidden_size / heads (its config's query_pre_attn_scalar 168).
    const uint64_t layers = file.u32(p + "block_count");
    const uint64_t pattern = file.u32(p + "attention.sliding_window_pattern", 6);
    Json layer_types = Json::array();
    for (uint64_t i = 0; i < layers; ++i) {
      layer_types.push_back(pattern != 0 && (i + 1) % pattern == 0 ? "full_attention"
                                                                   : "sliding_attention");
    }
    config["layer_types"] = layer_types;
    config["sliding_window"] = file.u32(p + "attention.sliding_window");
    config["query_pre_attn_scalar"] = layers == 62 && heads > 0 ? hidden / heads : head_dim;
    config["rope_local_base_freq"] = 10000.0;
    config["hidden_activation"] = "gelu_pytorch_tanh";
    config["final_logit_softcapping"] =
        file.has(p + "final_logit_softcapping")
            ? Json(written_number(file, p + "final_logit_softcapping"))
            : Json();
    config["attn_logit_softcapping"] =
        file.has(p + "attn_logit_softcapping")
            ? Json(written_number(file, p + "attn_logit_softcapping"))
            : Json();
  }
  return config;
}

ModelConfig gguf_model_config(const GgufFile& file) {
  return ModelConfig::parse(gguf_config_json(file).dump(), file.source());
}

}  // namespace kvlens
