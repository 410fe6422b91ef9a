// magicpig against the authors' rule (tests/fixtures/magicpig, made by tools/magicpig_reference.py,
// which re-implements the lines of Infini-AI-Lab/MagicPIG's attnserver.py, lsh.cc and
// sparse_attention.cc it cites): one decode step's LSH sample and weights through the CPU op.
// q [1, H, D], k_cache [G, T, D], planes [L * K, D]; visible, log_weights, scores [H, T].
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "engine/backend/backend.h"
#include "engine/policy/magicpig_ops.h"
#include "tests/support/json_fixture.h"

using namespace kvlens;

TEST_CASE("magicpig's sample and weights match MagicPIG's retrieve and transform",
          "[policy][parity]") {
  // Held in a variable: a range-for over a member of the temporary would read freed memory.
  const nlohmann::json f = test::read_json_fixture("tests/fixtures/magicpig/reference.json");
  const int64_t heads = f["heads"], kv_heads = f["kv_heads"], dim = f["head_dim"];
  const int64_t tokens = f["tokens"], sinks = f["sinks"], window = f["window"];
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  DeviceTensor q = backend->alloc(DType::F32, {1, heads, dim});
  DeviceTensor k_cache = backend->alloc(DType::F32, {kv_heads, tokens, dim});
  const std::vector<float> q_host = test::json_floats(f["q"]), k_host = test::json_floats(f["k"]);
  REQUIRE(int64_t(q_host.size()) == heads * dim);
  REQUIRE(int64_t(k_host.size()) == kv_heads * tokens * dim);
  backend->from_host(q, q_host.data(), q_host.size() * sizeof(float));
  backend->from_host(k_cache, k_host.data(), k_host.size() * sizeof(float));

  for (const auto& config : f["configs"]) {
    const int64_t bits = config["bits"], tables = config["tables"];
    INFO("K " << bits << " L " << tables);
    const std::vector<float> planes_host = test::json_floats(config["planes"]);
    REQUIRE(int64_t(planes_host.size()) == tables * bits * dim);
    DeviceTensor planes = backend->alloc(DType::F32, {tables * bits, dim});
    backend->from_host(planes, planes_host.data(), planes_host.size() * sizeof(float));
    DeviceTensor codes = backend->alloc(DType::F32, {kv_heads, tokens, tables});
    DeviceTensor visible = backend->alloc(DType::U8, {heads, tokens});
    DeviceTensor log_weights = backend->alloc(DType::F32, {heads, tokens});
    DeviceTensor scores = backend->alloc(DType::F32, {heads, tokens});
    MagicpigOps& ops = magicpig_ops(*backend);
    ops.hash_keys(k_cache, 0, tokens, planes, bits, codes);
    ops.lsh_sample(q, k_cache, codes, planes, bits, tokens, sinks, tokens - window, visible,
                   log_weights, scores);
    std::vector<uint8_t> mask(size_t(heads * tokens));
    std::vector<float> weights(mask.size()), probability(mask.size());
    backend->to_host(visible, mask.data(), mask.size());
    backend->to_host(log_weights, weights.data(), weights.size() * sizeof(float));
    backend->to_host(scores, probability.data(), probability.size() * sizeof(float));

    for (int64_t h = 0; h < heads; ++h) {
      const nlohmann::json& want = config["heads"][size_t(h)];
      std::set<int64_t> sampled;
      for (const auto& j : want["sampled"]) sampled.insert(j.get<int64_t>());
      const std::vector<float> w = test::json_floats(want["w"]);
      const std::vector<float> sampled_logits = test::json_floats(want["sampled_logits"]);
      size_t nth_sampled = 0;
      for (int64_t j = 0; j < tokens; ++j) {
        INFO("head " << h << " token " << j);
        const size_t at = size_t(h * tokens + j);
        if (j < sinks || j >= tokens - window) {
          // The exact part: visible, weight 1 (log weight 0).
          CHECK(mask[at] == 1);
          CHECK(weights[at] == 0.0f);
          continue;
        }
        // Every input is a multiple of 1/64, so every projection is exact on both sides: the
        // codes, and the sets, agree exactly.
        const bool is_sampled = sampled.count(j) > 0;
        CHECK(bool(mask[at]) == is_sampled);
        // p: kvlens's fixed-rounding acos (absolute error <= 2e-8) and F32 powers to L - 1 <= 23
        // against float64: within 2e-5 (measured below 3e-6 here).
        const float p_ref = w[size_t(j - sinks)];
        CHECK(probability[at] == Approx(p_ref).margin(2e-5));
        if (!is_sampled) {
          CHECK(weights[at] == 0.0f);
          continue;
        }
        // The logit: the authors' q.k / sqrt(D) - log(w + 1e-4); kvlens adds -log(max(p, 1e-4))
        // to the same q.k / sqrt(D), which differs by log(1 + 1e-4 / p) (docs/policies/
        // magicpig.md) plus the p tolerance's effect, 2e-5 / p.
        double dot = 0.0;
        for (int64_t d = 0; d < dim; ++d)
          dot += double(q_host[size_t(h * dim + d)]) *
                 double(k_host[size_t(((h / (heads / kv_heads)) * tokens + j) * dim + d)]);
        const double ours = dot / std::sqrt(double(dim)) + double(weights[at]);
        const double floored = std::max(double(p_ref), 1e-4);
        const double allowed = std::log1p(1e-4 / floored) + 2e-5 / floored + 1e-5;
        CHECK(std::fabs(ours - double(sampled_logits[nth_sampled])) <= allowed);
        ++nth_sampled;
      }
      CHECK(nth_sampled == sampled.size());
    }
  }
}
