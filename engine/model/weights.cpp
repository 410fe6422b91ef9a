// Resolves the Llama tensor names of a checkpoint folder into views and checks each one's shape
// (Hugging Face [out, in] layout, derived from the config) and dtype before any compute. Fused
// phi3 projections (qkv_proj [(H + 2G) * D, E], gate_up_proj [2F, E]) become row-range views.
#include "engine/model/weights.h"

#include <cmath>
#include <cstring>

#include "engine/common/error.h"

namespace kvlens {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

class TensorChecker {
 public:
  explicit TensorChecker(const SafetensorsSet& files) : files_(files) {}

  TensorView get(const std::string& name, const std::vector<int64_t>& expected_shape) const {
    const std::string expectation = "a tensor of shape " + shape_text(expected_shape);
    if (!files_.contains(name)) {
      throw Error(files_.folder(), name, expectation + " (F32, F16 or BF16)",
                  "no such tensor in the checkpoint");
    }
    TensorView view = files_.tensor(name);  // throws for dtypes other than F32/F16/BF16
    if (view.dtype != DType::F32 && view.dtype != DType::F16 && view.dtype != DType::BF16) {
      throw Error(view.file, name, "dtype F32, F16 or BF16",
                  "dtype " + std::string(dtype_name(view.dtype)));
    }
    if (view.shape != expected_shape) {
      throw Error(view.file, name, expectation, shape_text(view.shape));
    }
    return view;
  }

 private:
  const SafetensorsSet& files_;
};

// Rows [first, first + count) of a row-major [rows, cols] weight, as a view of the same mapped
// bytes: a fused projection's parts (phi3) look like ordinary weights to the rest of the engine.
TensorView row_range(const TensorView& fused, int64_t first, int64_t count, const char* part) {
  const int64_t cols = fused.shape.at(1);
  const size_t row_bytes = size_t(cols) * dtype_size(fused.dtype);
  TensorView view = fused;
  view.name = fused.name + " (" + part + " rows)";
  view.shape = {count, cols};
  view.data = fused.data + size_t(first) * row_bytes;
  view.bytes = size_t(count) * row_bytes;
  return view;
}

// Host copies the loader derives from mapped tensors, owned with the maps (ModelWeights::files).
struct DerivedTensors {
  std::shared_ptr<SafetensorsSet> files;
  std::vector<std::vector<float>> buffers;

  // An F32 copy of `view` with every value v replaced by (1 + v) * factor: Gemma's RMSNorm
  // scales by (1 + weight) computed in float, and `factor` folds a constant into it.
  TensorView offset_norm(const TensorView& view, float factor = 1.0f) {
    std::vector<float> values(size_t(view.numel()));
    if (!widen_to_f32(view.data, view.dtype, view.numel(), values.data()))
      throw Error(view.file, view.name, "dtype F32, F16 or BF16",
                  std::string(dtype_name(view.dtype)));
    for (float& v : values) v = (1.0f + v) * factor;
    TensorView result = view;
    result.name = view.name + " (1 + weight)";
    result.dtype = DType::F32;
    result.bytes = values.size() * sizeof(float);
    result.data = reinterpret_cast<const std::byte*>(values.data());
    buffers.push_back(std::move(values));  // the vector's storage does not move with it
    return result;
  }
};

// Where a checkpoint keeps the decoder's tensors: "model." (a CausalLM), or for a gemma3
// multimodal checkpoint the language model's prefix (transformers 4: language_model.model.,
// 5: model.language_model.).
std::string decoder_prefix(const SafetensorsSet& files, const ModelConfig& config) {
  if (!config.multimodal_prefix) return "model.";
  for (const char* prefix : {"language_model.model.", "model.language_model."}) {
    if (files.contains(std::string(prefix) + "embed_tokens.weight")) return prefix;
  }
  throw Error(files.folder(), "language_model.model.embed_tokens.weight",
              "a gemma3 checkpoint's language model (language_model.model.* or "
              "model.language_model.* tensors)",
              "no such tensor in the checkpoint");
}

}  // namespace

ModelWeights ModelWeights::load(const std::string& model_dir, const ModelConfig& config) {
  return from_files(std::make_shared<SafetensorsSet>(SafetensorsSet::open_folder(model_dir)),
                    config);
}

