// The views' reads of a Trace (trace_queries.h): head matrices, consensus, predicted vs true,
// retention counts, built from the kept rows with the metric functions of step_metrics.
#include "engine/trace/trace_queries.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "engine/backend/thread_pool.h"
#include "engine/common/error.h"
#include "engine/trace/step_metrics.h"

namespace kvlens {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr float kNaNf = std::numeric_limits<float>::quiet_NaN();

void require_index(int64_t value, int64_t limit, const char* field) {
  if (value < 0 || value >= limit) {
    throw Error("trace", field, "an index in [0, " + std::to_string(limit) + ")",
                std::to_string(value));
  }
}

const StepRecord& record_at(const Trace& trace, int64_t run, int64_t step) {
  require_index(run, int64_t(trace.runs.size()), "run");
  require_index(step, trace.step_count(), "step");
  return trace.steps()[size_t(step)][size_t(run)];
}

void require_head(const Trace& trace, int64_t layer, int64_t head) {
  require_index(layer, trace.model.layers, "layer");
  require_index(head, trace.model.heads, "head");
}

// A head's map of steps [0, last_step] of a run.
void require_map(const Trace& trace, int64_t run, int64_t layer, int64_t head, int64_t last_step) {
  require_index(run, int64_t(trace.runs.size()), "run");
  require_index(last_step, trace.step_count(), "step");
  require_head(trace, layer, head);
}

// Average ranks (1-based) of the values, ties sharing the mean of their positions.
std::vector<double> average_ranks(const std::vector<double>& values) {
  std::vector<size_t> order(values.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return values[a] < values[b]; });
  std::vector<double> ranks(values.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    while (j < order.size() && values[order[j]] == values[order[i]]) ++j;
    const double rank = 0.5 * double(i + 1 + j);  // mean of positions i + 1 .. j
    for (size_t k = i; k < j; ++k) ranks[order[k]] = rank;
    i = j;
  }
  return ranks;
}

}  // namespace

double spearman(std::span<const float> x, std::span<const float> y) {
  if (x.size() != y.size()) {
    throw Error("trace", "spearman", "rows of equal length",
                std::to_string(x.size()) + " and " + std::to_string(y.size()));
  }
  std::vector<double> a, b;
  for (size_t j = 0; j < x.size(); ++j) {
    if (std::isfinite(x[j]) && std::isfinite(y[j])) a.push_back(x[j]), b.push_back(y[j]);
  }
  if (a.size() < 2) return kNaN;
  const std::vector<double> ra = average_ranks(a), rb = average_ranks(b);
  std::vector<float> fa(ra.begin(), ra.end()), fb(rb.begin(), rb.end());
  return pearson(fa, fb);  // ranks are small integers or halves: exact in float
}

