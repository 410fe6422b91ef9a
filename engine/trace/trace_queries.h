// What the app's views and `kvlens-cli figure` read from a Trace, computed here (views never
// compute): a head's steps x tokens matrix of logits, probabilities or scores with its visible
// set, the cross-head consensus matrix at a step, a head's predicted-vs-true agreement, every
// head's summary (recall of dense mass, hit rate, sparsity) and the per-token retention counts.
// Matrices are row-major [rows][cols]; NaN marks "no value" (a token after the step, a row the
// trace did not keep, -inf outside a sliding window).
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/trace/trace.h"

namespace kvlens {

class ThreadPool;

enum class HeadQuantity { Logits, Probabilities, Scores };

// A token a sliding-window layer cannot see at a step (before its window: no candidate), in
// HeadMatrix::visible and HeadRow::visible: neither seen nor hidden by a policy. Read from the
// trace as a row's leading -inf true logits that another kept head of the layer shares (a window
// is the layer's; a lone -inf logit is only a missing value).
inline constexpr uint8_t kOutsideWindow = 3;

struct HeadMatrix {
  int64_t rows = 0, cols = 0;  // steps [0, rows), tokens [0, cols) (cols = rows: step t has t + 1)
  std::vector<float> values;   // [rows][cols], NaN where there is no value
  // [rows][cols]: 1 seen, 0 hidden, 2 unknown (not kept / j > t), kOutsideWindow (a pooled cell:
  // every known token of it outside the window)
  std::vector<uint8_t> visible;
  int64_t missing_rows = 0;  // steps whose rows the trace did not keep for this head
  int64_t block = 1;         // steps and tokens per cell (level of detail, see below)
  int64_t steps = 0;         // steps folded in: [0, steps)
};

// Steps [0, last_step] of run `run`, (layer, head). Probabilities are the softmax of the row's
// finite logits over every candidate (what dense attention gives), not renormalised to the
// visible set. With max_side > 0 the matrix is pooled to at most max_side cells a side, each cell
// a block x block square of (steps, tokens) holding its largest value (peaks stay visible) and
// visible 1 when the head saw any of its tokens, 0 when it hid some and saw none: a grid of many
// heads over a long text stays small. Throws kvlens::Error (file "trace") for a run, layer, head
// or step out of range.
HeadMatrix head_matrix(const Trace& trace, int64_t run, int64_t layer, int64_t head,
                       HeadQuantity quantity, int64_t last_step, int64_t max_side = 0);

// Whether a kept row of some run at `step` has keys outside a sliding window (true logit -inf):
// the views then draw and explain kOutsideWindow cells (a window only slides forward, so no
// earlier step of the trace has any where this one has none). Throws kvlens::Error (file
// "trace") for a step out of range.
bool has_keys_outside_window(const Trace& trace, int64_t step);

// The pooling block of a map of `steps` steps at most max_side cells a side: the smallest power
// of two with ceil(steps / block) <= max_side (1 for max_side 0). Powers of two let a map that
// grows step by step re-pool by merging 2 x 2 cells.
int64_t map_block(int64_t steps, int64_t max_side);

// head_matrix(..., max_side) for views redrawn as a recording grows: each (run, layer, head,
// quantity) keeps its last map and reads only the steps added since (merging cells when the block
// doubles); a map for fewer steps than the kept one is made afresh. Maps are shared with the
// figures that show them (a kept map still in use is copied before it changes). A call with
// another max_side than the kept maps' (the view zoomed: another level of detail) drops them all.
// Clear it when the trace is replaced; the trace may only grow between calls.
class HeadMapCache {
 public:
  std::shared_ptr<const HeadMatrix> get(const Trace& trace, int64_t run, int64_t layer,
                                        int64_t head, HeadQuantity quantity, int64_t last_step,
                                        int64_t max_side);
  // get() for every layer and head of `runs` at once, the maps folded on up to `threads` threads
  // (0: one per core): a grid's first build, or one after a step back, reads every kept row.
  void update(const Trace& trace, const std::vector<int64_t>& runs, HeadQuantity quantity,
              int64_t last_step, int64_t max_side, int threads = 0);
  void clear() { maps_.clear(); }

 private:
  // The kept map of a head, made afresh, copied or re-pooled as it must be to fold in steps up to
  // last_step (which get() then folds).
  std::shared_ptr<HeadMatrix>& prepare(const Trace& trace, int64_t run, int64_t layer, int64_t head,
                                       HeadQuantity quantity, int64_t last_step, int64_t max_side);

