// GGUF tensor names -> Hugging Face names, and the conversion of each tensor into a view the
// backends upload: in place for plain float types, else an F32 buffer (dequantized, then with
// the converter's q/k permutation or gemma3 norm offset undone).
#include "engine/model/gguf_weights.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
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

// One tensor to dequantize into its buffer, with what the converter changed undone.
struct Conversion {
  const GgufTensorInfo* info;
  std::string source;
  int64_t heads;  // > 0: llama q/k rows to un-permute, in groups of rows / heads
  bool shifted;   // gemma3 norm: subtract the 1 the converter added
  float* f32_out;
  uint16_t* bf16_out;  // BF16 output instead of F32 when set
};

// Dequantizes in groups of whole rows (a head's rows when un-permuting) through a small buffer,
// so neither a whole-tensor F32 copy nor a second pass is needed for BF16 or permuted output.
void convert(const Conversion& job) {
  const GgufTensorInfo& info = *job.info;
  const GgmlTypeInfo& type = *ggml_type_info(info.type);
  const int64_t cols = int64_t(info.dims[0]);
  const int64_t rows = int64_t(info.elements) / cols;
  const size_t row_bytes = size_t(cols / type.block_elements * type.block_bytes);
  const int64_t group =
      job.heads > 0 ? rows / job.heads : std::max<int64_t>(1, (int64_t(1) << 16) / cols);
  std::vector<float> chunk(size_t(std::min(group, rows) * cols));
  const float offset = job.shifted ? 1.0f : 0.0f;
  for (int64_t first = 0; first < rows; first += group) {
    const int64_t count = std::min(group, rows - first);
    dequantize_to_f32(info.type, info.data + size_t(first) * row_bytes, count * cols, chunk.data(),
                      job.source);
    for (int64_t r = 0; r < count; ++r) {
      // Stored row 2i + j of a head is Hugging Face's row j * (head rows / 2) + i.
      const int64_t to = job.heads > 0 ? (r % 2) * (count / 2) + r / 2 : r;
      const float* from = chunk.data() + r * cols;
      const size_t at = size_t((first + to) * cols);
      if (job.bf16_out != nullptr) {
        for (int64_t c = 0; c < cols; ++c)
          job.bf16_out[at + size_t(c)] = f32_to_bf16(from[c] - offset);
      } else {
        for (int64_t c = 0; c < cols; ++c) job.f32_out[at + size_t(c)] = from[c] - offset;
      }
    }
  }
}

// Tensors are converted in parallel, one per thread at a time (a 7B file has hundreds).
void run_conversions(const std::vector<Conversion>& jobs) {
  const size_t threads =
      std::min<size_t>(jobs.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<size_t> next{0};
  std::mutex failure_mutex;
  std::exception_ptr failure;
  auto work = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      try {
        convert(jobs[i]);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
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
  std::vector<Conversion> jobs;
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
    require_dequantizable(info.type, source);
    Conversion job{&info, source, 0, shifted, nullptr, nullptr};
    if (permuted) {
      job.heads = is_q ? config.num_heads : config.num_kv_heads;
      if (info.dims[1] % uint64_t(2 * job.heads) != 0) {
        throw Error(file->source(), "tensor \"" + info.name + "\"",
                    "rows that split into " + std::to_string(job.heads) + " heads of even size",
                    std::to_string(info.dims[1]) + " rows");
      }
    }
    const size_t count = size_t(info.elements);
    if (matrix_dtype == DType::BF16 && info.dims.size() == 2) {
      store->bf16_buffers.emplace_back(new uint16_t[count]);
      job.bf16_out = store->bf16_buffers.back().get();
      view.dtype = DType::BF16;
      view.data = reinterpret_cast<const std::byte*>(job.bf16_out);
      view.bytes = count * sizeof(uint16_t);
    } else {
      store->buffers.emplace_back(new float[count]);
      job.f32_out = store->buffers.back().get();
      view.dtype = DType::F32;
      view.data = reinterpret_cast<const std::byte*>(job.f32_out);
      view.bytes = count * sizeof(float);
    }
    jobs.push_back(std::move(job));
    views.push_back(std::move(view));
  }
  run_conversions(jobs);
  return std::make_shared<SafetensorsSet>(
      SafetensorsSet::from_views(file->source(), std::move(views), std::move(store)));
}

}  // namespace kvlens
