// DecoderSession, scoring and generation on random tiny checkpoints: decode step by step and
// chunked prefill agree, the KV cache survives growth, scores match the logits they came from,
// and bad input is rejected with a clear error.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "engine/common/error.h"
#include "engine/policy/registry.h"
#include "engine/session/scoring.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;

namespace {

std::vector<int32_t> random_tokens(int64_t count, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(vocab - 1));
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (auto& t : tokens) t = pick(rng);
  return tokens;
}

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const BackendModel> model;
};

Loaded load_tiny(const test::TinyLlamaSpec& spec, int threads = 2) {
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("session"), spec);
  Loaded loaded;
  loaded.backend = make_cpu_backend(threads);
  loaded.model = upload_model(Model::load(dir), *loaded.backend);
  return loaded;
}

std::vector<float> host_rows(Backend& backend, const DeviceTensor& tensor) {
  std::vector<float> host(static_cast<size_t>(tensor.numel()));
  backend.to_host(tensor, host.data(), host.size() * sizeof(float));
  return host;
}

// Step-by-step and chunked runs do the same arithmetic per row but may sum in a different
// order inside the matmul blocking; 1e-5 relative to the logit scale is far below any real bug.
void require_close(const std::vector<float>& a, const std::vector<float>& b, double tolerance) {
  REQUIRE(a.size() == b.size());
  double scale = 1.0;
  for (const float v : b) scale = std::max(scale, double(std::fabs(v)));
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  INFO("max abs diff " << worst << " scale " << scale);
  REQUIRE(worst <= tolerance * scale);
}

}  // namespace

TEST_CASE("decode step by step equals one chunked prefill, across cache growth", "[session]") {
  test::TinyLlamaSpec spec;
  spec.max_positions = 320;
  spec.heads = 4;
  spec.kv_heads = 2;
  Loaded loaded = load_tiny(spec);
  // 300 tokens: the cache starts at 256 positions and must grow once, keeping its contents.
  const auto tokens = random_tokens(300, spec.vocab, 7);

  DecoderSession chunked(loaded.model);
  const std::vector<float> all = host_rows(*loaded.backend, chunked.forward(tokens));
  REQUIRE(chunked.position() == 300);

  DecoderSession stepped(loaded.model);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float> row = stepped.step(tokens[i]);
    if (i == 0 || i == 255 || i == 256 || i == 299) {
      INFO("position " << i);
      const std::vector<float> expected(all.begin() + long(i) * spec.vocab,
                                        all.begin() + long(i + 1) * spec.vocab);
      require_close(row, expected, 1e-5);
    }
  }
}

TEST_CASE("mixed chunk sizes give the same logits as single steps", "[session]") {
  test::TinyLlamaSpec spec;
  spec.model_type = "mistral";
  spec.extra_config = R"({"sliding_window": 8})";
  Loaded loaded = load_tiny(spec);
  const auto tokens = random_tokens(40, spec.vocab, 3);
  DecoderSession stepped(loaded.model);
  std::vector<float> last;
  for (const int32_t t : tokens) last = stepped.step(t);

  DecoderSession mixed(loaded.model);
  std::span<const int32_t> rest(tokens);
  for (const size_t size : {size_t(5), size_t(1), size_t(17), size_t(17)}) {
    const DeviceTensor& logits = mixed.forward(rest.subspan(0, size));
    if (size == rest.size()) {
      const std::vector<float> rows = host_rows(*loaded.backend, logits);
      require_close(std::vector<float>(rows.end() - spec.vocab, rows.end()), last, 1e-5);
    }
    rest = rest.subspan(size);
  }
  REQUIRE(rest.empty());
}

TEST_CASE("score_tokens matches the log-softmax of the step logits", "[session]") {
  test::TinyLlamaSpec spec;
  spec.dtype = "BF16";
  spec.tied = true;
  Loaded loaded = load_tiny(spec);
  const auto tokens = random_tokens(24, spec.vocab, 11);
  const ScoreResult result = score_tokens(loaded.model, tokens);
  REQUIRE(result.nll.size() == tokens.size() - 1);
  REQUIRE(result.argmax.size() == tokens.size());

  DecoderSession session(loaded.model);
  double total = 0.0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float> logits = session.step(tokens[i]);
    const auto best = std::max_element(logits.begin(), logits.end());
    CHECK(result.argmax[i] == int32_t(best - logits.begin()));
    if (i + 1 == tokens.size()) break;
    double sum = 0.0;
    for (const float v : logits) sum += std::exp(double(v) - *best);
    const double nll = -(double(logits[size_t(tokens[i + 1])]) - *best - std::log(sum));
    CHECK(result.nll[i] == Approx(nll).epsilon(1e-6));
    total += nll;
  }
  CHECK(result.ppl == Approx(std::exp(total / double(result.nll.size()))).epsilon(1e-6));

  ScoreOptions prefill;
  prefill.chunk = 10;
  const ScoreResult chunked = score_tokens(loaded.model, tokens, prefill);
  CHECK(chunked.argmax == result.argmax);
  for (size_t i = 0; i < result.nll.size(); ++i)
    CHECK(chunked.nll[i] == Approx(result.nll[i]).margin(1e-5));
}

