// Parsing and validation of a Llama-family config.json into ModelConfig, and the rotary inverse
// frequencies [head_dim / 2] with transformers' `linear` and `llama3` rope scaling applied.
#include "engine/model/config.h"

#include <cmath>
#include <limits>
#include <numbers>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/common/json_describe.h"
#include "engine/common/json_fields.h"
#include "engine/common/mapped_file.h"

namespace kvlens {
namespace {

using Json = nlohmann::json;

// Integer fields are bounded so that later products (vocab * hidden, heads * head_dim, ...) can
// never overflow int64 and token ids fit int32.
constexpr int64_t kMaxDimension = std::numeric_limits<int32_t>::max();

// rope_scaling (transformers 4) or rope_parameters (transformers 5). Both spell the kind as
// "rope_type"; older configs use "type", which transformers copies over "rope_type".
RopeScaling parse_rope_scaling(const FieldReader& rope) {
  RopeScaling scaling;
  std::optional<std::string> kind = rope.optional_string("type");
  if (!kind) kind = rope.optional_string("rope_type");
  if (!kind || *kind == "default") return scaling;
  if (*kind == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
    scaling.factor = rope.number_or("factor", 1.0, 0.0);
    return scaling;
  }
  if (*kind == "llama3") {
    scaling.type = RopeScaling::Type::kLlama3;
    if (rope.find("factor") == nullptr) {
      throw Error(rope.source(), rope.prefix() + "factor", "a number for llama3 rope scaling",
                  "missing");
    }
    scaling.factor = rope.number_or("factor", 1.0, 0.0);
    scaling.low_freq_factor = rope.number_or("low_freq_factor", 1.0, 0.0);
    scaling.high_freq_factor = rope.number_or("high_freq_factor", 4.0, 0.0);
    scaling.original_max_position_embeddings =
        rope.integer_or("original_max_position_embeddings", 8192, 1, kMaxDimension);
    // The smoothing step divides by (high - low); equal factors would make it 0/0.
    if (!(scaling.high_freq_factor > scaling.low_freq_factor)) {
      throw Error(
          rope.source(), rope.prefix() + "high_freq_factor",
          "a value greater than low_freq_factor (" + Json(scaling.low_freq_factor).dump() + ")",
          Json(scaling.high_freq_factor).dump());
    }
    return scaling;
  }
  const std::string field = rope.prefix() + (rope.find("type") ? "type" : "rope_type");
  throw Error(rope.source(), field, "\"default\", \"linear\" or \"llama3\"", "\"" + *kind + "\"");
}

DType parse_torch_dtype(const FieldReader& reader) {
  // transformers 5 writes "dtype"; 4.x writes "torch_dtype".
  const std::string key = reader.find("dtype") != nullptr ? "dtype" : "torch_dtype";
  const std::optional<std::string> name = reader.optional_string(key);
  if (!name) return DType::F32;
  if (*name == "float32") return DType::F32;
  if (*name == "bfloat16") return DType::BF16;
  if (*name == "float16") return DType::F16;
  throw Error(reader.source(), key, "\"float32\", \"bfloat16\" or \"float16\"",
              "\"" + *name + "\"");
}

}  // namespace

ModelConfig ModelConfig::parse(const std::string& json_text, const std::string& source) {
  Json root;
  try {
    root = Json::parse(json_text);
  } catch (const Json::exception& error) {
    throw Error(source, "JSON", "a valid JSON document", error.what());
  }
  if (!root.is_object())
    throw Error(source, "JSON", "an object at the top level", describe_json(root));
  const FieldReader reader(root, source);

  ModelConfig config;
  config.source = source;

  const std::optional<std::string> model_type = reader.optional_string("model_type");
  // llama_butler: a TokenButler release, a Llama whose layer-0 attention also holds the
  // predictor (Predictor::from_butler reads its fields).
  const char* expected_types = "\"llama\", \"mistral\", \"llama_butler\", \"qwen2\" or \"qwen3\"";
  if (!model_type) throw Error(source, "model_type", expected_types, "missing");
  if (*model_type != "llama" && *model_type != "mistral" && *model_type != "llama_butler" &&
      *model_type != "qwen2" && *model_type != "qwen3") {
    throw Error(source, "model_type", expected_types, "\"" + *model_type + "\"");
  }
  config.model_type = *model_type;
  const bool mistral = config.model_type == "mistral";
  const bool qwen2 = config.model_type == "qwen2";
  const bool qwen3 = config.model_type == "qwen3";

  // Structural sizes are required: transformers' class defaults (a 7B shape) would only turn a
  // broken config into a confusing weight-shape error later.
  config.vocab_size = reader.integer("vocab_size", 1, kMaxDimension);
  config.hidden_size = reader.integer("hidden_size", 1, kMaxDimension);
  config.intermediate_size = reader.integer("intermediate_size", 1, kMaxDimension);
  config.num_layers = reader.integer("num_hidden_layers", 1, kMaxDimension);
  config.num_heads = reader.integer("num_attention_heads", 1, kMaxDimension);
  config.num_kv_heads =
      reader.integer_or("num_key_value_heads", config.num_heads, 1, config.num_heads);
  if (config.num_heads % config.num_kv_heads != 0) {
    throw Error(source, "num_key_value_heads",
                "a divisor of num_attention_heads (" + std::to_string(config.num_heads) + ")",
                std::to_string(config.num_kv_heads));
  }
  if (const auto head_dim = reader.optional_integer("head_dim", 1, kMaxDimension)) {
    config.head_dim = *head_dim;
  } else {
    if (config.hidden_size % config.num_heads != 0) {
      throw Error(source, "hidden_size",
                  "a multiple of num_attention_heads (" + std::to_string(config.num_heads) +
                      ") when head_dim is not given",
                  std::to_string(config.hidden_size));
    }
    config.head_dim = config.hidden_size / config.num_heads;
  }
  // Rotary embeddings rotate pairs of channels.
  if (config.head_dim % 2 != 0) {
    throw Error(source, "head_dim", "an even number", std::to_string(config.head_dim));
  }
  if (config.num_heads * config.head_dim > kMaxDimension) {
    throw Error(source, "num_attention_heads * head_dim",
                "at most " + std::to_string(kMaxDimension),
                std::to_string(config.num_heads * config.head_dim));
  }

  config.rms_norm_eps = reader.number_or("rms_norm_eps", 1e-6, 0.0);

  // Rope: transformers 5 nests rope_theta inside rope_parameters; 4.x has it at the top level
  // and the scaling in rope_scaling. rope_parameters wins when both are present.
  config.rope_theta = reader.number_or("rope_theta", 10000.0, 0.0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const Json* rope = reader.find(key);
    if (rope == nullptr) continue;
    if (!rope->is_object()) throw Error(source, key, "an object or null", describe_json(*rope));
    const FieldReader rope_reader(*rope, source, std::string(key) + ".");
    config.rope_theta = rope_reader.number_or("rope_theta", config.rope_theta, 0.0);
    config.rope_scaling = parse_rope_scaling(rope_reader);
    break;
  }
  // Llama-family models rotate every channel of a head; a partial rotation is another model.
  if (reader.number_or("partial_rotary_factor", 1.0, 0.0) != 1.0) {
    throw Error(source, "partial_rotary_factor", "1.0 (full rotary embedding)",
                reader.find("partial_rotary_factor")->dump());
  }

  config.tie_word_embeddings = reader.boolean_or("tie_word_embeddings", false);
  config.max_position_embeddings =
      reader.integer_or("max_position_embeddings", mistral ? 4096 * 32 : 2048, 1, kMaxDimension);

  // Mistral only: an absent key means MistralConfig's default window of 4096 (what
  // transformers' masks then apply); an explicit null means no window. LlamaConfig has no
  // sliding window, so Llama attention ignores the key.
  if (mistral) {
    if (root.contains("sliding_window")) {
      config.sliding_window = reader.optional_integer("sliding_window", 1, kMaxDimension);
    } else {
      config.sliding_window = 4096;
    }
  }

  config.bos_token_id = reader.optional_integer("bos_token_id", 0, kMaxDimension);
  if (const Json* eos = reader.find("eos_token_id")) {
    if (eos->is_array()) {
      for (size_t i = 0; i < eos->size(); ++i) {
        config.eos_token_ids.push_back(reader.integer_value(
            "eos_token_id[" + std::to_string(i) + "]", (*eos)[i], 0, kMaxDimension));
      }
    } else {
      config.eos_token_ids.push_back(reader.integer_value("eos_token_id", *eos, 0, kMaxDimension));
    }
  }

  config.torch_dtype = parse_torch_dtype(reader);

  // Qwen2 always has q, k and v biases (and none on o_proj: it has no attention_bias field).
  // attention_bias (biases on all four projections of a Llama or Qwen3) and MLP biases are
  // other models, not supported yet.
  config.qkv_bias = qwen2;
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (reader.boolean_or(key, false)) {
      throw Error(source, key, "false (bias terms are not supported)", "true");
    }
  }
  config.qk_norm = qwen3;
  // Qwen sliding windows apply to some layers only (max_window_layers, layer_types); kvlens
  // attends the same way in every layer, so a config that turns them on is refused.
  if ((qwen2 || qwen3) && reader.boolean_or("use_sliding_window", false)) {
    throw Error(source, "use_sliding_window", "false (per-layer sliding windows are not supported)",
                "true");
  }
  // The MLP is SwiGLU; another activation would silently compute a different model.
  if (const auto act = reader.optional_string("hidden_act"); act && *act != "silu") {
    throw Error(source, "hidden_act", "\"silu\"", "\"" + *act + "\"");
  }
  return config;
}

