// The run data model every view reads (DESIGN.md, "Trace"): the tokens and their text, the runs
// (one policy each, advanced in lockstep over the same text) and, per step and run, what every
// (layer, head) saw: the true logits row, the visible set and the policy's scores, each [t + 1]
// (the candidates 0..t of step t), plus the next-token top-k and the step's metrics.
// Rows are kept in full within a memory budget; past it a step keeps only the rows of the selected
// heads and its summaries, and the trace says from which step on (degraded_from_step).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens {

struct TraceToken {
  int32_t id = 0;
  std::string text;  // the token's own text as decoded alone (may be empty for specials)
};

// One policy run of the trace.
struct TraceRun {
  std::string policy;               // registered policy id
  double sparsity = 0.0;            // nominal s
  std::vector<std::string> params;  // every resolved parameter, "key=value" (ParamValues order)
  int64_t first_step = 0;           // the policy applies from this step on (0: decode simulation)
};

// The most likely next tokens under one run at one step, most likely first.
struct NextTokenTopK {
  std::vector<int32_t> ids;
  std::vector<float> log_probs;  // natural-log probabilities, same length as ids
  // Each id's text as decoded alone, same length as ids; empty when the recorder had no
  // tokenizer (or the file is version 1).
  std::vector<std::string> texts;
};

// Per-step metrics of one run (POLICIES.md, Metrics). NaN where a metric does not apply (no next
// token at the last step, no dense reference run, a dense layer...). Means are over the layers
// where the policy chose a set (Masked) and their heads.
struct StepMetrics {
  static constexpr double kNone = std::numeric_limits<double>::quiet_NaN();
  double nll = kNone;                      // -log p(true next token) under this run
  int64_t true_rank = -1;                  // rank of the true next token (0 = argmax; -1: none)
  int64_t dense_true_rank = -1;            // the same under the dense reference run
  double kl_vs_dense = kNone;              // KL(dense || run) of the next-token distributions, nats
  double recall_vs_oracle = kNone;         // mean |S ∩ S_oracle| / |S_oracle|
  double classification_accuracy = kNone;  // mean top-50% agreement of scores vs true logits
  double consensus = kNone;           // mean strict-upper-triangle Pearson of the true logits rows
  double effective_sparsity = kNone;  // 1 - visible / candidates, over every layer and head
};

// One run at one step. Summaries are always kept; rows only for the heads in kept_heads.
struct StepRecord {
  std::vector<LayerDecision> decisions;  // [layers]
  std::vector<int32_t> visible_counts;   // [layers * heads]: tokens each head saw
  NextTokenTopK top;
  int32_t argmax = -1;  // the run's most likely next token
  StepMetrics metrics;
  // Rows of the heads kept at this step, in increasing (layer * heads + head) order; each row has
  // `columns` = t + 1 entries, packed in kept_heads order.
  std::vector<int32_t> kept_heads;
  std::vector<float> logits;     // [kept][columns] true pre-softmax logits (-inf outside a
                                 // sliding window)
  std::vector<float> scores;     // [kept][columns] the policy's importance scores
  std::vector<uint8_t> visible;  // [kept][columns] 1 where the head saw the token, else 0
  // [kept][columns] what the policy added to each visible logit before the softmax (magicpig:
  // ln(1 / p) of a sampled key, p its sampling probability; 0 for an exact key and on layers it
  // did not weight), or empty: the run weighted no layer at this step (every other policy).
  std::vector<float> log_weights;
  int64_t columns = 0;

  // Pointers to a head's row, or nullptr when that head's rows were not kept at this step.
  const float* logits_row(int64_t layer, int64_t head, int64_t heads) const;
  const float* scores_row(int64_t layer, int64_t head, int64_t heads) const;
  const uint8_t* visible_row(int64_t layer, int64_t head, int64_t heads) const;
  // nullptr also when the step has no log-weights (log_weights empty).
  const float* log_weights_row(int64_t layer, int64_t head, int64_t heads) const;
  int64_t kept_index(int64_t layer, int64_t head, int64_t heads) const;  // -1 when not kept
  // Bytes held by the rows (what the memory budget counts): 4 per logit, score and log-weight, 1
  // per visible.
  size_t row_bytes() const;
};

// Shape of the model the trace was recorded with (enough to read it without the model).
struct TraceModelInfo {
  std::string name;  // the checkpoint folder as given
  int64_t layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab_size = 0;
};

