// Parity with Hugging Face transformers on the tiny random-weight checkpoints of tests/fixtures
// (built by tools/make_fixtures.py, which records what transformers computes in reference.json).
//
// Tolerances. Let scale = max(1, max |reference logit|) (about 3-4 here).
//
// * F32 (and BF16/F16 checkpoints against "reference_f32", computed by transformers after
//   model.float(): the same exactly widened weights and F32 arithmetic the CPU engine uses):
//   logits |a - b| <= 1e-4 * scale, NLL |a - b| <= 1e-4 * max(1, |ref|), attention probabilities
//   |a - b| <= 1e-4. Two correct F32 implementations differ only by accumulation order over
//   2-3 layers of 64-192 term dot products; at build time transformers' F32 logits were within
//   5e-6 of its own F64 logits (reference.json "notes"), so 1e-4 * scale leaves about 20x
//   headroom while any real mistake (RoPE frequencies, GQA head mapping, masks, norms, tied
//   weights) moves logits by 1e-2 or more.
// * argmax and the greedy continuation must be identical, except at a genuine near tie: a
//   position whose reference top-1/top-2 margin is at most twice the logit tolerance may pick
//   either token (and the greedy comparison stops there, since later prompts then differ). At
//   build time the smallest F32 margins were 3e-4..1e-2, so this almost never applies.
// * BF16/F16 against the reference computed in the checkpoint's own dtype (see native_bounds).
//
// Step-by-step decoding and chunked prefill must agree with each other to the same F32 bounds,
// except under longrope and dynamic RoPE, whose table transformers picks per forward call from
// the call's largest position: there every way of feeding the sequence (one call, calls of 7,
// steps) has a reference of its own ("chunked" in reference.json), met to the same bounds.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/model/model.h"
#include "engine/session/decoder_session.h"
#include "engine/session/scoring.h"
#include "tests/support/test_paths.h"

