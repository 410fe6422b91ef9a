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

  PerplexityResult result;
  result.window = window;
  result.windows = windows;
  double total_nll = 0.0;
  int64_t fed = 0;
  ScoreOptions options;
  options.chunk = chunk;
  options.policy = policy;
  for (int64_t k = 0; k < windows; ++k) {
    const int64_t begin = k * stride;
    const int64_t length = std::min(window, n - begin);
    if (progress) {
      options.progress = [&progress, fed, total_fed](int64_t done, int64_t) {
        progress(fed + done, total_fed);
      };
    }
    const ScoreResult scored =
        score_tokens(model, tokens.subspan(size_t(begin), size_t(length)), options);
    for (const double nll : scored.nll) total_nll += nll;
    result.tokens_scored += int64_t(scored.nll.size());
    result.sparsity.merge(scored.sparsity);
    fed += length;
  }
  result.mean_nll = total_nll / double(result.tokens_scored);
  result.ppl = std::exp(result.mean_nll);
  return result;
}

}  // namespace kvlens
