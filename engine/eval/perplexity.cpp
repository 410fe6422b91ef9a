// Windowed perplexity: score_tokens on each window, each with its own (empty) decoder session.
// Windows start every W-1 tokens so each window's first token is the previous window's last.
#include "engine/eval/perplexity.h"

#include <algorithm>
#include <cmath>

#include "engine/common/error.h"

namespace kvlens {

PerplexityResult evaluate_perplexity(std::shared_ptr<const BackendModel> model,
                                     std::span<const int32_t> tokens, int64_t window, int64_t chunk,
                                     const ProgressFn& progress, const PolicyConfig& policy) {
  return std::move(evaluate_perplexity_lockstep(std::move(model), tokens, window, chunk, progress,
                                                std::span<const PolicyConfig>(&policy, 1))
                       .front());
}

int64_t perplexity_window_count(const ModelConfig& config, int64_t n, int64_t window) {
  if (n < 2) {
    throw Error("perplexity", "tokens", "at least 2 tokens (one to predict from, one to predict)",
                std::to_string(n));
  }
  if (window < 2 || window > config.max_position_embeddings) {
    throw Error("perplexity", "window",
                "2 <= window <= " + std::to_string(config.max_position_embeddings) +
                    " (max_position_embeddings of " + config.source + ")",
                std::to_string(window));
  }
  // Window k starts at k*(window-1); it exists while at least 2 tokens remain from its start.
  return (n - 2) / (window - 1) + 1;
}

std::vector<PerplexityWindow> score_perplexity_window(std::shared_ptr<const BackendModel> model,
                                                      std::span<const int32_t> tokens,
                                                      int64_t window, int64_t k,
                                                      std::span<const PolicyConfig> policies,
                                                      const ScoreOptions& options) {
  const auto n = int64_t(tokens.size());
  const int64_t begin = k * (window - 1);
  const int64_t length = std::min(window, n - begin);
  const std::vector<ScoreResult> scored = score_tokens_lockstep(
      std::move(model), tokens.subspan(size_t(begin), size_t(length)), policies, options);
  std::vector<PerplexityWindow> windows(policies.size());
  for (size_t p = 0; p < policies.size(); ++p) {
    for (const double nll : scored[p].nll) windows[p].nll_sum += nll;
    windows[p].tokens_scored = int64_t(scored[p].nll.size());
    windows[p].sparsity = scored[p].sparsity;
    windows[p].hit_rate = scored[p].hit_rate;
  }
  return windows;
}

PerplexityResult summarize_perplexity(std::span<const PerplexityWindow> windows, int64_t window) {
  PerplexityResult result;
  double total_nll = 0.0;
  for (const PerplexityWindow& w : windows) {
    total_nll += w.nll_sum;
    result.tokens_scored += w.tokens_scored;
    result.sparsity.merge(w.sparsity);
    result.hit_rate.merge(w.hit_rate);
  }
  result.window = window;
  result.windows = int64_t(windows.size());
  result.mean_nll = total_nll / double(result.tokens_scored);
  result.ppl = std::exp(result.mean_nll);
  return result;
}

std::vector<PerplexityResult> evaluate_perplexity_lockstep(
    std::shared_ptr<const BackendModel> model, std::span<const int32_t> tokens, int64_t window,
    int64_t chunk, const ProgressFn& progress, std::span<const PolicyConfig> policies,
    bool measure_hit_rate) {
  const auto n = int64_t(tokens.size());
  const int64_t windows = perplexity_window_count(model->config(), n, window);
  if (chunk < 1) throw Error("perplexity", "chunk", "at least 1 token", std::to_string(chunk));

  const int64_t stride = window - 1;
  int64_t total_fed = 0;
  for (int64_t k = 0; k < windows; ++k) total_fed += std::min(window, n - k * stride);

  // per_run[p][k]: run p's window k.
  std::vector<std::vector<PerplexityWindow>> per_run(policies.size());
  int64_t fed = 0;
  ScoreOptions options;
  options.chunk = chunk;
  options.hit_rate = measure_hit_rate;
  for (int64_t k = 0; k < windows; ++k) {
    if (progress) {
      options.progress = [&progress, fed, total_fed](int64_t done, int64_t) {
        progress(fed + done, total_fed);
      };
    }
    std::vector<PerplexityWindow> scored =
        score_perplexity_window(model, tokens, window, k, policies, options);
    for (size_t p = 0; p < policies.size(); ++p) per_run[p].push_back(std::move(scored[p]));
    fed += std::min(window, n - k * stride);
  }
  std::vector<PerplexityResult> results;
  for (const std::vector<PerplexityWindow>& run : per_run) {
    results.push_back(summarize_perplexity(run, window));
  }
  return results;
}

}  // namespace kvlens