namespace {

using kvlens::Backend;
using kvlens::BackendModel;
using kvlens::DecoderSession;
using kvlens::DeviceTensor;
using nlohmann::json;

constexpr double kF32LogitRel = 1e-4;  // times scale, see the file comment
constexpr double kF32AttentionAbs = 1e-4;

// What transformers computed, parsed from one reference block of reference.json.
struct Reference {
  std::vector<int32_t> tokens;
  std::vector<double> nll;
  std::vector<int32_t> argmax;
  std::vector<double> argmax_margin;
  std::vector<double> last_logits;
  std::vector<int64_t> row_positions;
  std::vector<std::vector<double>> rows;
  std::vector<int32_t> greedy_prompt, greedy_new;
  std::vector<double> greedy_margin;
  std::vector<std::vector<std::vector<double>>> attention;  // [layer][head][key]
  double scale = 1.0;  // max(1, max |logit|) over all positions
};

Reference parse_reference(const json& block, const json& notes) {
  Reference r;
  r.tokens = block.at("tokens").get<std::vector<int32_t>>();
  r.nll = block.at("nll").get<std::vector<double>>();
  r.argmax = block.at("argmax").get<std::vector<int32_t>>();
  r.argmax_margin = block.at("argmax_margin").get<std::vector<double>>();
  r.last_logits = block.at("last_logits").get<std::vector<double>>();
  r.row_positions = block.at("logits_rows").at("positions").get<std::vector<int64_t>>();
  r.rows = block.at("logits_rows").at("values").get<std::vector<std::vector<double>>>();
  r.greedy_prompt = block.at("greedy_prompt").get<std::vector<int32_t>>();
  r.greedy_new = block.at("greedy_new").get<std::vector<int32_t>>();
  r.greedy_margin = block.at("greedy_margin").get<std::vector<double>>();
  r.attention = block.at("last_row_attention").get<std::vector<std::vector<std::vector<double>>>>();
  r.scale = std::max(1.0, notes.at("logit_scale").get<double>());
  const size_t n = r.tokens.size();
  REQUIRE(n >= 2);
  REQUIRE(r.nll.size() == n - 1);
  REQUIRE(r.argmax.size() == n);
  REQUIRE(r.argmax_margin.size() == n);
  REQUIRE(r.rows.size() == r.row_positions.size());
  REQUIRE(r.greedy_new.size() == r.greedy_margin.size());
  return r;
}

// One checkpoint on the CPU backend, loaded once for all test cases (the backend must outlive
// the uploaded weights, which keep a pointer to it).
struct LoadedFixture {
  json doc;
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const BackendModel> model;
};

const LoadedFixture& fixture(const std::string& name) {
  static std::map<std::string, std::unique_ptr<LoadedFixture>> cache;
  auto& slot = cache[name];
  if (!slot) {
    const std::string dir = kvlens::test::source_path("tests/fixtures/" + name);
    std::ifstream in(dir + "/reference.json");
    REQUIRE(in.good());
    auto loaded = std::make_unique<LoadedFixture>();
    loaded->doc = json::parse(in);
    REQUIRE(loaded->doc.at("model").get<std::string>() == name);
    loaded->backend = kvlens::make_cpu_backend();
    loaded->model = upload_model(kvlens::Model::load(dir), *loaded->backend);
    slot = std::move(loaded);
  }
  return *slot;
}

// The engine's logits for every position and the attention probabilities of the last query row.
struct EngineRun {
  std::vector<std::vector<float>> logits;              // [T][vocab]
  std::vector<std::vector<std::vector<double>>> attn;  // [layer][head][key], softmaxed
  std::vector<std::vector<int64_t>> visible_keys;      // [layer][head]: finite logits
};

std::vector<float> copy_to_host(Backend& backend, const DeviceTensor& t) {
  std::vector<float> host(size_t(t.numel()));
  backend.to_host(t, host.data(), host.size() * sizeof(float));
  return host;
}

// Softmax (in double) of the last query row of each layer's recorded logits: [n, H, S], the
// first context = position() columns of each row (a single step's rows are as wide as the cache).
void read_last_attention_row(const DecoderSession& session, Backend& backend, EngineRun& run) {
  run.attn.clear();
  run.visible_keys.clear();
  for (const DeviceTensor& t : session.attention_logits()) {
    REQUIRE(t.dtype == kvlens::DType::F32);
    REQUIRE(t.shape.size() == 3);
    const int64_t n = t.dim(0), heads = t.dim(1), stride = t.dim(2);
    const int64_t context = session.position();
    REQUIRE(stride >= context);
    const std::vector<float> host = copy_to_host(backend, t);
    std::vector<std::vector<double>> layer;
    std::vector<int64_t> visible;
    for (int64_t h = 0; h < heads; ++h) {
      const float* row = host.data() + ((n - 1) * heads + h) * stride;
      double max_logit = -std::numeric_limits<double>::infinity();
      int64_t finite = 0;
      for (int64_t j = 0; j < context; ++j) {
        if (std::isfinite(row[j])) {
          max_logit = std::max(max_logit, double(row[j]));
          ++finite;
        }
      }
      REQUIRE(finite > 0);
      std::vector<double> p(size_t(context), 0.0);
      double sum = 0.0;
      for (int64_t j = 0; j < context; ++j) {
        if (std::isfinite(row[j])) sum += p[size_t(j)] = std::exp(double(row[j]) - max_logit);
      }
      for (double& v : p) v /= sum;
      layer.push_back(std::move(p));
      visible.push_back(finite);
    }
    run.attn.push_back(std::move(layer));
    run.visible_keys.push_back(std::move(visible));
  }
}

// Feeds `tokens` in chunks of `chunk` tokens (1 = decode step by step).
EngineRun run_engine(const LoadedFixture& f, const std::vector<int32_t>& tokens, size_t chunk) {
  DecoderSession session(f.model, kvlens::SessionOptions{.record_attention_logits = true});
  EngineRun run;
  const int64_t vocab = f.model->config().vocab_size;
  for (size_t begin = 0; begin < tokens.size(); begin += chunk) {
    const size_t n = std::min(chunk, tokens.size() - begin);
    const DeviceTensor& logits =
        session.forward(std::span<const int32_t>(tokens.data() + begin, n));
    REQUIRE(logits.shape == std::vector<int64_t>{int64_t(n), vocab});
    const std::vector<float> host = copy_to_host(*f.backend, logits);
    for (size_t i = 0; i < n; ++i) {
      run.logits.emplace_back(host.begin() + std::ptrdiff_t(i * size_t(vocab)),
                              host.begin() + std::ptrdiff_t((i + 1) * size_t(vocab)));
    }
  }
  REQUIRE(session.position() == int64_t(tokens.size()));
  read_last_attention_row(session, *f.backend, run);
  return run;
}

// Largest |a - b| over a logits row, with where it happened, for the failure message.
struct MaxDiff {
  double value = 0.0;
  std::string where;
  void add(double a, double b, const std::string& what) {
    const double d = std::abs(a - b);
    if (!(d <= value)) {  // also records NaN
      value = d;
      where = what;
    }
  }
};

std::string at(const char* what, size_t i) {
  return std::string(what) + "[" + std::to_string(i) + "]";
}

// Tolerances for one comparison. logit_abs is absolute (already multiplied by the scale).
struct Bounds {
  double logit_abs;
  double attention_abs;  // attention probabilities
};

Bounds f32_bounds(const Reference& ref) {
  return {kF32LogitRel * ref.scale, kF32AttentionAbs};
}

void check_logits(const EngineRun& run, const Reference& ref, double tol) {
  const size_t T = ref.tokens.size();
  REQUIRE(run.logits.size() == T);
  MaxDiff diff;
  REQUIRE(run.logits[T - 1].size() == ref.last_logits.size());
  for (size_t v = 0; v < ref.last_logits.size(); ++v) {
    diff.add(run.logits[T - 1][v], ref.last_logits[v], "last_logits" + at("", v));
  }
  for (size_t r = 0; r < ref.rows.size(); ++r) {
    const size_t p = size_t(ref.row_positions[r]);
    REQUIRE(p < T);
    REQUIRE(run.logits[p].size() == ref.rows[r].size());
    for (size_t v = 0; v < ref.rows[r].size(); ++v) {
      diff.add(run.logits[p][v], ref.rows[r][v], at("position", p) + at(" vocab", v));
    }
  }
  INFO("max |engine - reference| logit " << diff.value << " at " << diff.where << ", bound "
                                         << tol);
  CHECK(diff.value <= tol);
}

void check_nll(const std::vector<double>& nll, const Reference& ref, double rel) {
  REQUIRE(nll.size() == ref.nll.size());
  double worst = 0.0;  // largest |a - b| / max(1, |ref|)
  size_t worst_at = 0;
  for (size_t i = 0; i < nll.size(); ++i) {
    const double d = std::abs(nll[i] - ref.nll[i]) / std::max(1.0, std::abs(ref.nll[i]));
    if (!(d <= worst)) worst = d, worst_at = i;
  }
  INFO("worst relative NLL difference " << worst << " at " << worst_at << " (engine "
                                        << nll[worst_at] << ", reference " << ref.nll[worst_at]
                                        << "), bound " << rel);
  CHECK(worst <= rel);
}

// argmax must match wherever the reference's top-1/top-2 margin exceeds twice the logit
// tolerance; closer than that, both tokens are correct answers within tolerance.
void check_argmax(const std::vector<int32_t>& argmax, const Reference& ref, double logit_tol) {
  REQUIRE(argmax.size() == ref.argmax.size());
  for (size_t i = 0; i < argmax.size(); ++i) {
    if (argmax[i] == ref.argmax[i]) continue;
    INFO("position " << i << ": engine argmax " << argmax[i] << ", reference " << ref.argmax[i]
                     << ", reference margin " << ref.argmax_margin[i]);
    CHECK(ref.argmax_margin[i] <= 2 * logit_tol);
  }
}

void check_greedy(const std::vector<int32_t>& generated, const Reference& ref, double logit_tol) {
  REQUIRE(generated.size() == ref.greedy_new.size());
  for (size_t i = 0; i < generated.size(); ++i) {
    if (generated[i] == ref.greedy_new[i]) continue;
    INFO("greedy step " << i << ": engine " << generated[i] << ", reference " << ref.greedy_new[i]
                        << ", reference margin " << ref.greedy_margin[i]);
    CHECK(ref.greedy_margin[i] <= 2 * logit_tol);
    break;  // the continuations legitimately part after a near tie
  }
}

void check_attention(const EngineRun& run, const Reference& ref, double tol) {
  REQUIRE(run.attn.size() == ref.attention.size());
  MaxDiff diff;
  for (size_t l = 0; l < ref.attention.size(); ++l) {
    REQUIRE(run.attn[l].size() == ref.attention[l].size());
    for (size_t h = 0; h < ref.attention[l].size(); ++h) {
      REQUIRE(run.attn[l][h].size() == ref.attention[l][h].size());
      for (size_t j = 0; j < ref.attention[l][h].size(); ++j) {
        diff.add(run.attn[l][h][j], ref.attention[l][h][j],
                 at("layer", l) + at(" head", h) + at(" key", j));
      }
    }
  }
  INFO("max |engine - reference| attention probability " << diff.value << " at " << diff.where
                                                         << ", bound " << tol);
  CHECK(diff.value <= tol);
}

// The last query row sees min(T, window) keys with a sliding window, all T without.
void check_visible_keys(const EngineRun& run, const LoadedFixture& f, size_t T) {
  for (size_t l = 0; l < run.visible_keys.size(); ++l) {
    // A layer's own window (gemma3: the local layers only).
    const int64_t window = f.model->config().layer_window(int64_t(l));
    const int64_t expected = window > 0 ? std::min<int64_t>(int64_t(T), window) : int64_t(T);
    for (size_t h = 0; h < run.visible_keys[l].size(); ++h) {
      INFO("layer " << l << " head " << h);
      CHECK(run.visible_keys[l][h] == expected);
    }
  }
}

std::vector<int32_t> argmax_rows(const EngineRun& run) {
  std::vector<int32_t> out;
  for (const auto& row : run.logits) {
    out.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
  }
  return out;
}

// Everything an F32 reference pins down, checked tightly.
void check_against_f32(const LoadedFixture& f, const Reference& ref) {
  const Bounds b = f32_bounds(ref);
  const size_t T = ref.tokens.size();

  SECTION("chunked prefill: logits, argmax, last-row attention") {
    const EngineRun run = run_engine(f, ref.tokens, T);
    check_logits(run, ref, b.logit_abs);
    check_argmax(argmax_rows(run), ref, b.logit_abs);
    check_attention(run, ref, b.attention_abs);
    check_visible_keys(run, f, T);
  }
  SECTION("step-by-step decode: logits, last-row attention") {
    const EngineRun run = run_engine(f, ref.tokens, 1);
    check_logits(run, ref, b.logit_abs);
    check_attention(run, ref, b.attention_abs);
    check_visible_keys(run, f, T);
  }
  SECTION("score_tokens: nll and argmax, step by step and chunked") {
    for (int64_t chunk : {int64_t(1), int64_t(7), int64_t(T)}) {
      INFO("chunk " << chunk);
      const kvlens::ScoreResult s =
          kvlens::score_tokens(f.model, ref.tokens, kvlens::ScoreOptions{.chunk = chunk});
      CHECK(s.tokens == ref.tokens);
      check_nll(s.nll, ref, kF32LogitRel);
      check_argmax(s.argmax, ref, b.logit_abs);
    }
  }
  SECTION("greedy continuation") {
    const std::vector<int32_t> generated = kvlens::generate_greedy(
        f.model, ref.greedy_prompt, kvlens::GenerateOptions{.max_new = 16, .stop_at_eos = false});
    check_greedy(generated, ref, b.logit_abs);
  }
}

// Step-by-step decode and chunked prefill (one chunk, and uneven chunks of 7 that cross the
// sliding window) must agree with each other at every position, not only the sampled rows.
void check_step_vs_chunk(const LoadedFixture& f, const Reference& ref) {
  const size_t T = ref.tokens.size();
  const EngineRun step = run_engine(f, ref.tokens, 1);
  for (size_t chunk : {size_t(7), T}) {
    INFO("chunk " << chunk);
    const EngineRun chunked = run_engine(f, ref.tokens, chunk);
    MaxDiff diff;
    for (size_t p = 0; p < T; ++p) {
      REQUIRE(step.logits[p].size() == chunked.logits[p].size());
      for (size_t v = 0; v < step.logits[p].size(); ++v) {
        diff.add(step.logits[p][v], chunked.logits[p][v], at("position", p) + at(" vocab", v));
      }
    }
    INFO("max |step - chunked| logit " << diff.value << " at " << diff.where);
    CHECK(diff.value <= kF32LogitRel * ref.scale);
    MaxDiff attn;
    for (size_t l = 0; l < step.attn.size(); ++l) {
      for (size_t h = 0; h < step.attn[l].size(); ++h) {
        for (size_t j = 0; j < step.attn[l][h].size(); ++j) {
          attn.add(step.attn[l][h][j], chunked.attn[l][h][j],
                   at("layer", l) + at(" head", h) + at(" key", j));
        }
      }
    }
    INFO("max |step - chunked| attention " << attn.value << " at " << attn.where);
    CHECK(attn.value <= kF32AttentionAbs);
  }
}

// Bounds against the reference transformers computed in the checkpoint's own dtype, where it
// rounds every activation (and the logits themselves) to BF16/F16 while the engine keeps F32
// activations. Unit roundoff is 2^-9 ~ 2e-3 for BF16 (8-bit significand) and 2^-11 ~ 5e-4 for
// F16; ~10 roundings per layer over 2 layers plus the final rounding of logits of magnitude ~4
// compound to a few percent of the logit scale for BF16 and well under 1% for F16. Measured at
// build time (reference.json "notes"): max logit gap 0.109 = 3.2% of scale (BF16) and
// 0.016 = 0.5% (F16), attention gaps 0.005 and 0.004. The bounds leave ~1.5-2.5x headroom:
// loose enough for the dtype, still far below what a wrong norm, RoPE or mask produces (O(1)).
// NLL = logsumexp(logits) - logit[target] moves by at most 2x the largest logit change.
Bounds native_bounds(const std::string& dtype, const Reference& ref) {
  if (dtype == "bfloat16") return {0.05 * ref.scale, 0.02};
  if (dtype == "float16") return {0.01 * ref.scale, 0.01};
  FAIL("no native-dtype bounds for " << dtype);
  return {};
}

void check_against_native(const LoadedFixture& f, const Reference& ref, const std::string& dtype) {
  const Bounds b = native_bounds(dtype, ref);
  const size_t T = ref.tokens.size();
  const EngineRun run = run_engine(f, ref.tokens, T);
  check_logits(run, ref, b.logit_abs);
  check_attention(run, ref, b.attention_abs);

  const kvlens::ScoreResult s = kvlens::score_tokens(f.model, ref.tokens);
  REQUIRE(s.nll.size() == ref.nll.size());
  double worst_nll = 0.0;
  for (size_t i = 0; i < s.nll.size(); ++i) {
    worst_nll = std::max(worst_nll, std::abs(s.nll[i] - ref.nll[i]));
  }
  INFO("max |engine - native reference| NLL " << worst_nll << ", bound " << 2 * b.logit_abs);
  CHECK(worst_nll <= 2 * b.logit_abs);

  // argmax: exact wherever the native margin is beyond the tolerance (BF16 logits tie often:
  // their spacing near 4 is 2^-6), and at least 90% agreement overall (93.75% at build time
  // for BF16, 100% for F16).
  check_argmax(s.argmax, ref, b.logit_abs);
  size_t agree = 0;
  for (size_t i = 0; i < s.argmax.size(); ++i) agree += s.argmax[i] == ref.argmax[i];
  INFO("argmax agreement " << agree << " / " << s.argmax.size());
  CHECK(double(agree) >= 0.9 * double(s.argmax.size()));
  // Greedy continuations are compared with reference_f32 only: in the native dtype they part
  // at the first near tie (the BF16 reference's own top-2 are exactly tied at step 9).
}

void run_f32_fixture(const std::string& name) {
  const LoadedFixture& f = fixture(name);
  REQUIRE(f.doc.at("dtype") == "float32");
  const Reference ref = parse_reference(f.doc, f.doc.at("notes"));
  check_against_f32(f, ref);
  SECTION("step-by-step vs chunked prefill") {
    check_step_vs_chunk(f, ref);
  }
}

// The "chunked" references of a length-dependent RoPE fixture: the per-position keys of the
// sequence fed with a KV cache in calls of `chunk` tokens; tokens, greedy and scale as `base`.
struct ChunkedReference {
  size_t chunk = 0;
  Reference ref;
};

std::vector<ChunkedReference> parse_chunked(const json& doc, const Reference& base) {
  std::vector<ChunkedReference> out;
  for (const json& entry : doc.at("chunked")) {
    ChunkedReference c{entry.at("chunk").get<size_t>(), base};
    c.ref.nll = entry.at("nll").get<std::vector<double>>();
    c.ref.argmax = entry.at("argmax").get<std::vector<int32_t>>();
    c.ref.argmax_margin = entry.at("argmax_margin").get<std::vector<double>>();
    c.ref.last_logits = entry.at("last_logits").get<std::vector<double>>();
    c.ref.row_positions = entry.at("logits_rows").at("positions").get<std::vector<int64_t>>();
    c.ref.rows = entry.at("logits_rows").at("values").get<std::vector<std::vector<double>>>();
    REQUIRE(c.chunk >= 1);
    REQUIRE(c.ref.nll.size() == base.nll.size());
    REQUIRE(c.ref.argmax.size() == base.argmax.size());
    out.push_back(std::move(c));
  }
  REQUIRE(out.size() >= 2);
  return out;
}

// longrope / dynamic RoPE: each way of feeding the tokens against its own reference.
void run_length_dependent_fixture(const std::string& name) {
  const LoadedFixture& f = fixture(name);
  REQUIRE(f.doc.at("dtype") == "float32");
  const Reference ref = parse_reference(f.doc, f.doc.at("notes"));
  const std::vector<ChunkedReference> chunked = parse_chunked(f.doc, ref);
  const Bounds b = f32_bounds(ref);
  const size_t T = ref.tokens.size();
  SECTION("one call over every token: logits, argmax, last-row attention, NLL") {
    const EngineRun run = run_engine(f, ref.tokens, T);
    check_logits(run, ref, b.logit_abs);
    check_argmax(argmax_rows(run), ref, b.logit_abs);
    check_attention(run, ref, b.attention_abs);
    check_visible_keys(run, f, T);
    const kvlens::ScoreResult s = kvlens::score_tokens(
        f.model, ref.tokens, kvlens::ScoreOptions{.chunk = static_cast<int64_t>(T)});
    check_nll(s.nll, ref, kF32LogitRel);
    check_argmax(s.argmax, ref, b.logit_abs);
  }
  SECTION("calls of 1 and 7 tokens against transformers' calls with a KV cache") {
    for (const ChunkedReference& c : chunked) {
      INFO("calls of " << c.chunk << " tokens");
      const EngineRun run = run_engine(f, ref.tokens, c.chunk);
      check_logits(run, c.ref, b.logit_abs);
      check_argmax(argmax_rows(run), c.ref, b.logit_abs);
      const kvlens::ScoreResult s = kvlens::score_tokens(
          f.model, ref.tokens, kvlens::ScoreOptions{.chunk = static_cast<int64_t>(c.chunk)});
      check_nll(s.nll, c.ref, kF32LogitRel);
      check_argmax(s.argmax, c.ref, b.logit_abs);
    }
  }
  SECTION("greedy continuation across the switch (model() calls with a KV cache)") {
    const std::vector<int32_t> generated = kvlens::generate_greedy(
        f.model, ref.greedy_prompt, kvlens::GenerateOptions{.max_new = 16, .stop_at_eos = false});
    check_greedy(generated, ref, b.logit_abs);
  }
  SECTION("the fixture exercises the switch: steps and one call differ") {
    const EngineRun step = run_engine(f, ref.tokens, 1), one = run_engine(f, ref.tokens, T);
    MaxDiff diff;
    for (size_t v = 0; v < step.logits[T - 1].size(); ++v)
      diff.add(step.logits[T - 1][v], one.logits[T - 1][v], at("vocab", v));
    CHECK(diff.value > 0.01);
  }
}

void run_low_precision_fixture(const std::string& name, const std::string& dtype) {
  const LoadedFixture& f = fixture(name);
  REQUIRE(f.doc.at("dtype") == dtype);
  REQUIRE(f.doc.contains("reference_f32"));
  const Reference ref32 = parse_reference(f.doc.at("reference_f32"), f.doc.at("notes"));
  SECTION("against transformers in F32 (widened weights)") {
    check_against_f32(f, ref32);
  }
  SECTION("against transformers in " + dtype) {
    const Reference native = parse_reference(f.doc, f.doc.at("notes"));
    REQUIRE(native.tokens == ref32.tokens);
    check_against_native(f, native, dtype);
  }
  SECTION("step-by-step vs chunked prefill") {
    check_step_vs_chunk(f, ref32);
  }
}

}  // namespace

