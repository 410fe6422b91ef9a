// magicpig (docs/policies/magicpig.md): the fixed-rounding acos and log against the library's,
// the sampling probability against its closed forms, the LSH op on a hand-made example (planes,
// codes, samples and weights checked by hand), its errors, the policy's decisions and budget
// rule, and real decodes where the weights reach the softmax (and vanish where all is exact).
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "engine/eval/sparsity_match.h"
#include "engine/model/model.h"
#include "engine/policy/magicpig_math.h"
#include "engine/policy/magicpig_ops.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/registry.h"
#include "engine/session/scoring.h"
#include "tests/support/error_message.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using Catch::Matchers::Contains;
using namespace kvlens;
using kvlens::test::Harness;
using kvlens::test::kStride;

namespace {

// One hand-made LSH setup on the harness (D = 4, 4 query heads over 2 KV heads): two tables of
// one bit, table 0's plane the first axis and table 1's the second, so a vector's codes are
// (x0 > 0, x1 > 0) and a key is sampled only when both signs match the query's.
struct LshCase {
  Harness h;
  DeviceTensor planes = h.backend->alloc(DType::F32, {2, 4});
  DeviceTensor codes = h.backend->alloc(DType::F32, {2, kStride, 2});
  DeviceTensor weights = h.backend->alloc(DType::F32, {4, kStride});
  LshCase() {
    const float host[8] = {1, 0, 0, 0, 0, 1, 0, 0};
    h.backend->from_host(planes, host, sizeof host);
  }
  void sample(int64_t cols, int64_t sink_end, int64_t recent_begin) {
    MagicpigOps& ops = magicpig_ops(*h.backend);
    ops.hash_keys(h.k_cache, 0, cols, planes, 1, codes);
    ops.lsh_sample(h.q, h.k_cache, codes, planes, 1, cols, sink_end, recent_begin, h.visible,
                   weights, h.scores);
  }
  std::vector<float> row(const DeviceTensor& t, int64_t r) {
    std::vector<float> host(size_t(t.numel()));
    h.backend->to_host(t, host.data(), host.size() * sizeof(float));
    return {host.begin() + r * kStride, host.begin() + (r + 1) * kStride};
  }
  std::vector<uint8_t> mask_row(int64_t r) {
    std::vector<uint8_t> host(size_t(h.visible.numel()));
    h.backend->to_host(h.visible, host.data(), host.size());
    return {host.begin() + r * kStride, host.begin() + (r + 1) * kStride};
  }
};

// p(u) in double: 1 - (1 - u^K)^L - L u^K (1 - u^K)^(L - 1).
double reference_probability(double u, int64_t bits, int64_t tables) {
  const double v = std::pow(u, double(bits));
  return 1.0 - std::pow(1.0 - v, double(tables)) -
         double(tables) * v * std::pow(1.0 - v, double(tables - 1));
}

}  // namespace

TEST_CASE("magicpig acos and log: within a few ulps of the library's", "[policy][magicpig]") {
  for (double x = -1.0; x <= 1.0; x += 0.00731) {
    INFO(x);
    // A&S 4.4.46 is good to 2e-8 absolute; its F32 evaluation adds a few roundings of values
    // below pi: 1e-6 covers both with room, far below what a weight of 1 / p could notice.
    CHECK(double(acos_fixed(float(x))) == Approx(std::acos(double(float(x)))).margin(1e-6));
  }
  CHECK(acos_fixed(1.0f) == 0.0f);
  for (double x = 1e-30; x <= 1.0; x *= 1.37) {
    INFO(x);
    // The series' truncation is below 1e-9; ~6 F32 roundings of terms <= |ln x| remain.
    CHECK(double(log_fixed(float(x))) ==
          Approx(std::log(double(float(x)))).epsilon(1e-6).margin(1e-6));
  }
  CHECK(log_fixed(1.0f) == 0.0f);
}

