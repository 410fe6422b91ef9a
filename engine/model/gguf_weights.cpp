// GGUF tensor names -> Hugging Face names, and the conversion of each tensor into a view the
// backends upload: in place for plain float types, else an F32 buffer (dequantized, then with
// the converter's q/k permutation or gemma3 norm offset undone).
#include "engine/model/gguf_weights.h"

#include <vector>

#include "engine/common/error.h"
#include "engine/model/dequantize.h"

namespace kvlens {
namespace {

struct LayerName {
  std::string_view gguf, hf;
};

// blk.N.<gguf> -> model.layers.N.<hf>; the family-specific ones are resolved in hf_tensor_name.
constexpr LayerName kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_qkv.weight", "self_attn.qkv_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"post_attention_norm.weight", "post_attention_layernorm.weight"},
    {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
};

// Owns what the views point at: the mapped file and the dequantized buffers.
struct GgufTensorStore {
  std::shared_ptr<const GgufFile> file;
  std::vector<std::unique_ptr<float[]>> buffers;
  std::vector<std::unique_ptr<uint16_t[]>> bf16_buffers;
};

bool plain_float(uint32_t type) {
  return type == 0 || type == 1 || type == 30;
}

DType plain_dtype(uint32_t type) {
  return type == 0 ? DType::F32 : type == 1 ? DType::F16 : DType::BF16;
}

}  // namespace

std::optional<std::string> hf_tensor_name(std::string_view gguf_name, std::string_view model_type) {
  if (gguf_name == "token_embd.weight") return "model.embed_tokens.weight";
  if (gguf_name == "output_norm.weight") return "model.norm.weight";
  if (gguf_name == "output.weight") return "lm_head.weight";
  constexpr std::string_view kBlock = "blk.";
  if (gguf_name.substr(0, kBlock.size()) != kBlock) return std::nullopt;
  const size_t dot = gguf_name.find('.', kBlock.size());
  if (dot == std::string_view::npos || dot == kBlock.size()) return std::nullopt;
  const std::string_view index = gguf_name.substr(kBlock.size(), dot - kBlock.size());
  for (char c : index) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  const std::string_view part = gguf_name.substr(dot + 1);
  const std::string prefix = "model.layers." + std::string(index) + ".";
  const bool gemma = model_type == "gemma3_text";
  // Gemma3 has four norms per layer: ffn_norm is the pre-feed-forward one there, while for the
  // other families it is the norm after attention (which gemma3 calls post_attention_norm).
  if (part == "ffn_norm.weight") {
    return prefix +
           (gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight");
  }
  // phi3 keeps gate and up fused in ffn_up [2F, E].
  if (part == "ffn_up.weight") {
    return prefix + (model_type == "phi3" ? "mlp.gate_up_proj.weight" : "mlp.up_proj.weight");
  }
  for (const LayerName& name : kLayerNames) {
    if (part == name.gguf) return prefix + std::string(name.hf);
  }
  return std::nullopt;
}

void unpermute_rope_rows(const float* src, float* dst, int64_t rows, int64_t cols, int64_t heads) {
  const int64_t head_rows = rows / heads, half = head_rows / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const float* from = src + (h * head_rows + 2 * i + j) * cols;
        float* to = dst + (h * head_rows + j * half + i) * cols;
        std::copy(from, from + cols, to);
      }
    }
  }
}

DType gguf_dequantized_dtype(const GgufFile& file, uint64_t f32_limit) {
  uint64_t f32_bytes = 0;
  for (const GgufTensorInfo& info : file.tensors()) {
    if (!plain_float(info.type)) f32_bytes += info.elements * 4;
  }
  return f32_bytes <= f32_limit ? DType::F32 : DType::BF16;
}

std::shared_ptr<SafetensorsSet> load_gguf_tensors(std::shared_ptr<const GgufFile> file,
                                                  const ModelConfig& config, DType matrix_dtype) {
  auto store = std::make_shared<GgufTensorStore>();
  store->file = file;
  const bool llama = config.model_type == "llama";
  const bool gemma = config.model_type == "gemma3_text";
  std::vector<TensorView> views;
  for (const GgufTensorInfo& info : file->tensors()) {
    const std::optional<std::string> name = hf_tensor_name(info.name, config.model_type);
    if (!name) continue;
    const std::string source = file->source() + ": tensor \"" + info.name + "\"";
    const bool is_q = name->ends_with("self_attn.q_proj.weight");
    const bool is_k = name->ends_with("self_attn.k_proj.weight");
    const bool permuted = llama && (is_q || is_k) && info.dims.size() == 2;
    const bool shifted = gemma && name->ends_with("norm.weight");
    TensorView view;
    view.name = *name;
    view.shape = info.shape();
    view.file = file->source();
    if (plain_float(info.type) && !permuted && !shifted) {
      view.dtype = plain_dtype(info.type);
      view.data = info.data;
      view.bytes = size_t(info.bytes);
      views.push_back(std::move(view));
      continue;
    }
    const int64_t count = int64_t(info.elements);
    std::unique_ptr<float[]> values(new float[size_t(count)]);
    dequantize_to_f32(info.type, info.data, count, values.get(), source);
    if (permuted) {
      const int64_t heads = is_q ? config.num_heads : config.num_kv_heads;
      const int64_t rows = int64_t(info.dims[1]), cols = int64_t(info.dims[0]);
      if (rows % (2 * heads) != 0) {
        throw Error(file->source(), "tensor \"" + info.name + "\"",
                    "rows that split into " + std::to_string(heads) + " heads of even size",
                    std::to_string(rows) + " rows");
      }
      std::unique_ptr<float[]> ordered(new float[size_t(count)]);
      unpermute_rope_rows(values.get(), ordered.get(), rows, cols, heads);
      values = std::move(ordered);
    }
    // convert_hf_to_gguf.py stores gemma3's (1 + w) norm weights as w + 1.
    if (shifted) {
      for (int64_t i = 0; i < count; ++i) values[size_t(i)] -= 1.0f;
    }
    if (matrix_dtype == DType::BF16 && info.dims.size() == 2) {
      std::unique_ptr<uint16_t[]> rounded(new uint16_t[size_t(count)]);
      for (int64_t i = 0; i < count; ++i) rounded[size_t(i)] = f32_to_bf16(values[size_t(i)]);
      view.dtype = DType::BF16;
      view.data = reinterpret_cast<const std::byte*>(rounded.get());
      view.bytes = size_t(count) * sizeof(uint16_t);
      store->bf16_buffers.push_back(std::move(rounded));
    } else {
      view.dtype = DType::F32;
      view.data = reinterpret_cast<const std::byte*>(values.get());
      view.bytes = size_t(count) * sizeof(float);
      store->buffers.push_back(std::move(values));
    }
    views.push_back(std::move(view));
  }
  return std::make_shared<SafetensorsSet>(
      SafetensorsSet::from_views(file->source(), std::move(views), std::move(store)));
}

}  // namespace kvlens