TEST_CASE("HF parity: Llama GQA, untied, default RoPE, F32", "[parity]") {
  run_f32_fixture("llama-gqa-f32");
}

TEST_CASE("HF parity: Llama MHA, head_dim 24, tied, llama3 RoPE, sharded, F32", "[parity]") {
  const LoadedFixture& f = fixture("llama-mha-headdim-tied-llama3-f32");
  // The fixture is only meaningful if the loader read what makes it special.
  const kvlens::ModelConfig& c = f.model->config();
  CHECK(c.head_dim == 24);
  CHECK(c.tie_word_embeddings);
  CHECK(c.rope_scaling.type == kvlens::RopeScaling::Type::kLlama3);
  CHECK(c.rope_theta == 500000.0);
  run_f32_fixture("llama-mha-headdim-tied-llama3-f32");
}

TEST_CASE("HF parity: Mistral sliding window 24, GQA, BF16", "[parity]") {
  const LoadedFixture& f = fixture("mistral-window-bf16");
  REQUIRE(f.model->config().sliding_window.has_value());
  CHECK(*f.model->config().sliding_window == 24);
  CHECK(f.model->config().torch_dtype == kvlens::DType::BF16);
  run_low_precision_fixture("mistral-window-bf16", "bfloat16");
}

TEST_CASE("HF parity: Llama linear RoPE x2, F16", "[parity]") {
  const LoadedFixture& f = fixture("llama-linear-f16");
  CHECK(f.model->config().rope_scaling.type == kvlens::RopeScaling::Type::kLinear);
  CHECK(f.model->config().torch_dtype == kvlens::DType::F16);
  run_low_precision_fixture("llama-linear-f16", "float16");
}