TEST_CASE("magicpig's sampling probability: closed forms and the stable tail",
          "[policy][magicpig]") {
  // Two tables need both to agree: p = u^(2K). Hand values: u = 1/2, K = 1 -> 1/4;
  // K = 2, L = 3 -> v = 1/4, 1 - 27/64 - 3 (1/4)(9/16) = 10/64.
  CHECK(magicpig_probability(0.5f, 1, 2) == 0.25f);
  CHECK(magicpig_probability(0.5f, 2, 3) == Approx(10.0 / 64.0).epsilon(1e-6));
  CHECK(magicpig_probability(1.0f, 10, 150) == 1.0f);
  CHECK(magicpig_probability(0.0f, 10, 150) == 0.0f);
  for (const int64_t bits : {1, 4, 10, 16}) {
    for (const int64_t tables : {2, 20, 150, 300}) {
      for (double u = 0.05; u < 1.0; u += 0.05) {
        INFO(bits << " bits, " << tables << " tables, u " << u);
        const double expected = reference_probability(double(float(u)), bits, tables);
        // Relative 2e-5 (a few hundred F32 roundings in the powers and the tail) where p is not
        // tiny; where the double formula itself cancels (p < 1e-12) only the margin applies.
        CHECK(double(magicpig_probability(float(u), bits, tables)) ==
              Approx(expected).epsilon(2e-5).margin(1e-12));
      }
    }
  }
  CHECK(magicpig_log_weight(1.0f) == 0.0f);
  CHECK(magicpig_log_weight(0.25f) == Approx(std::log(4.0)).epsilon(1e-6));
  // p below the floor weighs 1 / 1e-4, as the authors' p + 1e-4 bounds it.
  CHECK(magicpig_log_weight(1e-9f) == Approx(std::log(1e4)).epsilon(1e-6));
}

TEST_CASE("lsh_sample on a hand-made example: samples, weights and forced columns",
          "[policy][magicpig]") {
  LshCase c;
  // KV head 0's keys: 0 a sink; 1 parallel to q (both signs match: sampled, u = 1, p = 1);
  // 2 orthogonal with one sign different (not sampled; u = 1/2, p = 1/4); 3 at an angle with
  // both signs matching (sampled); 4 the current token.
  c.h.set_keys({{{-1, -1, 0, 0}, {1, 1, 0, 0}, {1, -1, 0, 0}, {2, 0.5f, 1, 0}, {-3, 1, 0, 0}},
                {{1, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}, {1, 0, 0, 0}}});
  c.h.set_q({{1, 1, 0, 0}, {1, 1, 0, 0}, {1, 1, 0, 0}, {1, 1, 0, 0}});
  c.sample(5, 1, 4);
  const std::vector<uint8_t> visible = c.mask_row(0);
  CHECK(std::vector<uint8_t>(visible.begin(), visible.begin() + 5) ==
        std::vector<uint8_t>{1, 1, 0, 1, 1});
  const std::vector<float> w = c.row(c.weights, 0), s = c.row(c.h.scores, 0);
  // Forced columns: weight 1 (log 0), score 1, whatever their angle (the sink is opposite q).
  CHECK(w[0] == 0.0f);
  CHECK(s[0] == 1.0f);
  CHECK(w[4] == 0.0f);
  CHECK(s[1] == 1.0f);  // theta = 0
  CHECK(w[1] == 0.0f);
  CHECK(s[2] == Approx(0.25).epsilon(1e-6));  // theta = pi / 2: u = 1/2, p = u^2
  CHECK(w[2] == 0.0f);                        // not sampled: no weight
  // Key 3: cos = 2.5 / (sqrt(2) sqrt(5.25)) = 0.771517, theta = 0.689575, u = 0.780502,
  // p = u^2 = 0.609183, log weight -ln p = 0.495637 (by hand, double precision).
  CHECK(s[3] == Approx(0.609183).epsilon(1e-5));
  CHECK(w[3] == Approx(0.495637).epsilon(1e-5));
  // KV head 1's keys (query heads 2 and 3) all have code (1, 0): none sampled but the forced.
  const std::vector<uint8_t> other = c.mask_row(2);
  CHECK(std::vector<uint8_t>(other.begin(), other.begin() + 5) ==
        std::vector<uint8_t>{1, 0, 0, 0, 1});
}

