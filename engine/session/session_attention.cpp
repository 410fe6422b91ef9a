// DecoderSession's single-token step, per run: each run appends its key and value, its policy
// observes the previous layer and selects, and its attention goes through the backend's policy
// ops (logits, softmax over the visible set, value sums), op by op over a group of runs on one
// thread (attend_group; each run alone as one of the backend's tasks, or the lockstep groups),
// or phase by phase while the runs share run 0's logits (attend_alike). Row buffers: logits / probs
// / scores F32 and masks U8 [H, stride].
#include <algorithm>
#include <span>
#include <vector>

#include "engine/backend/tensor_views.h"
#include "engine/session/decoder_session.h"

namespace kvlens {

using tensor::row_prefix;
using tensor::row_range;
using tensor::timed_work;
using tensor::view;

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
  const int64_t window = model_->config().layer_window(int64_t(layer));
  if (window > 0) step.first_candidate = std::max<int64_t>(0, position_ + 1 - window);
  // Some layer's window leaves out a key (its candidates differ from the other layers'): none.
  if (!run.every_layer_scores.empty() &&
      (narrowest_window_ == 0 || position_ + 1 <= narrowest_window_)) {
    step.every_layer_scores = &run.every_layer_scores;
    step.every_layer_visible = &run.every_layer_visible;
  }
  return step;
}

void DecoderSession::step_attention(size_t layer) {
  const int64_t n = runs();
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
  if (!borrowed) {
    // Every run computes its own logits: its whole attention is one backend task (a group of one
    // run), the costliest runs of the last step first. One hand-over to the threads per layer
    // instead of three, and each run's logits and mask are read back while still in its thread's
    // cache; a run's results do not depend on the grouping (the ops' arithmetic is per run).
    // Where the tasks would run one after another anyway (this session is itself a task, as an
    // eval's samples are), all runs are one group: the backend gets each op once for all of them
    // (on the GPU one launch instead of one per run: the eval is bound by launches).
    // (grown only: a split step's groups use the first batches, and kept ones keep their storage)
    attention_batches_.resize(std::max(attention_batches_.size(), size_t(n)));
    logits_first_.resize(size_t(n));
    if (backend_.runs_tasks_in_order()) {
      attend_group(plan_.run_order, layer, shared, attention_batches_[0]);
    } else {
      backend_.run_tasks(n, [&](int64_t task) {
        const std::span<const int64_t> alone(&plan_.run_order[size_t(task)], 1);
        attend_group(alone, layer, shared, attention_batches_[size_t(alone[0])]);
      });
    }
  } else {
    for (int64_t r = 0; r < n; ++r) prepare_attention(r, layer);
    attend_alike(layer, shared);
    for (int64_t r = 0; r < n; ++r) await_observe(r, layer);
  }
}

void DecoderSession::prepare_attention(int64_t r, size_t layer) {
  SessionRun& run = runs_[size_t(r)];
  // A run without a policy (or before its first policy step) goes through the same calls,
  // unmasked (the attention op's bits), so its attention is shared out with the others'.
  if (run.policy_logits.empty()) {
    run.policy_logits =
        backend_.alloc(DType::F32, {model_->config().num_heads, policy_shape().stride});
  }
  if (run.fused_attention.size() <= layer) run.fused_attention.resize(layer + 1, 0);
  run.fused_attention[layer] = 0;
  Backend::RunAttention& attention = run_attention_[size_t(r)];
  attention = {};
  attention.q = &q_rows_[size_t(r)];
  attention.k_cache = &run.k_cache[layer];
  attention.v_cache = &run.v_cache[layer];
  attention.logits = &runs_[size_t(logits_source_[size_t(r)])].policy_logits;
  attention.out = &out_rows_[size_t(r)];
}

// The probabilities go to the policy, which accumulates them at the start of the run's work of
// the next layer (or after the last layer): one parallel call fewer per layer, and the
// observations share the threads with the selections. Nothing in between touches the run's
// probabilities or its policy.
void DecoderSession::await_observe(int64_t r, size_t layer) {
  const Backend::RunAttention& attention = run_attention_[size_t(r)];
  if (attention.out && attention.probs) runs_[size_t(r)].pending_observe = int64_t(layer);
}

template <typename Work>
void DecoderSession::shared_work(std::span<const int64_t> group, Work&& work) {
  double seconds = 0.0;
  timed_work(seconds, work);
  for (const int64_t r : group) plan_.run_seconds[size_t(r)] += seconds / double(group.size());
}

