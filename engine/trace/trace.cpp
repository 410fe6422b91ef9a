// The trace data model: row lookup in a StepRecord (kept_heads is sorted, so a binary search),
// add_step's shape checks and the memory budget (a step past the budget keeps only the rows of the
// selected heads), and truncation. The .kvtrace format lives in trace_file.cpp.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "engine/common/error.h"
#include "engine/trace/trace.h"

namespace kvlens {

int64_t StepRecord::kept_index(int64_t layer, int64_t head, int64_t heads) const {
  if (layer < 0 || head < 0 || head >= heads) return -1;
  const int64_t flat = layer * heads + head;
  const auto it = std::lower_bound(kept_heads.begin(), kept_heads.end(), flat);
  if (it == kept_heads.end() || *it != flat) return -1;
  return int64_t(it - kept_heads.begin());
}

namespace {
// A row of `rows` (packed [kept][columns]), or nullptr when the head is not kept. The size check
// keeps a record that never went through add_step (still being filled) from being read past.
template <class T>
const T* row_of(const StepRecord& record, const std::vector<T>& rows, int64_t layer, int64_t head,
                int64_t heads) {
  const int64_t index = record.kept_index(layer, head, heads);
  if (index < 0 || record.columns <= 0 || size_t((index + 1) * record.columns) > rows.size()) {
    return nullptr;
  }
  return rows.data() + index * record.columns;
}
}  // namespace

const float* StepRecord::logits_row(int64_t layer, int64_t head, int64_t heads) const {
  return row_of(*this, logits, layer, head, heads);
}
const float* StepRecord::scores_row(int64_t layer, int64_t head, int64_t heads) const {
  return row_of(*this, scores, layer, head, heads);
}
const uint8_t* StepRecord::visible_row(int64_t layer, int64_t head, int64_t heads) const {
  return row_of(*this, visible, layer, head, heads);
}
const float* StepRecord::log_weights_row(int64_t layer, int64_t head, int64_t heads) const {
  return row_of(*this, log_weights, layer, head, heads);
}

size_t StepRecord::row_bytes() const {
  return (logits.size() + scores.size() + log_weights.size()) * sizeof(float) +
         visible.size() * sizeof(uint8_t);
}

namespace {

constexpr const char* kSource = "trace";  // the Error "file" of an in-memory trace

std::string n(int64_t value) {
  return std::to_string(value);
}

// Heads must be strictly increasing (sorted, no repeats) and within [0, head_count).
void check_heads(const std::vector<int32_t>& ids, int64_t head_count, const std::string& field) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= head_count) {
      throw Error(kSource, field + " [" + n(int64_t(i)) + "]",
                  "a head (layer * heads + head) in [0, " + n(head_count) + ")", n(ids[i]));
    }
    if (i > 0 && ids[i] <= ids[i - 1]) {
      throw Error(kSource, field + " [" + n(int64_t(i)) + "]",
                  "heads in increasing order without repeats",
                  n(ids[i]) + " after " + n(ids[i - 1]));
    }
  }
}