  int64_t max_side_ = 0;
  std::unordered_map<uint64_t, std::shared_ptr<HeadMatrix>> maps_;
  std::shared_ptr<ThreadPool> pool_;  // update()'s threads, made on its first call
};

// One step's row of a head at full resolution: values [t + 1] and visible flags; `kept` is false
// (and the vectors empty) when the trace did not keep the row.
struct HeadRow {
  std::vector<float> values;
  std::vector<uint8_t> visible;  // 1 seen, 0 hidden by the policy, kOutsideWindow
  bool kept = false;
};
HeadRow head_row_at(const Trace& trace, int64_t run, int64_t step, int64_t layer, int64_t head,
                    HeadQuantity quantity);

enum class ConsensusMetric { Pearson, Jaccard };

// The [M, M] matrix over the (layer, head) rows kept at `step` for `run`, in increasing
// layer * heads + head order (`heads` lists them), and the mean of its strict upper triangle.
struct ConsensusMatrix {
  std::vector<int32_t> heads;
  std::vector<double> values;  // [M][M]
  double mean = 0.0;
};
ConsensusMatrix consensus_matrix(const Trace& trace, int64_t run, int64_t step,
                                 ConsensusMetric metric);

// A head's policy scores against its true logits at one step: the candidates' pairs (for a
// scatter), Pearson and Spearman over the pairs where both are finite, and the top-50%
// classification agreement of POLICIES.md. NaN (and no pairs) when the row was not kept.
struct PredictedVsTrue {
  std::vector<float> scores, logits;  // [t + 1]
  double pearson = 0.0, spearman = 0.0, accuracy = 0.0;
};
PredictedVsTrue predicted_vs_true(const Trace& trace, int64_t run, int64_t step, int64_t layer,
                                  int64_t head);

// The top-50% agreement of every (layer, head) at a step: [layers][heads], NaN where not kept
// or where the policy set no scores (a dense layer).
std::vector<double> head_accuracy_grid(const Trace& trace, int64_t run, int64_t step);

// Every (layer, head)'s summary at a step, [layers][heads] each, NaN where the trace did not keep
// the head's row (sparsity comes from the always-kept counts):
// - recall: the share of the head's dense attention mass that falls on the tokens it saw, i.e.
//   sum over visible j of softmax(logits)_j, the softmax taken over every finite logit of the
//   row (all t + 1 candidates, what dense attention would give this head in this run). 1 when
//   the head saw everything.
// - hit_rate: the top-50% agreement of the policy's scores with the true logits (as
//   head_accuracy_grid: NaN on a layer the policy left dense, where it set no scores).
// - sparsity: 1 - visible / candidates (candidates = t + 1, or the keys with a finite true logit
//   where the row is kept: a sliding-window layer's window).
struct HeadSummary {
  std::vector<double> recall, hit_rate, sparsity;
};
HeadSummary head_summary(const Trace& trace, int64_t run, int64_t step);

// Each head's own budget at `step`: the tokens it kept in sight (visible_counts) on the layers
// where the policy chose a set (Masked), -1 on dense and skipped layers (no budget of their own).
// An allocator (pyramidkv, adakv) makes them differ by layer or head; a uniform policy's are one
// figure (less where an eviction ran out of candidates). Spread over the Masked heads: min, max
// and mean (-1, -1, NaN when no layer was Masked); per layer the sum over its heads (-1 where
// not Masked). Throws kvlens::Error (file "trace") for a run or step out of range.
struct HeadBudgets {
  std::vector<int32_t> kept;         // [layers * heads]
  std::vector<int64_t> layer_total;  // [layers]
  // [layers * heads] of a run that weighted its sample (magicpig), where the head's row is kept:
  // the kept tokens seen with an importance weight above 1 (sampled, p < 1) and the mean of
  // those weights 1 / p (NaN for none); -1 and NaN elsewhere. Empty for every other run.
  std::vector<int32_t> sampled;
  std::vector<double> mean_weight;
  int64_t candidates = 0;  // t + 1
  int32_t min = -1, max = -1;
  double mean = std::numeric_limits<double>::quiet_NaN();
  bool uniform() const { return min == max; }
};
HeadBudgets head_budgets(const Trace& trace, int64_t run, int64_t step);

// How many of the heads in scope see each token at `step`: scope layer = -1 (every layer) or one
// layer, head = -1 (every head of the scope) or one head. `heads_in_scope` is the count the
// tokens can reach; tokens after the step get -1; `known` is false when a head in scope has no
// rows at this step (a degraded trace).
// outside_window_of counts the heads in scope (with rows) for which the token lies before their
// sliding window: no candidate of theirs, so neither seen nor hidden by the policy.
struct RetentionCounts {
  std::vector<int32_t> seen_by;            // [tokens]
  std::vector<int32_t> outside_window_of;  // [tokens] (-1 after the step, as seen_by)
  // A run that weighted its sample at this step (StepRecord::log_weights: magicpig): per token,
  // the heads in scope that saw it with an importance weight above 1 (sampled, p < 1), and the
  // mean of those weights exp(log-weight) = 1 / p (NaN where no head did). Empty otherwise.
  std::vector<int32_t> sampled_by;
  std::vector<double> mean_weight;
  int32_t heads_in_scope = 0;
  bool known = true;
};
RetentionCounts retention_counts(const Trace& trace, int64_t run, int64_t step, int64_t layer,
                                 int64_t head);

// A co-reference sample's answer as a run predicted it so far: for each answer token (positions
// p = answer_token_begin - 1 .. answer_token_end - 2 predict token p + 1), the run's argmax at step
// p against the true token, for the steps recorded. Empty when the trace is not a sample.
struct AnswerPrediction {
  int64_t position = 0;  // the step that predicts tokens[position + 1]
  int32_t predicted = -1, truth = -1;
  bool correct = false;
  std::string predicted_text;  // the prediction's text (from the step's top-k; empty if unknown)
};
std::vector<AnswerPrediction> answer_predictions(const Trace& trace, int64_t run);

// Spearman's rank correlation over the columns where both are finite (average ranks for ties);
// NaN with fewer than 2 such columns or zero variance.
double spearman(std::span<const float> x, std::span<const float> y);

}  // namespace kvlens

namespace kvlens {

// The heads of run `run` that saw every candidate at `step` in a layer the policy masked while
// another head of a masked layer saw fewer: DuoAttention's retrieval heads (the others are its
// streaming heads), or any per-head policy's unrestricted heads. A layer left dense marks none;
// a step where no head was limited marks none.
// [layers * heads] each; `score` is the head's policy score where its row was kept and the scores
// are one value over every candidate (duoattention records each head's gate so), else NaN.
struct FullHeads {
  std::vector<uint8_t> full;
  std::vector<float> score;
};
FullHeads full_heads_at(const Trace& trace, int64_t run, int64_t step);

}  // namespace kvlens
