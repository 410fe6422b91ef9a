// Perplexity of a token sequence longer than the model's context, scored in independent windows
// of at most W tokens (each from an empty KV cache). tokens: [n] ids, n >= 2; W <= the model's
// max_position_embeddings. tools/eval_demo_model.py cross-checks with the same windowing rule.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/session/scoring.h"

namespace kvlens {

struct PerplexityResult {
  double ppl = 0.0;  // exp(mean_nll)
  double mean_nll = 0.0;
  int64_t tokens_scored = 0;  // n - 1: every token but the first is predicted exactly once
  int64_t windows = 0;
  int64_t window = 0;      // W
  SparsityStats sparsity;  // merged over the windows' policy steps
  HitRateStats hit_rate;   // merged over the windows (measured with measure_hit_rate only)
};

// Window k holds tokens[k*(W-1), k*(W-1) + W) (the last one may be shorter; windows of fewer
// than 2 tokens are not formed) and contributes the NLL of its tokens 1..len-1: consecutive
// windows overlap by one token, so that token is context in the later window and never scored
// twice. `chunk`: tokens per forward pass inside a window (1 = step by step). `progress` gets
// (tokens fed, total tokens fed over all windows). Throws kvlens::Error for fewer than 2 tokens,
// window < 2 or > max_position_embeddings, or chunk < 1.
PerplexityResult evaluate_perplexity(std::shared_ptr<const BackendModel> model,
                                     std::span<const int32_t> tokens, int64_t window, int64_t chunk,
                                     const ProgressFn& progress, const PolicyConfig& policy = {});
// The same for several policies in lockstep over each window; result[i] equals
// evaluate_perplexity with policies[i] alone. measure_hit_rate: ScoreOptions::hit_rate.
std::vector<PerplexityResult> evaluate_perplexity_lockstep(
    std::shared_ptr<const BackendModel> model, std::span<const int32_t> tokens, int64_t window,
    int64_t chunk, const ProgressFn& progress, std::span<const PolicyConfig> policies,
    bool measure_hit_rate = false);

}  // namespace kvlens
