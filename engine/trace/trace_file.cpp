// .kvtrace files: a Trace written as one checksummed little-endian binary, readable without the
// model or a GPU. The reader checks every count against the bytes left before allocating, so a
// hostile file costs at most a few times its own size in memory and never crashes.
//
// Layout, version 3 (version 2, still read, lacks the log-weights; version 1 also the top-k
// texts). Integers are little-endian
// two's complement; f32/f64 are IEEE 754 binary32/ binary64 bit patterns, little-endian (NaN and
// +-inf allowed); str = u32 byte length, then that many bytes of UTF-8 (token texts may hold a
// partial UTF-8 sequence: a token decoded alone); T[n] = n values of T back to back, no padding
// anywhere.
//
//   offset 0   u8[8]  magic "KVTRACE\0" (4B 56 54 52 41 43 45 00)
//   offset 8   u32    version = 3 (1 and 2 are read too)
//   offset 12  u32    flags = 0 (none defined; readers reject others)
//   offset 16  u64    B = body bytes
//   offset 24  u8[B]  body, below
//   offset 24+B u32   CRC-32 (zlib / IEEE 802.3, as zlib's crc32()) of bytes [0, 24 + B)
//   the file ends there: its size is exactly 28 + B.
//
// Body (L = model.layers, H = model.heads, R = run count; a head is numbered l * H + h):
//   model      str name; i64 layers L, heads H, kv_heads, head_dim, vocab_size
//   i64 top_k; u64 memory_budget (row bytes); i64 degraded_from_step (-1: none)
//   u32 S; i32[S] selected_heads (strictly increasing, each in [0, L*H))
//   coref      u8 present (0 or 1); i64 sample_index; u64 seed; str answer;
//              i64 answer_token_begin, answer_token_end   (token range [begin, end))
//   u64 N; N tokens:  i32 id; str text
//   u32 R; R runs:    str policy; f64 sparsity; u32 P; str[P] params ("key=value");
//                     i64 first_step
//   u64 T; then for t in [0, T), for r in [0, R), the StepRecord of run r at step t:
//     u8[L]      decisions (0 dense, 1 masked, 2 skipped)
//     i32[L*H]   visible_counts (tokens each head saw, in [0, t + 1])
//     u32 K; i32[K] top ids; f32[K] top natural-log probabilities (K <= top_k)
//     u8 texts (0 or 1; version 2 only); when 1, str[K]: each top id's text as decoded alone
//     i32        argmax (-1: none)
//     f64 nll; i64 true_rank; i64 dense_true_rank; f64 kl_vs_dense; f64 recall_vs_oracle;
//     f64 classification_accuracy; f64 consensus; f64 effective_sparsity (NaN: not applicable)
//     i64 C      columns, always t + 1
//     u32 E; i32[E] kept_heads (strictly increasing, each in [0, L*H))
//     f32[E*C] logits; f32[E*C] scores; u8[E*C] visible (0 or 1); each row-major [kept][column]
//     u8 weighted (0 or 1; version 3 only); when 1, f32[E*C] log_weights (finite; row-major)
//   The body ends right after the last record.
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/trace/trace.h"

namespace kvlens {
namespace {

constexpr uint8_t kMagic[8] = {'K', 'V', 'T', 'R', 'A', 'C', 'E', 0};
constexpr size_t kHeaderBytes = 24, kChecksumBytes = 4;

std::string n(uint64_t value) {
  return std::to_string(value);
}
std::string n(int64_t value) {
  return std::to_string(value);
}

uint32_t crc32_of(uint32_t crc, const uint8_t* data, size_t size) {
  // zlib's crc32 takes a uInt length: feed it in chunks so files past 4 GiB work.
  while (size > 0) {
    const auto chunk = uInt(std::min<size_t>(size, 1u << 30));
    crc = uint32_t(crc32(crc, data, chunk));
    data += chunk;
    size -= chunk;
  }
  return crc;
}

// Writes the format to one of three sinks: counting only (the body size goes in the header before
// the body), a memory buffer, or a FILE* (buffered; the CRC runs over each chunk as it leaves).
class Writer {
 public:
  enum class Sink { Count, Memory, File };
  explicit Writer(Sink sink, std::FILE* file = nullptr, std::string path = {})
      : sink_(sink), file_(file), path_(std::move(path)) {}