TEST_CASE("HF parity: Qwen2, q/k/v biases, GQA, F32", "[parity]") {
  const LoadedFixture& f = fixture("qwen2-bias-f32");
  const kvlens::ModelConfig& c = f.model->config();
  CHECK(c.model_type == "qwen2");
  CHECK(c.qkv_bias);
  CHECK_FALSE(c.qk_norm);
  REQUIRE_FALSE(f.model->layers[0].bq.empty());
  run_f32_fixture("qwen2-bias-f32");
}

TEST_CASE("HF parity: Qwen3, per-head q/k RMSNorm, head_dim 32, tied, F32", "[parity]") {
  const LoadedFixture& f = fixture("qwen3-qknorm-f32");
  const kvlens::ModelConfig& c = f.model->config();
  CHECK(c.model_type == "qwen3");
  CHECK(c.qk_norm);
  CHECK_FALSE(c.qkv_bias);
  CHECK(c.head_dim == 32);
  REQUIRE_FALSE(f.model->layers[1].k_norm.empty());
  run_f32_fixture("qwen3-qknorm-f32");
}

TEST_CASE("HF parity: Gemma 3, local/global layers, window 16, soft-cap, GeGLU, F32", "[parity]") {
  const LoadedFixture& f = fixture("gemma3-window-softcap-f32");
  // The fixture is only meaningful if the loader read what makes it special.
  const kvlens::ModelConfig& c = f.model->config();
  CHECK(c.model_type == "gemma3_text");
  CHECK(c.sliding_layers == std::vector<bool>{true, true, false});
  CHECK(c.layer_window(0) == 16);
  CHECK(c.layer_window(2) == 0);
  CHECK(c.rope_local_theta == 10000.0);
  CHECK(c.rope_theta == 1000000.0);
  CHECK(c.rope_scaling.type == kvlens::RopeScaling::Type::kLinear);
  CHECK(c.attention_scalar == 24.0);
  CHECK(c.final_logit_softcap == 3.0);
  CHECK(c.hidden_activation == kvlens::ModelConfig::Activation::kGeluTanh);
  CHECK(c.embedding_scale == Approx(8.0));
  CHECK(c.qk_norm);
  CHECK(c.tie_word_embeddings);
  REQUIRE_FALSE(f.model->layers[2].post_mlp_norm.empty());
  REQUIRE_FALSE(f.model->inv_freq_local.empty());
  // Every reference logit lies inside the cap.
  for (const double logit : f.doc.at("last_logits")) CHECK(std::abs(logit) < 3.0);
  run_f32_fixture("gemma3-window-softcap-f32");
}