// Whether run r's softmax and value sums go to attention_masked_runs: the backend has a fused
// path, the run wants no probabilities and its logits are its own, uncapped and unweighted, so
// nothing reads them after the softmax (a backend may then compute them inside).
bool DecoderSession::attends_fused(int64_t r) const {
  const Backend::RunAttention& attention = run_attention_[size_t(r)];
  return backend_.fuses_masked_attention() && attention.out && !attention.probs &&
         attention.logits == &runs_[size_t(r)].policy_logits &&
         model_->config().attn_logit_softcap <= 0.0;
}

void DecoderSession::attend_group(std::span<const int64_t> group, size_t layer, int64_t shared,
                                  std::vector<Backend::RunAttention>& batch) {
  const int64_t cols = position_ + 1;
  const int64_t window = model_->config().layer_window(int64_t(layer));
  // Per calling thread: groups that are tasks of their own run on the backend's threads.
  thread_local std::vector<Backend::RunAttention> fused;
  fused.clear();
  // The runs that choose first do so now; a run that then wants neither its logits nor its
  // probabilities attends in one call (attention_masked_runs); the logits of every other run
  // that needs them, in one call (each run's own: the caches differ by now) ...
  batch.clear();
  for (const int64_t r : group) prepare_attention(r, layer);
  shared_work(group, [&] { append_runs(group, layer); });
  for (const int64_t r : group) {
    timed_work(plan_.run_seconds[size_t(r)], [&] {
      if (!policy_step(runs_[size_t(r)])) {
        attend_unselected(r, layer, window);
        return;
      }
      logits_first_[size_t(r)] = !chooses_first(r, layer);
      if (!logits_first_[size_t(r)]) select_run(r, layer, cols);
      if (!run_attention_[size_t(r)].out) return;
      if (!logits_first_[size_t(r)] && attends_fused(r)) {
        fused.push_back(run_attention_[size_t(r)]);
        runs_[size_t(r)].fused_attention[layer] = 1;
        run_attention_[size_t(r)].out = nullptr;  // attended below
        return;
      }
      batch.push_back(run_attention_[size_t(r)]);
    });
  }
  shared_work(group, [&] {
    backend_.attention_logits_runs(batch, shared, position_, window);
    cap_attention_logits(batch);
    if (!fused.empty()) backend_.attention_masked_runs(fused, shared, position_, window);
  });
  // ... the selections that read them, and the softmax and value sums of every run, in one call.
  batch.clear();
  for (const int64_t r : group) {
    if (!run_attention_[size_t(r)].out) continue;  // attended already
    if (logits_first_[size_t(r)])
      timed_work(plan_.run_seconds[size_t(r)], [&] { select_run(r, layer, cols); });
    if (run_attention_[size_t(r)].out) batch.push_back(run_attention_[size_t(r)]);
  }
  shared_work(group, [&] { backend_.attention_visible_runs(batch, shared, cols); });
  for (const int64_t r : group) {
    apply_gate(r, layer);
    await_observe(r, layer);
  }
}

void DecoderSession::apply_gate(int64_t r, size_t layer) {
  SessionRun& run = runs_[size_t(r)];
  if (!run.gated_layers.empty() && run.gated_layers.back() == int64_t(layer))
    backend_.zero_unless(out_rows_[size_t(r)], *run.policy->gate(int64_t(layer)));
}

// A run that selects nothing this step (no policy, or before its first step) sees every key: the
// attention op, one fused pass over its cache, instead of the policy ops' logits, softmax and
// value sums; the pre-softmax logits are its by-product when recorded.
void DecoderSession::attend_unselected(int64_t r, size_t layer, int64_t window) {
  SessionRun& run = runs_[size_t(r)];
  Backend::RunAttention& attention = run_attention_[size_t(r)];
  observe_pending(run);
  if (run.policy && layer == 0) run.policy->observe_inputs(input_rows_[size_t(r)], position_);
  DeviceTensor* logits_out =
      options_.record_attention_logits ? &record_layer_logits(run, layer) : nullptr;
  if (model_->config().attn_logit_softcap > 0.0) {
    // The fused op has no soft-cap: logits, cap and softmax apart, in the recorded row if any.
    const int64_t H = model_->config().num_heads;
    DeviceTensor logits =
        logits_out ? view(*logits_out, {H, logits_out->dim(2)}) : *attention.logits;
    capped_attention(*attention.q, *attention.k_cache, *attention.v_cache, position_, window,
                     logits, *attention.out);
  } else {
    backend_.attention(*attention.q, *attention.k_cache, *attention.v_cache, position_, window,
                       Visibility{}, *attention.out, logits_out);
  }
  attention.out = nullptr;  // done: in neither of the batches
}

void DecoderSession::cap_attention_logits(std::span<const Backend::RunAttention> runs) {
  const double cap = model_->config().attn_logit_softcap;
  if (cap <= 0.0) return;
  for (const Backend::RunAttention& run : runs) backend_.soft_cap(*run.logits, float(cap));
}

