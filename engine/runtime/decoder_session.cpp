// The Llama forward pass over the Backend interface: embeddings, per layer RMSNorm -> q/k/v ->
// RoPE -> KV append -> causal attention -> o_proj + residual -> RMSNorm -> SwiGLU MLP + residual,
// then final norm and lm_head. The projections see every run's row at once (one read of the
// weights); in single-token steps the policy runs' attention goes through backend calls over all
// runs (the prompt rows every cache shares read once) and their selections run run by run (the
// backend's tasks). Caches grow by doubling up to max_position_embeddings.
#include "engine/runtime/decoder_session.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
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

// `shape` of `dtype` at byte `offset` of `bytes`, over the same storage.
DeviceTensor rows_of(const DeviceTensor& bytes, int64_t offset, DType dtype,
                     std::vector<int64_t> shape) {
  DeviceTensor result = bytes;
  result.data = static_cast<std::byte*>(bytes.data) + offset;
  result.dtype = dtype;
  result.shape = std::move(shape);
  return result;
}

// Columns [0, cols) of row `row` of a [rows, stride] F32 tensor, as a [1, cols] tensor.
DeviceTensor row_prefix(const DeviceTensor& tensor, int64_t row, int64_t cols) {
  DeviceTensor result = tensor;
  result.data = tensor.as<float>() + row * tensor.dim(1);
  result.shape = {1, cols};
  return result;
}

// Row `row` of a [n, ...] tensor as a [1, ...] tensor over the same storage.
DeviceTensor row_view(const DeviceTensor& tensor, int64_t row) {
  DeviceTensor result = tensor;
  const int64_t row_elems = tensor.numel() / tensor.dim(0);
  result.data =
      static_cast<std::byte*>(tensor.data) + size_t(row * row_elems) * dtype_size(tensor.dtype);
  result.shape[0] = 1;
  return result;
}

constexpr int64_t kInitialCacheCapacity = 256;

