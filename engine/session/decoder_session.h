// DecoderSession: a Llama forward pass over a backend with one KV cache per run. A run is one
// policy over the same text; several runs advance in lockstep as one batch (hidden [runs, E]), so
// one pass over the weights serves every run, while attention and the policy work per run.
// A chunk of several tokens (prefill) is always dense: it is computed once and its keys/values
// are copied into every run's cache. KV cache per run and layer: [G, capacity, D], F32 or (on a
// backend that supports it, by default where the weights are narrow) the weights' BF16 / F16.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/arch/backend_model.h"
#include "engine/backend/backend.h"
#include "engine/model/model.h"
#include "engine/policy/policy.h"
#include "engine/policy/sparsity_stats.h"
#include "engine/session/lockstep_plan.h"
#include "engine/session/step_capture.h"

namespace kvlens {

// The model's weights on `backend` (BackendModel::upload_weights) with its TokenButler predictor,
// when it has one, beside them (what a session's policies read). Throws kvlens::Error for a dtype
// the options cannot have (naming the option's value).
std::shared_ptr<const BackendModel> upload_model(std::shared_ptr<const Model> model,
                                                 Backend& backend,
                                                 const UploadOptions& options = {});

struct SessionOptions {
  int64_t capacity = 0;  // hard cap on cached positions; 0 = max_position_embeddings
  // The caches' (and the policy rows') first capacity; they double from it as the context
  // grows, up to max_position_embeddings. Results never depend on it.
  int64_t initial_capacity = 256;
  // Keep the pre-softmax attention logits of the last forward per run and layer (-inf where a
  // head did not see a token only on the plain dense path with a sliding window): a chunk's
  // [n, H, context]; a single-token step's [1, H, stride] rows of SessionRun::recorded_logits,
  // columns [0, position()) in use.
  bool record_attention_logits = false;
  // Let the backend record a single-token step of a lone dense run once and replay it
  // (Backend::record_step: a CUDA graph); false runs every step op by op.
  bool record_steps = true;
  // The KV caches' dtype; empty: the model's (BackendModel::kv_cache_dtype).
  std::optional<DType> kv_cache_dtype;
};

// One run's state: its cache, its policy and the policy's row buffers of the last step.
struct SessionRun {
  std::vector<DeviceTensor> k_cache, v_cache;  // per layer [G, capacity, D]
  std::unique_ptr<Policy> policy;              // null: the plain dense path
  int64_t first_step = 0;                      // the policy applies from this position on
  // Per layer, as left by the last single-token step: what each head saw (U8 [H, stride];
  // meaningful where the decision was Masked), the scores the policy ranked by (F32 [H, stride])
  // and the decision. Columns 0..position()-1 are in use.
  std::vector<DeviceTensor> visible, scores;
  // The same rows of every layer as one tensor each (F32 and U8 [L * H, stride]): what
  // LayerStep::every_layer_scores and every_layer_visible point at. Empty without a policy.
  DeviceTensor every_layer_scores, every_layer_visible;
  std::vector<LayerDecision> decisions;
  // Per layer at the last step: 1 where its softmax and value sums went to
  // Backend::attention_masked_runs (no probabilities, logits read by nobody else).
  std::vector<uint8_t> fused_attention;
  SparsityStats sparsity;  // effective sparsity over the policy's steps (reset by set_policy)
  std::vector<DeviceTensor> attention_logits;  // per layer (record_attention_logits)
  // Where single-token steps record them: F32 [layers * H, stride] (stride = the caches'
  // capacity), layer l's heads in rows l * H ..; fixed addresses, so a recorded step (a CUDA
  // graph) writes them too, and one strided copy reads a whole step back.
  DeviceTensor recorded_logits;
  // The run's own scratch, so that runs can step on different threads: the attention logits of
  // the current layer [H, stride] (every run's: a run without a policy gets them at its first
  // step) and its probabilities (policy runs).
  DeviceTensor policy_logits, policy_probs;
  // The logits plus the policy's log-weights (Policy::log_weights) where it weights its sample
  // [H, stride]: the logits the softmax then reads. Apart from policy_logits, which may be read
  // by other runs of a lockstep step (logits_source_) and are recorded unweighted.
  DeviceTensor weighted_logits;
  // Per layer, the per-head counts of the visible mask (host), which the backend fills by the
  // end of the step (count_nonzero_rows_deferred); the (layer, candidates) of this step's masked
  // layers, added to `sparsity` once they are there.
  std::vector<std::vector<int64_t>> visible_counts;
  std::vector<std::pair<int64_t, int64_t>> counted_layers;
  // This step's counts to ask the backend for, all runs' in one call at the end of the step (the
  // masks and gates keep their values until the next step selects).
  std::vector<Backend::RowCount> queued_counts;
  // This step's Gated layers, whose gate (counted like a one-column mask, into visible_counts)
  // makes them Dense or Skipped once the counts are there.
  std::vector<int64_t> gated_layers;
  // The layer whose probabilities (policy_probs) await the policy's observe, or -1: a step
  // observes layer l in the run's selection task of layer l + 1 (the last layer's after the
  // layers).
  int64_t pending_observe = -1;
};

class DecoderSession {
 public:
  explicit DecoderSession(std::shared_ptr<const BackendModel> model, SessionOptions options = {},
                          int64_t runs = 1);
  ~DecoderSession();
  DecoderSession(const DecoderSession&) = delete;
  DecoderSession& operator=(const DecoderSession&) = delete;