TEST_CASE("HF parity: Phi-3, fused qkv / gate_up, partial rotary 0.75, window 40, GQA, F32",
          "[parity]") {
  const LoadedFixture& f = fixture("phi3-fused-partial-f32");
  const kvlens::ModelConfig& c = f.model->config();
  CHECK(c.model_type == "phi3");
  CHECK(c.fused_projections);
  CHECK(c.head_dim == 16);
  CHECK(c.rotary_dim == 12);
  REQUIRE(c.sliding_window.has_value());
  CHECK(*c.sliding_window == 40);
  // q, k, v (and gate, up) are consecutive row ranges of the one mapped tensor: no copies.
  const kvlens::LayerWeights& w = f.model->model->weights.layers[0];
  const size_t row_bytes = size_t(c.hidden_size) * sizeof(float);
  CHECK(w.wq.shape == std::vector<int64_t>{c.num_heads * c.head_dim, c.hidden_size});
  CHECK(w.wk.data == w.wq.data + size_t(c.num_heads * c.head_dim) * row_bytes);
  CHECK(w.wv.data == w.wk.data + size_t(c.num_kv_heads * c.head_dim) * row_bytes);
  CHECK(w.w_up.data == w.w_gate.data + size_t(c.intermediate_size) * row_bytes);
  run_f32_fixture("phi3-fused-partial-f32");
}