void check_record(const Trace& trace, const StepRecord& record, int64_t step, size_t run) {
  const std::string where = "step " + n(step) + " run " + n(int64_t(run)) + ": ";
  const int64_t layers = trace.model.layers, heads = trace.model.heads;
  if (int64_t(record.decisions.size()) != layers) {
    throw Error(kSource, where + "decisions", n(layers) + " (model.layers)",
                n(int64_t(record.decisions.size())));
  }
  for (size_t l = 0; l < record.decisions.size(); ++l) {
    const int value = int(record.decisions[l]);
    if (value < 0 || value > int(LayerDecision::Skipped)) {
      throw Error(kSource, where + "decisions [" + n(int64_t(l)) + "]",
                  "0 (dense), 1 (masked) or 2 (skipped)", n(value));
    }
  }
  if (record.columns != step + 1) {
    throw Error(kSource, where + "columns", n(step + 1) + " (step + 1)", n(record.columns));
  }
  if (int64_t(record.visible_counts.size()) != layers * heads) {
    throw Error(kSource, where + "visible_counts", n(layers * heads) + " (layers * heads)",
                n(int64_t(record.visible_counts.size())));
  }
  for (size_t i = 0; i < record.visible_counts.size(); ++i) {
    if (record.visible_counts[i] < 0 || record.visible_counts[i] > record.columns) {
      throw Error(kSource, where + "visible_counts [" + n(int64_t(i)) + "]",
                  "a count in [0, " + n(record.columns) + "]", n(record.visible_counts[i]));
    }
  }
  const auto top = int64_t(record.top.ids.size());
  if (int64_t(record.top.log_probs.size()) != top) {
    throw Error(kSource, where + "top.log_probs", n(top) + " entries (as many as top.ids)",
                n(int64_t(record.top.log_probs.size())));
  }
  if (top > trace.top_k)
    throw Error(kSource, where + "top.ids", "at most top_k = " + n(trace.top_k) + " entries",
                n(top));
  const int64_t vocab = trace.model.vocab_size;
  for (size_t i = 0; i < record.top.ids.size(); ++i) {
    const int32_t id = record.top.ids[i];
    if (id < 0 || (vocab > 0 && id >= vocab)) {
      throw Error(kSource, where + "top.ids [" + n(int64_t(i)) + "]",
                  "a token id in [0, " + n(vocab) + ")", n(id));
    }
  }
  if (!record.top.texts.empty() && int64_t(record.top.texts.size()) != top) {
    throw Error(kSource, where + "top.texts", "none or " + n(top) + " entries (one per top id)",
                n(int64_t(record.top.texts.size())));
  }
  if (record.argmax < -1 || (vocab > 0 && record.argmax >= vocab)) {
    throw Error(kSource, where + "argmax", "-1 or a token id in [0, " + n(vocab) + ")",
                n(record.argmax));
  }
  if (record.metrics.true_rank < -1 || record.metrics.dense_true_rank < -1) {
    throw Error(kSource, where + "metrics.true_rank", "a rank >= 0, or -1 for none",
                n(std::min(record.metrics.true_rank, record.metrics.dense_true_rank)));
  }
  check_heads(record.kept_heads, layers * heads, where + "kept_heads");
  const int64_t cells = int64_t(record.kept_heads.size()) * record.columns;
  const std::pair<const char*, size_t> rows[] = {{"logits", record.logits.size()},
                                                 {"scores", record.scores.size()},
                                                 {"visible", record.visible.size()}};
  for (const auto& [name, size] : rows) {
    if (int64_t(size) != cells) {
      throw Error(kSource, where + name, n(cells) + " entries (kept heads * columns)",
                  n(int64_t(size)));
    }
  }
  if (!record.log_weights.empty() && int64_t(record.log_weights.size()) != cells) {
    throw Error(kSource, where + "log_weights",
                "none or " + n(cells) + " entries (kept heads * columns)",
                n(int64_t(record.log_weights.size())));
  }
  for (size_t i = 0; i < record.log_weights.size(); ++i) {
    if (!std::isfinite(record.log_weights[i])) {
      throw Error(kSource, where + "log_weights", "a finite value in every entry",
                  "not finite at entry " + n(int64_t(i)));
    }
  }
  for (size_t i = 0; i < record.visible.size(); ++i) {
    if (record.visible[i] > 1) {
      throw Error(kSource, where + "visible", "0 or 1 in every entry",
                  n(record.visible[i]) + " at entry " + n(int64_t(i)));
    }
  }
}

// Keeps only the rows of the heads in `selected` (sorted); the summaries stay as they are.
void keep_only(StepRecord& record, const std::vector<int32_t>& selected) {
  const auto columns = size_t(record.columns);
  size_t out = 0;  // kept rows so far: compacted in place, in kept_heads order
  for (size_t k = 0; k < record.kept_heads.size(); ++k) {
    if (!std::binary_search(selected.begin(), selected.end(), record.kept_heads[k])) continue;
    if (out != k) {
      record.kept_heads[out] = record.kept_heads[k];
      std::copy_n(record.logits.begin() + k * columns, columns,
                  record.logits.begin() + out * columns);
      std::copy_n(record.scores.begin() + k * columns, columns,
                  record.scores.begin() + out * columns);
      std::copy_n(record.visible.begin() + k * columns, columns,
                  record.visible.begin() + out * columns);
      if (!record.log_weights.empty())
        std::copy_n(record.log_weights.begin() + k * columns, columns,
                    record.log_weights.begin() + out * columns);
    }
    ++out;
  }
  record.kept_heads.resize(out);
  // shrink_to_fit: the point of dropping rows is to give their memory back.
  for (auto* rows : {&record.logits, &record.scores}) {
    rows->resize(out * columns);
    rows->shrink_to_fit();
  }
  // Left empty where it was: empty means "no weights at this step".
  if (!record.log_weights.empty()) {
    record.log_weights.resize(out * columns);
    record.log_weights.shrink_to_fit();
  }
  record.visible.resize(out * columns);
  record.visible.shrink_to_fit();
  record.kept_heads.shrink_to_fit();
}

void check_model(const TraceModelInfo& model) {
  const std::pair<const char*, int64_t> sizes[] = {{"model.layers", model.layers},
                                                   {"model.heads", model.heads},
                                                   {"model.kv_heads", model.kv_heads},
                                                   {"model.head_dim", model.head_dim},
                                                   {"model.vocab_size", model.vocab_size}};
  for (const auto& [name, value] : sizes) {
    if (value < 0 || value > std::numeric_limits<int32_t>::max()) {
      throw Error(kSource, name, "a count in [0, 2^31)", n(value));
    }
  }
  // Heads are numbered layer * heads + head in int32 (kept_heads, selected_heads).
  if (model.layers * model.heads > std::numeric_limits<int32_t>::max()) {
    throw Error(kSource, "model.layers * model.heads", "fewer than 2^31 heads in all",
                n(model.layers * model.heads));
  }
}

