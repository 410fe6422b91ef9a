// The token-selection policy interface (POLICIES.md): at every decode step t and layer l a policy
// decides which cached tokens each query head may see. Buffers are the backend's row tensors:
// true logits, scores and probabilities F32 [H, stride], visibility U8 [H, stride], of which the
// first t + 1 columns (the candidates) are in use; stride = the run's cache capacity, which grows
// (doubling) with the context: the session then widens its rows and calls Policy::grow, so no
// buffer is sized by max_position_embeddings.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/config.h"
#include "engine/policy/policy_params.h"

namespace kvlens {

struct LayerStep;

// The knobs every policy has (POLICIES.md, "Common knobs" and "Budget").
struct CommonKnobs {
  double sparsity = 0.0;             // s in [0, 1)
  int64_t budget_tokens = 0;         // > 0: fixed-count budget K instead of the fraction
  int64_t min_keep = 1;              // lower bound of B(t)
  int64_t sinks = 4;                 // first tokens always visible
  int64_t window = 0;                // most recent tokens always visible (besides the current one)
  int64_t dense_layers = 1;          // layers < dense_layers see everything
  bool kv_head_granularity = false;  // one selection per KV group (scores summed over the group)
  bool budget_excludes_sinks = false;  // the TokenButler code's sinks on top of the budget

