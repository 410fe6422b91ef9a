// Loading a TokenButler predictor (predictor.h): predictor.json + predictor.safetensors, or the
// predictor inside a llama_butler checkpoint; every size checked against the base model and
// every tensor's dtype and shape checked before any compute.
#include "engine/model/predictor.h"

#include <filesystem>
#include <functional>
#include <limits>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/common/json_describe.h"
#include "engine/common/json_fields.h"
#include "engine/common/json_file.h"

namespace kvlens {
namespace {

using Json = nlohmann::json;

// Sizes are bounded like config.json's, so products of them cannot overflow int64.
constexpr int64_t kMaxSize = std::numeric_limits<int32_t>::max();
constexpr const char* kFormat = "kvlens-tokenbutler-predictor";
constexpr const char* kButlerPrefix = "model.layers.0.self_attn.sparse_token_predictor.";

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// The sizes every predictor must agree on with its base model, and the divisibility the
// architecture needs (Er = E / r split over H heads, E a multiple of 4H as the reference asserts).
void check_against_model(PredictorConfig& c, const ModelConfig& model, const std::string& source) {
  if (c.hidden_size != model.hidden_size) {
    throw Error(source, "hidden_size",
                "the base model's hidden_size " + std::to_string(model.hidden_size),
                std::to_string(c.hidden_size));
  }
  if (c.heads != model.num_heads) {
    throw Error(source, "heads",
                "the base model's num_attention_heads " + std::to_string(model.num_heads),
                std::to_string(c.heads));
  }
  if (c.layers != model.num_layers) {
    throw Error(source, "layers",
                "the base model's num_hidden_layers " + std::to_string(model.num_layers),
                std::to_string(c.layers));
  }
  if (c.hidden_size % c.attn_reduce_factor != 0) {
    throw Error(source, "attn_reduce_factor",
                "a divisor of hidden_size " + std::to_string(c.hidden_size),
                std::to_string(c.attn_reduce_factor));
  }
  c.reduced_size = c.hidden_size / c.attn_reduce_factor;
  if (c.reduced_size % c.heads != 0 || c.attention_head_dim() % 2 != 0) {
    throw Error(source, "attn_reduce_factor",
                "hidden_size / attn_reduce_factor divisible by 2 * heads (" +
                    std::to_string(2 * c.heads) + ") for the predictor's rotary attention",
                std::to_string(c.reduced_size));
  }
  if (c.importance_dim % 2 != 0) {
    throw Error(source, "dDash", "an even number (rotary pairs)", std::to_string(c.importance_dim));
  }
}

RopeScaling forced_llama3() {
  RopeScaling s;
  s.type = RopeScaling::Type::kLlama3;
  s.factor = 32.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192;
  return s;
}

// Resolves the predictor's tensors by name through `lookup` (null when absent) and checks each.
PredictorWeights resolve_weights(const PredictorConfig& c, const std::string& where,
                                 const std::string& prefix,
                                 const std::function<const TensorView*(const std::string&)>& find) {
  auto get = [&](const std::string& name, const std::vector<int64_t>& shape) {
    const std::string full = prefix + name;
    const TensorView* view = find(full);
    const std::string expectation = "a tensor of shape " + shape_text(shape) + " (F32, F16, BF16)";
    if (view == nullptr) throw Error(where, full, expectation, "no such tensor");
    if (view->dtype != DType::F32 && view->dtype != DType::F16 && view->dtype != DType::BF16)
      throw Error(view->file, full, expectation, "dtype " + std::string(dtype_name(view->dtype)));
    if (view->shape != shape) throw Error(view->file, full, expectation, shape_text(view->shape));
    return *view;
  };
  const int64_t E = c.hidden_size, Er = c.reduced_size, m = c.intermediate;
  const int64_t slots = c.layers * c.heads * c.importance_dim;
  PredictorWeights w;
  w.input_proj = get("input_proj.weight", {Er, E});
  w.q_proj_attn = get("q_proj_attn.weight", {Er, Er});
  w.k_proj_attn = get("k_proj_attn.weight", {Er, Er});
  w.v_proj_attn = get("v_proj_attn.weight", {Er, Er});
  w.norm1_weight = get("norm1.weight", {Er});
  w.norm1_bias = get("norm1.bias", {Er});
  w.ffn_in_weight = get("ffn.0.weight", {2 * Er, Er});
  w.ffn_in_bias = get("ffn.0.bias", {2 * Er});
  w.ffn_out_weight = get("ffn.2.weight", {E, 2 * Er});
  w.ffn_out_bias = get("ffn.2.bias", {E});
  if (c.variant == PredictorConfig::Variant::kHf) {
    w.norm2_weight = get("norm2.weight", {E});
    w.norm2_bias = get("norm2.bias", {E});
    w.norm_importance_weight = get("norm_importance.weight", {E});
    w.norm_importance_bias = get("norm_importance.bias", {E});
  }
  w.q_importance_in = get("q_proj_importance.0.weight", {m, E});
  w.q_importance_out = get("q_proj_importance.2.weight", {slots, m});
  w.k_importance_in = get("k_proj_importance.0.weight", {m, E});
  w.k_importance_out = get("k_proj_importance.2.weight", {slots, m});
  return w;
}

}  // namespace

int64_t PredictorConfig::parameter_count() const {
  const int64_t E = hidden_size, Er = reduced_size, m = intermediate;
  const int64_t slots = layers * heads * importance_dim;
  int64_t count = E * Er + 3 * Er * Er + 2 * Er;   // input_proj, q/k/v_proj_attn, norm1
  count += Er * 2 * Er + 2 * Er + 2 * Er * E + E;  // ffn
  count += 2 * E;                                  // norm2 (unused but present in v1)
  if (variant == Variant::kHf) count += 2 * E;     // norm_importance
  count += 2 * (E * m + m * slots);                // q/k_proj_importance
  return count;
}

std::vector<float> PredictorConfig::rope_inv_freq(int64_t dim) const {
  ModelConfig rope;
  rope.head_dim = dim;
  rope.rope_theta = rope_theta;
  rope.rope_scaling = rope_scaling;
  return rope.rope_inv_freq();
}

std::shared_ptr<const Predictor> Predictor::load_file(const std::string& safetensors_path,
                                                      const ModelConfig& model) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(safetensors_path, ec)) {
    throw Error(safetensors_path, "predictor", "a predictor.safetensors file", "no such file");
  }
  const fs::path json_path = fs::path(safetensors_path).parent_path() / "predictor.json";
  const std::string source = json_path.string();
  if (!fs::is_regular_file(json_path, ec)) {
    throw Error(source, "predictor.json",
                "the predictor's sizes beside " + fs::path(safetensors_path).filename().string(),
                "no such file");
  }
  const Json root = read_json_file(source);
  if (!root.is_object()) throw Error(source, "JSON", "an object", describe_json(root));
  const auto format = root.find("format");
  if (format == root.end() || !format->is_string() || format->get<std::string>() != kFormat) {
    throw Error(source, "format", std::string("\"") + kFormat + "\"",
                format == root.end() ? "missing" : describe_json(*format));
  }
  const FieldReader fields(root, source);
  fields.integer("version", 1, 1);

  PredictorConfig c;
  c.source = source;
  const auto variant = root.find("variant");
  if (variant != root.end() && variant->is_string() && variant->get<std::string>() == "v1") {
    c.variant = PredictorConfig::Variant::kV1;
  } else if (variant != root.end() && variant->is_string() && variant->get<std::string>() == "hf") {
    c.variant = PredictorConfig::Variant::kHf;
  } else {
    throw Error(source, "variant", "\"v1\" or \"hf\"",
                variant == root.end() ? "missing" : describe_json(*variant));
  }
  c.hidden_size = fields.integer("hidden_size", 1, kMaxSize);
  c.attn_reduce_factor = fields.integer("attn_reduce_factor", 1, kMaxSize);
  c.heads = fields.integer("heads", 1, kMaxSize);
  c.layers = fields.integer("layers", 1, kMaxSize);
  c.importance_dim = fields.integer("dDash", 1, kMaxSize);
  c.intermediate = fields.integer("intdim", 1, kMaxSize);
  c.layer_norm_eps = fields.number_or("layer_norm_eps", 1e-5, 0.0);
  c.rope_theta = fields.number_or("rope_theta", model.rope_theta, 0.0);
  c.rope_scaling = forced_llama3();
  check_against_model(c, model, source);

  auto file = std::make_shared<SafetensorsFile>(safetensors_path);
  auto predictor = std::make_shared<Predictor>();
  predictor->path = safetensors_path;
  predictor->config = c;
  std::map<std::string, TensorView> views;
  predictor->weights =
      resolve_weights(c, safetensors_path, "", [&](const std::string& name) -> const TensorView* {
        if (!file->contains(name)) return nullptr;
        return &(views[name] = file->tensor(name));
      });
  predictor->keep_alive = file;
  return predictor;
}