  int64_t runs() const { return int64_t(runs_.size()); }

  // Feeds tokens at positions position() .. position() + n - 1 to every run. One token: every
  // run steps (under its policy) and the logits are [runs, vocab]; several: a dense chunk whose
  // logits are [n, vocab] (the same for every run). Backend memory, valid until the next forward.
  // Throws kvlens::Error for an id outside the vocabulary or when the positions would pass
  // max_position_embeddings or the capacity.
  const DeviceTensor& forward(std::span<const int32_t> tokens);
  // One step with its own token per run (tokens.size() == runs(); lockstep generation, where the
  // runs' greedy choices differ). Logits [runs, vocab].
  const DeviceTensor& forward_runs(std::span<const int32_t> tokens);
  // forward() of one token with a single run, logits copied to the host.
  std::vector<float> step(int32_t token);

  int64_t position() const { return position_; }
  void reset() {
    settle();
    position_ = 0;
    shared_rows_ = 0;
    std::fill(identical_rows_.begin(), identical_rows_.end(), 0);
  }
  // Runs `policy` in `run` at every single-token step from position `first_step` on (0: the
  // decode simulation; the prompt length: prefill + decode). Its row buffers span the caches'
  // capacity (policy_shape().stride), and grow with them: whenever the caches double, every
  // run's rows are widened (their columns kept) and each policy's Policy::grow is called, so the
  // policy state follows the context in use, not max_position_embeddings.
  void set_policy(int64_t run, std::unique_ptr<Policy> policy, int64_t first_step = 0);
  void set_policy(std::unique_ptr<Policy> policy, int64_t first_step = 0) {
    set_policy(0, std::move(policy), first_step);
  }
  // A run's state after the last forward, its sparsity and decisions complete: reading it waits
  // for that step's counts and gates (settle).
  const SessionRun& run(int64_t index) const {
    settle();
    return runs_.at(size_t(index));
  }
  // The run as the last forward left it on the host without waiting for the device: its tensors
  // (being written by the queued step), its decisions with Gated layers unresolved (their
  // Policy::gate says), its sparsity without that step's counts. For a reader that copies the
  // step's rows while the device works on (TraceRecorder).
  const SessionRun& run_in_flight(int64_t index) const { return runs_.at(size_t(index)); }
  // Waits for the last step's counts and gates and adds them to the runs' sparsity and
  // decisions. Every reader of those calls it (the accessors here do); the next forward does.
  void settle() const;
  // The model's shape with stride = the columns of the row buffers now: the caches' capacity
  // (before the first forward, the capacity they will start with).
  PolicyShape policy_shape() const;
  // Bytes of backend memory the policy state holds now: every run's row buffers (scores,
  // logits, probabilities, masks) and each policy's own buffers (Policy::state_bytes).
  int64_t policy_state_bytes() const;

