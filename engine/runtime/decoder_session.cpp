// The Llama forward pass over the Backend interface: embeddings, per layer RMSNorm -> q/k/v ->
// RoPE -> KV append -> causal attention -> o_proj + residual -> RMSNorm -> SwiGLU MLP + residual,
// then final norm and lm_head. The KV cache grows by doubling up to max_position_embeddings.
#include "engine/runtime/decoder_session.h"

#include <algorithm>
#include <string>

#include "engine/common/error.h"

namespace kvlens {
namespace {

// The same storage seen with another shape (rows of a scratch buffer, or a reshape).
DeviceTensor view(const DeviceTensor& tensor, std::vector<int64_t> shape) {
  DeviceTensor result = tensor;
  result.shape = std::move(shape);
  return result;
}

constexpr int64_t kInitialCacheCapacity = 256;

}  // namespace

std::shared_ptr<const BackendModel> BackendModel::upload(std::shared_ptr<const Model> model,
                                                         Backend& backend) {
  auto result = std::make_shared<BackendModel>();
  result->model = model;
  result->backend = &backend;
  // The mapped files stay alive as long as any uploaded view may alias them.
  const std::shared_ptr<void> keep_alive = model->weights.files;
  auto up = [&](const TensorView& view) { return backend.upload_weight(view, keep_alive); };
  const ModelWeights& weights = model->weights;
  result->embed = up(weights.embed);
  result->final_norm = up(weights.final_norm);
  result->lm_head =
      (weights.lm_head.data == weights.embed.data) ? result->embed : up(weights.lm_head);
  for (const LayerWeights& layer : weights.layers) {
    result->layers.push_back({up(layer.attn_norm), up(layer.wq), up(layer.wk), up(layer.wv),
                              up(layer.wo), up(layer.mlp_norm), up(layer.w_gate), up(layer.w_up),
                              up(layer.w_down)});
  }
  const std::vector<float> inv_freq = model->config.rope_inv_freq();
  result->inv_freq = backend.alloc(DType::F32, {int64_t(inv_freq.size())});
  backend.from_host(result->inv_freq, inv_freq.data(), inv_freq.size() * sizeof(float));
  return result;
}

DecoderSession::DecoderSession(std::shared_ptr<const BackendModel> model, SessionOptions options)
    : model_(std::move(model)), backend_(*model_->backend), options_(options) {}

void DecoderSession::ensure_scratch(int64_t n) {
  if (n <= scratch_rows_) return;
  const ModelConfig& c = model_->config();
  const int64_t q_width = c.num_heads * c.head_dim, kv_width = c.num_kv_heads * c.head_dim;
  hidden_ = backend_.alloc(DType::F32, {n, c.hidden_size});
  normed_ = backend_.alloc(DType::F32, {n, c.hidden_size});
  q_ = backend_.alloc(DType::F32, {n, q_width});
  k_ = backend_.alloc(DType::F32, {n, kv_width});
  v_ = backend_.alloc(DType::F32, {n, kv_width});
  attn_out_ = backend_.alloc(DType::F32, {n, q_width});
  proj_ = backend_.alloc(DType::F32, {n, c.hidden_size});
  gate_ = backend_.alloc(DType::F32, {n, c.intermediate_size});
  up_ = backend_.alloc(DType::F32, {n, c.intermediate_size});
  act_ = backend_.alloc(DType::F32, {n, c.intermediate_size});
  logits_ = backend_.alloc(DType::F32, {n, c.vocab_size});
  scratch_rows_ = n;
}

const DeviceTensor& DecoderSession::forward(std::span<const int32_t> tokens) {
  const ModelConfig& c = model_->config();
  const int64_t n = int64_t(tokens.size());
  if (n == 0) throw Error("input", "tokens", "at least one token");
  for (const int32_t id : tokens) {
    if (id < 0 || id >= c.vocab_size) {
      throw Error("input", "token id", "an id in [0, " + std::to_string(c.vocab_size) + ")",
                  std::to_string(id));
    }
  }
  if (position_ + n > c.max_position_embeddings) {
    throw Error(c.source, "max_position_embeddings",
                "at most " + std::to_string(c.max_position_embeddings) + " positions",
                "input reaching position " + std::to_string(position_ + n));
  }
  if (options_.capacity > 0 && position_ + n > options_.capacity) {
    throw Error("session", "capacity",
                "at most " + std::to_string(options_.capacity) + " cached positions",
                std::to_string(position_ + n));
  }

  // Grow every layer's cache (by doubling) so that positions [0, position_ + n) fit.
  const int64_t needed = position_ + n;
  const int64_t current = k_cache_.empty() ? 0 : k_cache_.front().dim(1);
  if (needed > current) {
    int64_t capacity = std::max<int64_t>(current, kInitialCacheCapacity);
    while (capacity < needed) capacity *= 2;
    capacity = std::min(capacity, c.max_position_embeddings);
    k_cache_.resize(size_t(c.num_layers));
    v_cache_.resize(size_t(c.num_layers));
    for (auto* caches : {&k_cache_, &v_cache_}) {
      for (DeviceTensor& cache : *caches) {
        DeviceTensor grown = backend_.alloc(DType::F32, {c.num_kv_heads, capacity, c.head_dim});
        for (int64_t g = 0; g < c.num_kv_heads && position_ > 0; ++g) {
          backend_.copy_rows(cache, g * current, grown, g * capacity, position_, c.head_dim);
        }
        cache = std::move(grown);
      }
    }
  }

  ensure_scratch(n);
  const int64_t H = c.num_heads, G = c.num_kv_heads, D = c.head_dim, E = c.hidden_size;
  const int64_t F = c.intermediate_size;
  DeviceTensor hidden = view(hidden_, {n, E}), normed = view(normed_, {n, E});
  DeviceTensor q = view(q_, {n, H * D}), k = view(k_, {n, G * D}), v = view(v_, {n, G * D});
  DeviceTensor q_heads = view(q_, {n, H, D}), k_heads = view(k_, {n, G, D});
  DeviceTensor v_heads = view(v_, {n, G, D});
  DeviceTensor attn_heads = view(attn_out_, {n, H, D}), attn = view(attn_out_, {n, H * D});
  DeviceTensor proj = view(proj_, {n, E}), gate = view(gate_, {n, F}), up = view(up_, {n, F});
  DeviceTensor act = view(act_, {n, F});
  logits_view_ = view(logits_, {n, c.vocab_size});

  std::vector<int64_t> positions(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) positions[size_t(i)] = position_ + i;
  const int64_t window = c.sliding_window.value_or(0);
  const float eps = float(c.rms_norm_eps);

  attention_logits_.clear();
  backend_.embed(model_->embed, tokens, hidden);
  for (size_t l = 0; l < model_->layers.size(); ++l) {
    const BackendModel::Layer& layer = model_->layers[l];
    backend_.rmsnorm(hidden, layer.attn_norm, eps, normed);
    backend_.matmul(normed, layer.wq, q);
    backend_.matmul(normed, layer.wk, k);
    backend_.matmul(normed, layer.wv, v);
    backend_.rope(q_heads, positions, model_->inv_freq);
    backend_.rope(k_heads, positions, model_->inv_freq);
    backend_.kv_append(k_heads, v_heads, k_cache_[l], v_cache_[l], position_);
    DeviceTensor* logits_out = nullptr;
    if (options_.record_attention_logits) {
      attention_logits_.push_back(backend_.alloc(DType::F32, {n, H, position_ + n}));
      logits_out = &attention_logits_.back();
    }
    const bool policy_step = policy_ && n == 1 && position_ >= policy_first_step_;
    if (policy_step) {
      policy_attention(l, q_heads, window, attn_heads);
      if (logits_out) {
        // policy_logits_ rows have the policy stride; the recorded rows are packed.
        const int64_t stride = policy_logits_.dim(1), cols = position_ + 1;
        for (int64_t h = 0; h < H; ++h) {
          DeviceTensor row = policy_logits_;
          row.data = policy_logits_.as<float>() + h * stride;
          row.shape = {1, cols};
          backend_.copy_rows(row, 0, *logits_out, h, 1, cols);
        }
      }
    } else {
      backend_.attention(q_heads, k_cache_[l], v_cache_[l], position_, window, Visibility{},
                         attn_heads, logits_out);
    }
    // A skipped attention contributes nothing: o_proj of zero is zero.
    if (!policy_step || decisions_[l] != LayerDecision::Skipped) {
      backend_.matmul(attn, layer.wo, proj);
      backend_.add_inplace(hidden, proj);
    }
    backend_.rmsnorm(hidden, layer.mlp_norm, eps, normed);
    backend_.matmul(normed, layer.w_gate, gate);
    backend_.matmul(normed, layer.w_up, up);
    backend_.silu_mul(gate, up, act);
    backend_.matmul(act, layer.w_down, proj);
    backend_.add_inplace(hidden, proj);
  }
  if (policy_ && n == 1 && position_ >= policy_first_step_) sparsity_.end_step();
  backend_.rmsnorm(hidden, model_->final_norm, eps, normed);
  backend_.matmul(normed, model_->lm_head, logits_view_);
  position_ += n;
  return logits_view_;
}

PolicyShape DecoderSession::policy_shape() const {
  const ModelConfig& c = model_->config();
  return {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
          options_.capacity > 0 ? options_.capacity : c.max_position_embeddings};
}

void DecoderSession::set_policy(std::unique_ptr<Policy> policy, int64_t first_step) {
  policy_ = std::move(policy);
  policy_first_step_ = first_step;
  visible_.clear();
  scores_.clear();
  decisions_.clear();
  if (!policy_) return;
  const PolicyShape shape = policy_shape();
  for (int64_t l = 0; l < shape.layers; ++l) {
    visible_.push_back(backend_.alloc(DType::U8, {shape.heads, shape.stride}));
    scores_.push_back(backend_.alloc(DType::F32, {shape.heads, shape.stride}));
  }
  decisions_.assign(size_t(shape.layers), LayerDecision::Dense);
  sparsity_.reset(shape.layers, shape.heads);
  policy_logits_ = backend_.alloc(DType::F32, {shape.heads, shape.stride});
  policy_probs_ = backend_.alloc(DType::F32, {shape.heads, shape.stride});
}

void DecoderSession::policy_attention(size_t layer, const DeviceTensor& q_heads, int64_t window,
                                      DeviceTensor& attn_heads) {
  LayerStep step;
  step.step = position_;
  step.layer = int64_t(layer);
  step.q = &q_heads;
  step.k_cache = &k_cache_[layer];
  step.v_cache = &v_cache_[layer];
  step.logits = &policy_logits_;
  backend_.attention_logits(q_heads, k_cache_[layer], position_, window, policy_logits_);
  const LayerDecision decision = policy_->select(step, visible_[layer], scores_[layer]);
  decisions_[layer] = decision;
  record_sparsity(layer, decision, step.cols());
  if (decision == LayerDecision::Skipped) return;
  const bool want_probs = policy_->wants_probs();
  backend_.attention_visible(policy_logits_, step.cols(),
                             decision == LayerDecision::Masked ? &visible_[layer] : nullptr,
                             v_cache_[layer], attn_heads, want_probs ? &policy_probs_ : nullptr);
  if (want_probs) policy_->observe(step, policy_probs_);
}

void DecoderSession::record_sparsity(size_t layer, LayerDecision decision, int64_t cols) {
  if (decision == LayerDecision::Dense) return sparsity_.add_dense_layer(int64_t(layer));
  if (decision == LayerDecision::Skipped) return sparsity_.add_skipped_layer(int64_t(layer));
  // A metric, not policy work: the mask is read back once per layer to count it (H x stride
  // bytes), which a device-side count would avoid.
  const DeviceTensor& mask = visible_[layer];
  const int64_t heads = mask.dim(0), stride = mask.dim(1);
  host_visible_.resize(size_t(heads * stride));
  backend_.to_host(mask, host_visible_.data(), host_visible_.size());
  std::vector<int64_t> counts(size_t(heads), 0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < cols; ++j) counts[size_t(h)] += host_visible_[size_t(h * stride + j)];
  }
  sparsity_.add_layer(int64_t(layer), counts, cols);
}

std::vector<float> DecoderSession::step(int32_t token) {
  const DeviceTensor& logits = forward(std::span<const int32_t>(&token, 1));
  std::vector<float> host(size_t(logits.numel()));
  backend_.to_host(logits, host.data(), host.size() * sizeof(float));
  return host;
}

}  // namespace kvlens