  // B(t): the most tokens a head may see at step t (never more than the t + 1 candidates).
  int64_t budget(int64_t step) const;
  // B of a layer's own candidates: B(t) on a full layer, B(n - 1) for the n keys a
  // sliding-window layer sees (the budget rule applied to the window, POLICIES.md).
  int64_t budget(const LayerStep& step) const;
};

// The always-visible tokens at step t under budget B, truncated by POLICIES.md's priority (the
// current token, then the sinks, then the most recent): columns [0, sink_end) and
// [recent_begin, t] (recent_begin >= sink_end, so the two never overlap).
struct ForcedColumns {
  int64_t sink_end = 0;
  int64_t recent_begin = 0;
  int64_t count(int64_t step) const { return sink_end + (step + 1 - recent_begin); }
};
ForcedColumns forced_columns(int64_t step, int64_t budget, int64_t sinks, int64_t window);

// The specs of the common knobs, shared by every policy's parameter list (sparsity is a run
// setting, given next to the policy id, not a parameter).
std::vector<ParamSpec> common_param_specs();
CommonKnobs read_common_knobs(const ParamValues& values, double sparsity);

// What one (step, layer) of a run gives a policy.
struct LayerStep {
  int64_t step = 0;  // t: the token just appended; candidates are columns 0..t
  int64_t layer = 0;
  // [1, E]: this layer's attention input for the token (the hidden state after the layer's input
  // RMSNorm). At layer 0 it is what a learned predictor reads (TokenButler: the embedding after
  // layer 0's input norm), so a predictor policy computes its step at layer 0 and ranks by it at
  // every later layer of the same step.
  const DeviceTensor* layer_input = nullptr;
  const DeviceTensor* q = nullptr;        // [1, H, D] after RoPE
  const DeviceTensor* k_cache = nullptr;  // [G, stride, D]
  const DeviceTensor* v_cache = nullptr;  // [G, stride, D]
  const DeviceTensor* logits = nullptr;   // [H, stride]: true pre-softmax logits z(l, h, t, j)
  // A sliding-window layer (gemma3's local ones): columns before this one are outside the window,
  // no candidates (the session hides them whatever the policy picks; budgeted policies spend
  // their budget, B of the window's tokens, within it). 0 elsewhere.
  int64_t first_candidate = 0;
  // The run's rows of every layer at this step, one buffer each, of which select's `scores` and
  // `visible` are the rows of this layer (layer l's [H, stride] at rows l * H ..): a policy that
  // ranks every later layer at once (tokenbutler, whose predictor scores them all from layer 0's
  // input) may fill their rows at one layer's select, in one launch, and only return its decision
  // at theirs. Null where the session keeps no such buffers, or where some layer of this step
  // has a sliding window (its candidates differ from the others').
  DeviceTensor* every_layer_scores = nullptr;   // F32 [L * H, stride]
  DeviceTensor* every_layer_visible = nullptr;  // U8 [L * H, stride]
  int64_t cols() const { return step + 1; }
  // The keys the layer can see: columns first_candidate..t (all t + 1 but on a sliding window).
  int64_t candidates() const { return step + 1 - first_candidate; }
};

enum class LayerDecision {
  Dense,    // every candidate visible (no mask applied)
  Masked,   // the policy wrote the visibility mask
  Skipped,  // the layer's attention output is zero for this token (tokenfilter)
  // Dense or Skipped, decided on the backend (Policy::gate, U8 [1, 1]: 1 Dense, 0 Skipped) so
  // that no value waits for the host: the attention runs over every candidate and its output is
  // zeroed where the gate is 0. The session reads the gates back with the step's other counts
  // and records Dense or Skipped; Gated never reaches a trace.
  Gated,
};

// What a Gated layer was, once its gate (or its count of nonzero gate bytes) is known.
inline LayerDecision gated_decision(int64_t gate) {
  return gate != 0 ? LayerDecision::Dense : LayerDecision::Skipped;
}

struct BackendPredictor;

// The model shape and buffer geometry a policy instance is created for.
struct PolicyShape {
  int64_t layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  // Columns of every row buffer when the policy is made: the session's cache capacity (it grows
  // with the context; Policy::grow follows it).
  int64_t stride = 0;
  // The model's TokenButler predictor on the session's backend (null: none), and where the
  // model's lookup looked when it found none (for the tokenbutler policy's error).
  std::shared_ptr<const BackendPredictor> predictor;
  std::vector<std::string> predictor_searched;
  int64_t hidden_size = 0;    // E (0 where unknown: a policy built outside a session)
  int64_t max_positions = 0;  // max_position_embeddings (0 where unknown)
  // The model's folder or .gguf file (Model::dir), where policies find files made for the model
  // (loki's and doublesparsity's calibration, duoattention's gates, seerattention's gate); empty
  // where unknown.
  std::string model_dir;
  // The folders where those files are looked for, in order (Model::file_dirs: beside the model,
  // then the folder kvlens ships for a known GGUF model); empty: model_dir's folder alone.
  std::vector<std::string> model_file_dirs;
  // Where these heads sit in the whole model: on a tensor-parallel shard
  // (engine/arch/tensor_parallel.h) the whole model's first query head and first KV head it
  // holds, and the whole model's head counts (Model::shard); 0, 0 and counts 0 (read as heads
  // and kv_heads) for an unsplit model. A rule over every head of the model (duoattention's
  // ranking of all heads) or a file made for the whole model (loki's, doublesparsity's,
  // duoattention's, seerattention's) reads the whole model's heads by these.
  int64_t first_head = 0, first_kv_head = 0;
  int64_t model_heads = 0, model_kv_heads = 0;
  int64_t whole_heads() const { return model_heads > 0 ? model_heads : heads; }
  int64_t whole_kv_heads() const { return model_kv_heads > 0 ? model_kv_heads : kv_heads; }
};

class Policy {
 public:
  virtual ~Policy() = default;
  // Chooses visible[H, stride] (columns 0..t) and writes the importance scores it ranked by into
  // scores[H, stride] (the "predicted vs true" view reads them). The mask arrives holding this
  // layer's set of the run's previous step, not zeroed (a pass per layer saved; duoattention's
  // tests found the old comment wrong): a policy writes every column 0..t. (Plug-ins do get a
  // zeroed `visible`: plugin_policy.cpp clears it for them.)
  virtual LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                               DeviceTensor& scores) = 0;
  // The attention probabilities actually computed at this (step, layer) under the chosen set
  // (0 where not visible). Eviction policies accumulate them; the default ignores them. step
  // carries the step, the layer and its caches, but no q, layer_input or logits: the session
  // may observe a layer after the next layer's projections have replaced them (always before
  // this policy's next select).
  virtual void observe(const LayerStep& /*step*/, const DeviceTensor& /*probs*/) {}
  // True when this policy's observe() uses the probabilities of `step` (its step and layer),
  // which the run then computes and hands over; false leaves them uncomputed (a dense layer's
  // attention is then the plain one, which a lockstep step computes once for all its runs).
  virtual bool wants_probs(const LayerStep& /*step*/) const { return false; }
  // False when select() at `step` never reads step.logits: the session may then choose first
  // and compute the logits at the chosen columns only (about half the work at s = 0.5). True
  // unless a policy says otherwise: the answer that is never wrong.
  virtual bool reads_logits(const LayerStep& /*step*/) const { return true; }
  // The layer-0 attention inputs [n, E] of tokens at positions first_position .. + n - 1 that
  // the policy does not select for (a dense prompt chunk, or steps before its first step): a
  // learned predictor reads them to keep its own cache complete. Called in position order, once
  // per token, before the policy's first select at a later position. The default ignores them.
  virtual void observe_inputs(const DeviceTensor& /*layer_input*/, int64_t /*first_position*/) {}
  // The rows the session hands over now have `stride` columns (its caches grew; never fewer
  // than before): a policy whose own buffers are [.., stride] widens them, keeping every column
  // it holds, so its selections do not depend on when it grew. A stride not above its own is a
  // no-op. The default has no such buffers.
  virtual void grow(int64_t /*stride*/) {}
  // Bytes of the backend buffers the policy holds itself (not the session's rows it is given).
  virtual int64_t state_bytes() const { return 0; }
  // The gate of a layer whose last select returned Gated (backend memory, U8 [1, 1]); null
  // otherwise (the default: a policy that never gates).
  virtual const DeviceTensor* gate(int64_t /*layer*/) const { return nullptr; }
  // Additive log-weights F32 [H, stride] of a layer whose last select returned Masked: the
  // session adds them to the logits of the visible columns before the softmax, so the attention
  // is softmax(z_j + w_j) over the visible set (an importance-weighted sample: magicpig's
  // ln(1 / p_j)). Null (the default, every other policy) leaves the logits untouched, bit for
  // bit. The trace records them beside the visible set. A policy that weights keeps
  // reads_logits true: the session adds the weights right after its select, so the logits must
  // be there already.
  virtual const DeviceTensor* log_weights(int64_t /*layer*/) const { return nullptr; }
  // Seconds spent so far outside kvlens's own ops: in a plug-in's code (`plugin`) and in the
  // copies that carry a host-only plug-in's inputs and answers across (`copies`). Built-ins: 0.
  struct ExternalSeconds {
    double plugin = 0.0, copies = 0.0;
  };
  virtual ExternalSeconds external_seconds() const { return {}; }
};

