// BackendModel::upload_weights: every weight into the backend (converted on the host first when
// UploadOptions asks for another dtype), the RoPE tables, and the KV cache dtype resolved.
#include "engine/arch/backend_model.h"

#include <cstddef>
#include <cstring>
#include <string>

#include "engine/arch/architecture.h"
#include "engine/common/error.h"

namespace kvlens {

namespace {

// `view` as `dtype` in a new host buffer owned by `keep`: widening is exact, narrowing to BF16
// rounds to nearest even (torch's .to(torch.bfloat16)).
TensorView converted(const TensorView& view, DType dtype,
                     std::vector<std::shared_ptr<void>>& keep) {
  if (view.data == nullptr || view.dtype == dtype) return view;
  const int64_t count = view.numel();
  std::vector<float> wide(static_cast<size_t>(count));
  if (!widen_to_f32(view.data, view.dtype, count, wide.data()))
    throw Error(view.name, "dtype", "F32, BF16 or F16", std::string(dtype_name(view.dtype)));
  auto buffer = std::shared_ptr<void>(::operator new(size_t(count) * dtype_size(dtype)),
                                      [](void* p) { ::operator delete(p); });
  if (dtype == DType::F32) {
    std::memcpy(buffer.get(), wide.data(), size_t(count) * sizeof(float));
  } else {
    auto* out = static_cast<uint16_t*>(buffer.get());
    for (int64_t i = 0; i < count; ++i) out[i] = f32_to_bf16(wide[size_t(i)]);
  }
  keep.push_back(buffer);
  TensorView result = view;
  result.data = static_cast<const std::byte*>(buffer.get());
  result.bytes = size_t(count) * dtype_size(dtype);
  result.dtype = dtype;
  return result;
}

}  // namespace

std::shared_ptr<BackendModel> BackendModel::upload_weights(std::shared_ptr<const Model> model,
                                                           Backend& backend,
                                                           const UploadOptions& options) {
  if (options.weight_dtype && *options.weight_dtype != DType::F32 &&
      *options.weight_dtype != DType::BF16) {
    throw Error("upload", "weight dtype", "F32 or BF16",
                std::string(dtype_name(*options.weight_dtype)));
  }
  auto result = std::make_shared<BackendModel>();
  result->model = model;
  result->backend = &backend;
  // The mapped files stay alive as long as any uploaded view may alias them; converted weights
  // live in host buffers kept alongside (a backend that aliases host memory keeps them too).
  auto converted_buffers = std::make_shared<std::vector<std::shared_ptr<void>>>();
  const std::shared_ptr<void> files = model->weights.files;
  const std::shared_ptr<void> keep_alive(converted_buffers.get(),
                                         [files, converted_buffers](void*) {});
  auto up = [&](const TensorView& view) {
    if (!options.weight_dtype) return backend.upload_weight(view, files);
    return backend.upload_weight(converted(view, *options.weight_dtype, *converted_buffers),
                                 keep_alive);
  };
  const ModelWeights& weights = model->weights;
  result->embed = up(weights.embed);
  result->final_norm = up(weights.final_norm);
  result->lm_head =
      (weights.lm_head.data == weights.embed.data) ? result->embed : up(weights.lm_head);
  for (const LayerWeights& layer : weights.layers) {
    auto optional = [&](const TensorView& view) {
      return view.data != nullptr ? up(view) : DeviceTensor{};
    };
    result->layers.push_back({up(layer.attn_norm), up(layer.wq), up(layer.wk), up(layer.wv),
                              up(layer.wo), up(layer.mlp_norm), up(layer.w_gate), up(layer.w_up),
                              up(layer.w_down), optional(layer.bq), optional(layer.bk),
                              optional(layer.bv), optional(layer.q_norm), optional(layer.k_norm),
                              optional(layer.post_attn_norm), optional(layer.post_mlp_norm)});
  }
  auto upload_floats = [&](const std::vector<float>& values) {
    DeviceTensor t = backend.alloc(DType::F32, {int64_t(values.size())});
    backend.from_host(t, values.data(), values.size() * sizeof(float));
    return t;
  };
  const ModelConfig& config = model->config;
  result->inv_freq = upload_floats(config.rope_inv_freq());
  if (config.rope_scaling.type == RopeScaling::Type::kLongRope) {
    result->inv_freq_long = upload_floats(
        config.rope_inv_freq(config.rope_scaling.original_max_position_embeddings + 1));
  }
  result->rope_scale = float(config.rope_attention_scale());
  if (const std::vector<float> local = config.rope_inv_freq_local(); !local.empty())
    result->inv_freq_local = upload_floats(local);
  result->architecture = &architecture_for(config);
  if (options.kv_cache_dtype) {
    if (!backend.supports_cache_dtype(*options.kv_cache_dtype)) {
      throw Error("upload", "KV cache dtype",
                  "a dtype the " + backend.name() + " backend keeps caches in (F32" +
                      (backend.supports_cache_dtype(DType::BF16) ? ", BF16, F16)" : ")"),
                  std::string(dtype_name(*options.kv_cache_dtype)));
    }
    result->kv_cache_dtype = *options.kv_cache_dtype;
  } else {
    const DType weights_dtype = result->weight_dtype();
    result->kv_cache_dtype =
        backend.supports_cache_dtype(weights_dtype) ? weights_dtype : DType::F32;
  }
  return result;
}

DType BackendModel::weight_dtype() const {
  return layers.empty() ? embed.dtype : layers.front().wq.dtype;
}

int64_t BackendModel::layer_weight_bytes() const {
  int64_t bytes = 0;
  for (const Layer& layer : layers) {
    for (const DeviceTensor* t :
         {&layer.attn_norm, &layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.mlp_norm,
          &layer.w_gate, &layer.w_up, &layer.w_down, &layer.post_attn_norm, &layer.post_mlp_norm}) {
      bytes += int64_t(t->bytes());
    }
  }
  return bytes;
}

int64_t BackendModel::step_weight_bytes() const {
  int64_t bytes = layer_weight_bytes() + int64_t(final_norm.bytes()) + int64_t(lm_head.bytes());
  if (embed.dim(0) > 0) bytes += int64_t(embed.bytes()) / embed.dim(0);
  return bytes;
}

}  // namespace kvlens