namespace {

// Leading -inf true logits of a row: how many keys lie before a sliding window.
int64_t leading_minus_inf(const float* logits, int64_t cols) {
  int64_t n = 0;
  while (n < cols && std::isinf(logits[n]) && logits[n] < 0) ++n;
  return n;
}

// The first column of a (layer, head)'s sliding window at a step: 0 without one, or where its
// row was not kept. A window is the layer's (every head of a local layer has the same one), so
// a row's leading -inf logits count as one only when another kept head of the layer has as many:
// a lone -inf is no window.
int64_t window_start(const StepRecord& record, int64_t layer, int64_t head, int64_t heads) {
  const float* logits = record.logits_row(layer, head, heads);
  if (!logits) return 0;
  const int64_t first = leading_minus_inf(logits, record.columns);
  if (first == 0) return 0;
  for (int64_t other = 0; other < heads; ++other) {
    if (other == head) continue;
    if (const float* row = record.logits_row(layer, other, heads))
      return leading_minus_inf(row, record.columns) == first ? first : 0;
  }
  return first;  // the layer's only kept head
}

// One step's row of a head: `out` [cols] gets the quantity (NaN where there is no value) and
// `shown` the visible flags; false when the trace did not keep the row.
bool head_row(const StepRecord& record, int64_t layer, int64_t head, int64_t heads,
              HeadQuantity quantity, float* out, uint8_t* shown) {
  const float* logits = record.logits_row(layer, head, heads);
  if (!logits) return false;
  const int64_t cols = record.columns;
  std::copy_n(record.visible_row(layer, head, heads), cols, shown);
  // Keys before a sliding window: never candidates.
  std::fill_n(shown, window_start(record, layer, head, heads), kOutsideWindow);
  if (quantity == HeadQuantity::Scores) {
    std::copy_n(record.scores_row(layer, head, heads), cols, out);
  } else if (quantity == HeadQuantity::Logits) {
    std::copy_n(logits, cols, out);
  } else {
    double top = -std::numeric_limits<double>::infinity(), total = 0.0;
    for (int64_t j = 0; j < cols; ++j)
      if (std::isfinite(logits[j])) top = std::max(top, double(logits[j]));
    for (int64_t j = 0; j < cols; ++j) {
      // (float exp: a display value, computed for every cell of a grid of maps)
      const double e = std::isfinite(logits[j]) ? std::exp(float(double(logits[j]) - top)) : -1.0;
      out[j] = float(e);
      if (e >= 0) total += e;
    }
    for (int64_t j = 0; j < cols; ++j) out[j] = out[j] >= 0 ? float(out[j] / total) : kNaNf;
  }
  for (int64_t j = 0; j < cols; ++j)
    if (!std::isfinite(out[j])) out[j] = kNaNf;  // -inf outside a window: no value
  return true;
}

// A map of `cells` x `cells` empty cells (NaN, unknown).
void reset_cells(HeadMatrix& m, int64_t cells) {
  m.rows = m.cols = cells;
  m.values.assign(size_t(cells * cells), kNaNf);
  m.visible.assign(size_t(cells * cells), 2);
}

// The larger value (NaN counts as none) and the visibility of a merged block: seen if any cell
// was, hidden if some cell was hidden and none seen, outside the window if every known cell was,
// unknown otherwise.
void merge_cell(float& value, uint8_t& visible, float other_value, uint8_t other_visible) {
  if (!std::isnan(other_value) && !(value >= other_value)) value = other_value;
  if (other_visible == 1) {
    visible = 1;
  } else if (other_visible == 0 && (visible == 2 || visible == kOutsideWindow)) {
    visible = 0;
  } else if (other_visible == kOutsideWindow && visible == 2) {
    visible = kOutsideWindow;
  }
}

// Grows m to hold steps [0, steps) at block m.block (cells are square: rows = cols).
void grow_cells(HeadMatrix& m, int64_t steps) {
  const int64_t cells = (steps + m.block - 1) / m.block;
  if (cells <= m.rows) return;
  HeadMatrix grown;
  reset_cells(grown, cells);
  for (int64_t r = 0; r < m.rows; ++r) {
    std::copy_n(m.values.data() + r * m.cols, m.cols, grown.values.data() + r * cells);
    std::copy_n(m.visible.data() + r * m.cols, m.cols, grown.visible.data() + r * cells);
  }
  m.values.swap(grown.values);
  m.visible.swap(grown.visible);
  m.rows = m.cols = cells;
}

// Doubles m's block, merging 2 x 2 cells.
void double_block(HeadMatrix& m) {
  HeadMatrix merged;
  reset_cells(merged, (m.rows + 1) / 2);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < m.cols; ++c) {
      const size_t to = size_t((r / 2) * merged.cols + c / 2), from = size_t(r * m.cols + c);
      merge_cell(merged.values[to], merged.visible[to], m.values[from], m.visible[from]);
    }
  }
  m.values.swap(merged.values);
  m.visible.swap(merged.visible);
  m.rows = m.cols = merged.rows;
  m.block *= 2;
}

