// Trace data model and .kvtrace files: hand-built traces (2 runs, 2 layers x 2 heads, a few steps
// with NaN metrics and -inf logits) round-trip exactly; the memory budget trims rows to the
// selected heads; bad records, truncated, damaged and hostile files each give a kvlens::Error.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <utility>

#include "engine/common/error.h"
#include "engine/trace/trace.h"
#include "tests/support/error_message.h"
#include "tests/support/small_trace.h"
#include "tests/support/test_paths.h"

using Catch::Matchers::Contains;
using kvlens::LayerDecision;
using kvlens::StepRecord;
using kvlens::Trace;
using kvlens::test::error_message;

namespace {

constexpr int64_t kLayers = 2, kHeads = 2, kHeadCount = kLayers * kHeads;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Trace make_trace() {
  Trace trace;
  trace.model = {"tiny-llama", kLayers, kHeads, 1, 4, 50};
  trace.coref = {true, 7, 1234, "Mary", 3, 5};
  // A token decoded alone may be a partial UTF-8 sequence: stored as bytes, untouched.
  trace.tokens = {{1, "<s>"}, {17, " Mary"}, {23, " went"}, {4, "\xe2\x82"}, {0, ""}, {9, "."}};
  trace.runs = {{"dense", 0.0, {"sinks=4"}, 0}, {"h2o", 0.5, {"sinks=4", "window=2"}, 1}};
  trace.top_k = 3;
  trace.selected_heads = {2, 1};  // any order in memory; files store them sorted
  return trace;
}

// Distinct values per (step, run, head, column); -inf logits in odd heads' first column.
StepRecord make_record(int64_t step, int run, std::vector<int32_t> kept = {0, 1, 2, 3}) {
  StepRecord record;
  record.columns = step + 1;
  record.decisions = {LayerDecision::Dense,
                      run == 0 ? LayerDecision::Masked : LayerDecision::Skipped};
  for (int64_t i = 0; i < kHeadCount; ++i) {
    record.visible_counts.push_back(int32_t((i + run + step) % (step + 2)));
  }
  record.top.ids = {int32_t(step + run), int32_t(10 + step), int32_t(20 + run)};
  record.top.log_probs = {-0.1f * float(step + 1), -1.5f - float(run), -kInf};
  // Run 1's top ids come with their text (a partial UTF-8 sequence too); run 0's without.
  if (run == 1) record.top.texts = {"a", " b" + std::to_string(step), "\xe2\x82"};
  record.argmax = record.top.ids[0];
  record.metrics.nll = step == 2 ? kNaN : 0.5 + double(step);
  record.metrics.true_rank = step;
  record.metrics.dense_true_rank = run == 0 ? -1 : 2;
  record.metrics.kl_vs_dense = run == 0 ? kNaN : 0.01 * double(step);
  record.metrics.recall_vs_oracle = run == 0 ? kNaN : 0.875;
  record.metrics.classification_accuracy = 0.75;
  record.metrics.consensus = -0.25;
  record.metrics.effective_sparsity = 0.5 * run;
  record.kept_heads = std::move(kept);
  for (int32_t head : record.kept_heads) {
    for (int64_t c = 0; c <= step; ++c) {
      const float logit = float(100 * run + 10 * head + c) + 0.5f * float(step);
      record.logits.push_back(c == 0 && head % 2 == 1 ? -kInf : logit);
      record.scores.push_back(-logit / 8);
      record.visible.push_back(uint8_t((c + head + run) % 2));
    }
  }
  return record;
}

Trace make_trace_with_steps(int64_t steps) {
  Trace trace = make_trace();
  for (int64_t t = 0; t < steps; ++t) trace.add_step({make_record(t, 0), make_record(t, 1)});
  return trace;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
bool same(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

void check_same(const StepRecord& a, const StepRecord& b) {
  CHECK(a.decisions == b.decisions);
  CHECK(a.visible_counts == b.visible_counts);
  CHECK(a.top.ids == b.top.ids);
  CHECK(a.top.texts == b.top.texts);
  CHECK(same_bits(a.top.log_probs, b.top.log_probs));
  CHECK(a.argmax == b.argmax);
  const kvlens::StepMetrics &x = a.metrics, &y = b.metrics;
  CHECK(same(x.nll, y.nll));
  CHECK(x.true_rank == y.true_rank);
  CHECK(x.dense_true_rank == y.dense_true_rank);
  CHECK(same(x.kl_vs_dense, y.kl_vs_dense));
  CHECK(same(x.recall_vs_oracle, y.recall_vs_oracle));
  CHECK(same(x.classification_accuracy, y.classification_accuracy));
  CHECK(same(x.consensus, y.consensus));
  CHECK(same(x.effective_sparsity, y.effective_sparsity));
  CHECK(a.kept_heads == b.kept_heads);
  CHECK(a.columns == b.columns);
  CHECK(same_bits(a.logits, b.logits));  // bitwise: -inf stays -inf
  CHECK(same_bits(a.scores, b.scores));
  CHECK(a.visible == b.visible);
  CHECK(same_bits(a.log_weights, b.log_weights));
}

void check_same(const Trace& a, const Trace& b) {
  CHECK(a.model.name == b.model.name);
  CHECK(a.model.layers == b.model.layers);
  CHECK(a.model.heads == b.model.heads);
  CHECK(a.model.kv_heads == b.model.kv_heads);
  CHECK(a.model.head_dim == b.model.head_dim);
  CHECK(a.model.vocab_size == b.model.vocab_size);
  CHECK(a.coref.present == b.coref.present);
  CHECK(a.coref.sample_index == b.coref.sample_index);
  CHECK(a.coref.seed == b.coref.seed);
  CHECK(a.coref.answer == b.coref.answer);
  CHECK(a.coref.answer_token_begin == b.coref.answer_token_begin);
  CHECK(a.coref.answer_token_end == b.coref.answer_token_end);
  REQUIRE(a.tokens.size() == b.tokens.size());
  for (size_t i = 0; i < a.tokens.size(); ++i) {
    CHECK(a.tokens[i].id == b.tokens[i].id);
    CHECK(a.tokens[i].text == b.tokens[i].text);
  }
  REQUIRE(a.runs.size() == b.runs.size());
  for (size_t r = 0; r < a.runs.size(); ++r) {
    CHECK(a.runs[r].policy == b.runs[r].policy);
    CHECK(a.runs[r].sparsity == b.runs[r].sparsity);
    CHECK(a.runs[r].params == b.runs[r].params);
    CHECK(a.runs[r].first_step == b.runs[r].first_step);
  }
  CHECK(a.top_k == b.top_k);
  CHECK(a.memory_budget == b.memory_budget);
  std::vector<int32_t> selected = a.selected_heads;
  std::sort(selected.begin(), selected.end());
  CHECK(selected == b.selected_heads);
  CHECK(a.row_bytes() == b.row_bytes());
  CHECK(a.degraded_from_step() == b.degraded_from_step());
  REQUIRE(a.step_count() == b.step_count());
  for (int64_t t = 0; t < a.step_count(); ++t) {
    REQUIRE(a.steps()[t].size() == b.steps()[t].size());
    for (size_t r = 0; r < a.steps()[t].size(); ++r) check_same(a.steps()[t][r], b.steps()[t][r]);
  }
}

Trace parse(const std::vector<uint8_t>& bytes) {
  return kvlens::parse_trace(bytes.data(), bytes.size(), "test.kvtrace");
}
std::string parse_error(const std::vector<uint8_t>& bytes) {
  return error_message([&] { parse(bytes); });
}

// The documented checksum, written independently of the engine: IEEE CRC-32, reflected.
uint32_t crc32_ieee(const uint8_t* data, size_t size) {
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}
template <class T>
void poke(std::vector<uint8_t>& bytes, size_t offset, T value) {  // little-endian host
  std::memcpy(bytes.data() + offset, &value, sizeof(T));
}
template <class T>
T peek(const std::vector<uint8_t>& bytes, size_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;
}
// Makes the framing of edited bytes valid again (body size, CRC), so the body's checks are hit.
void reseal(std::vector<uint8_t>& bytes) {
  poke(bytes, 16, uint64_t(bytes.size() - 28));
  poke(bytes, bytes.size() - 4, crc32_ieee(bytes.data(), bytes.size() - 4));
}

// Offset of the first record: everything before the steps is the same as in a trace with no
// steps, whose u64 step count ends 4 bytes before its end.
size_t first_record_offset() {
  return serialize_trace(make_trace()).size() - 4;
}
// A record's size by the documented layout.
size_t texts_size(const StepRecord& r) {
  size_t bytes = 1;  // the texts flag
  for (const std::string& text : r.top.texts) bytes += 4 + text.size();
  return bytes;
}
// Where a record's column count is: after decisions, visible counts, the top-k with its texts,
// argmax and the metrics.
size_t columns_offset(const StepRecord& r) {
  return size_t(kLayers) + 4 * size_t(kHeadCount) + 4 + 8 * r.top.ids.size() + texts_size(r) + 4 +
         64;
}
size_t record_size(const StepRecord& r) {
  const size_t kept = r.kept_heads.size(), cells = kept * size_t(r.columns);
  // (then the log-weights flag, and the log-weights where there are any)
  return columns_offset(r) + 8 + 4 + 4 * kept + 9 * cells + 1 + 4 * r.log_weights.size();
}

}  // namespace

TEST_CASE("trace: row accessors find the kept heads", "[trace]") {
  const StepRecord record = make_record(2, 1, {0, 3});
  CHECK(record.kept_index(0, 0, kHeads) == 0);
  CHECK(record.kept_index(1, 1, kHeads) == 1);
  CHECK(record.kept_index(0, 1, kHeads) == -1);
  CHECK(record.kept_index(0, 2, kHeads) == -1);  // head out of range: no aliasing into layer 1
  CHECK(record.kept_index(-1, 0, kHeads) == -1);
  REQUIRE(record.logits_row(1, 1, kHeads) == record.logits.data() + 3);
  CHECK(record.scores_row(1, 1, kHeads) == record.scores.data() + 3);
  CHECK(record.visible_row(0, 0, kHeads) == record.visible.data());
  CHECK(record.logits_row(1, 1, kHeads)[0] == -kInf);
  CHECK(record.logits_row(0, 1, kHeads) == nullptr);
  CHECK(record.scores_row(1, 0, kHeads) == nullptr);
  CHECK(record.visible_row(1, 0, kHeads) == nullptr);
  CHECK(record.row_bytes() == 2 * 3 * (4 + 4 + 1));
}

TEST_CASE("trace: serialize and parse round-trip every field", "[trace]") {
  const Trace trace = make_trace_with_steps(3);
  CHECK(trace.degraded_from_step() == -1);
  CHECK(trace.row_bytes() == 2 * 4 * (1 + 2 + 3) * 9);
  const std::vector<uint8_t> bytes = serialize_trace(trace);
  CHECK(std::memcmp(bytes.data(), "KVTRACE\0", 8) == 0);
  CHECK(peek<uint32_t>(bytes, 8) == kvlens::kTraceFileVersion);
  CHECK(peek<uint64_t>(bytes, 16) == bytes.size() - 28);
  CHECK(peek<uint32_t>(bytes, bytes.size() - 4) == crc32_ieee(bytes.data(), bytes.size() - 4));
  CHECK(bytes.size() == first_record_offset() + 4 + [&] {
    size_t total = 0;
    for (const auto& step : trace.steps()) {
      for (const auto& record : step) total += record_size(record);
    }
    return total;
  }());
  const Trace back = parse(bytes);
  check_same(trace, back);
  CHECK(std::isnan(back.steps()[2][0].metrics.nll));
  CHECK(serialize_trace(back) == bytes);  // one canonical encoding

  const Trace empty;  // no runs, no steps, default model: a valid (if dull) trace
  check_same(empty, parse(serialize_trace(empty)));
}

TEST_CASE("trace: save and load round-trip through an atomic write", "[trace]") {
  const std::string dir = kvlens::test::make_temp_dir("trace-save");
  const std::string path = dir + "/run.kvtrace";
  const Trace trace = make_trace_with_steps(4);
  kvlens::save_trace(trace, path);
  check_same(trace, kvlens::load_trace(path));
  CHECK_FALSE(std::filesystem::exists(path + ".partial"));

  Trace shorter = trace;  // overwriting replaces the file whole
  shorter.truncate_steps(1);
  kvlens::save_trace(shorter, path);
  check_same(shorter, kvlens::load_trace(path));
}

TEST_CASE("trace: rows larger than the write buffer save and load", "[trace]") {
  Trace trace;
  trace.model = {"wide", 1, 300000, 1, 1, 0};  // 1.2 MB per row block at step 0
  trace.runs = {{}};
  StepRecord record;
  record.columns = 1;
  record.decisions = {LayerDecision::Masked};
  record.visible_counts.assign(300000, 1);
  for (int32_t h = 0; h < 300000; ++h) {
    record.kept_heads.push_back(h);
    record.logits.push_back(float(h));
    record.scores.push_back(-float(h));
    record.visible.push_back(uint8_t(h % 2));
  }
  trace.add_step({record});
  const std::string path = kvlens::test::make_temp_dir("trace-wide") + "/wide.kvtrace";
  kvlens::save_trace(trace, path);
  CHECK(std::filesystem::file_size(path) == serialize_trace(trace).size());
  check_same(trace, kvlens::load_trace(path));
}

TEST_CASE("trace: past the memory budget only the selected heads keep rows", "[trace]") {
  // Full steps cost 2 runs * 4 heads * (t + 1) * 9 bytes: 72, 144, 216, 288... cumulative 72,
  // 216, 432, 720. A budget of 432 keeps steps 0-2 whole; step 3 would pass it.
  Trace trace = make_trace();
  trace.memory_budget = 432;
  for (int64_t t = 0; t < 5; ++t) trace.add_step({make_record(t, 0), make_record(t, 1)});
  CHECK(trace.degraded_from_step() == 3);
  for (int64_t t = 0; t < 3; ++t) {
    for (const StepRecord& record : trace.steps()[t]) CHECK(record.kept_heads.size() == 4);
  }
  for (int64_t t = 3; t < 5; ++t) {
    for (int run = 0; run < 2; ++run) {
      const StepRecord& record = trace.steps()[t][run];
      const StepRecord full = make_record(t, run);
      CHECK(record.kept_heads == std::vector<int32_t>{1, 2});
      CHECK(record.logits_row(0, 0, kHeads) == nullptr);
      CHECK(record.logits_row(1, 1, kHeads) == nullptr);
      for (auto [layer, head] : {std::pair{0, 1}, std::pair{1, 0}}) {
        const auto begin = size_t((layer * kHeads + head) * (t + 1)), size = size_t(t + 1);
        REQUIRE(record.logits_row(layer, head, kHeads) != nullptr);
        CHECK(std::memcmp(record.logits_row(layer, head, kHeads), full.logits.data() + begin,
                          size * 4) == 0);
        CHECK(std::memcmp(record.scores_row(layer, head, kHeads), full.scores.data() + begin,
                          size * 4) == 0);
        CHECK(std::memcmp(record.visible_row(layer, head, kHeads), full.visible.data() + begin,
                          size) == 0);
      }
      // Summaries are always kept.
      CHECK(record.decisions == full.decisions);
      CHECK(record.visible_counts == full.visible_counts);
      CHECK(record.top.ids == full.top.ids);
      CHECK(record.metrics.true_rank == full.metrics.true_rank);
      CHECK(record.columns == t + 1);
    }
  }
  CHECK(trace.row_bytes() == 432 + 2 * 2 * (4 + 5) * 9);  // selected rows may pass the budget
  check_same(trace, parse(serialize_trace(trace)));       // degradation is saved as it is

  trace.truncate_steps(3);  // back before the budget ran out: whole again
  CHECK(trace.step_count() == 3);
  CHECK(trace.degraded_from_step() == -1);
  CHECK(trace.row_bytes() == 432);
  trace.add_step({make_record(3, 0), make_record(3, 1)});
  CHECK(trace.degraded_from_step() == 3);
  CHECK(error_message([&] { trace.truncate_steps(-1); }).find("truncate_steps") !=
        std::string::npos);

  Trace none = make_trace();  // no budget and no selected heads: summaries only
  none.memory_budget = 0;
  none.selected_heads.clear();
  none.add_step({make_record(0, 0), make_record(0, 1)});
  CHECK(none.degraded_from_step() == 0);
  CHECK(none.row_bytes() == 0);
  CHECK(none.steps()[0][1].kept_heads.empty());
  CHECK(none.steps()[0][1].top.ids == make_record(0, 1).top.ids);
}

TEST_CASE("trace: steps handed over keep the budget's decisions in both traces", "[trace]") {
  // A recording that hands every step to a reader's trace (the app) holds the rows once: the
  // reader's trace equals the one recorded without hand-over, budget trimming included.
  Trace whole = make_trace(), recorded = make_trace(), reader = make_trace();
  for (Trace* trace : {&whole, &recorded, &reader}) trace->memory_budget = 432;
  for (int64_t t = 0; t < 5; ++t) {
    whole.add_step({make_record(t, 0), make_record(t, 1)});
    recorded.add_step({make_record(t, 0), make_record(t, 1)});
    reader.add_step(recorded.hand_over_step(t));
  }
  CHECK(reader.row_bytes() == whole.row_bytes());
  CHECK(reader.degraded_from_step() == 3);
  CHECK(recorded.row_bytes() == whole.row_bytes());
  CHECK(recorded.degraded_from_step() == 3);
  for (size_t t = 0; t < 5; ++t) {
    for (size_t r = 0; r < 2; ++r) {
      check_same(whole.steps()[t][r], reader.steps()[t][r]);
      const StepRecord& record = recorded.steps()[t][r];
      CHECK(record.kept_heads.empty());
      CHECK(record.logits.empty());
      CHECK(record.visible_counts == whole.steps()[t][r].visible_counts);
    }
  }
  recorded.check();  // still a consistent trace (summaries only)
  recorded.truncate_steps(3);
  CHECK(recorded.row_bytes() == 432);
  CHECK(recorded.degraded_from_step() == -1);
  recorded.add_step({make_record(3, 0), make_record(3, 1)});
  CHECK(recorded.degraded_from_step() == 3);  // the handed rows still count
  CHECK(error_message([&] { recorded.hand_over_step(4); }).find("hand_over_step") !=
        std::string::npos);
  CHECK(error_message([&] { recorded.hand_over_step(-1); }).find("[0, 4)") != std::string::npos);
}

TEST_CASE("trace: add_step rejects records that do not fit the trace", "[trace]") {
  Trace trace = make_trace_with_steps(1);
  const auto add_error = [&](auto&& edit, int run = 1) {
    std::vector<StepRecord> records = {make_record(1, 0), make_record(1, 1)};
    edit(records[size_t(run)]);
    return error_message([&] { trace.add_step(records); });
  };
  CHECK_THAT(add_error([](StepRecord& r) { r.decisions.pop_back(); }),
             Contains("step 1 run 1: decisions") && Contains("expected 2 (model.layers)"));
  CHECK_THAT(add_error([](StepRecord& r) { r.decisions[1] = LayerDecision(7); }),
             Contains("step 1 run 1: decisions [1]") && Contains("found 7"));
  CHECK_THAT(add_error([](StepRecord& r) { r.visible_counts.push_back(0); }),
             Contains("visible_counts: expected 4 (layers * heads)"));
  CHECK_THAT(add_error([](StepRecord& r) { r.visible_counts[2] = 3; }),
             Contains("visible_counts [2]: expected a count in [0, 2]"));
  CHECK_THAT(add_error([](StepRecord& r) { r.columns = 1; }, 0),
             Contains("step 1 run 0: columns: expected 2 (step + 1), found 1"));
  CHECK_THAT(add_error([](StepRecord& r) { std::swap(r.kept_heads[0], r.kept_heads[1]); }),
             Contains("step 1 run 1: kept_heads [1]") && Contains("increasing"));
  CHECK_THAT(add_error([](StepRecord& r) { r.kept_heads[3] = 2; }),
             Contains("kept_heads [3]") && Contains("without repeats"));
  CHECK_THAT(add_error([](StepRecord& r) { r.kept_heads[3] = 4; }),
             Contains("kept_heads [3]: expected a head (layer * heads + head) in [0, 4)"));
  CHECK_THAT(add_error([](StepRecord& r) { r.logits.pop_back(); }),
             Contains("logits: expected 8 entries (kept heads * columns), found 7"));
  CHECK_THAT(add_error([](StepRecord& r) { r.scores.push_back(0); }), Contains("run 1: scores"));
  CHECK_THAT(add_error([](StepRecord& r) { r.visible[3] = 2; }),
             Contains("run 1: visible: expected 0 or 1"));
  CHECK_THAT(add_error([](StepRecord& r) { r.top.log_probs.pop_back(); }),
             Contains("top.log_probs: expected 3 entries"));
  CHECK_THAT(add_error([](StepRecord& r) { r.top.texts = {"only one"}; }),
             Contains("top.texts: expected none or 3 entries (one per top id), found 1"));
  CHECK_THAT(add_error([](StepRecord& r) {
               r.top.ids.push_back(1);
               r.top.log_probs.push_back(-9);
             }),
             Contains("top.ids: expected at most top_k = 3 entries, found 4"));
  CHECK_THAT(add_error([](StepRecord& r) { r.top.ids[1] = 50; }),
             Contains("top.ids [1]: expected a token id in [0, 50)"));
  CHECK_THAT(add_error([](StepRecord& r) { r.argmax = -2; }), Contains("run 1: argmax"));
  CHECK_THAT(add_error([](StepRecord& r) { r.metrics.true_rank = -5; }),
             Contains("metrics.true_rank"));
  CHECK_THAT(error_message([&] { trace.add_step({make_record(1, 0)}); }),
             Contains("trace: step 1: expected 2 records (one per run), found 1"));
  trace.selected_heads = {9};
  CHECK_THAT(error_message([&] {
               trace.add_step({make_record(1, 0), make_record(1, 1)});
             }),
             Contains("selected_heads [0]"));
  CHECK(trace.step_count() == 1);  // nothing was added by a failed call

  Trace no_runs;
  CHECK_THAT(error_message([&] { no_runs.add_step({}); }),
             Contains("runs: expected at least one run"));
}

TEST_CASE("trace: serialize refuses a trace edited out of shape", "[trace]") {
  Trace trace = make_trace_with_steps(2);
  trace.model.layers = 3;  // records hold 2 decisions each: load_trace would refuse the file
  CHECK_THAT(error_message([&] { serialize_trace(trace); }),
             Contains("step 0 run 0: decisions: expected 3 (model.layers)"));
  const std::string path = kvlens::test::make_temp_dir("trace-refuse") + "/bad.kvtrace";
  CHECK_THAT(error_message([&] { kvlens::save_trace(trace, path); }), Contains("decisions"));
  CHECK_FALSE(std::filesystem::exists(path));
  CHECK_FALSE(std::filesystem::exists(path + ".partial"));

  trace = make_trace_with_steps(1);
  trace.tokens[2].id = 50;
  CHECK_THAT(error_message([&] { serialize_trace(trace); }), Contains("tokens [2].id"));
  trace = make_trace_with_steps(1);
  trace.coref.answer_token_end = 7;
  CHECK_THAT(error_message([&] { serialize_trace(trace); }), Contains("coref.answer_token_begin"));
}

TEST_CASE("trace: every truncated prefix of a file is rejected", "[trace]") {
  const std::vector<uint8_t> bytes = serialize_trace(make_trace_with_steps(3));
  for (size_t size = 0; size < bytes.size(); ++size) {
    INFO("prefix of " << size << " bytes");
    const std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + ptrdiff_t(size));
    CHECK_THAT(parse_error(prefix), Contains("test.kvtrace") && Contains("truncated file"));
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  CHECK_THAT(parse_error(longer), Contains("end of file") && Contains("1 trailing bytes"));
}

TEST_CASE("trace: damaged bytes are always detected", "[trace]") {
  const std::vector<uint8_t> bytes = serialize_trace(make_trace_with_steps(3));
  for (size_t offset = 0; offset < bytes.size(); ++offset) {
    for (uint8_t mask : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xff)}) {
      INFO("offset " << offset << " mask " << int(mask));
      std::vector<uint8_t> damaged = bytes;
      damaged[offset] ^= mask;
      error_message([&] { parse(damaged); });
    }
  }
  std::vector<uint8_t> damaged = bytes;
  damaged[100] ^= 0x10;
  CHECK_THAT(parse_error(damaged), Contains("test.kvtrace: checksum: expected CRC-32"));
}