  // Run 0's state (the single-run API).
  const Policy* policy() const { return runs_[0].policy.get(); }
  // Each run's own work in the last single-token step, summed over the layers, in seconds, on
  // whichever thread ran it (a benchmark's breakdown; the lockstep groups are planned from it):
  // its policy's select and observe, and in the layers where it computes its own logits also its
  // attention (append, logits, softmax and value sums; where a group of runs makes one call for
  // all of them, an even share of it). Empty before the first step.
  const std::vector<double>& run_step_seconds() const { return plan_.run_seconds; }
  const std::vector<DeviceTensor>& visible() const { return run(0).visible; }
  const std::vector<DeviceTensor>& policy_scores() const { return run(0).scores; }
  const std::vector<LayerDecision>& decisions() const { return run(0).decisions; }
  const SparsityStats& sparsity() const { return run(0).sparsity; }
  const std::vector<DeviceTensor>& attention_logits() const { return runs_[0].attention_logits; }
  const BackendModel& model() const { return *model_; }
  DType kv_cache_dtype() const { return cache_dtype_; }

  // Throws what forward (positions = tokens.size()) or forward_runs (positions = 1) would for these
  // tokens before any work: an id outside the vocabulary, positions past max_position_embeddings
  // or the capacity.
  void check_tokens(std::span<const int32_t> tokens, int64_t positions) const;

