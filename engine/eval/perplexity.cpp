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

std::vector<PerplexityResult> evaluate_perplexity_lockstep(
    std::shared_ptr<const BackendModel> model, std::span<const int32_t> tokens, int64_t window,
    int64_t chunk, const ProgressFn& progress, std::span<const PolicyConfig> policies,
    bool measure_hit_rate) {
  const ModelConfig& config = model->config();
  const auto n = int64_t(tokens.size());
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
  if (chunk < 1) throw Error("perplexity", "chunk", "at least 1 token", std::to_string(chunk));

  const int64_t stride = window - 1;
  // Window k starts at k*stride; it exists while at least 2 tokens remain from its start.
  const int64_t windows = (n - 2) / stride + 1;
  int64_t total_fed = 0;
  for (int64_t k = 0; k < windows; ++k) total_fed += std::min(window, n - k * stride);

  std::vector<PerplexityResult> results(policies.size());
  std::vector<double> total_nll(policies.size(), 0.0);
  int64_t fed = 0;
  ScoreOptions options;
  options.chunk = chunk;
  options.hit_rate = measure_hit_rate;
  for (int64_t k = 0; k < windows; ++k) {
    const int64_t begin = k * stride;
    const int64_t length = std::min(window, n - begin);
    if (progress) {
      options.progress = [&progress, fed, total_fed](int64_t done, int64_t) {
        progress(fed + done, total_fed);
      };
    }
    const std::vector<ScoreResult> scored = score_tokens_lockstep(
        model, tokens.subspan(size_t(begin), size_t(length)), policies, options);
    for (size_t p = 0; p < policies.size(); ++p) {
      for (const double nll : scored[p].nll) total_nll[p] += nll;
      results[p].tokens_scored += int64_t(scored[p].nll.size());
      results[p].sparsity.merge(scored[p].sparsity);
      results[p].hit_rate.merge(scored[p].hit_rate);
    }
    fed += length;
  }
  for (size_t p = 0; p < policies.size(); ++p) {
    PerplexityResult& result = results[p];
    result.window = window;
    result.windows = windows;
    result.mean_nll = total_nll[p] / double(result.tokens_scored);
    result.ppl = std::exp(result.mean_nll);
  }
  return results;
}

}  // namespace kvlens
