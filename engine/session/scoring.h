// Teacher-forced scoring (per-position NLL, argmax, perplexity) and greedy generation on top of
// DecoderSession. Both advance one token per step by default: the decode simulation every
// policy issue builds on.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/session/decoder_session.h"

namespace kvlens {

// Called after each processed token with (done, total); may be empty.
using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// The top-50% hit rate (POLICIES.md) of a run's policy scores against its true attention logits,
// summed over the (step, layer, head) rows the policy scored: the heads of its Masked layers at
// its policy steps. Each row's value is top_half_agreement(scores, logits) over the step's t + 1
// candidates, the value trace_queries.h's head_summary gives as hit_rate for the same row.
struct HitRateStats {
  double sum = 0.0;
  int64_t rows = 0;

  void merge(const HitRateStats& other) {
    sum += other.sum;
    rows += other.rows;
  }
  double mean() const;  // NaN when no row was scored (dense, or every layer left dense)
};

struct ScoreResult {
  std::vector<int32_t> tokens;
  std::vector<double> nll;      // nll[i] = -log p(tokens[i+1] | tokens[..i]), size n-1
  std::vector<int32_t> argmax;  // argmax of the distribution after tokens[..i], size n
  double ppl = 0.0;             // exp(mean nll); 0 tokens scored -> NaN
  SparsityStats sparsity;       // over the policy's steps (no steps for dense)
  HitRateStats hit_rate;        // with ScoreOptions::hit_rate only
};

struct ScoreOptions {
  int64_t chunk = 1;  // tokens per forward: 1 = step by step; larger = chunked prefill
  // The token-selection policy (POLICIES.md). Any policy but dense runs one token per step from
  // `prefill` on: 0 is the decode simulation; > 0 feeds that many prompt tokens densely first
  // (in chunks) and applies the policy to the steps after (prefill + decode).
  PolicyConfig policy;
  int64_t prefill = 0;
  ProgressFn progress;
  // Measure each run's hit rate (ScoreResult::hit_rate). The session then records every step's
  // true attention logits (as TraceRecorder's does, so a policy that would compute logits only
  // at the columns it chose computes all of them), and each step's scored rows are read back and
  // compared on the backend's threads. The NLL and argmax do not change; prefill chunks are cut
  // to 16 tokens (a recorded chunk keeps [chunk, H, context] logits per layer).
  bool hit_rate = false;
};

ScoreResult score_tokens(std::shared_ptr<const BackendModel> model, std::span<const int32_t> tokens,
                         const ScoreOptions& options = {});
// The same text under several policies in lockstep (one run each, one pass over the weights per
// step); options.policy is ignored. result[i] equals score_tokens with policies[i] alone. Chunks
// (options.chunk) apply only while every run is still dense (all-dense, or before the prefill).
// On a model that leads a tensor-parallel group (BackendModel::tensor_parallel) every rank steps
// (tensor_parallel_session.h): one backend's results within its arithmetic, the sparsity and hit
// rate over every head.
std::vector<ScoreResult> score_tokens_lockstep(std::shared_ptr<const BackendModel> model,
                                               std::span<const int32_t> tokens,
                                               std::span<const PolicyConfig> policies,
                                               const ScoreOptions& options = {});

struct GenerateOptions {
  int64_t max_new = 16;
  bool stop_at_eos = true;
  ProgressFn progress;
  std::function<void(int32_t token)> on_token;  // streaming callback
  PolicyConfig policy;  // applied at every step, the prompt's included (decode simulation)
};

// Greedy: feeds the prompt (step by step), then appends argmax tokens. Returns new tokens only.
std::vector<int32_t> generate_greedy(std::shared_ptr<const BackendModel> model,
                                     std::span<const int32_t> prompt,
                                     const GenerateOptions& options);
// The loop of generate_greedy over any decoder: advance(token) feeds one token and returns the
// greedy choice after it; position() is the decoder's. options.progress is advance's to call.
std::vector<int32_t> greedy_continuation(const ModelConfig& config, std::span<const int32_t> prompt,
                                         const GenerateOptions& options,
                                         const std::function<int32_t(int32_t)>& advance,
                                         const std::function<int64_t()>& position);

}  // namespace kvlens
