// The TokenButler predictor's forward pass over backend ops (POLICIES.md): x -> input_proj ->
// q/k/v -> RoPE -> causal attention over its own cache -> norm1 -> ffn (GELU) -> + x
// [hf: -> norm2 -> norm_importance] -> importance projections (SiLU) -> RoPE at width d'. Each
// key is rotated once at its own position and cached (the v1 code's re-rotation is not
// reproduced), and a token attends to every earlier token, so a step gives exactly the row of a
// full-sequence forward. Scratch rows: [n, width] per activation.
#include "engine/policy/predictor_runtime.h"

#include <algorithm>
#include <cstring>

#include "engine/backend/tensor_views.h"
#include "engine/common/error.h"
#include "engine/policy/predictor_step_ops.h"

namespace kvlens {

using tensor::rows_of;
using tensor::view;

namespace {

// The importance projection's output rows reordered from the checkpoint's slots [H][N][d'] to
// layer-major [N][H][d'], layer 0 dropped: new row ((l-1)*H + h)*d' + c <- old ((h*N + l)*d' + c).
TensorView layer_major_rows(const TensorView& out, const PredictorConfig& c,
                            std::shared_ptr<std::vector<std::byte>>& storage) {
  const int64_t H = c.heads, N = c.layers, d = c.importance_dim, m = c.intermediate;
  const size_t row_bytes = size_t(m) * dtype_size(out.dtype);
  storage = std::make_shared<std::vector<std::byte>>(size_t((N - 1) * H * d) * row_bytes);
  for (int64_t l = 1; l < N; ++l) {
    for (int64_t h = 0; h < H; ++h) {
      const size_t to = size_t(((l - 1) * H + h) * d) * row_bytes;
      const size_t from = size_t((h * N + l) * d) * row_bytes;
      std::memcpy(storage->data() + to, out.data + from, size_t(d) * row_bytes);
    }
  }
  TensorView result = out;
  result.shape = {(N - 1) * H * d, m};
  result.data = storage->data();
  result.bytes = storage->size();
  return result;
}

DeviceTensor upload_floats(Backend& backend, const std::vector<float>& values) {
  DeviceTensor t = backend.alloc(DType::F32, {int64_t(values.size())});
  backend.from_host(t, values.data(), values.size() * sizeof(float));
  return t;
}

}  // namespace

std::shared_ptr<const BackendPredictor> BackendPredictor::upload(
    std::shared_ptr<const Predictor> predictor, Backend& backend) {
  const PredictorConfig& c = predictor->config;
  if (c.layers < 2) {
    throw Error(c.source, "layers", "at least 2 (layer 0 is never predicted)",
                std::to_string(c.layers));
  }
  auto result = std::make_shared<BackendPredictor>();
  result->predictor = predictor;
  result->backend = &backend;
  // The predictor (and the mapped files behind its views) outlive every uploaded tensor.
  const std::shared_ptr<void> keep_alive = std::const_pointer_cast<Predictor>(predictor);
  const PredictorWeights& w = predictor->weights;
  // The tensors uploaded as stored (the hf-only norms are left empty in v1, which never applies
  // them); the importance outputs are reordered below.
  using Pair = std::pair<DeviceTensor BackendPredictor::*, TensorView PredictorWeights::*>;
  using B = BackendPredictor;
  using W = PredictorWeights;
  static constexpr Pair kEveryVariant[] = {
      {&B::input_proj, &W::input_proj},           {&B::q_proj_attn, &W::q_proj_attn},
      {&B::k_proj_attn, &W::k_proj_attn},         {&B::v_proj_attn, &W::v_proj_attn},
      {&B::norm1_weight, &W::norm1_weight},       {&B::norm1_bias, &W::norm1_bias},
      {&B::ffn_in_weight, &W::ffn_in_weight},     {&B::ffn_in_bias, &W::ffn_in_bias},
      {&B::ffn_out_weight, &W::ffn_out_weight},   {&B::ffn_out_bias, &W::ffn_out_bias},
      {&B::q_importance_in, &W::q_importance_in}, {&B::k_importance_in, &W::k_importance_in}};
  static constexpr Pair kHfOnly[] = {{&B::norm2_weight, &W::norm2_weight},
                                     {&B::norm2_bias, &W::norm2_bias},
                                     {&B::norm_importance_weight, &W::norm_importance_weight},
                                     {&B::norm_importance_bias, &W::norm_importance_bias}};
  for (const auto& [target, source] : kEveryVariant)
    (*result).*target = backend.upload_weight(w.*source, keep_alive);
  if (c.variant == PredictorConfig::Variant::kHf) {
    for (const auto& [target, source] : kHfOnly)
      (*result).*target = backend.upload_weight(w.*source, keep_alive);
  }
  for (auto [source, target] : {std::pair{&w.q_importance_out, &result->q_importance_out},
                                std::pair{&w.k_importance_out, &result->k_importance_out}}) {
    std::shared_ptr<std::vector<std::byte>> storage;
    const TensorView reordered = layer_major_rows(*source, c, storage);
    *target = backend.upload_weight(reordered, storage);
  }
  result->attention_inv_freq = upload_floats(backend, c.rope_inv_freq(c.attention_head_dim()));
  result->importance_inv_freq = upload_floats(backend, c.rope_inv_freq(c.importance_dim));
  return result;
}

PredictorState::PredictorState(std::shared_ptr<const BackendPredictor> predictor, bool fused_decode)
    : predictor_(std::move(predictor)), backend_(*predictor_->backend) {
  if (fused_decode && has_op_extension(PredictorStepOps::kExtensionName, backend_.name())) {
    auto& ops = backend_.extension<PredictorStepOps>();
    if (ops.takes(*predictor_)) fused_ = &ops;
  }
}

void PredictorState::fused_step(const DeviceTensor& x) {
  if (fused_scratch_.empty()) {
    fused_scratch_ = backend_.alloc(DType::F32, {fused_->scratch_floats(predictor_->config())});
  }
  PredictorStepOps::DecodeStep step;
  step.predictor = predictor_.get();
  step.x = &x;
  step.position = position_;
  step.attention_keys = &attention_keys_;
  step.attention_values = &attention_values_;
  step.importance_keys = &importance_keys_;
  step.query = &query_;
  step.scratch = &fused_scratch_;
  fused_->decode_step(step);
}

void PredictorState::ensure_capacity(int64_t needed) {
  if (needed <= capacity_) return;
  const PredictorConfig& c = predictor_->config();
  const int64_t capacity = std::max({needed, 2 * capacity_, int64_t(64)});
  const int64_t slots = (c.layers - 1) * c.heads;
  auto grow = [&](DeviceTensor& cache, int64_t groups, int64_t width) {
    DeviceTensor grown = backend_.alloc(DType::F32, {groups, capacity, width});
    if (position_ > 0) {
      for (int64_t g = 0; g < groups; ++g)
        backend_.copy_rows(cache, g * capacity_, grown, g * capacity, position_, width);
    }
    cache = std::move(grown);
  };
  grow(attention_keys_, c.heads, c.attention_head_dim());
  grow(attention_values_, c.heads, c.attention_head_dim());
  grow(importance_keys_, slots, c.importance_dim);
  capacity_ = capacity;
}

void PredictorState::ensure_scratch(int64_t rows) {
  if (rows <= scratch_rows_) return;
  const PredictorConfig& c = predictor_->config();
  const int64_t E = c.hidden_size, Er = c.reduced_size, m = c.intermediate;
  const int64_t slot_width = (c.layers - 1) * c.heads * c.importance_dim;
  auto rows_of_width = [&](int64_t width) { return backend_.alloc(DType::F32, {rows, width}); };
  reduced_ = rows_of_width(Er);
  q_ = rows_of_width(Er);
  k_ = rows_of_width(Er);
  v_ = rows_of_width(Er);
  attended_ = rows_of_width(Er);
  normed_reduced_ = rows_of_width(Er);
  ffn_hidden_ = rows_of_width(2 * Er);
  ffn_out_ = rows_of_width(E);
  importance_hidden_ = backend_.alloc(DType::F32, {2 * rows, m});  // queries' rows, then keys'
  importance_queries_ = rows_of_width(slot_width);
  importance_keys_new_ = rows_of_width(slot_width);
  if (query_.empty()) query_ = backend_.alloc(DType::F32, {1, slot_width});
  scratch_rows_ = rows;
}

void PredictorState::append(const DeviceTensor& layer_input) {
  const BackendPredictor& p = *predictor_;
  const PredictorConfig& c = p.config();
  const int64_t E = c.hidden_size, Er = c.reduced_size, H = c.heads, hd = c.attention_head_dim();
  const int64_t d = c.importance_dim, slots = (c.layers - 1) * H, m = c.intermediate;
  if (layer_input.dtype != DType::F32 || layer_input.numel() == 0 || layer_input.numel() % E != 0) {
    throw Error("tokenbutler predictor", "layer input",
                "F32 rows of the model's hidden size " + std::to_string(E),
                std::to_string(layer_input.numel()) + " values");
  }
  const int64_t n = layer_input.numel() / E;
  ensure_capacity(position_ + n);
  ensure_scratch(n);
  positions_.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) positions_[size_t(i)] = position_ + i;