std::shared_ptr<const Predictor> Predictor::from_butler(const std::string& model_dir,
                                                        std::shared_ptr<SafetensorsSet> files,
                                                        const ModelConfig& model) {
  const std::string source = model.source;
  const Json root = read_json_file(source);
  PredictorConfig c;
  c.source = source;
  c.hidden_size = model.hidden_size;
  c.heads = model.num_heads;
  c.layers = model.num_layers;
  const FieldReader fields(root, source);
  c.attn_reduce_factor = fields.integer_or("attn_reduce_factor", 8, 1, kMaxSize);
  c.importance_dim = fields.integer_or("dDash", 16, 1, kMaxSize);
  c.intermediate = fields.integer_or("intdim", 512, 1, kMaxSize);
  c.rope_theta = model.rope_theta;
  c.rope_scaling = forced_llama3();
  // The Hugging Face release code (the "hf" variant) normalises before the importance
  // projections; a checkpoint without norm_importance was saved by the v1 code.
  c.variant = files->contains(std::string(kButlerPrefix) + "norm_importance.weight")
                  ? PredictorConfig::Variant::kHf
                  : PredictorConfig::Variant::kV1;
  check_against_model(c, model, source);
  auto predictor = std::make_shared<Predictor>();
  predictor->path = model_dir;
  predictor->config = c;
  std::map<std::string, TensorView> views;
  predictor->weights = resolve_weights(c, model_dir, kButlerPrefix,
                                       [&](const std::string& name) -> const TensorView* {
                                         if (!files->contains(name)) return nullptr;
                                         return &(views[name] = files->tensor(name));
                                       });
  predictor->files = std::move(files);
  return predictor;
}

}  // namespace kvlens
