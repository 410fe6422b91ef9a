// A policy test bench: one layer of a small model (4 query heads over 2 KV heads, D = 4, rows of
// kStride columns) whose logits, query, keys and values tests set by hand, then select +
// attention + observe as DecoderSession runs them, returning each head's visible set.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/policy/registry.h"

namespace kvlens::test {

constexpr int64_t kStride = 16;

// One layer's inputs for a policy: true logits [H, kStride] and keys set by hand.
struct Harness {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  PolicyShape shape{2, 4, 2, 4, kStride};  // 2 layers, 4 query heads over 2 KV heads, D = 4
  DeviceTensor logits = backend->alloc(DType::F32, {4, kStride});
  DeviceTensor k_cache = backend->alloc(DType::F32, {2, kStride, 4});
  DeviceTensor v_cache = backend->alloc(DType::F32, {2, kStride, 4});
  DeviceTensor q = backend->alloc(DType::F32, {1, 4, 4});
  DeviceTensor visible = backend->alloc(DType::U8, {4, kStride});
  DeviceTensor scores = backend->alloc(DType::F32, {4, kStride});
  DeviceTensor probs = backend->alloc(DType::F32, {4, kStride});
  DeviceTensor out = backend->alloc(DType::F32, {1, 4, 4});
  LayerDecision last_decision = LayerDecision::Dense;  // of the last run()

  std::unique_ptr<Policy> make(const std::string& id, double sparsity,
                               std::vector<std::string> args = {}) {
    return make_policy({id, sparsity, std::move(args)}, shape, *backend);
  }

  // rows[h][j] for j <= t; the rest -inf.
  void set_logits(const std::vector<std::vector<float>>& rows) {
    std::vector<float> host(size_t(4 * kStride), -INFINITY);
    for (size_t h = 0; h < rows.size(); ++h) {
      for (size_t j = 0; j < rows[h].size(); ++j) host[h * kStride + j] = rows[h][j];
    }
    backend->from_host(logits, host.data(), host.size() * sizeof(float));
  }
  // Every head the same row.
  void set_logits(const std::vector<float>& row) { set_logits({row, row, row, row}); }

  // keys[g][j] (D = 4) for the first keys[g].size() positions of KV head g.
  void set_keys(const std::vector<std::vector<std::vector<float>>>& keys) {
    std::vector<float> host(size_t(2 * kStride * 4), 0.0f);
    for (size_t g = 0; g < keys.size(); ++g)
      for (size_t j = 0; j < keys[g].size(); ++j)
        for (size_t d = 0; d < 4; ++d) host[(g * kStride + j) * 4 + d] = keys[g][j][d];
    backend->from_host(k_cache, host.data(), host.size() * sizeof(float));
  }

  // values[g][j] (D = 4) for the first values[g].size() positions of KV head g.
  void set_values(const std::vector<std::vector<std::vector<float>>>& values) {
    std::vector<float> host(size_t(2 * kStride * 4), 0.0f);
    for (size_t g = 0; g < values.size(); ++g)
      for (size_t j = 0; j < values[g].size(); ++j)
        for (size_t d = 0; d < 4; ++d) host[(g * kStride + j) * 4 + d] = values[g][j][d];
    backend->from_host(v_cache, host.data(), host.size() * sizeof(float));
  }

  // The current query: rows[h] (D = 4) for query head h.
  void set_q(const std::vector<std::vector<float>>& rows) {
    std::vector<float> host(size_t(4 * 4), 0.0f);
    for (size_t h = 0; h < rows.size(); ++h)
      for (size_t d = 0; d < 4; ++d) host[h * 4 + d] = rows[h][d];
    backend->from_host(q, host.data(), host.size() * sizeof(float));
  }

  // The policy's scores row of head h, columns 0..t.
  std::vector<float> score_row(int64_t h, int64_t t) {
    std::vector<float> host(size_t(4 * kStride));
    backend->to_host(scores, host.data(), host.size() * sizeof(float));
    return std::vector<float>(host.begin() + h * kStride, host.begin() + h * kStride + t + 1);
  }

  LayerStep step(int64_t t, int64_t layer) {
    LayerStep s;
    s.step = t;
    s.layer = layer;
    s.q = &q;
    s.k_cache = &k_cache;
    s.v_cache = &v_cache;
    s.logits = &logits;
    return s;
  }

  // Runs select (+ the attention and observe the session would do) and returns each head's set.
  std::vector<std::set<int64_t>> run(Policy& policy, int64_t t, int64_t layer = 1) {
    const LayerStep s = step(t, layer);
    std::vector<uint8_t> zero(size_t(4 * kStride), 0);
    backend->from_host(visible, zero.data(), zero.size());
    LayerDecision decision = policy.select(s, visible, scores);
    if (decision == LayerDecision::Gated) {
      // What the session does with the step's counts: the gate makes it Dense or Skipped.
      REQUIRE(policy.gate(layer) != nullptr);
      uint8_t gate = 0;
      backend->to_host(*policy.gate(layer), &gate, 1);
      decision = gated_decision(gate);
    }
    last_decision = decision;
    std::vector<std::set<int64_t>> sets(4);
    std::vector<uint8_t> host(size_t(4 * kStride));
    backend->to_host(visible, host.data(), host.size());
    for (int64_t h = 0; h < 4; ++h) {
      for (int64_t j = 0; j <= t; ++j) {
        if (decision == LayerDecision::Dense || host[size_t(h * kStride + j)]) sets[h].insert(j);
      }
    }
    if (decision != LayerDecision::Skipped) {
      backend->attention_visible(logits, t + 1,
                                 decision == LayerDecision::Masked ? &visible : nullptr, v_cache,
                                 out, policy.wants_probs(s) ? &probs : nullptr);
      if (policy.wants_probs(s)) policy.observe(s, probs);
    }
    return sets;
  }

  // A whole step as the session runs it: layer 0, then layer 1; returns layer 1's sets.
  std::vector<std::set<int64_t>> run_step(Policy& policy, int64_t t) {
    run(policy, t, 0);
    return run(policy, t, 1);
  }
};

}  // namespace kvlens::test
