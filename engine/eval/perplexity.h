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

// One window's share of a run's perplexity: the sum of its scored tokens' NLL (nats) and their
// count, with its policy steps' statistics. A sharded eval gathers these in window order.
struct PerplexityWindow {
  double nll_sum = 0.0;
  int64_t tokens_scored = 0;
  SparsityStats sparsity;
  HitRateStats hit_rate;
};

// The number of windows of evaluate_perplexity below over n tokens (its checks of n, window and
// the model's positions first: kvlens::Error as below).
int64_t perplexity_window_count(const ModelConfig& config, int64_t n, int64_t window);
// Window k of `tokens` scored under `policies` in lockstep, one result per policy. `options`:
// chunk, hit rate and progress (within the window) as evaluate_perplexity passes them.
std::vector<PerplexityWindow> score_perplexity_window(std::shared_ptr<const BackendModel> model,
                                                      std::span<const int32_t> tokens,
                                                      int64_t window, int64_t k,
                                                      std::span<const PolicyConfig> policies,
                                                      const ScoreOptions& options);
// One run's perplexity from its windows in window order: the windows' NLL sums are added in that
// order (so a sharded eval that gathers the same windows gets the same bits).
PerplexityResult summarize_perplexity(std::span<const PerplexityWindow> windows, int64_t window);

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