// A co-reference sample's markers, when the text is one (the final mention's token range).
struct TraceCorefInfo {
  bool present = false;
  int64_t sample_index = 0;
  uint64_t seed = 0;
  std::string answer;
  int64_t answer_token_begin = 0, answer_token_end = 0;  // [begin, end) in tokens
};

class Trace {
 public:
  static constexpr uint64_t kDefaultMemoryBudget = 2ull << 30;  // 2 GiB of rows

  TraceModelInfo model;
  TraceCorefInfo coref;
  std::vector<TraceToken> tokens;  // every token of the text, the ones not stepped yet included
  std::vector<TraceRun> runs;
  int64_t top_k = 10;  // entries in each NextTokenTopK
  uint64_t memory_budget = kDefaultMemoryBudget;
  // Heads (layer * heads + head) whose rows are kept even past the budget (any order; files
  // store them sorted, without repeats).
  std::vector<int32_t> selected_heads;

  // steps()[t][r]: run r at step t (records are only added through add_step, which checks them).
  const std::vector<std::vector<StepRecord>>& steps() const { return steps_; }
  int64_t step_count() const { return int64_t(steps_.size()); }
  // Appends step t = step_count() (one record per run, in runs order). When the step's rows
  // would take the trace's row bytes past memory_budget, every record of the step keeps only the
  // rows of selected_heads (the runs stay comparable head by head); from then on every step is
  // trimmed so (the trace is degraded) and the selected heads' rows may go past the budget.
  // Throws kvlens::Error (file "trace", field "step t run r: <member>") when the records do not
  // fit the trace's shape: no runs, one record per run, decisions [model.layers] of known values,
  // columns == t + 1, visible_counts [layers * heads] in [0, columns], top ids/log_probs of one
  // length <= top_k with ids in [0, vocab_size) (unchecked when vocab_size is 0), argmax -1 or
  // an id, ranks >= -1, kept_heads increasing and in range, rows [kept * columns], visible 0 or 1,
  // log_weights empty or [kept * columns] of finite values;
  // also when selected_heads holds a head outside [0, layers * heads).
  void add_step(std::vector<StepRecord> records);
  uint64_t row_bytes() const { return row_bytes_; }
  // The first step that lost rows to the budget, or -1 when every row was kept.
  int64_t degraded_from_step() const { return degraded_from_step_; }
  // Drops every step after the first `count` (step back and re-run, or a truncated recording);
  // a trace degraded only in the dropped steps is whole again.
  void truncate_steps(int64_t count);
  // Step t's records, rows and all, for a reader that keeps its own trace of the recording (the
  // app's window), so that rows are held once, not twice. This trace keeps the records without
  // rows (kept_heads empty) but still counts the rows' bytes toward memory_budget: later steps
  // are trimmed as they would have been, and a trace adding the handed records sees the same.
  // Throws kvlens::Error (file "trace") for a step outside [0, step_count()).
  std::vector<StepRecord> hand_over_step(int64_t t);
  // Throws kvlens::Error (file "trace") unless the whole trace is consistent: what add_step checks
  // for every step, plus non-negative model sizes with layers * heads < 2^31, top_k >= 0, token
  // ids in [0, vocab_size), the co-reference answer range within the tokens, runs' first_step >= 0
  // and degraded_from_step in [-1, step_count). save_trace and serialize_trace call it first, so a
  // trace whose public members were edited after recording is never written in a form that
  // load_trace would reject; parse_trace calls it on what it read.
  void check() const;

 private:
  friend Trace parse_trace(const uint8_t* data, size_t size, const std::string& source);
  std::vector<std::vector<StepRecord>> steps_;
  uint64_t row_bytes_ = 0;
  std::vector<uint64_t> handed_over_bytes_;  // [steps] row bytes given away by hand_over_step
  int64_t degraded_from_step_ = -1;
};

// The .kvtrace format version this build writes and reads.
inline constexpr uint32_t kTraceFileVersion = 3;

// .kvtrace files (layout documented in trace_file.cpp). save_trace check()s the trace, writes
// `<path>.partial`, syncs it and renames it into place: a failure (a kvlens::Error naming the
// path) leaves whatever was at `path` as it was and no partial file. load_trace throws
// kvlens::Error naming the file, the field and what was expected for anything that is not a
// complete, consistent trace of a known version.
void save_trace(const Trace& trace, const std::string& path);
Trace load_trace(const std::string& path);
// The same from and to memory (the file's bytes), for tests and the fuzzer.
std::vector<uint8_t> serialize_trace(const Trace& trace);
Trace parse_trace(const uint8_t* data, size_t size, const std::string& source);

}  // namespace kvlens