TEST_CASE("trace: bad magic, version and flags are named", "[trace]") {
  std::vector<uint8_t> bytes = serialize_trace(make_trace_with_steps(1));
  std::vector<uint8_t> other = bytes;
  std::memcpy(other.data(), "PK\x03\x04", 4);
  CHECK_THAT(parse_error(other),
             Contains("test.kvtrace: magic: expected a .kvtrace file (magic KVTRACE)") &&
                 Contains("50 4b 03 04"));
  CHECK_THAT(parse_error({'{', '}'}), Contains("magic"));
  other = bytes;
  poke(other, 8, uint32_t(3));
  poke(other, 8, uint32_t(4));
  CHECK_THAT(parse_error(other), Contains("version: expected version 1 to 3, found 4"));
  poke(other, 8, uint32_t(0));
  CHECK_THAT(parse_error(other), Contains("version: expected version 1 to 3, found 0"));
  other = bytes;
  poke(other, 12, uint32_t(1));
  CHECK_THAT(parse_error(other), Contains("flags: expected 0"));
}

TEST_CASE("trace: hostile bodies with a valid checksum name the field", "[trace]") {
  const Trace trace = make_trace_with_steps(2);
  const std::vector<uint8_t> bytes = serialize_trace(trace);
  const size_t record0 = first_record_offset();
  const size_t record1 = record0 + record_size(trace.steps()[0][0]);
  const size_t step1 = record1 + record_size(trace.steps()[0][1]);
  const size_t step1_run1 = step1 + record_size(trace.steps()[1][0]);
  const size_t columns_at = columns_offset(trace.steps()[1][1]);
  const auto edited = [&](auto&& edit) {
    std::vector<uint8_t> copy = bytes;
    edit(copy);
    reseal(copy);
    return parse_error(copy);
  };
  CHECK(peek<uint64_t>(bytes, record0 - 8) == 2);  // the step count just before the records
  CHECK(peek<int64_t>(bytes, step1_run1 + columns_at) == 2);
  CHECK_NOTHROW(parse([&] {  // resealing alone changes nothing
    std::vector<uint8_t> copy = bytes;
    reseal(copy);
    return copy;
  }()));

  CHECK_THAT(
      edited([&](auto& b) { b[record1 + 1] = 7; }),
      Contains("step 0 run 1: decisions [1]: expected a decision value") && Contains("found 7"));
  CHECK_THAT(edited([&](auto& b) { poke(b, step1_run1 + columns_at, int64_t(5)); }),
             Contains("step 1 run 1: columns: expected 2 (step + 1), found 5"));
  CHECK_THAT(edited([&](auto& b) { poke(b, step1_run1 + columns_at + 8 + 4, int32_t(3)); }),
             Contains("step 1 run 1: kept_heads [1]") && Contains("increasing"));
  CHECK_THAT(edited([&](auto& b) { poke(b, step1_run1 + columns_at + 8, uint32_t(0x7fffffff)); }),
             Contains("step 1 run 1: kept_heads count"));
  CHECK_THAT(edited([&](auto& b) { poke(b, step1 + 2, int32_t(99)); }),
             Contains("test.kvtrace: step 1 run 0: visible_counts [0]"));
  CHECK_THAT(edited([&](auto& b) { poke(b, step1 + 18, uint32_t(1) << 30); }),
             Contains("step 1 run 0: top count"));
  CHECK_THAT(edited([&](auto& b) { poke(b, record0 - 8, uint64_t(1) << 40); }),
             Contains("step count: expected a count whose entries fit"));
  const auto longer = [](auto& b) { b.insert(b.end() - 4, {1, 2, 3}); };
  CHECK_THAT(edited(longer),
             Contains("end of body: expected no bytes after the last step, found 3 bytes"));
  // One byte short: the last record's log-weights flag is missing; set, its weights are; not 0
  // or 1, it is named.
  CHECK_THAT(edited([](auto& b) { b.erase(b.end() - 5); }),
             Contains("step 1 run 1: log_weights present: expected 1 more bytes"));
  CHECK_THAT(edited([](auto& b) { b[b.size() - 5] = 1; }),
             Contains("step 1 run 1: log_weights: expected"));
  CHECK_THAT(edited([](auto& b) { b[b.size() - 5] = 2; }),
             Contains("step 1 run 1: log_weights present"));
  // Two bytes short: the last record's kept heads no longer fit in what is left.
  const auto shorter = [](auto& b) { b.erase(b.end() - 6, b.end() - 4); };
  CHECK_THAT(edited(shorter), Contains("step 1 run 1: kept_heads count: expected a count whose "
                                       "entries fit in the 87 bytes left, found 4 entries of at "
                                       "least 22 bytes"));
  // Header fields: the model name's length, then layers (8 bytes after a 10-byte name).
  CHECK_THAT(edited([&](auto& b) { poke(b, 24, uint32_t(1) << 31); }), Contains("model.name"));
  CHECK_THAT(edited([&](auto& b) { poke(b, 24 + 4 + 10, int64_t(-1)); }),
             Contains("model.layers, model.heads"));
  CHECK_THAT(edited([&](auto& b) { poke(b, 24 + 4 + 10 + 8, int64_t(1) << 40); }),
             Contains("model.layers, model.heads"));
}