  const DeviceTensor x = view(layer_input, {n, E});
  if (n == 1 && fused_ != nullptr) {
    fused_step(x);
    position_ += 1;
    fused_steps_ += 1;
    return;
  }
  DeviceTensor reduced = view(reduced_, {n, Er}), q = view(q_, {n, Er}), k = view(k_, {n, Er});
  DeviceTensor v = view(v_, {n, Er}), attended = view(attended_, {n, H, hd});
  DeviceTensor q_heads = view(q_, {n, H, hd}), k_heads = view(k_, {n, H, hd});
  DeviceTensor v_heads = view(v_, {n, H, hd}), normed = view(normed_reduced_, {n, Er});
  DeviceTensor ffn_hidden = view(ffn_hidden_, {n, 2 * Er}), ffn_out = view(ffn_out_, {n, E});

  // The predictor's own attention block (q, k and v one backend call: one launch on a GPU).
  backend_.matmul(x, p.input_proj, reduced);
  {
    const DeviceTensor* const weights[] = {&p.q_proj_attn, &p.k_proj_attn, &p.v_proj_attn};
    DeviceTensor* const outputs[] = {&q, &k, &v};
    backend_.matmul_many(reduced, weights, outputs);
  }
  if (n == 1) {
    // A decode step: the rotation and the cache append as one call (one launch on a GPU).
    const Backend::RunRopeAppend run{&q_heads, &k_heads, &v_heads, &attention_keys_,
                                     &attention_values_};
    backend_.rope_append_runs(std::span(&run, 1), position_, p.attention_inv_freq, 1.0f);
  } else {
    backend_.rope_pair(q_heads, k_heads, positions_, p.attention_inv_freq, 1.0f);
    backend_.kv_append(k_heads, v_heads, attention_keys_, attention_values_, position_);
  }
  backend_.attention(q_heads, attention_keys_, attention_values_, position_, 0, Visibility{},
                     attended, nullptr);
  backend_.layer_norm(view(attended_, {n, Er}), p.norm1_weight, p.norm1_bias,
                      float(c.layer_norm_eps), normed);
  backend_.matmul(normed, p.ffn_in_weight, ffn_hidden);
  backend_.bias_activation(ffn_hidden, &p.ffn_in_bias, Backend::Activation::Gelu);
  backend_.matmul(ffn_hidden, p.ffn_out_weight, ffn_out);
  backend_.bias_activation(ffn_out, &p.ffn_out_bias, Backend::Activation::None);
  // The residual: ffn_out + x, the sum x + ffn_out is (IEEE addition commutes), in ffn_out's rows.
  backend_.add_inplace(ffn_out, x);
  DeviceTensor& hidden = ffn_out;
  if (c.variant == PredictorConfig::Variant::kHf) {
    const float eps = float(c.layer_norm_eps);
    backend_.layer_norm(hidden, p.norm2_weight, p.norm2_bias, eps, hidden);
    backend_.layer_norm(hidden, p.norm_importance_weight, p.norm_importance_bias, eps, hidden);
  }

