// Parsing and validation of a Llama-family config.json into ModelConfig, and the rotary inverse
// frequencies [rotary_dim / 2] with transformers' rope scalings (linear, llama3, yarn, dynamic,
// longrope) applied, to the float where transformers computes in F32.
#include "engine/model/config.h"

#include <algorithm>
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

// What parse_rope_scaling needs beyond the rope object itself.
struct RopeContext {
  bool phi3 = false;
  int64_t rotary_dim = 0;
  int64_t max_position_embeddings = 0;  // config.json's
  const FieldReader* top = nullptr;     // the config's top level
};

// A number that must be given (llama3, yarn and dynamic `factor`; transformers raises a
// KeyError without it).
double required_number(const FieldReader& rope, const std::string& key, const std::string& what) {
  if (rope.find(key) == nullptr)
    throw Error(rope.source(), rope.prefix() + key, "a number for " + what, "missing");
  return rope.number_or(key, 1.0, 0.0);
}

// Any finite number (mscale, beta_fast: transformers only tests them for truth).
double any_number_or(const FieldReader& rope, const std::string& key, double fallback) {
  return rope.number_or(key, fallback, -std::numeric_limits<double>::infinity());
}

// longrope's short_factor / long_factor: one positive divisor per rotated frequency.
std::vector<double> factor_list(const FieldReader& rope, const std::string& key, int64_t count) {
  const std::string expected =
      "a list of " + std::to_string(count) + " numbers (one per rotated channel pair)";
  const Json* value = rope.find(key);
  if (value == nullptr) throw Error(rope.source(), rope.prefix() + key, expected, "missing");
  if (!value->is_array() || int64_t(value->size()) != count) {
    const std::string found = value->is_array()
                                  ? "a list of " + std::to_string(value->size()) + " entries"
                                  : describe_json(*value);
    throw Error(rope.source(), rope.prefix() + key, expected, found);
  }
  std::vector<double> factors;
  for (size_t i = 0; i < value->size(); ++i) {
    const Json& entry = (*value)[i];
    const double number = entry.is_number() ? entry.get<double>() : 0.0;
    if (!entry.is_number() || !std::isfinite(number) || !(number > 0.0)) {
      throw Error(rope.source(), rope.prefix() + key + "[" + std::to_string(i) + "]",
                  "a finite number greater than 0", describe_json(entry));
    }
    factors.push_back(number);
  }
  return factors;
}

// yarn / longrope pre-training context. Phi3Config always has a top-level
// original_max_position_embeddings (default 4096) and transformers copies it over the rope
// dict's; other configs take the rope dict's, else max_position_embeddings.
int64_t original_context(const FieldReader& rope, const RopeContext& ctx, int64_t min_value) {
  if (ctx.phi3) {
    return ctx.top->integer_or("original_max_position_embeddings", 4096, min_value, kMaxDimension);
  }
  return rope.integer_or("original_max_position_embeddings", ctx.max_position_embeddings, min_value,
                         kMaxDimension);
}