TEST_CASE("trace: file errors name the path", "[trace]") {
  const std::string dir = kvlens::test::make_temp_dir("trace-files");
  CHECK_THAT(error_message([&] { kvlens::load_trace(dir + "/missing.kvtrace"); }),
             Contains(dir + "/missing.kvtrace"));
  const Trace trace = make_trace_with_steps(1);
  // The parent is a regular file: no directory to write into, whoever runs the test.
  std::ofstream(dir + "/plain") << "x";
  CHECK_THAT(error_message([&] { kvlens::save_trace(trace, dir + "/plain/run.kvtrace"); }),
             Contains(dir + "/plain/run.kvtrace: file: expected a writable location"));
  // The target is a directory: the rename fails, the partial file is removed, nothing is lost.
  std::filesystem::create_directory(dir + "/taken.kvtrace");
  CHECK_THAT(error_message([&] { kvlens::save_trace(trace, dir + "/taken.kvtrace"); }),
             Contains("taken.kvtrace: file: expected to rename"));
  CHECK(std::filesystem::is_directory(dir + "/taken.kvtrace"));
  CHECK_FALSE(std::filesystem::exists(dir + "/taken.kvtrace.partial"));
  std::ofstream(dir + "/garbage.kvtrace") << "not a trace at all, just some text";
  CHECK_THAT(error_message([&] { kvlens::load_trace(dir + "/garbage.kvtrace"); }),
             Contains(dir + "/garbage.kvtrace: magic"));
}