// Folds steps [m.steps, last_step] of the head into m (its block already fits them).
void fold_steps(const Trace& trace, int64_t run, int64_t layer, int64_t head, HeadQuantity quantity,
                int64_t last_step, HeadMatrix& m) {
  grow_cells(m, last_step + 1);
  std::vector<float> row(static_cast<size_t>(last_step + 1));
  std::vector<uint8_t> shown(static_cast<size_t>(last_step + 1));
  for (int64_t t = m.steps; t <= last_step; ++t) {
    const StepRecord& record = trace.steps()[size_t(t)][size_t(run)];
    if (!head_row(record, layer, head, trace.model.heads, quantity, row.data(), shown.data())) {
      ++m.missing_rows;
      continue;
    }
    float* values = m.values.data() + (t / m.block) * m.cols;
    uint8_t* visible = m.visible.data() + (t / m.block) * m.cols;
    for (int64_t j = 0; j < record.columns; ++j) {
      const int64_t c = j / m.block;
      merge_cell(values[c], visible[c], row[size_t(j)], shown[size_t(j)]);
    }
  }
  m.steps = last_step + 1;
}

}  // namespace

int64_t map_block(int64_t steps, int64_t max_side) {
  int64_t block = 1;
  while (max_side > 0 && (steps + block - 1) / block > max_side) block *= 2;
  return block;
}

HeadMatrix head_matrix(const Trace& trace, int64_t run, int64_t layer, int64_t head,
                       HeadQuantity quantity, int64_t last_step, int64_t max_side) {
  require_map(trace, run, layer, head, last_step);
  HeadMatrix m;
  m.block = map_block(last_step + 1, max_side);
  fold_steps(trace, run, layer, head, quantity, last_step, m);
  return m;
}

std::shared_ptr<HeadMatrix>& HeadMapCache::prepare(const Trace& trace, int64_t run, int64_t layer,
                                                   int64_t head, HeadQuantity quantity,
                                                   int64_t last_step, int64_t max_side) {
  require_map(trace, run, layer, head, last_step);
  if (max_side != max_side_) maps_.clear(), max_side_ = max_side;
  const uint64_t key = ((uint64_t(run) * uint64_t(trace.model.layers) + uint64_t(layer)) *
                            uint64_t(trace.model.heads) +
                        uint64_t(head)) *
                           3 +
                       uint64_t(quantity);
  std::shared_ptr<HeadMatrix>& kept = maps_[key];
  if (kept && kept->steps == last_step + 1) return kept;
  if (!kept || kept->steps > last_step + 1) {
    kept = std::make_shared<HeadMatrix>();
    kept->block = map_block(last_step + 1, max_side_);
  } else if (kept.use_count() > 1) {
    kept = std::make_shared<HeadMatrix>(*kept);  // a figure still shows the kept one
  }
  while (kept->block < map_block(last_step + 1, max_side_)) double_block(*kept);
  return kept;
}

std::shared_ptr<const HeadMatrix> HeadMapCache::get(const Trace& trace, int64_t run, int64_t layer,
                                                    int64_t head, HeadQuantity quantity,
                                                    int64_t last_step, int64_t max_side) {
  std::shared_ptr<HeadMatrix>& kept =
      prepare(trace, run, layer, head, quantity, last_step, max_side);
  fold_steps(trace, run, layer, head, quantity, last_step, *kept);
  return kept;
}

void HeadMapCache::update(const Trace& trace, const std::vector<int64_t>& runs,
                          HeadQuantity quantity, int64_t last_step, int64_t max_side, int threads) {
  struct Pending {
    HeadMatrix* map;
    int64_t run, layer, head;
  };
  std::vector<Pending> pending;
  for (const int64_t run : runs) {
    for (int64_t l = 0; l < trace.model.layers; ++l) {
      for (int64_t h = 0; h < trace.model.heads; ++h) {
        HeadMatrix& m = *prepare(trace, run, l, h, quantity, last_step, max_side);
        if (m.steps <= last_step) pending.push_back({&m, run, l, h});
      }
    }
  }
  // Each map is folded by one thread; the trace is only read.
  if (!pool_ || (threads > 0 && pool_->size() != threads))
    pool_ = std::make_shared<ThreadPool>(threads);
  try {
    pool_->for_each(int64_t(pending.size()), [&](int64_t i) {
      const Pending& p = pending[size_t(i)];
      fold_steps(trace, p.run, p.layer, p.head, quantity, last_step, *p.map);
    });
  } catch (...) {
    maps_.clear();  // maps left half folded
    throw;
  }
}