ModelConfig ModelConfig::load(const std::string& config_json_path) {
  return parse(read_text_file(config_json_path), config_json_path);
}

std::vector<float> ModelConfig::rope_inv_freq() const {
  const int64_t half = head_dim / 2;
  std::vector<float> result(size_t(half > 0 ? half : 0));
  const double dim = double(head_dim);
  const RopeScaling& s = rope_scaling;
  const double old_context = double(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  for (int64_t i = 0; i < half; ++i) {
    double inv_freq = 1.0 / std::pow(rope_theta, double(2 * i) / dim);
    switch (s.type) {
      case RopeScaling::Type::kNone:
        break;
      case RopeScaling::Type::kLinear:
        inv_freq /= s.factor;
        break;
      case RopeScaling::Type::kLlama3: {
        // Same three bands as transformers' _compute_llama3_parameters: long wavelengths are
        // slowed by `factor`, short ones kept, the band in between interpolated.
        const double wavelen = 2.0 * std::numbers::pi / inv_freq;
        if (wavelen > low_freq_wavelen) {
          inv_freq /= s.factor;
        } else if (!(wavelen < high_freq_wavelen)) {
          const double smooth = (old_context / wavelen - s.low_freq_factor) /
                                (s.high_freq_factor - s.low_freq_factor);
          inv_freq = (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq;
        }
        break;
      }
    }
    result[size_t(i)] = float(inv_freq);
  }
  return result;
}

}  // namespace kvlens