  // Importance queries and keys of every predicted (layer, head), rotated at width d'. The two
  // first Linears read the same rows (one call), their SiLU is one pass over both, and the two
  // rotations one call.
  // A decode step's one query row is written straight into query_ (what the policy reads).
  DeviceTensor queries = n == 1 ? query_ : view(importance_queries_, {n, slots * d});
  DeviceTensor keys = view(importance_keys_new_, {n, slots * d});
  DeviceTensor both_hidden = view(importance_hidden_, {2 * n, m});
  DeviceTensor query_hidden = tensor::row_range(both_hidden, 0, n);
  DeviceTensor key_hidden = tensor::row_range(both_hidden, n, n);
  {
    const DeviceTensor* const weights[] = {&p.q_importance_in, &p.k_importance_in};
    DeviceTensor* const outputs[] = {&query_hidden, &key_hidden};
    backend_.matmul_many(hidden, weights, outputs);
  }
  backend_.bias_activation(both_hidden, nullptr, Backend::Activation::Silu);
  backend_.matmul(query_hidden, p.q_importance_out, queries);
  backend_.matmul(key_hidden, p.k_importance_out, keys);
  DeviceTensor query_heads = view(queries, {n, slots, d}), key_heads = view(keys, {n, slots, d});
  backend_.rope_pair(query_heads, key_heads, positions_, p.importance_inv_freq, 1.0f);
  backend_.kv_append(view(keys, {n, slots, d}), no_values_, importance_keys_, no_values_,
                     position_);
  if (n > 1) backend_.copy_rows(queries, n - 1, query_, 0, 1, slots * d);
  position_ += n;
}

void PredictorState::predicted_logits(int64_t layer, DeviceTensor& scores) const {
  predicted_logits(layer, 1, scores);
}

void PredictorState::predicted_logits(int64_t first_layer, int64_t layers,
                                      DeviceTensor& scores) const {
  const PredictorConfig& c = predictor_->config();
  if (first_layer < 1 || layers < 1 || first_layer + layers > c.layers || position_ == 0) {
    throw Error("tokenbutler predictor", "layers",
                "predicted layers within 1.." + std::to_string(c.layers - 1) + " after a token",
                std::to_string(first_layer) + ".." + std::to_string(first_layer + layers - 1) +
                    " at position " + std::to_string(position_));
  }
  // The slots of consecutive layers are consecutive (layer-major), so their rows are one query
  // [1, layers * H, d'] against one key cache of layers * H groups: one launch for them all.
  const int64_t slots = layers * c.heads, first_slot = (first_layer - 1) * c.heads;
  const int64_t d = c.importance_dim;
  const size_t f = sizeof(float);
  const DeviceTensor query =
      rows_of(query_, int64_t(first_slot * d * f), DType::F32, {1, slots, d});
  const DeviceTensor keys = rows_of(importance_keys_, int64_t(first_slot * capacity_ * d * f),
                                    DType::F32, {slots, capacity_, d});
  backend_.attention_logits(query, keys, position_ - 1, 0, scores);
}

}  // namespace kvlens