void DecoderSession::capped_attention(const DeviceTensor& q, const DeviceTensor& k_cache,
                                      const DeviceTensor& v_cache, int64_t position, int64_t window,
                                      DeviceTensor& logits, DeviceTensor& out) {
  backend_.attention_logits(q, k_cache, position, window, logits);
  backend_.soft_cap(logits, float(model_->config().attn_logit_softcap));
  backend_.attention_visible(logits, position + 1, nullptr, v_cache, out, nullptr);
}

DeviceTensor& DecoderSession::record_layer_logits(SessionRun& run, size_t layer) {
  const int64_t H = model_->config().num_heads;
  DeviceTensor rows = row_range(run.recorded_logits, int64_t(layer) * H, H);
  rows.shape = {1, H, run.recorded_logits.dim(1)};
  run.attention_logits.push_back(std::move(rows));
  return run.attention_logits.back();
}

bool DecoderSession::chooses_first(int64_t r, size_t layer) {
  SessionRun& run = runs_[size_t(r)];
  // Recorded logits are every column's, so a recording session computes them first.
  return !options_.record_attention_logits && policy_step(run) &&
         !run.policy->reads_logits(layer_step(run, layer, size_t(r)));
}

// The runs' queries and keys are rotated here, not with the layer's projections: RoPE and the
// append are one op.
void DecoderSession::append_runs(std::span<const int64_t> group, size_t layer) {
  thread_local std::vector<Backend::RunRopeAppend> appends;  // reused: every layer of every step
  appends.clear();
  for (const int64_t r : group) {
    SessionRun& run = runs_[size_t(r)];
    appends.push_back({&q_rows_[size_t(r)], &k_rows_[size_t(r)], &v_rows_[size_t(r)],
                       &run.k_cache[layer], &run.v_cache[layer]});
  }
  // gemma3's local layers rotate with their own, unscaled table.
  const bool local = model_->layer_uses_local_rope(layer);
  backend_.rope_append_runs(appends, position_, local ? model_->inv_freq_local : *step_inv_freq_,
                            local ? 1.0f : model_->rope_scale);
}