 private:
  void grow_caches(int64_t needed);
  // The columns of every row buffer: the caches' capacity, or the capacity they will start with.
  int64_t row_stride() const;
  // Bytes of one run's share of policy_rows_ at `stride` columns.
  int64_t policy_run_bytes(int64_t stride) const;
  // Points run `index`'s row buffers into policy_rows_ (policy_stride_ columns).
  void assign_policy_rows(SessionRun& run, int64_t index);
  // Widens every run's rows and every policy's own buffers to `stride` columns (grow_caches).
  void grow_policy_rows(int64_t stride);
  void ensure_scratch(int64_t n);
  // The decoder over `rows` hidden rows: a chunk of one run (per_run false: rows are positions
  // position_ .. + rows - 1 of run 0, copied to the other runs) or one token per run. A step the
  // backend can record (recordable_step) is recorded at its second occurrence over the same
  // buffers and replayed from then on; every other forward runs forward_ops.
  const DeviceTensor& forward_rows(std::span<const int32_t> tokens, bool per_run);
  const DeviceTensor& forward_ops(std::span<const int32_t> tokens, bool per_run);
  // A single-token step of one run without a policy that records no logits: its ops are the
  // same at every position (only the position and the token change), so the backend may record
  // it once (Backend::record_step) and replay it.
  bool recordable_step(bool per_run, int64_t rows) const;
  // The addresses a recording of this step would hold (StepCapture::Key).
  StepCapture::Key step_graph_key() const;
  // The inverse frequencies of a forward call up to position seq_len - 1: one of the model's
  // tables, or (dynamic NTK past its original context) rope_scratch_ filled for that seq_len.
  const DeviceTensor& rope_inv_freq(int64_t seq_len);
  // One single-token step's attention of every run at one layer. Runs that compute their own
  // logits each do all of their attention as one backend task (append, logits, the observation of
  // the previous layer, selection, softmax over the visible set, value sums); while runs borrow
  // run 0's logits (every row alike), attend_alike goes phase by phase over all runs instead.
  // The probabilities then wait for the next layer's task (pending_observe). The calls may read
  // the rows every cache holds alike (the prompt) once for all the runs they take.
  // It reads the runs' rows of the layer's scratch through input_rows_, q_rows_, k_rows_,
  // v_rows_ and writes out_rows_ (made once per forward).
  void step_attention(size_t layer);
  // step_attention while some run borrows run 0's logits: every run's append, the logits of the
  // runs that compute their own in one call, the selections as tasks, then the softmax and value
  // sums of every run in one call (runs that see everything with run 0's logits copy the first
  // such run's output).
  void attend_alike(size_t layer, int64_t shared);
  // Run r's recorded logits of `layer` ([1, H, stride] rows of recorded_logits), appended to its
  // attention_logits.
  DeviceTensor& record_layer_logits(SessionRun& run, size_t layer);
  // Sets run r's RunAttention at `layer` to its own query, caches, output row and logits (those
  // of logits_source_[r]); nothing masked yet.
  void prepare_attention(int64_t r, size_t layer);
  // Marks run r's probabilities of `layer` for its policy's observe (pending_observe).
  void await_observe(int64_t r, size_t layer);
  // Calls work(g) for each group g of plan_.plan_groups (its rows plan_.group_bounds[g] ..
  // plan_.group_bounds[g + 1] - 1) as the backend's concurrent tasks. Each group goes through the
  // layers left alone: rows no longer depend on each other, so the threads need not meet at
  // every op, and a group's matmuls over its rows give the bits of the whole batch (the kernels'
  // fixed order per row). No logits are shared meanwhile, and identical_rows_ of those layers
  // stays where it was (their appended rows are not compared: the runs' rows differ, and a prefix
  // that stops growing only means reading fewer rows once for all runs).
  void split_runs(const std::function<void(int64_t group)>& work);
  // Whether run r's attention at this step goes to Backend::attention_masked_runs (recorded in
  // SessionRun::fused_attention per layer).
  bool attends_fused(int64_t r) const;
  // The attention of a group's runs at `layer` on the calling thread, op by op over all of them
  // (`batch`: the calls' arguments; rows [0, shared) of the caches are alike in every run): each
  // KV head's keys and values are then read from memory once for the whole group. Each run's
  // whole attention: prepare_attention, append, its selection before or after its logits (its
  // observation of the previous layer first), softmax over the visible set, value sums, then
  // await_observe. The results do not depend on the group (the ops' arithmetic is per run).
  void attend_group(std::span<const int64_t> group, size_t layer, int64_t shared,
                    std::vector<Backend::RunAttention>& batch);
  // Runs work() and shares its seconds out evenly to the group's runs (plan_.run_seconds). A
  // template (defined where attend_group uses it): no std::function to build twice per run and
  // layer.
  template <typename Work>
  void shared_work(std::span<const int64_t> group, Work&& work);
  // Rotates the query and key rows of the group's runs (the layer's scratch) at the step's
  // position and appends the keys and values to their caches, in one backend call.
  void append_runs(std::span<const int64_t> group, size_t layer);
  // Asks the backend for the counts every run queued this step (record_sparsity), in one call.
  void queue_step_counts();
  // Whether run r chooses before its logits (its policy does not read them and nothing records
  // them), which are then computed at the chosen columns only.
  bool chooses_first(int64_t r, size_t layer);
  // Run r's observation of the previous layer, its recorded logits and its policy's selection
  // at `layer`: sets its RunAttention's visible and probs, or out to null for a skipped layer.
  void select_run(int64_t r, size_t layer, int64_t cols);
  void weigh_logits(SessionRun& run, Backend::RunAttention& attention, const LayerStep& step,
                    int64_t cols);
  void attend_unselected(int64_t r, size_t layer, int64_t window);
  // The attention logit soft-cap (ModelConfig::attn_logit_softcap; nothing when 0) on the logits
  // rows the runs just computed, before any policy or softmax reads them.
  void cap_attention_logits(std::span<const Backend::RunAttention> runs);
  // A dense chunk's attention (q_heads [n, H, D] at positions position_..) for a soft-capped
  // model, as Backend::attention gives it uncapped (logits_out [n, H, context] when not null).
  void capped_chunk_attention(const DeviceTensor& q_heads, const DeviceTensor& k_cache,
                              const DeviceTensor& v_cache, int64_t window, DeviceTensor& out_heads,
                              DeviceTensor* logits_out);
  // One row of attention the unfused way, for a soft-capped model: q [1, H, D] at `position`
  // over the caches into out [1, H, D], the capped logits left in logits [H, S >= position + 1].
  void capped_attention(const DeviceTensor& q, const DeviceTensor& k_cache,
                        const DeviceTensor& v_cache, int64_t position, int64_t window,
                        DeviceTensor& logits, DeviceTensor& out);
  // Zeroes run r's attention output of `layer` on the backend where its policy gated the layer
  // off (a Gated decision of this step; nothing otherwise).
  void apply_gate(int64_t r, size_t layer);
  LayerStep layer_step(SessionRun& run, size_t layer, size_t row) const;
  // The run's pending observe, if any (its LayerStep without q, layer input or logits: the next
  // layer's have replaced them).
  void observe_pending(SessionRun& run) const;
  void record_sparsity(SessionRun& run, size_t layer, LayerDecision decision, int64_t cols);
  // Waits for the step's deferred visible counts (one synchronisation per step) and adds them
  // to the runs' sparsity.
  void collect_sparsity();
  // A step's counts are queued (collect_sparsity not yet run for them).
  mutable bool counts_pending_ = false;
  // After a step that threw: waits for its deferred counts and forgets them.
  void drop_deferred_counts() noexcept;
  bool policy_step(const SessionRun& run) const {
    return run.policy && position_ >= run.first_step;
  }