TEST_CASE("lsh_sample: every error names its operand", "[policy][magicpig]") {
  LshCase c;
  MagicpigOps& ops = magicpig_ops(*c.h.backend);
  CHECK_THAT(test::error_message([&] { ops.hash_keys(c.h.k_cache, 0, 4, c.planes, 0, c.codes); }),
             Contains("hash_keys: bits"));
  CHECK_THAT(test::error_message([&] { ops.hash_keys(c.h.k_cache, 3, 2, c.planes, 1, c.codes); }),
             Contains("hash_keys: columns"));
  CHECK_THAT(test::error_message(
                 [&] { ops.hash_keys(c.h.k_cache, 0, kStride + 1, c.planes, 1, c.codes); }),
             Contains("hash_keys: cols"));
  DeviceTensor narrow = c.h.backend->alloc(DType::F32, {1, kStride, 2});
  CHECK_THAT(test::error_message([&] { ops.hash_keys(c.h.k_cache, 0, 4, c.planes, 1, narrow); }),
             Contains("hash_keys: codes"));
  CHECK_THAT(test::error_message([&] { ops.hash_keys(c.h.k_cache, 0, 4, c.planes, 2, c.codes); }),
             Contains("hash_keys: planes"));
  auto sample = [&](int64_t sink_end, int64_t recent_begin, DeviceTensor& q, DeviceTensor& visible,
                    DeviceTensor& weights) {
    ops.lsh_sample(q, c.h.k_cache, c.codes, c.planes, 1, 4, sink_end, recent_begin, visible,
                   weights, c.h.scores);
  };
  CHECK_THAT(test::error_message([&] { sample(3, 2, c.h.q, c.h.visible, c.weights); }),
             Contains("lsh_sample: forced columns"));
  DeviceTensor short_q = c.h.backend->alloc(DType::F32, {1, 2, 4});
  CHECK_THAT(test::error_message([&] { sample(1, 3, short_q, c.h.visible, c.weights); }),
             Contains("lsh_sample: q"));
  DeviceTensor odd_rows = c.h.backend->alloc(DType::U8, {3, kStride});
  DeviceTensor odd_weights = c.h.backend->alloc(DType::F32, {3, kStride});
  DeviceTensor odd_scores = c.h.backend->alloc(DType::F32, {3, kStride});
  CHECK_THAT(test::error_message([&] {
               ops.lsh_sample(c.h.q, c.h.k_cache, c.codes, c.planes, 1, 4, 1, 3, odd_rows,
                              odd_weights, odd_scores);
             }),
             Contains("lsh_sample: visible"));
  DeviceTensor u8_weights = c.h.backend->alloc(DType::U8, {4, kStride});
  CHECK_THAT(test::error_message([&] { sample(1, 3, c.h.q, c.h.visible, u8_weights); }),
             Contains("lsh_sample: log_weights"));
}