// The first cache column whose per-key summaries a policy must recompute at a step (quest's,
// seerattention's and rocketkv's page minima and maxima, loki's and doublesparsity's projected
// keys): those the cache gained since `filled` (the layer's columns at its last step), the current
// token's always (a step run again over changed keys stays right), every column when the position
// is behind them (a session started over). Sets `filled` to `cols`.
inline int64_t columns_to_refresh(int64_t& filled, int64_t step, int64_t cols) {
  const int64_t begin = filled <= cols ? (filled < step ? filled : step) : 0;
  filled = cols;
  return begin;
}

// `src` [R, S] copied into columns [0, S) of `dst` [R, S'] (S' >= S), row by row, on the
// backend; F32 or U8 (both the same dtype).
void copy_columns(Backend& backend, const DeviceTensor& src, DeviceTensor& dst);
// A new [R, stride] tensor holding `rows` [R, S] in its first S columns and `fill` (U8; F32
// tensors get 0) in the rest. An empty tensor stays empty.
DeviceTensor widen_columns(Backend& backend, const DeviceTensor& rows, int64_t stride,
                           uint8_t fill = 0);
// A new F32 [B, N', W] tensor holding `blocks` [B, N, W] in the first N rows of each of its B
// blocks (N' >= N; the rest uninitialised): per-KV-head page summaries, projected keys and block
// keys widened when the session's stride grows. An empty tensor stays empty.
DeviceTensor widen_middle(Backend& backend, const DeviceTensor& blocks, int64_t rows);
// Sum of the tensors' bytes (empty ones count 0).
int64_t tensor_bytes(const std::vector<DeviceTensor>& tensors);

// A registered policy: its id, family, one-line rule and parameters (common knobs included).
struct PolicyInfo {
  std::string id;
  std::string family;
  std::string description;
  std::vector<ParamSpec> params;
  // The reference policy (dense): every cached token visible, no state. A session runs it as
  // the plain attention (no Policy object), evaluations and traces compare every run with it,
  // and its sparsity is always 0. Exactly one registered policy has it.
  bool reference = false;
  // It reads the model's learned predictor (PolicyShape::predictor): a model without one cannot
  // run it, and the app's default comparison leaves it out there.
  bool needs_predictor = false;
  // Its scores estimate the true attention logits (a learned predictor's, an approximate-logit
  // method's): the predicted-vs-true view compares them with the true logits and reports the
  // hit rate.
  bool predicts_logits = false;
  // Its rule for each query head reads only that head's (and its KV head's) keys, queries,
  // logits and state, and per-head files and host-side counts at that head's place in the whole
  // model (PolicyShape::first_head ...): a tensor-parallel shard runs it over the heads it holds
  // and chooses what one GPU would (engine/session/tensor_parallel_session.h).
  bool per_head_rule = false;
  // Its rule reads every head of a layer through a sum (tova's and lazyllm's head averages,
  // tokenfilter's similarities) or through every head's row at once (Ada-KV's top-k over a
  // layer's heads), which a shard completes with Backend::all_reduce_sum (of zero-padded rows of
  // the whole model's heads where it needs them all): it chooses what one GPU would, in a
  // tensor-parallel session of one run (the collectives of runs stepped as concurrent tasks would
  // pair up differently on each rank).
  bool reduces_heads = false;
  // With per_head_rule: the rule reads a KV group's query heads together (sparq's and rocketkv's
  // channels by the group's summed query), so a shard needs whole groups: at most as many ranks
  // as KV heads.
  bool reads_kv_groups = false;
};

struct PolicyConfig {
  std::string id = "dense";  // the reference policy (registry.h: reference_policy())
  double sparsity = 0.0;
  std::vector<std::string> args;  // key=value
};

}  // namespace kvlens