ModelWeights ModelWeights::from_files(std::shared_ptr<SafetensorsSet> files,
                                      const ModelConfig& config) {
  ModelWeights weights;
  auto derived = std::make_shared<DerivedTensors>();
  derived->files = std::move(files);
  // Shares ownership of the maps and the derived copies, pointing at the maps.
  weights.files = std::shared_ptr<SafetensorsSet>(derived, derived->files.get());
  const TensorChecker checker(*derived->files);
  const std::string model = decoder_prefix(*derived->files, config);
  // gemma3's norms (see DerivedTensors::offset_norm); the others' are used as stored.
  auto norm = [&](const std::string& name, int64_t width, float factor = 1.0f) {
    const TensorView view = checker.get(name, {width});
    return config.norm_weight_offset ? derived->offset_norm(view, factor) : view;
  };

  // ModelConfig::parse bounds every size by INT32_MAX, so these products cannot overflow.
  const int64_t vocab = config.vocab_size, hidden = config.hidden_size;
  const int64_t q_width = config.num_heads * config.head_dim;
  const int64_t kv_width = config.num_kv_heads * config.head_dim;
  const int64_t ffn = config.intermediate_size;

  weights.embed = checker.get(model + "embed_tokens.weight", {vocab, hidden});
  weights.final_norm = norm(model + "norm.weight", hidden);
  // Tied checkpoints may still carry a copy of lm_head.weight; like transformers we use the
  // embedding then. Untied without lm_head.weight is an error: transformers would initialise
  // the head randomly, which no analysis should silently run on.
  weights.lm_head =
      config.tie_word_embeddings ? weights.embed : checker.get("lm_head.weight", {vocab, hidden});

  weights.layers.reserve(size_t(config.num_layers));
  for (int64_t i = 0; i < config.num_layers; ++i) {
    const std::string prefix = model + "layers." + std::to_string(i) + ".";
    LayerWeights layer;
    layer.attn_norm = norm(prefix + "input_layernorm.weight", hidden);
    if (config.fused_projections) {
      // phi3: q rows, then k rows, then v rows; gate rows, then up rows.
      const TensorView qkv =
          checker.get(prefix + "self_attn.qkv_proj.weight", {q_width + 2 * kv_width, hidden});
      layer.wq = row_range(qkv, 0, q_width, "q");
      layer.wk = row_range(qkv, q_width, kv_width, "k");
      layer.wv = row_range(qkv, q_width + kv_width, kv_width, "v");
      const TensorView gate_up = checker.get(prefix + "mlp.gate_up_proj.weight", {2 * ffn, hidden});
      layer.w_gate = row_range(gate_up, 0, ffn, "gate");
      layer.w_up = row_range(gate_up, ffn, ffn, "up");
    } else {
      layer.wq = checker.get(prefix + "self_attn.q_proj.weight", {q_width, hidden});
      layer.wk = checker.get(prefix + "self_attn.k_proj.weight", {kv_width, hidden});
      layer.wv = checker.get(prefix + "self_attn.v_proj.weight", {kv_width, hidden});
      layer.w_gate = checker.get(prefix + "mlp.gate_proj.weight", {ffn, hidden});
      layer.w_up = checker.get(prefix + "mlp.up_proj.weight", {ffn, hidden});
    }
    layer.wo = checker.get(prefix + "self_attn.o_proj.weight", {hidden, q_width});
    if (config.sandwich_norms) {
      layer.post_attn_norm = norm(prefix + "post_attention_layernorm.weight", hidden);
      layer.mlp_norm = norm(prefix + "pre_feedforward_layernorm.weight", hidden);
      layer.post_mlp_norm = norm(prefix + "post_feedforward_layernorm.weight", hidden);
    } else {
      layer.mlp_norm = checker.get(prefix + "post_attention_layernorm.weight", {hidden});
    }
    layer.w_down = checker.get(prefix + "mlp.down_proj.weight", {hidden, ffn});
    if (config.qkv_bias) {
      layer.bq = checker.get(prefix + "self_attn.q_proj.bias", {q_width});
      layer.bk = checker.get(prefix + "self_attn.k_proj.bias", {kv_width});
      layer.bv = checker.get(prefix + "self_attn.v_proj.bias", {kv_width});
    }
    if (config.qk_norm) {
      // The attention divides q.k by sqrt(head_dim); a model scaled by another attention_scalar
      // (gemma3's query_pre_attn_scalar) gets the ratio folded into its queries' norm, so every
      // consumer of q (the attention, the policies' scores) sees the model's logits.
      const float q_factor =
          config.attention_scalar > 0.0
              ? float(std::sqrt(double(config.head_dim) / config.attention_scalar))
              : 1.0f;
      layer.q_norm = norm(prefix + "self_attn.q_norm.weight", config.head_dim, q_factor);
      layer.k_norm = norm(prefix + "self_attn.k_norm.weight", config.head_dim);
    }
    weights.layers.push_back(std::move(layer));
  }
  return weights;
}

}  // namespace kvlens