TEST_CASE("HF parity: Phi-3.5-style longrope (short / long factors), partial rotary, F32",
          "[parity]") {
  const LoadedFixture& f = fixture("phi3-longrope-f32");
  const kvlens::ModelConfig& c = f.model->config();
  CHECK(c.rope_scaling.type == kvlens::RopeScaling::Type::kLongRope);
  CHECK(c.rope_scaling.original_max_position_embeddings == 20);
  CHECK(c.rotary_dim == 12);
  // No attention_factor given: sqrt(1 + ln(128 / 20) / ln(20)).
  CHECK(c.rope_attention_scale() == Approx(std::sqrt(1 + std::log(6.4) / std::log(20.0))));
  REQUIRE_FALSE(f.model->inv_freq_long.empty());
  run_length_dependent_fixture("phi3-longrope-f32");
}

TEST_CASE("HF parity: Llama yarn RoPE (factor 4, original 32), head_dim 32, F32", "[parity]") {
  const kvlens::ModelConfig& c = fixture("llama-yarn-f32").model->config();
  CHECK(c.rope_scaling.type == kvlens::RopeScaling::Type::kYarn);
  CHECK(c.rope_attention_scale() == Approx(0.1 * std::log(4.0) + 1.0));
  run_f32_fixture("llama-yarn-f32");
}

TEST_CASE("HF parity: Llama dynamic NTK RoPE (factor 4) past 20 positions, F32", "[parity]") {
  const kvlens::ModelConfig& c = fixture("llama-dynamic-f32").model->config();
  CHECK(c.rope_scaling.type == kvlens::RopeScaling::Type::kDynamic);
  CHECK(c.rope_scaling.original_max_position_embeddings == 20);
  CHECK(c.max_position_embeddings == 80);  // 20 x factor: the context kvlens allows
  run_length_dependent_fixture("llama-dynamic-f32");
}