// The fuzzer's seeds (tests/fuzz/corpus_kvtrace) must stay valid traces of the current format.
// KVLENS_WRITE_KVTRACE_CORPUS=1 rewrites them from the traces built here.
TEST_CASE("trace: the fuzz seed corpus holds valid traces", "[trace]") {
  Trace degraded = make_trace();
  degraded.memory_budget = 100;
  for (int64_t t = 0; t < 3; ++t) degraded.add_step({make_record(t, 0), make_record(t, 1)});
  Trace plain = make_trace_with_steps(2);
  plain.coref = {};
  const std::pair<const char*, const Trace*> seeds[] = {{"two_runs.kvtrace", &plain},
                                                        {"degraded.kvtrace", &degraded}};
  const std::string dir = kvlens::test::source_path("tests/fuzz/corpus_kvtrace");
  if (const char* write = std::getenv("KVLENS_WRITE_KVTRACE_CORPUS"); write && *write == '1') {
    std::filesystem::create_directories(dir);
    for (const auto& [name, trace] : seeds) kvlens::save_trace(*trace, dir + "/" + name);
    kvlens::save_trace(Trace{}, dir + "/empty.kvtrace");
  }
  for (const auto& [name, trace] : seeds) {
    INFO(name);
    check_same(*trace, kvlens::load_trace(dir + "/" + name));
  }
  CHECK(kvlens::load_trace(dir + "/empty.kvtrace").step_count() == 0);
}

