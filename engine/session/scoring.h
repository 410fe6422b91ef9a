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

struct ScoreResult {
  std::vector<int32_t> tokens;
  std::vector<double> nll;      // nll[i] = -log p(tokens[i+1] | tokens[..i]), size n-1
  std::vector<int32_t> argmax;  // argmax of the distribution after tokens[..i], size n
  double ppl = 0.0;             // exp(mean nll); 0 tokens scored -> NaN
  SparsityStats sparsity;       // over the policy's steps (no steps for dense)
};

struct ScoreOptions {
  int64_t chunk = 1;  // tokens per forward: 1 = step by step; larger = chunked prefill
  // The token-selection policy (POLICIES.md). Any policy but dense runs one token per step from
  // `prefill` on: 0 is the decode simulation; > 0 feeds that many prompt tokens densely first
  // (in chunks) and applies the policy to the steps after (prefill + decode).
  PolicyConfig policy;
  int64_t prefill = 0;
  ProgressFn progress;
};

ScoreResult score_tokens(std::shared_ptr<const BackendModel> model, std::span<const int32_t> tokens,
                         const ScoreOptions& options = {});
// The same text under several policies in lockstep (one run each, one pass over the weights per
// step); options.policy is ignored. result[i] equals score_tokens with policies[i] alone. Chunks
// (options.chunk) apply only while every run is still dense (all-dense, or before the prefill).
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

}  // namespace kvlens