  void bytes(const void* data, size_t size) {
    total_ += size;
    if (sink_ == Sink::Count || size == 0) return;
    const auto* p = static_cast<const uint8_t*>(data);
    if (sink_ == Sink::File && buffer_.size() + size > kChunk) {
      flush();
      if (size >= kChunk) return emit(p, size);  // a large row block goes straight out
    }
    buffer_.insert(buffer_.end(), p, p + size);
  }
  template <class T>
  void put(T value) {
    static_assert(std::is_arithmetic_v<T>);
    uint8_t out[sizeof(T)];
    std::memcpy(out, &value, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(out, out + sizeof(T));
    bytes(out, sizeof(T));
  }
  template <class T>
  void array(const std::vector<T>& values) {
    if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) {
      bytes(values.data(), values.size() * sizeof(T));
    } else {
      for (const T& value : values) put(value);
    }
  }
  void str(const std::string& text) {
    put(uint32_t(text.size()));
    bytes(text.data(), text.size());
  }
  // The CRC of everything written so far (Memory and File sinks).
  uint32_t checksum() {
    if (sink_ == Sink::Memory) return crc32_of(0, buffer_.data(), buffer_.size());
    flush();
    return crc_;
  }
  void flush() {
    if (sink_ == Sink::File && !buffer_.empty()) emit(buffer_.data(), buffer_.size());
    if (sink_ == Sink::File) buffer_.clear();
  }
  uint64_t total() const { return total_; }
  std::vector<uint8_t> take() { return std::move(buffer_); }
  void reserve(size_t size) { buffer_.reserve(size); }

 private:
  static constexpr size_t kChunk = 1 << 20;
  void emit(const uint8_t* data, size_t size) {
    crc_ = crc32_of(crc_, data, size);
    if (std::fwrite(data, 1, size, file_) != size) {
      throw Error(path_, "file", "a writable file", std::strerror(errno));
    }
  }
  Sink sink_;
  std::FILE* file_;
  std::string path_;
  std::vector<uint8_t> buffer_;
  uint32_t crc_ = 0;
  uint64_t total_ = 0;
};

void write_body(const Trace& trace, Writer& out) {
  const TraceModelInfo& m = trace.model;
  out.str(m.name);
  for (int64_t v : {m.layers, m.heads, m.kv_heads, m.head_dim, m.vocab_size}) out.put(v);
  out.put(trace.top_k);
  out.put(trace.memory_budget);
  out.put(trace.degraded_from_step());
  std::vector<int32_t> selected = trace.selected_heads;
  std::sort(selected.begin(), selected.end());
  selected.erase(std::unique(selected.begin(), selected.end()), selected.end());
  out.put(uint32_t(selected.size()));
  out.array(selected);

  const TraceCorefInfo& c = trace.coref;
  out.put(uint8_t(c.present ? 1 : 0));
  out.put(c.sample_index);
  out.put(c.seed);
  out.str(c.answer);
  out.put(c.answer_token_begin);
  out.put(c.answer_token_end);

  out.put(uint64_t(trace.tokens.size()));
  for (const TraceToken& token : trace.tokens) {
    out.put(token.id);
    out.str(token.text);
  }
  out.put(uint32_t(trace.runs.size()));
  for (const TraceRun& run : trace.runs) {
    out.str(run.policy);
    out.put(run.sparsity);
    out.put(uint32_t(run.params.size()));
    for (const std::string& param : run.params) out.str(param);
    out.put(run.first_step);
  }

  out.put(uint64_t(trace.step_count()));
  for (const std::vector<StepRecord>& step : trace.steps()) {
    for (const StepRecord& record : step) {
      for (LayerDecision decision : record.decisions) out.put(uint8_t(decision));
      out.array(record.visible_counts);
      out.put(uint32_t(record.top.ids.size()));
      out.array(record.top.ids);
      out.array(record.top.log_probs);
      out.put(uint8_t(!record.top.texts.empty()));
      for (const std::string& text : record.top.texts) out.str(text);
      out.put(record.argmax);
      const StepMetrics& s = record.metrics;
      out.put(s.nll);
      out.put(s.true_rank);
      out.put(s.dense_true_rank);
      for (double v : {s.kl_vs_dense, s.recall_vs_oracle, s.classification_accuracy, s.consensus,
                       s.effective_sparsity}) {
        out.put(v);
      }
      out.put(record.columns);
      out.put(uint32_t(record.kept_heads.size()));
      out.array(record.kept_heads);
      out.array(record.logits);
      out.array(record.scores);
      out.array(record.visible);
      out.put(uint8_t(!record.log_weights.empty()));
      if (!record.log_weights.empty()) out.array(record.log_weights);
    }
  }
}

// Header, body and checksum; the trace has been check()ed.
void write_trace(const Trace& trace, Writer& out) {
  Writer counter(Writer::Sink::Count);
  write_body(trace, counter);
  out.reserve(size_t(kHeaderBytes + counter.total() + kChecksumBytes));
  out.bytes(kMagic, sizeof(kMagic));
  out.put(kTraceFileVersion);
  out.put(uint32_t(0));
  out.put(counter.total());
  write_body(trace, out);
  out.put(out.checksum());
  out.flush();
}

// Reads the body. Every count is checked against the bytes left before anything is allocated;
// errors name the source, the field (prefixed by "step t run r" inside a record) and the
// expectation.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, const std::string& source)
      : p_(data), end_(data + size), source_(source) {}

