// The Llama forward pass over the Backend interface: embeddings, per layer RMSNorm -> q/k/v ->
// RoPE -> KV append -> causal attention -> o_proj + residual -> RMSNorm -> SwiGLU MLP + residual,
// then final norm and lm_head. Scratch rows: [rows, width] per activation, one row per run in a
// single-token step. The projections see every run's row at once (one read of the weights) until
// the rows differ; then, on a backend with several threads, each group of runs goes through the
// layers left on its own (session_groups.cpp), and the lm_head takes every row again. The per-run
// attention is in session_attention.cpp. Caches grow by doubling up to max_position_embeddings,
// and the policies' row buffers with them.
#include "engine/session/decoder_session.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "engine/arch/architecture.h"
#include "engine/backend/tensor_views.h"
#include "engine/common/error.h"
#include "engine/policy/predictor_runtime.h"

namespace kvlens {

using tensor::row_range;
using tensor::row_view;
using tensor::rows_of;
using tensor::timed_work;
using tensor::view;

std::shared_ptr<const BackendModel> upload_model(std::shared_ptr<const Model> model,
                                                 Backend& backend, const UploadOptions& options) {
  std::shared_ptr<BackendModel> result = BackendModel::upload_weights(model, backend, options);
  if (model->predictor.predictor)
    result->predictor = BackendPredictor::upload(model->predictor.predictor, backend);
  return result;
}

// Counts the backend still owes (a step that threw) must land before the runs' storage goes.
DecoderSession::~DecoderSession() {
  drop_deferred_counts();
}

DecoderSession::DecoderSession(std::shared_ptr<const BackendModel> model, SessionOptions options,
                               int64_t runs)
    : model_(std::move(model)),
      backend_(*model_->backend),
      options_(options),
      cache_dtype_(options.kv_cache_dtype.value_or(model_->kv_cache_dtype)) {
  if (runs < 1) throw Error("session", "runs", "at least one run", std::to_string(runs));
  if (!backend_.supports_cache_dtype(cache_dtype_)) {
    throw Error("session", "KV cache dtype",
                "a dtype the " + backend_.name() + " backend keeps caches in",
                std::string(dtype_name(cache_dtype_)));
  }
  runs_.resize(size_t(runs));
  identical_rows_.assign(size_t(model_->config().num_layers), 0);
  for (int64_t l = 0; l < model_->config().num_layers; ++l) {
    const int64_t window = model_->config().layer_window(l);
    if (window > 0 && (narrowest_window_ == 0 || window < narrowest_window_))
      narrowest_window_ = window;
  }
  plan_.reset(runs, runs > 1 ? backend_.lockstep_groups(runs, model_->layer_weight_bytes(),
                                                        int64_t(model_->layers.size()))
                             : 1);
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
  int64_t capacity = std::max<int64_t>({current, options_.initial_capacity, 1});
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
        caches[l] = backend_.alloc(cache_dtype_, {c.num_kv_heads, capacity, c.head_dim});
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
  grow_policy_rows(capacity);
}

int64_t DecoderSession::row_stride() const {
  if (!runs_[0].k_cache.empty()) return runs_[0].k_cache.front().dim(1);
  return std::min(std::max<int64_t>(options_.initial_capacity, 1),
                  model_->config().max_position_embeddings);
}

int64_t DecoderSession::policy_run_bytes(int64_t stride) const {
  const ModelConfig& c = model_->config();
  const int64_t row_floats = c.num_heads * stride;
  // Each run's F32 rows start 64-byte aligned.
  return ((c.num_layers + 2) * row_floats * int64_t(sizeof(float)) + c.num_layers * row_floats +
          63) /
         64 * 64;
}

void DecoderSession::assign_policy_rows(SessionRun& run, int64_t index) {
  const ModelConfig& c = model_->config();
  const int64_t stride = policy_stride_, row_floats = c.num_heads * stride;
  // Per run, in [H, stride] rows: scores of every layer, logits, probabilities (F32), then the
  // masks of every layer (U8).
  const int64_t first = index * policy_run_bytes(stride);
  int64_t at = first;
  auto next = [&](DType dtype) {
    DeviceTensor rows = rows_of(policy_rows_, at, dtype, {c.num_heads, stride});
    at += row_floats * int64_t(dtype_size(dtype));
    return rows;
  };
  run.scores.clear();
  run.visible.clear();
  for (int64_t l = 0; l < c.num_layers; ++l) run.scores.push_back(next(DType::F32));
  run.policy_logits = next(DType::F32);
  run.policy_probs = next(DType::F32);
  for (int64_t l = 0; l < c.num_layers; ++l) run.visible.push_back(next(DType::U8));
  const int64_t rows = c.num_layers * c.num_heads;
  run.every_layer_scores = rows_of(policy_rows_, first, DType::F32, {rows, stride});
  run.every_layer_visible =
      rows_of(policy_rows_, first + (c.num_layers + 2) * row_floats * int64_t(sizeof(float)),
              DType::U8, {rows, stride});
}

void DecoderSession::grow_policy_rows(int64_t stride) {
  if (options_.record_attention_logits) {
    const ModelConfig& c = model_->config();
    for (SessionRun& run : runs_) {
      if (!run.recorded_logits.empty() && run.recorded_logits.dim(1) == stride) continue;
      run.recorded_logits.storage.reset();  // rewritten by every step: nothing to keep
      run.recorded_logits = backend_.alloc(DType::F32, {c.num_layers * c.num_heads, stride});
    }
  }
  // Runs without a policy keep their logits scratch (and a former policy's rows) on their own.
  for (SessionRun& run : runs_) {
    if (run.policy) continue;
    run.policy_logits = widen_columns(backend_, run.policy_logits, stride);
    run.policy_probs = widen_columns(backend_, run.policy_probs, stride);
    run.scores.clear();
    run.visible.clear();
    run.every_layer_scores = {};
    run.every_layer_visible = {};
  }
  if (policy_rows_.empty() || stride <= policy_stride_) return;
  const DeviceTensor old_rows = policy_rows_;  // alive until every run's rows are copied
  policy_rows_ = backend_.alloc(DType::U8, {runs(), policy_run_bytes(stride)});
  policy_stride_ = stride;
  for (size_t r = 0; r < runs_.size(); ++r) {
    SessionRun& run = runs_[r];
    if (!run.policy) continue;
    std::vector<DeviceTensor> old = run.scores;
    old.push_back(run.policy_logits);
    old.push_back(run.policy_probs);
    old.insert(old.end(), run.visible.begin(), run.visible.end());
    assign_policy_rows(run, int64_t(r));
    std::vector<DeviceTensor*> grown;
    for (DeviceTensor& t : run.scores) grown.push_back(&t);
    grown.push_back(&run.policy_logits);
    grown.push_back(&run.policy_probs);
    for (DeviceTensor& t : run.visible) grown.push_back(&t);
    for (size_t i = 0; i < old.size(); ++i) copy_columns(backend_, old[i], *grown[i]);
    run.policy->grow(stride);
  }
}

int64_t DecoderSession::policy_state_bytes() const {
  int64_t bytes = policy_rows_.empty() ? 0 : int64_t(policy_rows_.bytes());
  for (const SessionRun& run : runs_) {
    if (run.policy) {
      bytes += run.policy->state_bytes();
    } else {
      // A run without a policy holds its logits scratch (and a former policy's rows) itself.
      for (const DeviceTensor* t : {&run.policy_logits, &run.policy_probs}) {
        if (!t->empty() && t->storage != policy_rows_.storage) bytes += int64_t(t->bytes());
      }
    }
  }
  return bytes;
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

const DeviceTensor& DecoderSession::rope_inv_freq(int64_t seq_len) {
  switch (model_->config().rope_table(seq_len)) {
    case ModelConfig::RopeTable::kShort:
      return model_->inv_freq;
    case ModelConfig::RopeTable::kLong:
      return model_->inv_freq_long;
    case ModelConfig::RopeTable::kPerLength:
      break;
  }
  // Stream-ordered after the ops that read the previous table (from_host), so it may be reused.
  if (rope_scratch_length_ != seq_len) {
    const std::vector<float> table = model_->config().rope_inv_freq(seq_len);
    if (rope_scratch_.empty()) rope_scratch_ = backend_.alloc(DType::F32, {int64_t(table.size())});
    backend_.from_host(rope_scratch_, table.data(), table.size() * sizeof(float));
    rope_scratch_length_ = seq_len;
  }
  return rope_scratch_;
}

const DeviceTensor& DecoderSession::forward_ops(std::span<const int32_t> tokens, bool per_run) {
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
  const float eps = float(c.rms_norm_eps);
  const int64_t context = position_ + (per_run ? 1 : n);
  // transformers picks the RoPE table per forward call from its largest position.
  const DeviceTensor& inv_freq = rope_inv_freq(context);
  step_inv_freq_ = &inv_freq;

  settle();                // the last step's counts
  drop_deferred_counts();  // left over only by a step that threw
  for (SessionRun& run : runs_) {
    run.attention_logits.clear();
    run.pending_observe = -1;  // left over only by a step that threw
  }
  if (per_run) {
    plan_.order_by_cost();
    plan_.plan_groups();
    // Every layer's step_attention reads the runs' rows of the same scratch tensors.
    input_rows_.resize(size_t(n));
    q_rows_.resize(size_t(n));
    out_rows_.resize(size_t(n));
    k_rows_.resize(size_t(n));
    v_rows_.resize(size_t(n));
    for (int64_t r = 0; r < n; ++r) {
      const int64_t slot = plan_.slot_of_run[size_t(r)];
      input_rows_[size_t(r)] = row_view(normed, slot);
      q_rows_[size_t(r)] = row_view(q_heads, slot);
      out_rows_[size_t(r)] = row_view(attn_heads, slot);
      k_rows_[size_t(r)] = row_view(k_heads, slot);
      v_rows_[size_t(r)] = row_view(v_heads, slot);
    }
    if (!plan_.rows_in_run_order) {
      slot_tokens_.resize(size_t(n));
      for (int64_t r = 0; r < n; ++r)
        slot_tokens_[size_t(plan_.slot_of_run[size_t(r)])] = tokens[size_t(r)];
      tokens = slot_tokens_;
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
  const std::span<const int64_t> all_positions(positions);
  // The layer's projections up to the attention (norm, q/k/v; RoPE for a chunk, while a run's
  // step rotates as it appends) and after it (o_proj and the MLP with their residuals), over rows
  // [first, first + m).
  const Architecture& architecture = *model_->architecture;
  // Rows [first, first + m) of the scratch, as the family's layer math takes them.
  auto layer_rows = [&](int64_t first, int64_t m) {
    return LayerRows{row_range(hidden, first, m), row_range(normed, first, m),
                     row_range(q, first, m),      row_range(k, first, m),
                     row_range(v, first, m),      row_range(attn, first, m),
                     row_range(proj, first, m),   row_range(gate, first, m),
                     row_range(up, first, m),     row_range(act, first, m)};
  };
  // The views are made once per forward (a layer's math is the hot path): every row, the first
  // row alone (rows alike), or a split group's rows (made once per group in split_runs).
  LayerRows all_rows = layer_rows(0, n), first_row = layer_rows(0, 1);
  // The layer's math up to the attention (the family's norm, q/k/v and extras; RoPE for a
  // chunk, while a run's step rotates as it appends) and after it (o_proj and the MLP with their
  // residuals), over `rows`, rows [first, first + rows' count) of the scratch.
  auto project_input = [&](const BackendModel::Layer& layer, LayerRows& rows, int64_t first) {
    architecture.attention_inputs(backend_, c, layer, rows);
    // A run's step rotates its query and key as it appends (append_runs: one op for both).
    if (per_run) return;
    const int64_t m = rows.q.dim(0);
    DeviceTensor q_heads_m = row_range(q_heads, first, m), k_heads_m = row_range(k_heads, first, m);
    const std::span<const int64_t> rows_positions = all_positions.subspan(size_t(first), size_t(m));
    // gemma3's local layers rotate with their own, unscaled table.
    const bool local = model_->layer_uses_local_rope(size_t(&layer - model_->layers.data()));
    backend_.rope_pair(q_heads_m, k_heads_m, rows_positions,
                       local ? model_->inv_freq_local : inv_freq,
                       local ? 1.0f : model_->rope_scale);
  };
  auto project_output = [&](const BackendModel::Layer& layer, LayerRows& rows) {
    architecture.attention_output_and_mlp(backend_, c, layer, rows);
  };

  backend_.embed(model_->embed, tokens, hidden);
  if (c.embedding_scale != 1.0) {
    // gemma3: transformers multiplies by the scale rounded to the embeddings' dtype (BF16:
    // sqrt(1152) = 33.94 becomes 34; F16 checkpoints keep the F32 scale here).
    float scale = float(c.embedding_scale);
    if (model_->embed.dtype == DType::BF16) scale = bf16_to_f32(f32_to_bf16(scale));
    backend_.axpby_rows(hidden, scale, hidden, 0.0f, E);
  }
  // Whether the hidden rows are alike: checked once after the embedding, then carried (a layer
  // keeps them alike exactly when its attention outputs are alike too).
  bool alike = rows_alike(hidden);
  bool split = false;  // the layers left went to the run groups (split_runs)
  for (size_t l = 0; l < model_->layers.size(); ++l) {
    const BackendModel::Layer& layer = model_->layers[l];
    const bool alike_in = alike;
    if (per_run && !alike_in && plan_.splits()) {
      // From here on no row depends on another: each group of runs goes through the layers left
      // on its own thread.
      split_runs([&](int64_t group_index) {
        const int64_t first = plan_.group_bounds[size_t(group_index)];
        const int64_t m = plan_.group_bounds[size_t(group_index) + 1] - first;
        const std::span<const int64_t> group(plan_.run_of_slot.data() + first, size_t(m));
        LayerRows group_rows = layer_rows(first, m);
        for (size_t own = l; own < model_->layers.size(); ++own) {
          project_input(model_->layers[own], group_rows, first);
          attend_group(group, own, std::min(identical_rows_[own], position_),
                       attention_batches_[size_t(group_index)]);
          project_output(model_->layers[own], group_rows);
        }
        for (const int64_t r : group) {
          timed_work(plan_.run_seconds[size_t(r)], [&] { observe_pending(runs_[size_t(r)]); });
        }
      });
      split = true;
      break;
    }
    project_input(layer, alike_in ? first_row : all_rows, 0);
    if (alike_in) {
      // The runs' layer inputs, queries, keys and values (their policies read them).
      for (DeviceTensor* rows : {&normed, &q, &k, &v}) copy_first_row(*rows);
    }
    if (!per_run && l == 0) {
      // A dense chunk is not selected for: policies that keep state of their own over the
      // layer-0 inputs (a learned predictor) read them here.
      for (SessionRun& run : runs_) {
        if (run.policy) run.policy->observe_inputs(normed, position_);
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
      if (c.attn_logit_softcap > 0.0) {
        capped_chunk_attention(q_heads, first.k_cache[l], first.v_cache[l],
                               c.layer_window(int64_t(l)), attn_heads, logits_out);
      } else {
        backend_.attention(q_heads, first.k_cache[l], first.v_cache[l], position_,
                           c.layer_window(int64_t(l)), Visibility{}, attn_heads, logits_out);
      }
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
    project_output(layer, alike_out ? first_row : all_rows);
    if (alike_out) copy_first_row(hidden);
  }
  if (per_run && !split) {
    // The last layer's observations (the earlier ones ran in the next layer's selection tasks).
    if (std::any_of(runs_.begin(), runs_.end(),
                    [](const SessionRun& run) { return run.pending_observe >= 0; })) {
      backend_.run_tasks(n, [&](int64_t task) {
        const int64_t r = plan_.run_order[size_t(task)];
        timed_work(plan_.run_seconds[size_t(r)], [&] { observe_pending(runs_[size_t(r)]); });
      });
    }
  }
  {
    // The lm_head over every row at once, split or not: it is the largest weight, and the
    // threads meet at the end of the step anyway (its products in each group made a lockstep
    // step at 512 tokens ~3% slower: each thread read all of it). Rows not in run order are put
    // in run order first (in proj's scratch), so the logits come out in run order.
    const int64_t m = alike ? 1 : n;
    DeviceTensor normed_m = row_range(normed, 0, m), logits_m = row_range(logits_view_, 0, m);
    if (per_run && !alike && !plan_.rows_in_run_order) {
      backend_.rmsnorm(row_range(hidden, 0, m), model_->final_norm, eps, normed_m);
      for (int64_t r = 0; r < n; ++r)
        backend_.copy_rows(normed, plan_.slot_of_run[size_t(r)], proj, r, 1, E);
      backend_.matmul(proj, model_->lm_head, logits_m);
    } else {
      const DeviceTensor* const head[] = {&model_->lm_head};
      DeviceTensor* const logits_out[] = {&logits_m};
      backend_.rmsnorm_matmul_many(row_range(hidden, 0, m), model_->final_norm, eps, normed_m, head,
                                   logits_out);
    }
    if (c.final_logit_softcap > 0.0) backend_.soft_cap(logits_m, float(c.final_logit_softcap));
    if (alike) copy_first_row(logits_view_);
  }
  if (per_run) {
    // The counts and gates come back when a reader or the next step needs them (settle): the
    // step returns as soon as its ops are queued.
    queue_step_counts();
    counts_pending_ = std::any_of(runs_.begin(), runs_.end(), [](const SessionRun& run) {
      return !run.counted_layers.empty() || !run.gated_layers.empty();
    });
    for (SessionRun& run : runs_) {
      if (policy_step(run)) run.sparsity.end_step();
    }
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

PolicyShape DecoderSession::policy_shape() const {
  const ModelConfig& c = model_->config();
  return {c.num_layers,
          c.num_heads,
          c.num_kv_heads,
          c.head_dim,
          row_stride(),
          model_->predictor,
          model_->model->predictor.searched,
          c.hidden_size,
          c.max_position_embeddings,
          model_->model->dir,
          model_->model->file_dirs,
          model_->model->shard.first_head,
          model_->model->shard.first_kv_head,
          model_->model->shard.model_heads,
          model_->model->shard.model_kv_heads};
}

void DecoderSession::set_policy(int64_t index, std::unique_ptr<Policy> policy, int64_t first_step) {
  if (index < 0 || index >= runs()) {
    throw Error("session", "run", "a run index in [0, " + std::to_string(runs()) + ")",
                std::to_string(index));
  }
  settle();  // the last step's counts belong to the policies that counted them
  SessionRun& run = runs_[size_t(index)];
  run.policy = std::move(policy);
  run.first_step = first_step;
  run.visible.clear();
  run.scores.clear();
  run.every_layer_scores = {};
  run.every_layer_visible = {};
  run.decisions.clear();
  if (!run.policy) return;
  const PolicyShape shape = policy_shape();
  // Every run's policy rows live in one allocation (in huge pages on the CPU: a lockstep step
  // touches all of them, and thousands of small pages cost a TLB miss each), at the caches'
  // capacity (grow_policy_rows widens them with the caches).
  if (policy_rows_.empty()) {
    policy_stride_ = shape.stride;
    policy_rows_ = backend_.alloc(DType::U8, {runs(), policy_run_bytes(policy_stride_)});
  } else {
    // A run given a new policy starts from zeros, as in a fresh allocation.
    const int64_t run_bytes = policy_run_bytes(policy_stride_);
    DeviceTensor rows = rows_of(policy_rows_, index * run_bytes, DType::U8, {1, run_bytes});
    backend_.fill_columns(rows, 0, run_bytes, 0);
  }
  assign_policy_rows(run, index);
  // A policy made for an earlier, narrower stride catches up.
  run.policy->grow(policy_stride_);
  run.decisions.assign(size_t(shape.layers), LayerDecision::Dense);
  run.sparsity.reset(shape.layers, shape.heads);
  if (zero_attention_.empty()) {
    zero_attention_ = backend_.alloc(DType::F32, {1, shape.heads * shape.head_dim});
  }
}

std::vector<float> DecoderSession::step(int32_t token) {
  if (runs() != 1) throw Error("session", "step", "a single-run session (use forward)");
  const DeviceTensor& logits = forward(std::span<const int32_t>(&token, 1));
  std::vector<float> host(size_t(logits.numel()));
  backend_.to_host(logits, host.data(), host.size() * sizeof(float));
  return host;
}

// A soft-capped model's chunk: row by row, the logits capped between the products and the
// softmax (the fused attention op has no cap). Row i (position p = position_ + i) writes the
// logits as the fused op would: [0, p] computed, (p, context) -inf.
void DecoderSession::capped_chunk_attention(const DeviceTensor& q_heads,
                                            const DeviceTensor& k_cache,
                                            const DeviceTensor& v_cache, int64_t window,
                                            DeviceTensor& out_heads, DeviceTensor* logits_out) {
  const int64_t n = q_heads.dim(0), H = q_heads.dim(1), context = position_ + n;
  DeviceTensor scratch;
  if (!logits_out) scratch = backend_.alloc(DType::F32, {H, context});
  DeviceTensor masked;  // [1, context] of -inf: the columns after a row's own position
  if (logits_out && n > 1) {
    masked = backend_.alloc(DType::F32, {1, context});
    const std::vector<float> minus_inf(size_t(context), -std::numeric_limits<float>::infinity());
    backend_.from_host(masked, minus_inf.data(), minus_inf.size() * sizeof(float));
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t position = position_ + i;
    DeviceTensor logits = logits_out ? view(row_view(*logits_out, i), {H, context}) : scratch;
    DeviceTensor out = row_view(out_heads, i);
    capped_attention(row_view(q_heads, i), k_cache, v_cache, position, window, logits, out);
    const int64_t after = context - (position + 1);
    for (int64_t h = 0; h < H && logits_out && after > 0; ++h)
      backend_.copy_rows(masked, 0, logits, h * context + position + 1, after, 1);
  }
}

}  // namespace kvlens