bool has_keys_outside_window(const Trace& trace, int64_t step) {
  require_index(step, trace.step_count(), "step");
  const int64_t L = trace.model.layers, H = trace.model.heads;
  for (const StepRecord& record : trace.steps()[size_t(step)]) {
    for (int64_t l = 0; l < L; ++l)
      for (int64_t h = 0; h < H; ++h)
        if (window_start(record, l, h, H) > 0) return true;
  }
  return false;
}

HeadRow head_row_at(const Trace& trace, int64_t run, int64_t step, int64_t layer, int64_t head,
                    HeadQuantity quantity) {
  const StepRecord& record = record_at(trace, run, step);
  require_head(trace, layer, head);
  HeadRow row;
  row.values.resize(size_t(record.columns));
  row.visible.resize(size_t(record.columns));
  row.kept = head_row(record, layer, head, trace.model.heads, quantity, row.values.data(),
                      row.visible.data());
  if (!row.kept) row.values.clear(), row.visible.clear();
  return row;
}

ConsensusMatrix consensus_matrix(const Trace& trace, int64_t run, int64_t step,
                                 ConsensusMetric metric) {
  const StepRecord& record = record_at(trace, run, step);
  ConsensusMatrix c;
  c.heads = record.kept_heads;
  const size_t cols = size_t(record.columns);
  if (metric == ConsensusMetric::Pearson) {
    std::vector<std::span<const float>> rows;
    for (size_t i = 0; i < c.heads.size(); ++i)
      rows.emplace_back(record.logits.data() + i * cols, cols);
    c.values = pearson_matrix(rows);
  } else {
    std::vector<std::span<const uint8_t>> masks;
    for (size_t i = 0; i < c.heads.size(); ++i)
      masks.emplace_back(record.visible.data() + i * cols, cols);
    c.values = jaccard_matrix(masks);
  }
  c.mean = c.heads.size() >= 2 ? mean_upper_triangle(c.values, int64_t(c.heads.size())) : kNaN;
  return c;
}

PredictedVsTrue predicted_vs_true(const Trace& trace, int64_t run, int64_t step, int64_t layer,
                                  int64_t head) {
  const StepRecord& record = record_at(trace, run, step);
  require_head(trace, layer, head);
  PredictedVsTrue p;
  p.pearson = p.spearman = p.accuracy = kNaN;
  const float* logits = record.logits_row(layer, head, trace.model.heads);
  if (!logits) return p;
  const float* scores = record.scores_row(layer, head, trace.model.heads);
  p.logits.assign(logits, logits + record.columns);
  p.scores.assign(scores, scores + record.columns);
  p.pearson = pearson(p.scores, p.logits);
  p.spearman = spearman(p.scores, p.logits);
  if (record.decisions[size_t(layer)] == LayerDecision::Masked)
    p.accuracy = top_half_agreement(p.scores, p.logits);
  return p;
}

std::vector<double> head_accuracy_grid(const Trace& trace, int64_t run, int64_t step) {
  const StepRecord& record = record_at(trace, run, step);
  const int64_t L = trace.model.layers, H = trace.model.heads;
  std::vector<double> grid(size_t(L * H), kNaN);
  for (int64_t l = 0; l < L; ++l) {
    if (record.decisions[size_t(l)] != LayerDecision::Masked) continue;
    for (int64_t h = 0; h < H; ++h) {
      const float* logits = record.logits_row(l, h, H);
      if (!logits) continue;
      const size_t cols = size_t(record.columns);
      grid[size_t(l * H + h)] =
          top_half_agreement({record.scores_row(l, h, H), cols}, {logits, cols});
    }
  }
  return grid;
}

