// Teacher-forced scoring and greedy generation over DecoderSession.
#include "engine/runtime/scoring.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/common/error.h"
#include "engine/policy/registry.h"

namespace kvlens {

ScoreResult score_tokens(std::shared_ptr<const BackendModel> model, std::span<const int32_t> tokens,
                         const ScoreOptions& options) {
  ScoreResult result;
  result.tokens.assign(tokens.begin(), tokens.end());
  const int64_t n = int64_t(tokens.size());
  if (n == 0) throw Error("input", "tokens", "at least one token to score");
  const int64_t chunk = std::max<int64_t>(1, options.chunk);
  Backend& backend = *model->backend;
  DecoderSession session(model);
  // Dense runs take the plain attention path; every other policy steps one token at a time from
  // options.prefill on (the decode simulation when it is 0).
  const bool with_policy = options.policy.id != "dense";
  if (with_policy) {
    session.set_policy(make_policy(options.policy, session.policy_shape(), backend),
                       options.prefill);
  }
  result.argmax.resize(size_t(n));
  result.nll.resize(size_t(n - 1));
  std::vector<double> log_probs;
  for (int64_t begin = 0, rows = 0; begin < n; begin += rows) {
    rows = std::min(chunk, n - begin);
    if (with_policy) rows = begin < options.prefill ? std::min(rows, options.prefill - begin) : 1;
    const DeviceTensor& logits = session.forward(tokens.subspan(size_t(begin), size_t(rows)));
    backend.argmax_rows(logits,
                        std::span<int32_t>(result.argmax).subspan(size_t(begin), size_t(rows)));
    // Row i predicts tokens[begin + i + 1]; the very last row has no target.
    const int64_t scored = std::min(rows, n - 1 - begin);
    if (scored > 0) {
      DeviceTensor scored_logits = logits;
      scored_logits.shape[0] = scored;
      log_probs.resize(size_t(scored));
      backend.log_prob_rows(scored_logits, tokens.subspan(size_t(begin + 1), size_t(scored)),
                            log_probs);
      for (int64_t i = 0; i < scored; ++i) result.nll[size_t(begin + i)] = -log_probs[size_t(i)];
    }
    if (options.progress) options.progress(begin + rows, n);
  }
  result.sparsity = session.sparsity();
  double total = 0.0;
  for (const double value : result.nll) total += value;
  result.ppl = result.nll.empty() ? std::numeric_limits<double>::quiet_NaN()
                                  : std::exp(total / double(result.nll.size()));
  return result;
}

std::vector<int32_t> generate_greedy(std::shared_ptr<const BackendModel> model,
                                     std::span<const int32_t> prompt,
                                     const GenerateOptions& options) {
  if (prompt.empty()) throw Error("input", "prompt", "at least one token");
  const ModelConfig& config = model->config();
  Backend& backend = *model->backend;
  DecoderSession session(model);
  if (options.policy.id != "dense") {
    session.set_policy(make_policy(options.policy, session.policy_shape(), backend));
  }
  const int64_t total = int64_t(prompt.size()) + options.max_new;
  int32_t next = 0;
  auto advance = [&](int32_t token) {
    const DeviceTensor& logits = session.forward(std::span<const int32_t>(&token, 1));
    backend.argmax_rows(logits, std::span<int32_t>(&next, 1));
    if (options.progress) options.progress(session.position(), total);
  };
  for (const int32_t token : prompt) advance(token);
  std::vector<int32_t> generated;
  for (int64_t i = 0; i < options.max_new; ++i) {
    generated.push_back(next);
    if (options.on_token) options.on_token(next);
    const bool is_eos = std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(),
                                  int64_t(next)) != config.eos_token_ids.end();
    if (options.stop_at_eos && is_eos) break;
    if (i + 1 < options.max_new) {
      if (session.position() >= config.max_position_embeddings) break;
      advance(next);
    }
  }
  return generated;
}

}  // namespace kvlens