TEST_CASE("trace: version 1 files, without top-k texts, still load", "[trace]") {
  // Written by the version 1 writer from the small view-test trace (3 steps, 2 runs).
  const Trace old =
      kvlens::load_trace(kvlens::test::source_path("tests/fixtures/trace_v1_small.kvtrace"));
  const Trace now = kvlens::test::make_small_trace(3);
  REQUIRE(old.step_count() == 3);
  REQUIRE(old.runs.size() == 2);
  CHECK(old.tokens.size() == now.tokens.size());
  for (int64_t t = 0; t < 3; ++t) {
    for (size_t r = 0; r < 2; ++r) {
      const StepRecord &a = old.steps()[size_t(t)][r], &b = now.steps()[size_t(t)][r];
      CHECK(a.top.ids == b.top.ids);
      CHECK(a.top.texts.empty());
      CHECK(same_bits(a.logits, b.logits));
      CHECK(a.visible == b.visible);
    }
  }
  // Written again, it is a file of the current version with the same content.
  const std::vector<uint8_t> bytes = serialize_trace(old);
  CHECK(peek<uint32_t>(bytes, 8) == kvlens::kTraceFileVersion);
  check_same(old, parse(bytes));
}

TEST_CASE("trace: log-weights round-trip, follow the kept heads and are checked", "[trace]") {
  // A weighting run (magicpig) at step 1: run 1's rows get log-weights (0 where exact).
  Trace trace = make_trace_with_steps(1);
  std::vector<StepRecord> records = {make_record(1, 0), make_record(1, 1)};
  const size_t cells = records[1].kept_heads.size() * size_t(records[1].columns);
  records[1].log_weights.assign(cells, 0.0f);
  records[1].log_weights[1] = 0.75f;
  const size_t bytes_before = trace.row_bytes();
  trace.add_step(records);
  CHECK(trace.row_bytes() - bytes_before == records[0].row_bytes() + records[1].row_bytes());
  CHECK(records[1].row_bytes() == cells * (4 + 4 + 4 + 1));
  const StepRecord& kept = trace.steps()[1][1];
  REQUIRE(kept.log_weights_row(0, 0, kHeads) != nullptr);
  CHECK(kept.log_weights_row(0, 0, kHeads)[1] == 0.75f);
  CHECK(trace.steps()[1][0].log_weights_row(0, 0, kHeads) == nullptr);  // none: not weighted
  const std::vector<uint8_t> bytes = serialize_trace(trace);
  check_same(trace, parse(bytes));
  // Handed over, the weights move with the rows.
  Trace copy = parse(bytes);
  const std::vector<StepRecord> handed = copy.hand_over_step(1);
  CHECK(handed[1].log_weights == kept.log_weights);
  CHECK(copy.steps()[1][1].log_weights.empty());

  const auto add_error = [&](auto&& edit) {
    Trace fresh = make_trace_with_steps(1);
    std::vector<StepRecord> bad = records;
    edit(bad[1]);
    return error_message([&] { fresh.add_step(bad); });
  };
  CHECK_THAT(add_error([](StepRecord& r) { r.log_weights.pop_back(); }),
             Contains("step 1 run 1: log_weights") && Contains("none or"));
  CHECK_THAT(add_error([](StepRecord& r) { r.log_weights[2] = kInf; }),
             Contains("step 1 run 1: log_weights") && Contains("finite"));
}

TEST_CASE("trace: past the memory budget the log-weights keep the selected heads' rows",
          "[trace]") {
  Trace trace = make_trace();
  trace.selected_heads = {3};
  trace.memory_budget = 1;  // every step trimmed
  StepRecord weighted = make_record(0, 1);
  weighted.log_weights.assign(weighted.kept_heads.size() * size_t(weighted.columns), 0.0f);
  weighted.log_weights.back() = 2.0f;  // head 3's (the last kept) last column
  trace.add_step({make_record(0, 0), weighted});
  const StepRecord& kept = trace.steps()[0][1];
  REQUIRE(kept.kept_heads == std::vector<int32_t>{3});
  REQUIRE(kept.log_weights.size() == size_t(kept.columns));
  CHECK(kept.log_weights.back() == 2.0f);
  CHECK(trace.steps()[0][0].log_weights.empty());
}