HeadSummary head_summary(const Trace& trace, int64_t run, int64_t step) {
  const StepRecord& record = record_at(trace, run, step);
  const int64_t L = trace.model.layers, H = trace.model.heads;
  HeadSummary summary;
  summary.hit_rate = head_accuracy_grid(trace, run, step);
  summary.recall.assign(size_t(L * H), kNaN);
  summary.sparsity.assign(size_t(L * H), kNaN);
  for (int64_t i = 0; i < L * H; ++i) {
    const float* logits = record.logits_row(i / H, i % H, H);
    // The keys the head attends to: a sliding-window layer's true logits are -inf before its
    // window (those keys are no candidates); t + 1 where the row was not kept.
    int64_t candidates = record.columns;
    if (logits) {
      candidates = 0;
      for (int64_t j = 0; j < record.columns; ++j)
        candidates += logits[j] != -std::numeric_limits<float>::infinity();
    }
    if (size_t(i) < record.visible_counts.size() && candidates > 0) {
      summary.sparsity[size_t(i)] =
          1.0 - double(record.visible_counts[size_t(i)]) / double(candidates);
    }
    if (!logits) continue;
    const uint8_t* shown = record.visible_row(i / H, i % H, H);
    double top = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < record.columns; ++j)
      if (std::isfinite(logits[j])) top = std::max(top, double(logits[j]));
    if (!std::isfinite(top)) continue;
    double total = 0.0, seen = 0.0;
    for (int64_t j = 0; j < record.columns; ++j) {
      if (!std::isfinite(logits[j])) continue;
      const double e = std::exp(double(logits[j]) - top);
      total += e;
      if (shown[j]) seen += e;
    }
    summary.recall[size_t(i)] = seen / total;
  }
  return summary;
}

HeadBudgets head_budgets(const Trace& trace, int64_t run, int64_t step) {
  const StepRecord& record = record_at(trace, run, step);
  const int64_t L = trace.model.layers, H = trace.model.heads;
  HeadBudgets out;
  out.candidates = record.columns;
  out.kept.assign(size_t(L * H), -1);
  out.layer_total.assign(size_t(L), -1);
  int64_t heads = 0, sum = 0;
  for (int64_t l = 0; l < L; ++l) {
    if (size_t(l) >= record.decisions.size() ||
        record.decisions[size_t(l)] != LayerDecision::Masked)
      continue;
    out.layer_total[size_t(l)] = 0;
    for (int64_t h = 0; h < H; ++h) {
      const size_t at = size_t(l * H + h);
      if (at >= record.visible_counts.size()) continue;
      const int32_t kept = record.visible_counts[at];
      out.kept[at] = kept;
      const float* weights = record.log_weights_row(l, h, H);
      const uint8_t* shown = record.visible_row(l, h, H);
      if (weights && shown) {
        if (out.sampled.empty()) {
          out.sampled.assign(size_t(L * H), -1);
          out.mean_weight.assign(size_t(L * H), std::numeric_limits<double>::quiet_NaN());
        }
        int32_t sampled = 0;
        double sum_weights = 0.0;
        for (int64_t j = 0; j < record.columns; ++j) {
          if (!shown[j] || !(weights[j] > 0.0f)) continue;
          ++sampled;
          sum_weights += std::exp(double(weights[j]));
        }
        out.sampled[at] = sampled;
        if (sampled > 0) out.mean_weight[at] = sum_weights / double(sampled);
      }
      out.layer_total[size_t(l)] += kept;
      out.min = heads == 0 ? kept : std::min(out.min, kept);
      out.max = heads == 0 ? kept : std::max(out.max, kept);
      sum += kept;
      ++heads;
    }
  }
  if (heads > 0) out.mean = double(sum) / double(heads);
  return out;
}