  void scope(std::string scope) { scope_ = std::move(scope); }
  size_t left() const { return size_t(end_ - p_); }

  [[noreturn]] void fail(std::string_view field, const std::string& expected,
                         const std::string& found = {}) const {
    std::string name(field);
    if (!scope_.empty()) name = scope_ + ": " + name;
    throw Error(source_, name, expected, found);
  }
  void need(uint64_t size, std::string_view field) const {
    if (size > left()) {
      fail(field, n(size) + " more bytes in the body",
           n(uint64_t(left())) + " (inconsistent sizes or a damaged file)");
    }
  }
  template <class T>
  T get(std::string_view field) {
    need(sizeof(T), field);
    uint8_t in[sizeof(T)];
    std::memcpy(in, p_, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) std::reverse(in, in + sizeof(T));
    p_ += sizeof(T);
    T value;
    std::memcpy(&value, in, sizeof(T));
    return value;
  }
  std::string str(std::string_view field) {
    const auto size = get<uint32_t>(std::string(field) + " length");
    need(size, field);
    std::string text(reinterpret_cast<const char*>(p_), size);
    p_ += size;
    return text;
  }
  // A count of items taking at least `item_bytes` each, all of which must fit in what is left.
  size_t count(uint64_t value, uint64_t item_bytes, std::string_view field) const {
    if (item_bytes > 0 && value > left() / item_bytes) {
      fail(field, "a count whose entries fit in the " + n(uint64_t(left())) + " bytes left",
           n(value) + " entries of at least " + n(item_bytes) + " bytes");
    }
    return size_t(value);
  }
  template <class T>
  void array(std::vector<T>& out, uint64_t count, std::string_view field) {
    need(count > left() / sizeof(T) ? left() + 1 : count * sizeof(T), field);  // no overflow
    out.resize(size_t(count));
    if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) {
      if (count > 0) std::memcpy(out.data(), p_, size_t(count) * sizeof(T));
      p_ += size_t(count) * sizeof(T);
    } else {
      for (T& value : out) value = get<T>(field);
    }
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  const std::string& source_;
  std::string scope_;
};

// Strictly increasing heads in [0, head_count): what the writer produces.
void check_heads(const Reader& in, const std::vector<int32_t>& heads, int64_t head_count,
                 std::string_view field) {
  for (size_t i = 0; i < heads.size(); ++i) {
    if (heads[i] < 0 || heads[i] >= head_count || (i > 0 && heads[i] <= heads[i - 1])) {
      in.fail(std::string(field) + " [" + n(uint64_t(i)) + "]",
              "increasing heads in [0, " + n(head_count) + ") (layer * heads + head)",
              n(int64_t(heads[i])));
    }
  }
}

bool read_bool(Reader& in, const std::string& field) {
  const auto value = in.get<uint8_t>(field);
  if (value > 1) in.fail(field, "0 or 1", n(uint64_t(value)));
  return value == 1;
}

StepRecord read_record(Reader& in, const TraceModelInfo& model, int64_t step, uint32_t version) {
  const int64_t layers = model.layers, heads = model.layers * model.heads;
  StepRecord record;
  std::vector<uint8_t> decisions;
  in.array(decisions, uint64_t(layers), "decisions");
  for (size_t l = 0; l < decisions.size(); ++l) {
    if (decisions[l] > uint8_t(LayerDecision::Skipped)) {
      in.fail("decisions [" + n(uint64_t(l)) + "]",
              "a decision value of 0 (dense), 1 (masked) or 2 (skipped)",
              n(uint64_t(decisions[l])));
    }
    record.decisions.push_back(LayerDecision(decisions[l]));
  }
  in.array(record.visible_counts, uint64_t(heads), "visible_counts");
  const size_t top = in.count(in.get<uint32_t>("top count"), 8, "top count");
  in.array(record.top.ids, top, "top.ids");
  in.array(record.top.log_probs, top, "top.log_probs");
  if (version >= 2 && read_bool(in, "top.texts present")) {
    record.top.texts.resize(top);
    for (size_t k = 0; k < top; ++k) record.top.texts[k] = in.str("top.texts");
  }
  record.argmax = in.get<int32_t>("argmax");
  StepMetrics& s = record.metrics;
  s.nll = in.get<double>("metrics.nll");
  s.true_rank = in.get<int64_t>("metrics.true_rank");
  s.dense_true_rank = in.get<int64_t>("metrics.dense_true_rank");
  s.kl_vs_dense = in.get<double>("metrics.kl_vs_dense");
  s.recall_vs_oracle = in.get<double>("metrics.recall_vs_oracle");
  s.classification_accuracy = in.get<double>("metrics.classification_accuracy");
  s.consensus = in.get<double>("metrics.consensus");
  s.effective_sparsity = in.get<double>("metrics.effective_sparsity");
  record.columns = in.get<int64_t>("columns");
  if (record.columns != step + 1)
    in.fail("columns", n(step + 1) + " (step + 1)", n(record.columns));
  // Each kept head costs its id and a row of 4 + 4 + 1 bytes per column.
  const auto columns = uint64_t(record.columns);
  const size_t kept =
      in.count(in.get<uint32_t>("kept_heads count"), 4 + 9 * columns, "kept_heads count");
  in.array(record.kept_heads, kept, "kept_heads");
  check_heads(in, record.kept_heads, heads, "kept_heads");
  in.array(record.logits, kept * columns, "logits");
  in.array(record.scores, kept * columns, "scores");
  in.array(record.visible, kept * columns, "visible");
  if (version >= 3 && read_bool(in, "log_weights present")) {
    in.array(record.log_weights, kept * columns, "log_weights");
  }
  return record;
}

}  // namespace