// yarn's attention factor when none is given: transformers' get_mscale.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// rope_scaling (transformers 4) or rope_parameters (transformers 5). Both spell the kind as
// "rope_type"; older configs use "type", which transformers copies over "rope_type".
RopeScaling parse_rope_scaling(const FieldReader& rope, const RopeContext& ctx) {
  RopeScaling scaling;
  std::optional<std::string> kind = rope.optional_string("type");
  if (!kind) kind = rope.optional_string("rope_type");
  const std::string type_field = rope.prefix() + (rope.find("type") ? "type" : "rope_type");
  if (!kind || *kind == "default") return scaling;
  // Phi3Config renames "su" and "yarn" to longrope and accepts nothing else.
  if (ctx.phi3 && (*kind == "su" || *kind == "yarn")) kind = "longrope";
  if (ctx.phi3 && *kind != "longrope") {
    throw Error(rope.source(), type_field, "\"default\" or \"longrope\" (phi3)",
                "\"" + *kind + "\"");
  }
  if (*kind == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
    scaling.factor = rope.number_or("factor", 1.0, 0.0);
    return scaling;
  }
  if (*kind == "llama3") {
    scaling.type = RopeScaling::Type::kLlama3;
    scaling.factor = required_number(rope, "factor", "llama3 rope scaling");
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
  if (*kind == "yarn") {
    scaling.type = RopeScaling::Type::kYarn;
    scaling.factor = required_number(rope, "factor", "yarn rope scaling");
    scaling.original_max_position_embeddings = original_context(rope, ctx, 1);
    if (rope.find("attention_factor") != nullptr) {
      scaling.attention_factor = rope.number_or("attention_factor", 1.0, 0.0);
    } else {
      const double mscale = any_number_or(rope, "mscale", 0.0);
      const double mscale_all_dim = any_number_or(rope, "mscale_all_dim", 0.0);
      scaling.attention_factor =
          (mscale != 0.0 && mscale_all_dim != 0.0)
              ? yarn_mscale(scaling.factor, mscale) / yarn_mscale(scaling.factor, mscale_all_dim)
              : yarn_mscale(scaling.factor, 1.0);
    }
    // transformers: `rope_parameters.get("beta_fast") or 32`, so 0 means the default too.
    scaling.beta_fast = any_number_or(rope, "beta_fast", 32.0);
    if (scaling.beta_fast == 0.0) scaling.beta_fast = 32.0;
    scaling.beta_slow = any_number_or(rope, "beta_slow", 1.0);
    if (scaling.beta_slow == 0.0) scaling.beta_slow = 1.0;
    scaling.truncate = rope.boolean_or("truncate", true);
    return scaling;
  }
  if (*kind == "dynamic") {
    scaling.type = RopeScaling::Type::kDynamic;
    scaling.factor = required_number(rope, "factor", "dynamic rope scaling");
    scaling.original_max_position_embeddings = ctx.max_position_embeddings;
    // The rescaled base has the exponent dim / (dim - 2).
    if (ctx.rotary_dim <= 2) {
      throw Error(rope.source(), "head_dim", "more than 2 for dynamic rope scaling",
                  std::to_string(ctx.rotary_dim));
    }
    return scaling;
  }
  if (*kind == "longrope") {
    scaling.type = RopeScaling::Type::kLongRope;
    // The default attention factor divides by log(original_max_position_embeddings).
    scaling.original_max_position_embeddings = original_context(rope, ctx, 2);
    const int64_t pairs = ctx.rotary_dim / 2;
    scaling.short_factor = factor_list(rope, "short_factor", pairs);
    scaling.long_factor = factor_list(rope, "long_factor", pairs);
    // Phi-3 configs give no factor: the ratio of the two contexts stands for it.
    scaling.factor = rope.number_or(
        "factor",
        double(ctx.max_position_embeddings) / double(scaling.original_max_position_embeddings),
        0.0);
    if (rope.find("attention_factor") != nullptr) {
      scaling.attention_factor = rope.number_or("attention_factor", 1.0, 0.0);
    } else if (scaling.factor > 1.0) {
      scaling.attention_factor =
          std::sqrt(1.0 + std::log(scaling.factor) /
                              std::log(double(scaling.original_max_position_embeddings)));
    }
    return scaling;
  }
  throw Error(rope.source(), type_field,
              "\"default\", \"linear\", \"llama3\", \"yarn\", \"dynamic\" or \"longrope\"",
              "\"" + *kind + "\"");
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

// Gemma 3's fields beyond the Llama ones: which layers are local (layer_types, else every
// sliding_window_pattern-th layer is global), the window, the attention scalar, the soft-cap, the
// GeGLU activation, the scaled embeddings and the (1 + weight) sandwich norms.
void parse_gemma3_fields(const Json& text, const FieldReader& reader, ModelConfig& config) {
  const std::string& source = config.source;
  // An absent key is Gemma3TextConfig's default window; an explicit null is none.
  config.sliding_window = text.contains("sliding_window")
                              ? reader.optional_integer("sliding_window", 1, kMaxDimension)
                              : std::optional<int64_t>(4096);
  config.sliding_layers.assign(size_t(config.num_layers), false);
  if (const Json* types = reader.find("layer_types")) {
    const std::string expected = "a list of " + std::to_string(config.num_layers) +
                                 " \"sliding_attention\" or \"full_attention\" entries";
    if (!types->is_array() || int64_t(types->size()) != config.num_layers) {
      throw Error(source, reader.prefix() + "layer_types", expected,
                  types->is_array() ? "a list of " + std::to_string(types->size()) + " entries"
                                    : describe_json(*types));
    }
    for (size_t i = 0; i < types->size(); ++i) {
      const Json& kind = (*types)[i];
      if (kind != "sliding_attention" && kind != "full_attention") {
        throw Error(source, reader.prefix() + "layer_types[" + std::to_string(i) + "]",
                    "\"sliding_attention\" or \"full_attention\"", describe_json(kind));
      }
      config.sliding_layers[i] = kind == "sliding_attention";
    }
  } else {
    const int64_t pattern = reader.integer_or("sliding_window_pattern", 6, 1, kMaxDimension);
    for (int64_t i = 0; i < config.num_layers; ++i)
      config.sliding_layers[size_t(i)] = (i + 1) % pattern != 0;
  }
  config.attention_scalar = reader.number_or("query_pre_attn_scalar", 256.0, 0.0);
  config.final_logit_softcap = reader.number_or("final_logit_softcapping", 0.0, 0.0);
  // (transformers 5.17's Gemma3Attention stores it but never passes it to the attention, as
  // Gemma2's does; kvlens applies it as Gemma 2 defines it: docs/models.md)
  config.attn_logit_softcap = reader.number_or("attn_logit_softcapping", 0.0, 0.0);
  const std::string activation =
      reader.optional_string("hidden_activation").value_or("gelu_pytorch_tanh");
  if (activation != "gelu_pytorch_tanh") {
    throw Error(source, reader.prefix() + "hidden_activation", "\"gelu_pytorch_tanh\"",
                "\"" + activation + "\"");
  }
  config.hidden_activation = ModelConfig::Activation::kGeluTanh;
  config.embedding_scale = std::sqrt(double(config.hidden_size));
  config.norm_weight_offset = true;
  config.sandwich_norms = true;
  if (reader.boolean_or("use_bidirectional_attention", false)) {
    throw Error(source, reader.prefix() + "use_bidirectional_attention",
                "false (a decoder attends causally)", "true");
  }
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

  ModelConfig config;
  config.source = source;

  // A "gemma3" config (Gemma3ForConditionalGeneration) keeps the language model's fields under
  // text_config; kvlens runs that part alone.
  const Json* text = &root;
  std::string prefix;
  if (root.contains("model_type") && root["model_type"] == "gemma3") {
    const FieldReader top(root, source);
    text = top.find("text_config");
    if (text == nullptr || !text->is_object()) {
      throw Error(source, "text_config", "an object (a gemma3 config's language model)",
                  text == nullptr ? "missing" : describe_json(*text));
    }
    prefix = "text_config.";
    config.multimodal_prefix = true;
  }
  const FieldReader reader(*text, source, prefix);

  std::optional<std::string> model_type = reader.optional_string("model_type");
  if (config.multimodal_prefix && !model_type) model_type = "gemma3_text";
  // llama_butler: a TokenButler release, a Llama whose layer-0 attention also holds the
  // predictor (Predictor::from_butler reads its fields).
  const char* expected_types =
      "\"llama\", \"mistral\", \"llama_butler\", \"qwen2\", \"qwen3\", \"phi3\", "
      "\"gemma3_text\" or \"gemma3\"";
  if (!model_type) throw Error(source, "model_type", expected_types, "missing");
  if (*model_type != "llama" && *model_type != "mistral" && *model_type != "llama_butler" &&
      *model_type != "qwen2" && *model_type != "qwen3" && *model_type != "phi3" &&
      *model_type != "gemma3_text") {
    throw Error(source, reader.prefix() + "model_type", expected_types, "\"" + *model_type + "\"");
  }
  config.model_type = *model_type;
  const bool mistral = config.model_type == "mistral";
  const bool qwen2 = config.model_type == "qwen2";
  const bool qwen3 = config.model_type == "qwen3";
  const bool phi3 = config.model_type == "phi3";
  const bool gemma3 = config.model_type == "gemma3_text";

  // Structural sizes are required: transformers' class defaults (a 7B shape) would only turn a
  // broken config into a confusing weight-shape error later.
  // Gemma3TextConfig's defaults stand in for absent ones there (Gemma 3 4B's text_config gives
  // neither vocab_size nor the head counts).
  config.vocab_size = gemma3 ? reader.integer_or("vocab_size", 262208, 1, kMaxDimension)
                             : reader.integer("vocab_size", 1, kMaxDimension);
  config.hidden_size = reader.integer("hidden_size", 1, kMaxDimension);
  config.intermediate_size = reader.integer("intermediate_size", 1, kMaxDimension);
  config.num_layers = reader.integer("num_hidden_layers", 1, kMaxDimension);
  config.num_heads = gemma3 ? reader.integer_or("num_attention_heads", 8, 1, kMaxDimension)
                            : reader.integer("num_attention_heads", 1, kMaxDimension);
  config.num_kv_heads = reader.integer_or(
      "num_key_value_heads", gemma3 ? std::min<int64_t>(4, config.num_heads) : config.num_heads, 1,
      config.num_heads);
  if (config.num_heads % config.num_kv_heads != 0) {
    throw Error(source, "num_key_value_heads",
                "a divisor of num_attention_heads (" + std::to_string(config.num_heads) + ")",
                std::to_string(config.num_kv_heads));
  }
  if (const auto head_dim = reader.optional_integer("head_dim", 1, kMaxDimension)) {
    config.head_dim = *head_dim;
  } else if (gemma3) {
    config.head_dim = 256;
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

  // Absent fields take the transformers config class's defaults (Phi3Config: 1e-5, 4096).
  config.rms_norm_eps = reader.number_or("rms_norm_eps", phi3 ? 1e-5 : 1e-6, 0.0);

  // A gemma3 config may say tie_word_embeddings at its top level only (Gemma ties them).
  config.tie_word_embeddings = reader.boolean_or(
      "tie_word_embeddings",
      gemma3 && FieldReader(root, source).boolean_or("tie_word_embeddings", true));
  config.max_position_embeddings = reader.integer_or("max_position_embeddings",
                                                     mistral  ? 4096 * 32
                                                     : phi3   ? 4096
                                                     : gemma3 ? 131072
                                                              : 2048,
                                                     1, kMaxDimension);

  // Rope: transformers 5 nests rope_theta inside rope_parameters; 4.x has it at the top level
  // and the scaling in rope_scaling. rope_parameters wins when both are present.
  config.rope_theta = reader.number_or("rope_theta", gemma3 ? 1000000.0 : 10000.0, 0.0);
  std::optional<FieldReader> rope_reader;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const Json* rope = reader.find(key);
    if (rope == nullptr) continue;
    if (!rope->is_object())
      throw Error(source, reader.prefix() + key, "an object or null", describe_json(*rope));
    rope_reader.emplace(*rope, source, reader.prefix() + key + ".");
    break;
  }
  if (gemma3) {
    // transformers 5 keeps one rope_parameters entry per layer kind; 4.x has the global
    // layers' rope_theta and rope_scaling and the local layers' rope_local_base_freq.
    config.rope_local_theta = reader.number_or("rope_local_base_freq", 10000.0, 0.0);
    if (rope_reader && rope_reader->find("full_attention") != nullptr) {
      const FieldReader per_kind = *rope_reader;
      for (const char* kind : {"full_attention", "sliding_attention"}) {
        const Json* entry = per_kind.find(kind);
        if (entry != nullptr && !entry->is_object()) {
          throw Error(source, per_kind.prefix() + kind, "an object or null", describe_json(*entry));
        }
      }
      if (const Json* local = per_kind.find("sliding_attention")) {
        const FieldReader local_reader(*local, source, per_kind.prefix() + "sliding_attention.");
        config.rope_local_theta = local_reader.number_or("rope_theta", 10000.0, 0.0);
        const std::optional<std::string> type = local_reader.optional_string("rope_type");
        if (type && *type != "default") {
          throw Error(source, local_reader.prefix() + "rope_type",
                      "\"default\" (the local layers' RoPE is never scaled)", "\"" + *type + "\"");
        }
      }
      rope_reader.emplace(*per_kind.find("full_attention"), source,
                          per_kind.prefix() + "full_attention.");
    }
  }
  // partial_rotary_factor: in rope_parameters (transformers 5), else at the top level (Phi-4-mini's
  // config.json). Phi3 rotates the first int(head_dim * factor) channels of each head; the other
  // families rotate them all, so a partial rotation there is another model.
  const FieldReader& partial_reader =
      rope_reader && rope_reader->find("partial_rotary_factor") ? *rope_reader : reader;
  const std::string partial_field = partial_reader.prefix() + "partial_rotary_factor";
  const double partial = partial_reader.number_or("partial_rotary_factor", 1.0, 0.0);
  if (!phi3 && partial != 1.0) {
    throw Error(source, partial_field, "1.0 (full rotary embedding; partial is phi3 only)",
                partial_reader.find("partial_rotary_factor")->dump());
  }
  config.rotary_dim = int64_t(double(config.head_dim) * partial);  // Python's int(): truncation
  if (partial > 1.0 || config.rotary_dim < 2 || config.rotary_dim % 2 != 0) {
    throw Error(source, partial_field,
                "a factor in (0, 1] giving an even rotary dimension >= 2 (head_dim " +
                    std::to_string(config.head_dim) + " x factor)",
                partial_reader.find("partial_rotary_factor")->dump());
  }
  if (rope_reader) {
    config.rope_theta = rope_reader->number_or("rope_theta", config.rope_theta, 0.0);
    config.rope_scaling = parse_rope_scaling(
        *rope_reader, RopeContext{.phi3 = phi3,
                                  .rotary_dim = config.rotary_dim,
                                  .max_position_embeddings = config.max_position_embeddings,
                                  .top = &reader});
  }
  if (config.rope_scaling.type == RopeScaling::Type::kDynamic) {
    // transformers rescales past max_position_embeddings without limit; kvlens sizes caches by
    // it, so it allows the context the factor was configured for.
    const double scaled = std::floor(double(config.max_position_embeddings) *
                                     std::max(1.0, config.rope_scaling.factor));
    config.max_position_embeddings = int64_t(std::min(scaled, double(kMaxDimension)));
  }

  // Phi3Config's sliding_window defaults to None: only a given one masks (Phi-3-mini's 2047).
  if (phi3) config.sliding_window = reader.optional_integer("sliding_window", 1, kMaxDimension);

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

  if (gemma3) parse_gemma3_fields(*text, reader, config);

  // A gemma3 config may give the token ids and the dtype at its top level only.
  const FieldReader top(root, source);
  auto with_key = [&](const std::string& key) -> const FieldReader& {
    return reader.find(key) == nullptr && config.multimodal_prefix ? top : reader;
  };
  config.bos_token_id = with_key("bos_token_id").optional_integer("bos_token_id", 0, kMaxDimension);
  const FieldReader& eos_reader = with_key("eos_token_id");
  if (const Json* eos = eos_reader.find("eos_token_id")) {
    if (eos->is_array()) {
      for (size_t i = 0; i < eos->size(); ++i) {
        config.eos_token_ids.push_back(eos_reader.integer_value(
            "eos_token_id[" + std::to_string(i) + "]", (*eos)[i], 0, kMaxDimension));
      }
    } else {
      config.eos_token_ids.push_back(
          eos_reader.integer_value("eos_token_id", *eos, 0, kMaxDimension));
    }
  }

  const bool text_dtype = reader.find("dtype") != nullptr || reader.find("torch_dtype") != nullptr;
  config.torch_dtype = parse_torch_dtype(text_dtype || !config.multimodal_prefix ? reader : top);

  // Qwen2 always has q, k and v biases (and none on o_proj: it has no attention_bias field).
  // attention_bias (biases on all four projections of a Llama or Qwen3) and MLP biases are
  // other models, not supported yet.
  config.qkv_bias = qwen2;
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    if (reader.boolean_or(key, false)) {
      throw Error(source, key, "false (bias terms are not supported)", "true");
    }
  }
  config.qk_norm = qwen3 || gemma3;
  config.fused_projections = phi3;
  // Qwen sliding windows apply to some layers only (max_window_layers, layer_types); kvlens
  // attends the same way in every layer, so a config that turns them on is refused.
  if ((qwen2 || qwen3) && reader.boolean_or("use_sliding_window", false)) {
    throw Error(source, "use_sliding_window", "false (per-layer sliding windows are not supported)",
                "true");
  }
  // The MLP is SwiGLU (gemma3: GeGLU); another activation would silently compute a different
  // model. Gemma3TextConfig reads hidden_activation; hidden_act is the others' key.
  if (!gemma3) {
    if (const auto act = reader.optional_string("hidden_act"); act && *act != "silu") {
      throw Error(source, reader.prefix() + "hidden_act", "\"silu\"", "\"" + *act + "\"");
    }
  }
  return config;
}

ModelConfig ModelConfig::load(const std::string& config_json_path) {
  return parse(read_text_file(config_json_path), config_json_path);
}

namespace {

// F32 helpers for the tables transformers builds from F32 tensors: base ** (arange(0, dim, 2) /
// dim) with the exponent rounded to float, and a float power computed in double and rounded
// once (within an ulp of torch's powf).
float f32_pow(float base, float exponent) {
  return float(std::pow(double(base), double(exponent)));
}
float f32_exponent(int64_t i, int64_t dim) {
  return float(2 * i) / float(dim);
}

// yarn (transformers' _compute_yarn_parameters): frequencies below the correction range are
// interpolated (divided by factor), those above extrapolated (kept), with a linear ramp between.
std::vector<float> yarn_inv_freq(double base, int64_t dim, const RopeScaling& s) {
  const double original = double(s.original_max_position_embeddings);
  auto correction_dim = [&](double rotations) {
    return (double(dim) * std::log(original / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const float low_f = float(low), width_f = float(high - low), factor_f = float(s.factor);
  std::vector<float> result(size_t(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float pos_freq = f32_pow(float(base), f32_exponent(i, dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor_f * pos_freq);
    const float ramp = std::clamp((float(i) - low_f) / width_f, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    result[size_t(i)] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return result;
}

}  // namespace

ModelConfig::RopeTable ModelConfig::rope_table(int64_t seq_len) const {
  const RopeScaling& s = rope_scaling;
  const bool long_call = seq_len > s.original_max_position_embeddings;
  if (s.type == RopeScaling::Type::kLongRope && long_call) return RopeTable::kLong;
  if (s.type == RopeScaling::Type::kDynamic && long_call) return RopeTable::kPerLength;
  return RopeTable::kShort;
}

double ModelConfig::rope_attention_scale() const {
  const RopeScaling::Type type = rope_scaling.type;
  return type == RopeScaling::Type::kYarn || type == RopeScaling::Type::kLongRope
             ? rope_scaling.attention_factor
             : 1.0;
}

std::vector<float> ModelConfig::rope_inv_freq(int64_t seq_len) const {
  const int64_t rotated = rotary_dim > 0 ? rotary_dim : head_dim;
  const int64_t half = rotated / 2;
  const RopeScaling& s = rope_scaling;
  if (half <= 0) return {};
  if (s.type == RopeScaling::Type::kYarn) return yarn_inv_freq(rope_theta, rotated, s);
  if (s.type == RopeScaling::Type::kLongRope) {
    // 1 / (ext_factors * base ** exponent) in F32, the factors picked per call.
    const std::vector<double>& ext =
        rope_table(seq_len) == RopeTable::kLong ? s.long_factor : s.short_factor;
    std::vector<float> result(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      result[size_t(i)] =
          1.0f / (float(ext[size_t(i)]) * f32_pow(float(rope_theta), f32_exponent(i, rotated)));
    }
    return result;
  }
  if (s.type == RopeScaling::Type::kDynamic && rope_table(seq_len) == RopeTable::kPerLength) {
    // transformers' _compute_dynamic_ntk_parameters with seq_len a tensor: the base is rescaled
    // in F32, base * ((factor * seq_len / original) - (factor - 1)) ** (dim / (dim - 2)).
    const float length = float(std::max(seq_len, s.original_max_position_embeddings));
    float ratio = float(s.factor) * length;
    ratio = ratio / float(s.original_max_position_embeddings);
    ratio = ratio - float(s.factor - 1.0);
    const float base =
        float(rope_theta) * f32_pow(ratio, float(double(rotated) / double(rotated - 2)));
    std::vector<float> result(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      result[size_t(i)] = 1.0f / f32_pow(base, f32_exponent(i, rotated));
    }
    return result;
  }
  std::vector<float> result(static_cast<size_t>(half));
  const double dim = double(rotated);
  const double old_context = double(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  for (int64_t i = 0; i < half; ++i) {
    double inv_freq = 1.0 / std::pow(rope_theta, double(2 * i) / dim);
    switch (s.type) {
      case RopeScaling::Type::kNone:
      case RopeScaling::Type::kDynamic:  // calls within the original context: the plain table
      case RopeScaling::Type::kYarn:     // (yarn and longrope returned above)
      case RopeScaling::Type::kLongRope:
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

bool ModelConfig::layer_is_local(int64_t layer) const {
  if (sliding_layers.empty()) return sliding_window.has_value();
  return layer >= 0 && layer < int64_t(sliding_layers.size()) && sliding_layers[size_t(layer)] &&
         sliding_window.has_value();
}

int64_t ModelConfig::layer_window(int64_t layer) const {
  return layer_is_local(layer) ? *sliding_window : 0;
}

std::vector<float> ModelConfig::rope_inv_freq_local() const {
  if (rope_local_theta <= 0.0) return {};
  ModelConfig local = *this;
  local.rope_theta = rope_local_theta;
  local.rope_scaling = RopeScaling{};
  return local.rope_inv_freq();
}

std::string ModelConfig::layer_pattern() const {
  if (sliding_layers.empty() || !sliding_window) return "all " + std::to_string(num_layers);
  std::string text;
  for (int64_t first = 0; first < num_layers;) {
    const bool local = layer_is_local(first);
    int64_t last = first;
    while (last + 1 < num_layers && layer_is_local(last + 1) == local) ++last;
    const int64_t count = last - first + 1;
    text += (text.empty() ? "" : ", ") + std::string(local ? "local" : "global") +
            (count > 1 ? " x" + std::to_string(count) : "");
    first = last + 1;
  }
  return text;
}

}  // namespace kvlens