TEST_CASE("magicpig: dense layers, all-forced steps and sparsity 0 are exact, K from sparsity",
          "[policy][magicpig]") {
  Harness h;
  h.set_keys({{{1, 0, 0, 0}, {0, 1, 0, 0}, {1, 1, 0, 0}, {-1, 0, 1, 0}, {0, 0, 1, 1}},
              {{1, 0, 0, 0}, {0, 1, 0, 0}, {1, 1, 0, 0}, {-1, 0, 1, 0}, {0, 0, 1, 1}}});
  h.set_q({{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}});
  std::unique_ptr<Policy> policy = h.make("magicpig", 0.5, {"sinks=1", "window=1"});
  h.run(*policy, 4, 0);  // layer 0: dense_layers = 1
  CHECK(h.last_decision == LayerDecision::Dense);
  CHECK(policy->log_weights(0) == nullptr);
  h.run(*policy, 4, 1);
  CHECK(h.last_decision == LayerDecision::Masked);
  REQUIRE(policy->log_weights(1) != nullptr);
  // Sinks + window covering every candidate: the exact attention, no weights.
  std::unique_ptr<Policy> covered = h.make("magicpig", 0.5, {"sinks=2", "window=3"});
  h.run(*covered, 4, 1);
  CHECK(h.last_decision == LayerDecision::Dense);
  CHECK(covered->log_weights(1) == nullptr);
  std::unique_ptr<Policy> zero = h.make("magicpig", 0.0, {"window=1", "sinks=1"});
  h.run(*zero, 4, 1);
  CHECK(h.last_decision == LayerDecision::Dense);
  // K: the expected share of orthogonal keys nearest 1 - s, and monotone in s.
  for (const double s : {0.1, 0.5, 0.9, 0.98}) {
    const int64_t k = magicpig_bits_for(s, 150);
    for (int64_t other = 1; other <= 20; ++other)
      CHECK(std::fabs(magicpig_expected_share(k, 150) - (1.0 - s)) <=
            std::fabs(magicpig_expected_share(other, 150) - (1.0 - s)));
  }
  CHECK(magicpig_bits_for(0.5, 150) < magicpig_bits_for(0.98, 150));
  // Its knobs' errors are the registry's.
  CHECK_THAT(test::error_message([&] { h.make("magicpig", 0.5, {"tables=1"}); }),
             Contains("tables"));
  CHECK_THAT(test::error_message([&] { h.make("magicpig", 0.5, {"bits=21"}); }), Contains("bits"));
}

TEST_CASE("magicpig's nominal budget is reported as an expected share", "[policy][magicpig]") {
  const std::vector<std::string> warnings = nominal_budget_warnings({"magicpig", 0.5, {}}, 4);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Contains("expected"));
  CHECK_THAT(warnings[0], Contains("bits=" + std::to_string(magicpig_bits_for(0.5, 150)) + " "));
}

TEST_CASE("magicpig in a real decode: weights reach the softmax, and vanish where all is exact",
          "[policy][magicpig]") {
  test::TinyLlamaSpec spec;
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("magicpig-model"), spec);
  auto backend = make_cpu_backend(2);
  const auto model = upload_model(Model::load(dir), *backend);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 33, 7, 7, 12, 40, 3, 8, 61, 17, 4};
  const ScoreResult dense = score_tokens(model, tokens, {});
  // A window over the whole text: every layer exact, the dense bits (the weights are absent).
  ScoreOptions covered;
  covered.policy = {"magicpig", 0.5, {"window=64"}};
  CHECK(score_tokens(model, tokens, covered).nll == dense.nll);
  // Sampling at s = 0.5 with one exact token: differs from dense, and from the same samples with
  // no weights (bits=20 in one table pair samples almost nothing: a different output again).
  ScoreOptions sampled;
  sampled.policy = {"magicpig", 0.5, {"window=1", "sinks=1", "tables=16"}};
  const ScoreResult result = score_tokens(model, tokens, sampled);
  CHECK(result.nll != dense.nll);
  CHECK(result.sparsity.steps > 0);
  // Deterministic: the same seed, the same bits; another seed, other hyperplanes.
  CHECK(score_tokens(model, tokens, sampled).nll == result.nll);
  // The weights reach the softmax: the same sample unweighted gives other predictions. The same
  // sample: layer 1, the tiny model's only sampled layer, reads what the dense layer 0 gives, so
  // its sets (and the sparsity, to the count) are those of the weighted run.
  ScoreOptions unweighted = sampled;
  unweighted.policy.args.push_back("weights=false");
  const ScoreResult plain = score_tokens(model, tokens, unweighted);
  CHECK(plain.sparsity.hidden_sum == result.sparsity.hidden_sum);
  CHECK(plain.sparsity.steps == result.sparsity.steps);
  CHECK(plain.nll != result.nll);
  sampled.policy.args.push_back("seed=7");
  CHECK(score_tokens(model, tokens, sampled).nll != result.nll);
}