std::vector<uint8_t> serialize_trace(const Trace& trace) {
  trace.check();
  Writer out(Writer::Sink::Memory);
  write_trace(trace, out);
  return out.take();
}

void save_trace(const Trace& trace, const std::string& path) {
  trace.check();  // before touching the disk: a trace load_trace would reject is never written
  const std::string partial = path + ".partial";
  std::FILE* file = std::fopen(partial.c_str(), "wb");
  if (file == nullptr) {
    throw Error(path, "file", "a writable location (for " + partial + ")", std::strerror(errno));
  }
  // The finished file only appears under `path` once complete and on disk: a crash or a full disk
  // leaves the previous file (if any) as it was, never a half-written trace.
  try {
    Writer out(Writer::Sink::File, file, path);
    write_trace(trace, out);
    if (std::fflush(file) != 0 || ::fsync(::fileno(file)) != 0) {
      throw Error(path, "file", "a writable file", std::strerror(errno));
    }
  } catch (...) {
    std::fclose(file);
    std::remove(partial.c_str());
    throw;
  }
  if (std::fclose(file) != 0) {
    const int saved = errno;
    std::remove(partial.c_str());
    throw Error(path, "file", "a writable file", std::strerror(saved));
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    std::remove(partial.c_str());
    throw Error(path, "file", "to rename " + partial + " into place", std::strerror(saved));
  }
}