// Runs work() and adds its wall time to `seconds`.
template <typename Work>
void timed_work(double& seconds, Work&& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

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

DecoderSession::DecoderSession(std::shared_ptr<const BackendModel> model, SessionOptions options,
                               int64_t runs)
    : model_(std::move(model)), backend_(*model_->backend), options_(options) {
  if (runs < 1) throw Error("session", "runs", "at least one run", std::to_string(runs));
  runs_.resize(size_t(runs));
  identical_rows_.assign(size_t(model_->config().num_layers), 0);
}

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

void DecoderSession::check_tokens(std::span<const int32_t> tokens, int64_t positions) const {
  const ModelConfig& c = model_->config();
  if (tokens.empty()) throw Error("input", "tokens", "at least one token");
  for (const int32_t id : tokens) {
    if (id < 0 || id >= c.vocab_size) {
      throw Error("input", "token id", "an id in [0, " + std::to_string(c.vocab_size) + ")",
                  std::to_string(id));
    }
  }
  if (position_ + positions > c.max_position_embeddings) {
    throw Error(c.source, "max_position_embeddings",
                "at most " + std::to_string(c.max_position_embeddings) + " positions",
                "input reaching position " + std::to_string(position_ + positions));
  }
  if (options_.capacity > 0 && position_ + positions > options_.capacity) {
    throw Error("session", "capacity",
                "at most " + std::to_string(options_.capacity) + " cached positions",
                std::to_string(position_ + positions));
  }
}

// Every run's cache grows (by doubling) so that positions [0, needed) fit. The prefix every run
// holds alike (shared_rows_) goes to all new caches in one broadcast, so it stays stored once.
void DecoderSession::grow_caches(int64_t needed) {
  const ModelConfig& c = model_->config();
  const int64_t current = runs_[0].k_cache.empty() ? 0 : runs_[0].k_cache.front().dim(1);
  if (needed <= current) return;
  int64_t capacity = std::max<int64_t>(current, kInitialCacheCapacity);
  while (capacity < needed) capacity *= 2;
  capacity = std::min(capacity, c.max_position_embeddings);
  const int64_t shared = runs_.size() > 1 ? std::min(shared_rows_, position_) : 0;
  std::vector<DeviceTensor*> grown_caches(runs_.size());
  for (const bool keys : {true, false}) {
    for (size_t l = 0; l < size_t(c.num_layers); ++l) {
      std::vector<DeviceTensor> old(runs_.size());
      for (size_t r = 0; r < runs_.size(); ++r) {
        auto& caches = keys ? runs_[r].k_cache : runs_[r].v_cache;
        caches.resize(size_t(c.num_layers));
        old[r] = std::move(caches[l]);
        caches[l] = backend_.alloc(DType::F32, {c.num_kv_heads, capacity, c.head_dim});
        grown_caches[r] = &caches[l];
      }
      for (int64_t g = 0; g < c.num_kv_heads && position_ > 0; ++g) {
        if (shared > 0) {
          backend_.broadcast_rows(old[0], g * current, grown_caches, g * capacity, shared,
                                  c.head_dim);
        }
        for (size_t r = 0; r < runs_.size() && shared < position_; ++r) {
          backend_.copy_rows(old[r], g * current + shared, *grown_caches[r], g * capacity + shared,
                             position_ - shared, c.head_dim);
        }
      }
    }
  }
}

const DeviceTensor& DecoderSession::forward(std::span<const int32_t> tokens) {
  check_tokens(tokens, int64_t(tokens.size()));
  if (tokens.size() == 1 && runs() > 1) {
    const std::vector<int32_t> repeated(runs_.size(), tokens[0]);
    return forward_rows(repeated, true);
  }
  return forward_rows(tokens, tokens.size() == 1);
}

const DeviceTensor& DecoderSession::forward_runs(std::span<const int32_t> tokens) {
  if (int64_t(tokens.size()) != runs()) {
    throw Error("session", "tokens", "one token per run (" + std::to_string(runs()) + ")",
                std::to_string(tokens.size()));
  }
  check_tokens(tokens, 1);
  return forward_rows(tokens, true);
}

const DeviceTensor& DecoderSession::forward_rows(std::span<const int32_t> tokens, bool per_run) {
  const ModelConfig& c = model_->config();
  const int64_t n = int64_t(tokens.size());
  grow_caches(position_ + (per_run ? 1 : n));
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

  // Row i sits at position position_ + i in a chunk, at position_ in every run's row.
  std::vector<int64_t> positions(static_cast<size_t>(n), position_);
  if (!per_run) {
    for (int64_t i = 0; i < n; ++i) positions[size_t(i)] = position_ + i;
  }
  const int64_t window = c.sliding_window.value_or(0);
  const float eps = float(c.rms_norm_eps);
  const int64_t context = position_ + (per_run ? 1 : n);

  for (SessionRun& run : runs_) {
    run.attention_logits.clear();
    run.pending_observe = -1;  // left over only by a step that threw
  }
  if (per_run) {
    order_runs_by_cost();
    // Every layer's step_attention reads the runs' rows of the same scratch tensors.
    input_rows_.resize(size_t(n));
    q_rows_.resize(size_t(n));
    out_rows_.resize(size_t(n));
    k_rows_.resize(size_t(n));
    v_rows_.resize(size_t(n));
    for (int64_t r = 0; r < n; ++r) {
      input_rows_[size_t(r)] = row_view(normed, r);
      q_rows_[size_t(r)] = row_view(q_heads, r);
      out_rows_[size_t(r)] = row_view(attn_heads, r);
      k_rows_[size_t(r)] = row_view(k_heads, r);
      v_rows_[size_t(r)] = row_view(v_heads, r);
    }
  }
  // Lockstep rows that hold the same bytes (every run's hidden state alike: the same token, and
  // every earlier layer dense in all runs, as layer 0 is by default) are computed once, in row 0,
  // and copied to the other rows: the ops' results per row do not depend on the other rows, so
  // the bits are those of computing every row.
  auto rows_alike = [&](const DeviceTensor& rows) {
    if (!per_run || n == 1) return false;
    const DeviceTensor first = row_view(rows, 0);
    for (int64_t r = 1; r < n; ++r) {
      if (!backend_.same_bytes(row_view(rows, r), first)) return false;
    }
    return true;
  };
  auto copy_first_row = [&](DeviceTensor& rows) {
    const int64_t row_elems = rows.numel() / rows.dim(0);
    for (int64_t r = 1; r < rows.dim(0); ++r) backend_.copy_rows(rows, 0, rows, r, 1, row_elems);
  };
  // The first m rows of a [n, ...] scratch view.
  auto first_rows = [](const DeviceTensor& rows, int64_t m) {
    DeviceTensor result = rows;
    result.shape[0] = m;
    return result;
  };
  const std::span<const int64_t> all_positions(positions);

  backend_.embed(model_->embed, tokens, hidden);
  // Whether the hidden rows are alike: checked once after the embedding, then carried (a layer
  // keeps them alike exactly when its attention outputs are alike too).
  bool alike = rows_alike(hidden);
  for (size_t l = 0; l < model_->layers.size(); ++l) {
    const BackendModel::Layer& layer = model_->layers[l];
    const bool alike_in = alike;
    {
      const int64_t m = alike_in ? 1 : n;
      DeviceTensor normed_m = first_rows(normed, m), q_m = first_rows(q, m), k_m = first_rows(k, m);
      DeviceTensor v_m = first_rows(v, m), q_heads_m = first_rows(q_heads, m);
      DeviceTensor k_heads_m = first_rows(k_heads, m);
      backend_.rmsnorm(first_rows(hidden, m), layer.attn_norm, eps, normed_m);
      backend_.matmul(normed_m, layer.wq, q_m);
      backend_.matmul(normed_m, layer.wk, k_m);
      backend_.matmul(normed_m, layer.wv, v_m);
      backend_.rope(q_heads_m, all_positions.first(size_t(m)), model_->inv_freq);
      backend_.rope(k_heads_m, all_positions.first(size_t(m)), model_->inv_freq);
      if (alike_in) {
        // The runs' layer inputs, queries, keys and values (their policies read them).
        for (DeviceTensor* rows : {&normed, &q, &k, &v}) copy_first_row(*rows);
      }
    }
    if (per_run) {
      step_attention(l);
    } else {
      SessionRun& first = runs_[0];
      backend_.kv_append(k_heads, v_heads, first.k_cache[l], first.v_cache[l], position_);
      DeviceTensor* logits_out = nullptr;
      if (options_.record_attention_logits) {
        first.attention_logits.push_back(backend_.alloc(DType::F32, {n, H, context}));
        logits_out = &first.attention_logits.back();
      }
      backend_.attention(q_heads, first.k_cache[l], first.v_cache[l], position_, window,
                         Visibility{}, attn_heads, logits_out);
      // A chunk is dense in every run: every cache receives the same keys and values (stored
      // once where the backend can share them, run 0's own rows included).
      if (runs_.size() > 1) {
        const int64_t capacity = first.k_cache[l].dim(1);
        std::vector<DeviceTensor*> k_caches, v_caches;
        for (SessionRun& run : runs_) {
          k_caches.push_back(&run.k_cache[l]);
          v_caches.push_back(&run.v_cache[l]);
        }
        for (int64_t g = 0; g < G; ++g) {
          const int64_t row = g * capacity + position_;
          backend_.broadcast_rows(first.k_cache[l], row, k_caches, row, n, D);
          backend_.broadcast_rows(first.v_cache[l], row, v_caches, row, n, D);
        }
      }
      for (size_t r = 1; r < runs_.size(); ++r) {
        if (logits_out) runs_[r].attention_logits.push_back(*logits_out);
      }
    }
    // Alike inputs and alike attention outputs (every run dense here) give alike outputs.
    const bool alike_out = alike_in && rows_alike(attn);
    alike = alike_out;
    {
      const int64_t m = alike_out ? 1 : n;
      DeviceTensor hidden_m = first_rows(hidden, m), normed_m = first_rows(normed, m);
      DeviceTensor proj_m = first_rows(proj, m), gate_m = first_rows(gate, m);
      DeviceTensor up_m = first_rows(up, m), act_m = first_rows(act, m);
      backend_.matmul(first_rows(attn, m), layer.wo, proj_m);
      backend_.add_inplace(hidden_m, proj_m);
      backend_.rmsnorm(hidden_m, layer.mlp_norm, eps, normed_m);
      backend_.matmul(normed_m, layer.w_gate, gate_m);
      backend_.matmul(normed_m, layer.w_up, up_m);
      backend_.silu_mul(gate_m, up_m, act_m);
      backend_.matmul(act_m, layer.w_down, proj_m);
      backend_.add_inplace(hidden_m, proj_m);
      if (alike_out) copy_first_row(hidden);
    }
  }
  if (per_run) {
    // The last layer's observations (the earlier ones ran in the next layer's selection tasks).
    if (std::any_of(runs_.begin(), runs_.end(),
                    [](const SessionRun& run) { return run.pending_observe >= 0; })) {
      backend_.run_tasks(n, [&](int64_t task) {
        const int64_t r = run_order_[size_t(task)];
        timed_work(run_seconds_[size_t(r)], [&] { observe_pending(runs_[size_t(r)]); });
      });
    }
    for (SessionRun& run : runs_) {
      if (policy_step(run)) run.sparsity.end_step();
    }
  }
  {
    const int64_t m = alike ? 1 : n;
    DeviceTensor normed_m = first_rows(normed, m), logits_m = first_rows(logits_view_, m);
    backend_.rmsnorm(first_rows(hidden, m), model_->final_norm, eps, normed_m);
    backend_.matmul(normed_m, model_->lm_head, logits_m);
    if (alike) copy_first_row(logits_view_);
  }
  // A chunk that continues the common prefix extends it; steps of the runs never change it
  // (they write positions past it).
  if (!per_run) {
    if (shared_rows_ == position_) shared_rows_ = position_ + n;
    for (int64_t& identical : identical_rows_)
      if (identical == position_) identical = position_ + n;
  }
  position_ += per_run ? 1 : n;
  return logits_view_;
}

void DecoderSession::order_runs_by_cost() {
  if (run_order_.size() != runs_.size()) {
    run_order_.resize(runs_.size());
    for (size_t r = 0; r < runs_.size(); ++r) run_order_[r] = int64_t(r);
    run_seconds_.assign(runs_.size(), 0.0);
  }
  // A stable sort: equal costs (the first step) keep the run order.
  std::stable_sort(run_order_.begin(), run_order_.end(), [&](int64_t a, int64_t b) {
    return run_seconds_[size_t(a)] > run_seconds_[size_t(b)];
  });
  std::fill(run_seconds_.begin(), run_seconds_.end(), 0.0);
}

PolicyShape DecoderSession::policy_shape() const {
  const ModelConfig& c = model_->config();
  return {c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim,
          options_.capacity > 0 ? options_.capacity : c.max_position_embeddings};
}

void DecoderSession::set_policy(int64_t index, std::unique_ptr<Policy> policy, int64_t first_step) {
  if (index < 0 || index >= runs()) {
    throw Error("session", "run", "a run index in [0, " + std::to_string(runs()) + ")",
                std::to_string(index));
  }
  SessionRun& run = runs_[size_t(index)];
  run.policy = std::move(policy);
  run.first_step = first_step;
  run.visible.clear();
  run.scores.clear();
  run.decisions.clear();
  if (!run.policy) return;
  const PolicyShape shape = policy_shape();
  // Every run's policy rows live in one allocation (in huge pages on the CPU: a lockstep step
  // touches all of them, and thousands of small pages cost a TLB miss each). Per run, in
  // [H, stride] rows: scores of every layer, logits, probabilities (F32), then the masks of
  // every layer (U8).
  const int64_t row_floats = shape.heads * shape.stride;
  const int64_t run_bytes =
      ((shape.layers + 2) * row_floats * int64_t(sizeof(float)) + shape.layers * row_floats + 63) /
      64 * 64;  // each run's F32 rows start 64-byte aligned
  if (policy_rows_.empty()) {
    policy_rows_ = backend_.alloc(DType::U8, {runs(), run_bytes});
  } else {
    // A run given a new policy starts from zeros, as in a fresh allocation.
    DeviceTensor rows = rows_of(policy_rows_, index * run_bytes, DType::U8, {1, run_bytes});
    backend_.fill_columns(rows, 0, run_bytes, 0);
  }
  int64_t at = index * run_bytes;
  auto next = [&](DType dtype) {
    DeviceTensor rows = rows_of(policy_rows_, at, dtype, {shape.heads, shape.stride});
    at += row_floats * int64_t(dtype_size(dtype));
    return rows;
  };
  for (int64_t l = 0; l < shape.layers; ++l) run.scores.push_back(next(DType::F32));
  run.policy_logits = next(DType::F32);
  run.policy_probs = next(DType::F32);
  for (int64_t l = 0; l < shape.layers; ++l) run.visible.push_back(next(DType::U8));
  run.decisions.assign(size_t(shape.layers), LayerDecision::Dense);
  run.sparsity.reset(shape.layers, shape.heads);
  if (zero_attention_.empty()) {
    zero_attention_ = backend_.alloc(DType::F32, {1, shape.heads * shape.head_dim});
  }
}

// The runs' policies see the same LayerStep in select and observe.
LayerStep DecoderSession::layer_step(SessionRun& run, size_t layer, size_t row) const {
  LayerStep step;
  step.step = position_;
  step.layer = int64_t(layer);
  step.layer_input = &input_rows_[row];
  step.q = &q_rows_[row];
  step.k_cache = &run.k_cache[layer];
  step.v_cache = &run.v_cache[layer];
  step.logits = &runs_[size_t(logits_source_[row])].policy_logits;
  return step;
}

void DecoderSession::step_attention(size_t layer) {
  const ModelConfig& c = model_->config();
  const int64_t n = runs(), H = c.num_heads, cols = position_ + 1;
  const int64_t window = c.sliding_window.value_or(0);
  run_attention_.assign(size_t(n), {});
  // The rows this step appends are compared in the scratch, before they are appended.
  int64_t& identical = identical_rows_[layer];
  bool appended_alike = n > 1 && identical == position_;
  for (int64_t r = 1; r < n && appended_alike; ++r) {
    appended_alike = backend_.same_bytes(k_rows_[size_t(r)], k_rows_[0]) &&
                     backend_.same_bytes(v_rows_[size_t(r)], v_rows_[0]);
  }
  if (appended_alike) identical = position_ + 1;
  // Rows [0, shared) hold the same keys and values in every run's cache: the backend may read
  // them once for all runs (the current token's row is read per run).
  const int64_t shared = n > 1 ? std::min(identical, position_) : 0;
  // With every row alike, a run whose query equals run 0's has run 0's logits: they are
  // computed once and read from run 0 (select, softmax) instead of computed again.
  logits_source_.resize(size_t(n));
  bool borrowed = false;
  for (int64_t r = 0; r < n; ++r) {
    logits_source_[size_t(r)] =
        r > 0 && identical > position_ && backend_.same_bytes(q_rows_[size_t(r)], q_rows_[0]) ? 0
                                                                                              : r;
    borrowed = borrowed || logits_source_[size_t(r)] != r;
  }
  for (int64_t r = 0; r < n; ++r) {
    SessionRun& run = runs_[size_t(r)];
    // A run without a policy (or before its first policy step) goes through the same calls,
    // unmasked (the attention op's bits), so its attention is shared out with the others'.
    if (run.policy_logits.empty()) {
      run.policy_logits = backend_.alloc(DType::F32, {H, policy_shape().stride});
    }
    Backend::RunAttention& attention = run_attention_[size_t(r)];
    attention.q = &q_rows_[size_t(r)];
    attention.k_cache = &run.k_cache[layer];
    attention.v_cache = &run.v_cache[layer];
    attention.logits = &runs_[size_t(logits_source_[size_t(r)])].policy_logits;
    attention.out = &out_rows_[size_t(r)];
  }
  if (!borrowed) {
    // Every run computes its own logits: its whole attention (append, logits, observation,
    // selection, softmax and value sums) is one backend task, the costliest runs of the last step
    // first. One hand-over to the threads per layer instead of three, and each run's logits and
    // mask are read back while still in its thread's cache; a run's results do not depend on the
    // grouping (the ops' arithmetic is per run).
    backend_.run_tasks(n, [&](int64_t task) {
      const int64_t r = run_order_[size_t(task)];
      timed_work(run_seconds_[size_t(r)], [&] {
        append_run(r, layer);
        const std::span<const Backend::RunAttention> alone(&run_attention_[size_t(r)], 1);
        if (chooses_first(r, layer)) {
          // The logits at the chosen columns only (none for a skipped layer).
          select_run(r, layer, cols);
          if (!alone[0].out) return;
          backend_.attention_logits_runs(alone, shared, position_, window);
        } else {
          backend_.attention_logits_runs(alone, shared, position_, window);
          select_run(r, layer, cols);
          if (!alone[0].out) return;
        }
        backend_.attention_visible_runs(alone, shared, cols);
      });
    });
  } else {
    attend_alike(layer, shared);
  }
  // The probabilities go to the policies that accumulate them at the start of the next layer's
  // task (or after the last layer): one parallel call fewer per layer, and the observations share
  // the threads with the selections. Nothing in between touches the run's probabilities or its
  // policy.
  for (int64_t r = 0; r < n; ++r) {
    if (run_attention_[size_t(r)].out && run_attention_[size_t(r)].probs)
      runs_[size_t(r)].pending_observe = int64_t(layer);
  }
}

bool DecoderSession::chooses_first(int64_t r, size_t layer) {
  SessionRun& run = runs_[size_t(r)];
  // Recorded logits are every column's, so a recording session computes them first.
  return !options_.record_attention_logits && policy_step(run) &&
         !run.policy->reads_logits(layer_step(run, layer, size_t(r)));
}

void DecoderSession::append_run(int64_t r, size_t layer) {
  SessionRun& run = runs_[size_t(r)];
  backend_.kv_append(k_rows_[size_t(r)], v_rows_[size_t(r)], run.k_cache[layer], run.v_cache[layer],
                     position_);
}

void DecoderSession::attend_alike(size_t layer, int64_t shared) {
  const ModelConfig& c = model_->config();
  const int64_t n = runs(), H = c.num_heads, cols = position_ + 1;
  for (int64_t r = 0; r < n; ++r) append_run(r, layer);
  // 1. The logits of the runs that do not borrow them, in one call.
  attention_batch_.clear();
  for (int64_t r = 0; r < n; ++r) {
    if (logits_source_[size_t(r)] == r) attention_batch_.push_back(run_attention_[size_t(r)]);
  }
  backend_.attention_logits_runs(attention_batch_, shared, position_, c.sliding_window.value_or(0));
  // 2. Each policy run's observation of the previous layer and its selection on the backend's
  // threads.
  backend_.run_tasks(n, [&](int64_t task) {
    const int64_t r = run_order_[size_t(task)];
    timed_work(run_seconds_[size_t(r)], [&] { select_run(r, layer, cols); });
  });
  // 3. Softmax over each run's visible set and the value sums. A run with run 0's logits that
  // sees everything gets the output (and probabilities) of the first such run, preferably one
  // that computes probabilities (then every such run can copy it): the same arithmetic on the
  // same rows.
  attention_batch_.clear();
  auto unmasked = [&](int64_t r) {
    const Backend::RunAttention& attention = run_attention_[size_t(r)];
    return attention.out && !attention.visible && logits_source_[size_t(r)] == 0;
  };
  int64_t twin_of = -1;  // the run whose output the twins copy
  for (int64_t r = 0; r < n; ++r) {
    if (!unmasked(r)) continue;
    if (twin_of < 0 || (run_attention_[size_t(r)].probs && !run_attention_[size_t(twin_of)].probs))
      twin_of = r;
  }
  twins_.clear();
  for (int64_t r = 0; r < n; ++r) {
    const Backend::RunAttention& attention = run_attention_[size_t(r)];
    if (!attention.out) continue;
    // (two unmasked runs have run 0's logits, so every cache row is alike: the same output)
    if (r != twin_of && twin_of >= 0 && unmasked(r) &&
        (!attention.probs || run_attention_[size_t(twin_of)].probs)) {
      twins_.push_back(r);
      continue;
    }
    attention_batch_.push_back(attention);
  }
  if (!attention_batch_.empty()) backend_.attention_visible_runs(attention_batch_, shared, cols);
  for (const int64_t r : twins_) {
    const Backend::RunAttention& source = run_attention_[size_t(twin_of)];
    const Backend::RunAttention& twin = run_attention_[size_t(r)];
    backend_.copy_rows(*source.out, 0, *twin.out, 0, 1, twin.out->numel());
    if (!twin.probs) continue;
    for (int64_t h = 0; h < H; ++h) {
      DeviceTensor to = row_prefix(*twin.probs, h, cols);
      backend_.copy_rows(row_prefix(*source.probs, h, cols), 0, to, 0, 1, cols);
    }
  }
}

void DecoderSession::select_run(int64_t r, size_t layer, int64_t cols) {
  const int64_t H = model_->config().num_heads;
  SessionRun& run = runs_[size_t(r)];
  Backend::RunAttention& attention = run_attention_[size_t(r)];
  observe_pending(run);
  if (options_.record_attention_logits) {
    // policy_logits rows have the policy stride; the recorded rows are packed.
    run.attention_logits.push_back(backend_.alloc(DType::F32, {1, H, cols}));
    DeviceTensor& recorded = run.attention_logits.back();
    for (int64_t h = 0; h < H; ++h)
      backend_.copy_rows(row_prefix(*attention.logits, h, cols), 0, recorded, h, 1, cols);
  }
  if (!policy_step(run)) return;
  const LayerStep step = layer_step(run, layer, size_t(r));
  const LayerDecision decision = run.policy->select(step, run.visible[layer], run.scores[layer]);
  run.decisions[layer] = decision;
  record_sparsity(run, layer, decision, cols);
  if (decision == LayerDecision::Skipped) {
    // A skipped attention contributes nothing: its row becomes zeros, so the batched o_proj
    // gives exactly 0 for it and the residual is unchanged.
    backend_.copy_rows(zero_attention_, 0, out_rows_[size_t(r)], 0, 1, q_rows_[size_t(r)].numel());
    attention.out = nullptr;
    return;
  }
  attention.visible = decision == LayerDecision::Masked ? &run.visible[layer] : nullptr;
  attention.probs = run.policy->wants_probs(step) ? &run.policy_probs : nullptr;
}

void DecoderSession::observe_pending(SessionRun& run) const {
  if (run.pending_observe < 0) return;
  LayerStep step;
  step.step = position_;
  step.layer = run.pending_observe;
  step.k_cache = &run.k_cache[size_t(run.pending_observe)];
  step.v_cache = &run.v_cache[size_t(run.pending_observe)];
  run.pending_observe = -1;
  run.policy->observe(step, run.policy_probs);
}

void DecoderSession::record_sparsity(SessionRun& run, size_t layer, LayerDecision decision,
                                     int64_t cols) {
  if (decision == LayerDecision::Dense) return run.sparsity.add_dense_layer(int64_t(layer));
  if (decision == LayerDecision::Skipped) return run.sparsity.add_skipped_layer(int64_t(layer));
  // A metric, not policy work: counted by the backend where the mask lives.
  const DeviceTensor& mask = run.visible[layer];
  run.visible_counts.resize(size_t(mask.dim(0)));
  backend_.count_nonzero_rows(mask, cols, run.visible_counts);
  run.sparsity.add_layer(int64_t(layer), run.visible_counts, cols);
}

std::vector<float> DecoderSession::step(int32_t token) {
  if (runs() != 1) throw Error("session", "step", "a single-run session (use forward)");
  const DeviceTensor& logits = forward(std::span<const int32_t>(&token, 1));
  std::vector<float> host(size_t(logits.numel()));
  backend_.to_host(logits, host.data(), host.size() * sizeof(float));
  return host;
}

}  // namespace kvlens