RetentionCounts retention_counts(const Trace& trace, int64_t run, int64_t step, int64_t layer,
                                 int64_t head) {
  const StepRecord& record = record_at(trace, run, step);
  const int64_t L = trace.model.layers, H = trace.model.heads;
  if (layer >= 0) require_index(layer, L, "layer");
  if (head >= 0) require_index(head, H, "head");
  RetentionCounts counts;
  counts.seen_by.assign(trace.tokens.size(), -1);
  for (int64_t j = 0; j < record.columns && j < int64_t(counts.seen_by.size()); ++j)
    counts.seen_by[size_t(j)] = 0;
  counts.outside_window_of = counts.seen_by;
  for (int64_t l = 0; l < L; ++l) {
    if (layer >= 0 && l != layer) continue;
    for (int64_t h = 0; h < H; ++h) {
      if (head >= 0 && h != head) continue;
      ++counts.heads_in_scope;
      const uint8_t* shown = record.visible_row(l, h, H);
      if (!shown) {
        counts.known = false;
        continue;
      }
      const int64_t first = window_start(record, l, h, H);
      for (int64_t j = 0; j < record.columns && j < int64_t(counts.seen_by.size()); ++j) {
        counts.seen_by[size_t(j)] += shown[j];
        counts.outside_window_of[size_t(j)] += j < first;
      }
      const float* weights = record.log_weights_row(l, h, H);
      if (!weights) continue;
      if (counts.sampled_by.empty()) {
        counts.sampled_by.assign(counts.seen_by.size(), 0);
        counts.mean_weight.assign(counts.seen_by.size(), 0.0);  // sums until the division
      }
      for (int64_t j = 0; j < record.columns && j < int64_t(counts.seen_by.size()); ++j) {
        if (!shown[j] || !(weights[j] > 0.0f)) continue;
        ++counts.sampled_by[size_t(j)];
        counts.mean_weight[size_t(j)] += std::exp(double(weights[j]));
      }
    }
  }
  for (size_t j = 0; j < counts.mean_weight.size(); ++j) {
    counts.mean_weight[j] = counts.sampled_by[j] > 0
                                ? counts.mean_weight[j] / double(counts.sampled_by[j])
                                : std::numeric_limits<double>::quiet_NaN();
  }
  return counts;
}

std::vector<AnswerPrediction> answer_predictions(const Trace& trace, int64_t run) {
  require_index(run, int64_t(trace.runs.size()), "run");
  std::vector<AnswerPrediction> predictions;
  if (!trace.coref.present) return predictions;
  for (int64_t p = std::max<int64_t>(0, trace.coref.answer_token_begin - 1);
       p + 1 < trace.coref.answer_token_end && p < trace.step_count(); ++p) {
    AnswerPrediction a;
    a.position = p;
    const StepRecord& record = trace.steps()[size_t(p)][size_t(run)];
    a.predicted = record.argmax;
    for (size_t k = 0; k < record.top.texts.size(); ++k)
      if (record.top.ids[k] == a.predicted) a.predicted_text = record.top.texts[k];
    a.truth = trace.tokens[size_t(p + 1)].id;
    a.correct = a.predicted == a.truth;
    predictions.push_back(a);
  }
  return predictions;
}

}  // namespace kvlens

namespace kvlens {

FullHeads full_heads_at(const Trace& trace, int64_t run, int64_t step) {
  const StepRecord& record = record_at(trace, run, step);
  const int64_t L = trace.model.layers, H = trace.model.heads;
  FullHeads heads;
  heads.full.assign(size_t(L * H), 0);
  heads.score.assign(size_t(L * H), kNaN);
  if (record.visible_counts.size() < size_t(L * H)) return heads;
  // Candidates per head of a masked layer (-1 elsewhere); whether any head of the step was limited.
  // Across layers, not per layer: DuoAttention chooses its retrieval heads over the whole model, so
  // a layer whose heads are all retrieval heads still shows them as full.
  std::vector<int64_t> candidates(size_t(L * H), -1);
  bool limited = false;
  for (int64_t l = 0; l < L; ++l) {
    if (record.decisions[size_t(l)] != LayerDecision::Masked) continue;
    for (int64_t h = 0; h < H; ++h) {
      int64_t& count = candidates[size_t(l * H + h)];
      count = record.columns;
      // A sliding-window layer's candidates: the finite true logits of a kept row.
      if (const float* logits = record.logits_row(l, h, H)) {
        count = 0;
        for (int64_t j = 0; j < record.columns; ++j)
          count += logits[j] != -std::numeric_limits<float>::infinity();
      }
      limited = limited || record.visible_counts[size_t(l * H + h)] < count;
    }
  }
  if (!limited) return heads;
  for (int64_t i = 0; i < L * H; ++i) {
    if (candidates[size_t(i)] < 0 || record.visible_counts[size_t(i)] < candidates[size_t(i)])
      continue;
    heads.full[size_t(i)] = 1;
    const float* scores = record.scores_row(i / H, i % H, H);
    if (scores && record.columns > 0 &&
        std::all_of(scores, scores + record.columns, [&](float s) { return s == scores[0]; }))
      heads.score[size_t(i)] = scores[0];
  }
  return heads;
}

}  // namespace kvlens