void DecoderSession::attend_alike(size_t layer, int64_t shared) {
  const ModelConfig& c = model_->config();
  const int64_t n = runs(), H = c.num_heads, cols = position_ + 1;
  append_runs(plan_.run_order, layer);
  // 1. The logits of the runs that do not borrow them, in one call.
  attention_batch_.clear();
  for (int64_t r = 0; r < n; ++r) {
    if (logits_source_[size_t(r)] == r) attention_batch_.push_back(run_attention_[size_t(r)]);
  }
  backend_.attention_logits_runs(attention_batch_, shared, position_,
                                 c.layer_window(int64_t(layer)));
  cap_attention_logits(attention_batch_);
  // 2. Each policy run's observation of the previous layer and its selection on the backend's
  // threads.
  backend_.run_tasks(n, [&](int64_t task) {
    const int64_t r = plan_.run_order[size_t(task)];
    timed_work(plan_.run_seconds[size_t(r)], [&] { select_run(r, layer, cols); });
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
  // After the twins' copies: a gated run may have been a twin's source.
  for (int64_t r = 0; r < n; ++r) apply_gate(r, layer);
}

void DecoderSession::select_run(int64_t r, size_t layer, int64_t cols) {
  const int64_t H = model_->config().num_heads;
  SessionRun& run = runs_[size_t(r)];
  Backend::RunAttention& attention = run_attention_[size_t(r)];
  observe_pending(run);
  if (options_.record_attention_logits) {
    const DeviceTensor& logits = *attention.logits;
    DeviceTensor recorded = view(record_layer_logits(run, layer), {H, run.recorded_logits.dim(1)});
    if (logits.dim(1) == recorded.dim(1)) {
      backend_.copy_rows(logits, 0, recorded, 0, 1, logits.numel());  // both [H, stride]
    } else {
      for (int64_t h = 0; h < H; ++h) {
        DeviceTensor to = row_prefix(recorded, h, cols);
        backend_.copy_rows(row_prefix(logits, h, cols), 0, to, 0, 1, cols);
      }
    }
  }
  if (!policy_step(run)) {
    if (run.policy && layer == 0) run.policy->observe_inputs(input_rows_[size_t(r)], position_);
    return;
  }
  const LayerStep step = layer_step(run, layer, size_t(r));
  const LayerDecision decision = run.policy->select(step, run.visible[layer], run.scores[layer]);
  run.decisions[layer] = decision;
  // A sliding-window layer (gemma3's local ones): keys before the window are no candidates, so
  // what a policy picked there is hidden too; its logits are -inf anyway (the attention ops mask
  // them), so only the mask, the counts and the trace change.
  const int64_t window = model_->config().layer_window(int64_t(layer));
  if (decision == LayerDecision::Masked && window > 0 && cols > window)
    backend_.fill_columns(run.visible[layer], 0, cols - window, 0);
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
  if (decision == LayerDecision::Masked) weigh_logits(run, attention, step, cols);
}

// An importance-weighted sample (magicpig): the softmax reads z_j + w_j, added in the run's own
// buffer (the logits it was given may be run 0's, which other runs read too). Both steps are
// axpby_rows, whose roundings are fixed on every backend: a copy (beta 0, exact) and one rounded
// sum (fma(1, w, 1 * z) = z + w). A run whose policy weights nothing is not touched.
void DecoderSession::weigh_logits(SessionRun& run, Backend::RunAttention& attention,
                                  const LayerStep& step, int64_t cols) {
  const DeviceTensor* weights = run.policy->log_weights(step.layer);
  if (weights == nullptr) return;
  const DeviceTensor& logits = *attention.logits;
  if (run.weighted_logits.empty() || run.weighted_logits.dim(1) != logits.dim(1))
    run.weighted_logits = backend_.alloc(DType::F32, {logits.dim(0), logits.dim(1)});
  backend_.axpby_rows(run.weighted_logits, 1.0f, logits, 0.0f, cols);
  backend_.axpby_rows(run.weighted_logits, 1.0f, *weights, 1.0f, cols);
  attention.logits = &run.weighted_logits;
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
  // A metric, not policy work: counted by the backend where the mask (or the gate) lives, and
  // read back with the other layers' counts at the end of the step (collect_sparsity), not here.
  if (run.visible_counts.size() < run.visible.size()) run.visible_counts.resize(run.visible.size());
  std::vector<int64_t>& counts = run.visible_counts[layer];
  if (decision == LayerDecision::Gated) {
    counts.resize(1);
    run.queued_counts.push_back({run.policy->gate(int64_t(layer)), 1, counts});
    run.gated_layers.push_back(int64_t(layer));
    return;
  }
  const DeviceTensor& mask = run.visible[layer];
  counts.resize(size_t(mask.dim(0)));
  run.queued_counts.push_back({&mask, cols, counts});
  // Sparsity is over the keys the layer attends to: a sliding-window layer's window.
  const int64_t window = model_->config().layer_window(int64_t(layer));
  run.counted_layers.emplace_back(int64_t(layer), window > 0 ? std::min(cols, window) : cols);
}

void DecoderSession::queue_step_counts() {
  step_counts_.clear();
  for (SessionRun& run : runs_) {
    step_counts_.insert(step_counts_.end(), run.queued_counts.begin(), run.queued_counts.end());
    run.queued_counts.clear();
  }
  if (!step_counts_.empty()) backend_.count_nonzero_rows_deferred_many(step_counts_);
}

void DecoderSession::drop_deferred_counts() noexcept {
  for (SessionRun& run : runs_) run.queued_counts.clear();  // never asked for
  for (SessionRun& run : runs_) {
    if (run.counted_layers.empty() && run.gated_layers.empty()) continue;
    try {
      backend_.synchronize();  // the counts still on their way land before their storage goes
    } catch (...) {            // NOLINT(bugprone-empty-catch): a failed device has nothing to land
    }
    for (SessionRun& each : runs_) {
      each.counted_layers.clear();
      each.gated_layers.clear();
    }
    return;
  }
}

void DecoderSession::settle() const {
  if (!counts_pending_) return;
  counts_pending_ = false;
  // The runs' statistics are what a finished step left: completing them changes no observable
  // state of a const session but when it is known.
  const_cast<DecoderSession*>(this)->collect_sparsity();
}

void DecoderSession::collect_sparsity() {
  const bool any = std::any_of(runs_.begin(), runs_.end(), [](const SessionRun& run) {
    return !run.counted_layers.empty() || !run.gated_layers.empty();
  });
  if (!any) return;
  backend_.synchronize();
  for (SessionRun& run : runs_) {
    for (const auto& [layer, cols] : run.counted_layers)
      run.sparsity.add_layer(layer, run.visible_counts[size_t(layer)], cols);
    run.counted_layers.clear();
    // A gated layer is what its gate said: it attended (Dense) or its token skipped it.
    for (const int64_t layer : run.gated_layers) {
      const LayerDecision decision = gated_decision(run.visible_counts[size_t(layer)][0]);
      run.decisions[size_t(layer)] = decision;
      record_sparsity(run, size_t(layer), decision, 0);  // Dense or Skipped: no count to queue
    }
    run.gated_layers.clear();
  }
}

}  // namespace kvlens