Trace parse_trace(const uint8_t* data, size_t size, const std::string& source) {
  // Framing: magic, version, flags, body size and checksum, before anything in the body is read.
  const size_t magic_seen = std::min(size, sizeof(kMagic));
  if (magic_seen > 0 && std::memcmp(data, kMagic, magic_seen) != 0) {
    std::string found = "bytes";
    for (size_t i = 0; i < magic_seen; ++i) {
      char hex[4];
      std::snprintf(hex, sizeof(hex), " %02x", data[i]);
      found += hex;
    }
    throw Error(source, "magic", "a .kvtrace file (magic KVTRACE)", found);
  }
  if (size < kHeaderBytes + kChecksumBytes) {
    throw Error(source, "header",
                "at least " + n(uint64_t(kHeaderBytes + kChecksumBytes)) +
                    " bytes (magic, version, flags, body size, checksum)",
                "a truncated file of " + n(uint64_t(size)) + " bytes");
  }
  Reader header(data + sizeof(kMagic), kHeaderBytes - sizeof(kMagic), source);
  const auto version = header.get<uint32_t>("version");
  if (version < 1 || version > kTraceFileVersion) {
    throw Error(source, "version", "version 1 to " + n(uint64_t(kTraceFileVersion)),
                n(uint64_t(version)));
  }
  const auto flags = header.get<uint32_t>("flags");
  if (flags != 0) throw Error(source, "flags", "0 (none defined)", n(uint64_t(flags)));
  const auto body_size = header.get<uint64_t>("body size");
  const size_t body_room = size - kHeaderBytes - kChecksumBytes;
  if (body_size > body_room) {
    throw Error(source, "body size",
                n(body_size) + " bytes of body (a file of " +
                    n(body_size + kHeaderBytes + kChecksumBytes) + " bytes)",
                "a truncated file of " + n(uint64_t(size)) + " bytes");
  }
  if (body_size < body_room) {
    throw Error(source, "end of file",
                "the file to end after the checksum at byte " + n(kHeaderBytes + body_size),
                n(uint64_t(body_room - body_size)) + " trailing bytes");
  }
  Reader tail(data + kHeaderBytes + body_size, kChecksumBytes, source);
  const auto stored = tail.get<uint32_t>("checksum");
  const uint32_t actual = crc32_of(0, data, kHeaderBytes + size_t(body_size));
  if (stored != actual) {
    char found[96];
    std::snprintf(found, sizeof(found), "0x%08x over the file's bytes (the file is damaged)",
                  actual);
    char expected[64];
    std::snprintf(expected, sizeof(expected), "CRC-32 0x%08x as stored", stored);
    throw Error(source, "checksum", expected, found);
  }

  Reader in(data + kHeaderBytes, size_t(body_size), source);
  Trace trace;
  TraceModelInfo& m = trace.model;
  m.name = in.str("model.name");
  m.layers = in.get<int64_t>("model.layers");
  m.heads = in.get<int64_t>("model.heads");
  m.kv_heads = in.get<int64_t>("model.kv_heads");
  m.head_dim = in.get<int64_t>("model.head_dim");
  m.vocab_size = in.get<int64_t>("model.vocab_size");
  // Sizes first: the records' array lengths are computed from them.
  const int64_t int32_max = std::numeric_limits<int32_t>::max();
  if (m.layers < 0 || m.heads < 0 || m.layers > int32_max || m.heads > int32_max ||
      m.layers * m.heads > int32_max) {
    in.fail("model.layers, model.heads", "counts >= 0 with fewer than 2^31 heads in all",
            n(m.layers) + ", " + n(m.heads));
  }
  trace.top_k = in.get<int64_t>("top_k");
  trace.memory_budget = in.get<uint64_t>("memory_budget");
  const auto degraded_from_step = in.get<int64_t>("degraded_from_step");
  const size_t selected =
      in.count(in.get<uint32_t>("selected_heads count"), 4, "selected_heads count");
  in.array(trace.selected_heads, selected, "selected_heads");
  check_heads(in, trace.selected_heads, m.layers * m.heads, "selected_heads");

  TraceCorefInfo& c = trace.coref;
  c.present = read_bool(in, "coref.present");
  c.sample_index = in.get<int64_t>("coref.sample_index");
  c.seed = in.get<uint64_t>("coref.seed");
  c.answer = in.str("coref.answer");
  c.answer_token_begin = in.get<int64_t>("coref.answer_token_begin");
  c.answer_token_end = in.get<int64_t>("coref.answer_token_end");

  trace.tokens.resize(in.count(in.get<uint64_t>("token count"), 8, "token count"));
  for (size_t i = 0; i < trace.tokens.size(); ++i) {
    const std::string field = "tokens [" + n(uint64_t(i)) + "]";
    trace.tokens[i].id = in.get<int32_t>(field + ".id");
    trace.tokens[i].text = in.str(field + ".text");
  }
  trace.runs.resize(in.count(in.get<uint32_t>("run count"), 24, "run count"));
  for (size_t r = 0; r < trace.runs.size(); ++r) {
    const std::string field = "runs [" + n(uint64_t(r)) + "]";
    TraceRun& run = trace.runs[r];
    run.policy = in.str(field + ".policy");
    run.sparsity = in.get<double>(field + ".sparsity");
    run.params.resize(in.count(in.get<uint32_t>(field + ".params count"), 4, field + ".params"));
    for (std::string& param : run.params) param = in.str(field + ".params");
    run.first_step = in.get<int64_t>(field + ".first_step");
  }

  // The smallest record (no top-k, no kept heads) bounds the step count by the bytes left.
  const uint64_t heads = uint64_t(m.layers * m.heads);
  const uint64_t record_bytes = uint64_t(m.layers) + 4 * heads + 4 + 4 + 64 + 8 + 4;
  const uint64_t runs = trace.runs.size();
  const uint64_t step_count = in.get<uint64_t>("step count");
  if (step_count > 0 && runs == 0)
    in.fail("step count", "0 steps in a trace without runs", n(step_count));
  in.count(step_count,
           runs == 0 ? 0 : (record_bytes > in.left() / runs ? in.left() + 1 : record_bytes * runs),
           "step count");
  for (uint64_t t = 0; t < step_count; ++t) {
    std::vector<StepRecord>& records = trace.steps_.emplace_back();
    for (uint64_t r = 0; r < runs; ++r) {
      in.scope("step " + n(t) + " run " + n(r));
      records.push_back(read_record(in, m, int64_t(t), version));
      trace.row_bytes_ += records.back().row_bytes();
    }
  }
  in.scope({});
  if (in.left() != 0) {
    in.fail("end of body", "no bytes after the last step", n(uint64_t(in.left())) + " bytes");
  }
  trace.degraded_from_step_ = degraded_from_step;
  // The semantic checks (ranges, sizes against the model) are the ones every saved trace passed.
  try {
    trace.check();
  } catch (const Error& error) {
    throw Error(source, error.field(), error.expected(), error.found());
  }
  return trace;
}

Trace load_trace(const std::string& path) {
  const MappedFile file(path);
  return parse_trace(reinterpret_cast<const uint8_t*>(file.data()), file.size(), path);
}

}  // namespace kvlens