  StepCapture capture_;        // the recorded step of a lone dense run (step_capture.cpp)
  DeviceTensor rope_scratch_;  // dynamic NTK: the table of the last long call
  int64_t rope_scratch_length_ = 0;

  std::shared_ptr<const BackendModel> model_;
  Backend& backend_;
  SessionOptions options_;
  DType cache_dtype_ = DType::F32;
  int64_t position_ = 0;  // tokens in every run's cache
  // Positions [0, shared_rows_) hold the same keys and values in every run (dense chunks from
  // the start): growing the caches broadcasts them instead of copying run by run.
  int64_t shared_rows_ = 0;
  // Per layer: positions [0, identical_rows_[l]) hold the same keys and values in every run's
  // cache of layer l (the shared prompt, and then every step whose appended rows the backend
  // found equal: while the runs see the same tokens and every earlier layer was dense in all of
  // them, as layer 0 and 1 are by default). Equal queries over equal caches then give equal
  // logits, computed once.
  std::vector<int64_t> identical_rows_;
  // The smallest sliding window of any layer (0: none), fixed by the model: a step past it hands
  // policies no every-layer rows (LayerStep::every_layer_scores).
  int64_t narrowest_window_ = 0;
  // This step and layer: the run whose logits each run's equal (itself where computed).
  std::vector<int64_t> logits_source_;
  std::vector<int64_t> twins_;  // the runs that copy another run's attention output
  std::vector<SessionRun> runs_;
  // The order in which a step hands the runs to the backend's threads (longest first: the
  // threads then finish together), each run's seconds of attention and policy work, the rows
  // that hold the runs and the groups of a split step.
  LockstepPlan plan_;
  std::vector<int32_t> slot_tokens_;  // the step's tokens in row order (where not run order)
  // Scratch activations sized for the largest row count seen so far.
  int64_t scratch_rows_ = 0;
  DeviceTensor hidden_, normed_, q_, k_, v_, attn_out_, proj_, gate_, up_, act_, logits_;
  DeviceTensor logits_view_;     // logits_ seen as [rows, vocab] for the last forward
  DeviceTensor zero_attention_;  // [1, H * D] zeros: a skipped layer's attention output
  DeviceTensor policy_rows_;     // every run's policy rows (set_policy), U8 bytes
  int64_t policy_stride_ = 0;    // the columns of policy_rows_' rows
  // step_attention's per-run row views of the current layer (the policies' LayerStep points at
  // them) and its backend calls' arguments.
  std::vector<DeviceTensor> input_rows_, q_rows_, out_rows_, k_rows_, v_rows_;
  const DeviceTensor* step_inv_freq_ = nullptr;  // the step's RoPE table (append_runs reads it)
  std::vector<Backend::RunAttention> run_attention_, attention_batch_;
  // attend_group's call arguments per group (per run where each run is a task of its own), and
  // whether each run reads its logits before it selects (those select after the logits call).
  std::vector<std::vector<Backend::RunAttention>> attention_batches_;
  std::vector<uint8_t> logits_first_;
  std::vector<Backend::RowCount> step_counts_;  // queue_step_counts' call
};

}  // namespace kvlens