std::vector<int32_t> sorted_unique(std::vector<int32_t> heads) {
  std::sort(heads.begin(), heads.end());
  heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
  return heads;
}

void check_step(const Trace& trace, const std::vector<StepRecord>& records, int64_t step) {
  if (trace.runs.empty()) throw Error(kSource, "runs", "at least one run before adding steps");
  if (records.size() != trace.runs.size()) {
    throw Error(kSource, "step " + n(step),
                n(int64_t(trace.runs.size())) + " records (one per run)",
                n(int64_t(records.size())));
  }
  for (size_t r = 0; r < records.size(); ++r) check_record(trace, records[r], step, r);
}

}  // namespace

void Trace::check() const {
  check_model(model);
  if (top_k < 0) throw Error(kSource, "top_k", "a count >= 0", n(top_k));
  check_heads(sorted_unique(selected_heads), model.layers * model.heads, "selected_heads");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t id = tokens[i].id;
    if (id < 0 || (model.vocab_size > 0 && id >= model.vocab_size)) {
      throw Error(kSource, "tokens [" + n(int64_t(i)) + "].id",
                  "a token id in [0, " + n(model.vocab_size) + ")", n(id));
    }
  }
  if (coref.present &&
      (coref.answer_token_begin < 0 || coref.answer_token_begin > coref.answer_token_end ||
       coref.answer_token_end > int64_t(tokens.size()))) {
    throw Error(kSource, "coref.answer_token_begin, coref.answer_token_end",
                "0 <= begin <= end <= " + n(int64_t(tokens.size())) + " (the token count)",
                n(coref.answer_token_begin) + ", " + n(coref.answer_token_end));
  }
  for (size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].first_step < 0) {
      throw Error(kSource, "runs [" + n(int64_t(r)) + "].first_step", "a step >= 0",
                  n(runs[r].first_step));
    }
  }
  for (size_t t = 0; t < steps_.size(); ++t) check_step(*this, steps_[t], int64_t(t));
  if (degraded_from_step_ < -1 || degraded_from_step_ >= step_count()) {
    throw Error(kSource, "degraded_from_step",
                "-1 (not degraded) or a step in [0, " + n(step_count()) + ")",
                n(degraded_from_step_));
  }
}

void Trace::add_step(std::vector<StepRecord> records) {
  const int64_t step = step_count();
  check_model(model);
  const std::vector<int32_t> selected = sorted_unique(selected_heads);
  check_heads(selected, model.layers * model.heads, "selected_heads");
  check_step(*this, records, step);

  // A step's records are kept or trimmed together, so that the runs stay comparable head by head
  // at every step; once the trace is degraded every later step is trimmed too (rows only grow
  // with t, and a view should not flicker between full and partial steps).
  size_t step_bytes = 0;
  for (const StepRecord& record : records) step_bytes += record.row_bytes();
  if (degraded_from_step_ >= 0 || row_bytes_ + step_bytes > memory_budget) {
    for (StepRecord& record : records) keep_only(record, selected);
    if (degraded_from_step_ < 0) degraded_from_step_ = step;
    step_bytes = 0;
    for (const StepRecord& record : records) step_bytes += record.row_bytes();
  }
  row_bytes_ += step_bytes;
  steps_.push_back(std::move(records));
}

void Trace::truncate_steps(int64_t count) {
  if (count < 0) throw Error(kSource, "truncate_steps", "a step count >= 0", n(count));
  while (step_count() > count) {
    for (const StepRecord& record : steps_.back()) row_bytes_ -= record.row_bytes();
    const size_t last = steps_.size() - 1;
    if (last < handed_over_bytes_.size()) {
      row_bytes_ -= handed_over_bytes_[last];
      handed_over_bytes_.resize(last);
    }
    steps_.pop_back();
  }
  if (degraded_from_step_ >= count) degraded_from_step_ = -1;
}

std::vector<StepRecord> Trace::hand_over_step(int64_t t) {
  if (t < 0 || t >= step_count()) {
    throw Error(kSource, "hand_over_step", "a recorded step in [0, " + n(step_count()) + ")", n(t));
  }
  handed_over_bytes_.resize(steps_.size(), 0);
  std::vector<StepRecord> handed;
  for (StepRecord& record : steps_[size_t(t)]) {
    handed_over_bytes_[size_t(t)] += record.row_bytes();
    // The rows move; the summaries are copied (a few hundred bytes).
    std::vector<float> logits = std::move(record.logits), scores = std::move(record.scores);
    std::vector<float> log_weights = std::move(record.log_weights);
    std::vector<uint8_t> visible = std::move(record.visible);
    std::vector<int32_t> kept_heads = std::move(record.kept_heads);
    record.logits.clear(), record.scores.clear(), record.visible.clear();
    record.log_weights.clear();
    record.kept_heads.clear();
    StepRecord& out = handed.emplace_back(record);
    out.logits = std::move(logits);
    out.scores = std::move(scores);
    out.visible = std::move(visible);
    out.log_weights = std::move(log_weights);
    out.kept_heads = std::move(kept_heads);
  }
  return handed;
}

}  // namespace kvlens