TEST_CASE("greedy generation follows the argmax chain", "[session]") {
  test::TinyLlamaSpec spec;
  Loaded loaded = load_tiny(spec);
  const auto prompt = random_tokens(6, spec.vocab, 5);
  GenerateOptions options;
  options.max_new = 12;
  options.stop_at_eos = false;
  std::vector<int32_t> streamed;
  options.on_token = [&](int32_t t) { streamed.push_back(t); };
  const auto generated = generate_greedy(loaded.model, prompt, options);
  REQUIRE(generated.size() == 12);
  REQUIRE(streamed == generated);

  DecoderSession session(loaded.model);
  std::vector<float> logits;
  for (const int32_t t : prompt) logits = session.step(t);
  for (const int32_t expected : generated) {
    const int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    REQUIRE(best == expected);
    logits = session.step(best);
  }
  // Thread count does not change results (the matmul's summation order is fixed).
  Loaded single = load_tiny(spec, 1);
  REQUIRE(generate_greedy(single.model, prompt, options) == generated);
}

TEST_CASE("sessions reject bad input with clear errors", "[session][errors]") {
  test::TinyLlamaSpec spec;
  spec.max_positions = 16;
  Loaded loaded = load_tiny(spec);
  DecoderSession session(loaded.model);
  const int32_t too_big = int32_t(spec.vocab);
  REQUIRE_THROWS_WITH(session.step(too_big), Catch::Contains("token id") &&
                                                 Catch::Contains("[0, 64)") &&
                                                 Catch::Contains("64"));
  REQUIRE_THROWS_WITH(session.step(-1), Catch::Contains("token id"));
  REQUIRE(session.position() == 0);  // a rejected step changes nothing

  const auto tokens = random_tokens(17, spec.vocab, 1);
  REQUIRE_THROWS_WITH(session.forward(tokens), Catch::Contains("config.json") &&
                                                   Catch::Contains("max_position_embeddings") &&
                                                   Catch::Contains("at most 16"));
  REQUIRE(session.position() == 0);
  REQUIRE_NOTHROW(session.forward(std::span<const int32_t>(tokens).subspan(0, 16)));
  REQUIRE_THROWS_AS(session.step(0), Error);
  REQUIRE_THROWS_WITH(score_tokens(loaded.model, std::vector<int32_t>{}),
                      Catch::Contains("at least one"));
}

TEST_CASE("a step returns before its counts, and reading the run settles them", "[session]") {
  // tokenfilter gates its tail layers on the backend: in flight they are Gated, and the run's
  // decisions and sparsity, read through run(), are what the gates said (Dense or Skipped), with
  // the skipped layers counted as fully hidden.
  test::TinyLlamaSpec spec;
  Loaded loaded = load_tiny(spec);
  DecoderSession session(loaded.model);
  // tau -1 skips every tail token the target allows (a ratio 1 target for the one tail layer).
  session.set_policy(
      make_policy({"tokenfilter", 0.5, {"tau=-1"}}, session.policy_shape(), *loaded.backend));
  const std::vector<int32_t> tokens = random_tokens(6, spec.vocab, 5);
  int64_t gated = 0, skipped = 0;
  for (const int32_t token : tokens) {
    session.forward(std::span<const int32_t>(&token, 1));
    for (const LayerDecision d : session.run_in_flight(0).decisions)
      gated += d == LayerDecision::Gated;
    for (const LayerDecision d : session.run(0).decisions) {
      CHECK(d != LayerDecision::Gated);
      skipped += d == LayerDecision::Skipped;
    }
  }
  CHECK(gated == 5);  // the tail layer at every step but its first
  CHECK(skipped > 0);
  // Each skipped (layer, step) hides every head's candidates: their share of the layer-steps.
  const int64_t layers = loaded.model->config().num_layers;
  CHECK(session.sparsity().overall() ==
        Approx(double(skipped) / double(layers * int64_t(tokens.size()))).margin(1e-12));
}
