// Co-reference accuracy / coverage over generated samples, on top of score_tokens.
// Dense scores a sample in one chunk (on the CPU backend bit-identical to step-by-step); any
// other policy steps token by token (the decode simulation).
#include "engine/eval/coref_eval.h"

#include <mutex>

#include "engine/common/error.h"
#include "engine/session/decoder_session.h"

namespace kvlens {
namespace {

std::string sample_name(const CorefSample& sample) {
  return "coref sample " + std::to_string(sample.index) + " (seed " + std::to_string(sample.seed) +
         (sample.hard ? ", hard)" : ")");
}

void check_fits(const ModelConfig& config, const CorefSample& sample, const CorefTokens& marked) {
  const auto n = int64_t(marked.tokens.size());
  if (n > config.max_position_embeddings) {
    throw Error(sample_name(sample), "tokens",
                "at most " + std::to_string(config.max_position_embeddings) +
                    " tokens (max_position_embeddings of " + config.source + ")",
                std::to_string(n) + " tokens");
  }
}

}  // namespace

CorefSampleResult score_coref_sample(std::shared_ptr<const BackendModel> model,
                                     const CorefSample& sample, const CorefTokens& marked,
                                     const PolicyConfig& policy) {
  return std::move(score_coref_sample_lockstep(std::move(model), sample, marked,
                                               std::span<const PolicyConfig>(&policy, 1))
                       .front());
}

std::vector<CorefSampleResult> score_coref_sample_lockstep(
    std::shared_ptr<const BackendModel> model, const CorefSample& sample, const CorefTokens& marked,
    std::span<const PolicyConfig> policies, bool measure_hit_rate, int64_t dense_chunk) {
  check_fits(model->config(), sample, marked);
  ScoreOptions options;
  options.chunk = dense_chunk > 0 ? dense_chunk : int64_t(marked.tokens.size());
  options.hit_rate = measure_hit_rate;
  const std::vector<ScoreResult> scored_runs =
      score_tokens_lockstep(model, marked.tokens, policies, options);

  std::vector<CorefSampleResult> results;
  for (const ScoreResult& scored : scored_runs) {
    CorefSampleResult result;
    result.index = sample.index;
    result.answer = sample.answer;
    result.tokens = int64_t(marked.tokens.size());
    result.answer_token_begin = marked.answer_token_begin;
    result.answer_token_end = marked.answer_token_end;
    result.canonical = marked.canonical;
    // Position p's distribution predicts tokens[p + 1]; nll[p] is its negative log-probability.
    for (int64_t p = marked.first_scored_position(); p < marked.scored_position_end(); ++p) {
      result.correct_tokens += scored.argmax[size_t(p)] == marked.tokens[size_t(p + 1)];
      result.answer_nll += scored.nll[size_t(p)];
    }
    result.all_correct = result.correct_tokens == result.answer_tokens();
    result.sparsity = scored.sparsity;
    result.hit_rate = scored.hit_rate;
    results.push_back(std::move(result));
  }
  return results;
}

CorefEvalResult evaluate_coref(std::shared_ptr<const BackendModel> model, const CorefPools& pools,
                               const Tokenizer& tokenizer, uint64_t seed, int64_t first_index,
                               int64_t count, bool hard, const ProgressFn& progress,
                               const PolicyConfig& policy) {
  return std::move(evaluate_coref_lockstep(std::move(model), pools, tokenizer, seed, first_index,
                                           count, hard, progress,
                                           std::span<const PolicyConfig>(&policy, 1))
                       .front());
}

std::vector<MarkedCorefSample> mark_coref_samples(const ModelConfig& config,
                                                  const CorefPools& pools,
                                                  const Tokenizer& tokenizer, uint64_t seed,
                                                  int64_t first_index, int64_t count, bool hard) {
  if (count < 1) throw Error("coref eval", "samples", "at least 1", std::to_string(count));
  if (first_index < 0) {
    throw Error("coref eval", "first index", "a non-negative index", std::to_string(first_index));
  }
  std::vector<MarkedCorefSample> items;
  items.reserve(size_t(count));
  for (int64_t i = 0; i < count; ++i) {
    MarkedCorefSample item;
    item.sample = generate_coref_sample(pools, seed, first_index + i, hard);
    item.marked = mark_answer_tokens(item.sample, tokenizer);
    check_fits(config, item.sample, item.marked);
    items.push_back(std::move(item));
  }
  return items;
}

CorefEvalResult summarize_coref(std::vector<CorefSampleResult> per_sample) {
  CorefEvalResult result;
  int64_t all_correct = 0, correct_tokens = 0;
  for (CorefSampleResult& sample : per_sample) {
    all_correct += sample.all_correct;
    correct_tokens += sample.correct_tokens;
    result.sparsity.merge(sample.sparsity);
    result.hit_rate.merge(sample.hit_rate);
    result.answer_tokens += sample.answer_tokens();
    result.per_sample.push_back(std::move(sample));
  }
  result.samples = int64_t(result.per_sample.size());
  if (result.samples == 0) return result;
  result.accuracy = double(all_correct) / double(result.samples);
  // mark_answer_tokens guarantees at least one answer token per sample, so this is never 0/0.
  result.coverage = double(correct_tokens) / double(result.answer_tokens);
  return result;
}

std::vector<CorefEvalResult> evaluate_coref_lockstep(
    std::shared_ptr<const BackendModel> model, const CorefPools& pools, const Tokenizer& tokenizer,
    uint64_t seed, int64_t first_index, int64_t count, bool hard, const ProgressFn& progress,
    std::span<const PolicyConfig> policies, bool measure_hit_rate) {
  const std::vector<MarkedCorefSample> items =
      mark_coref_samples(model->config(), pools, tokenizer, seed, first_index, count, hard);

  // Samples are independent: the backend scores them as tasks (CPU: one per thread, its ops
  // inline; CUDA: one per host thread and stream), and the results are merged in index order.
  // A sample's scores do not depend on which task ran it or beside what.
  std::vector<std::vector<CorefSampleResult>> scored(static_cast<size_t>(count));
  std::mutex progress_mutex;
  int64_t done = 0;
  model->backend->run_tasks(count, [&](int64_t i) {
    scored[size_t(i)] = score_coref_sample_lockstep(
        model, items[size_t(i)].sample, items[size_t(i)].marked, policies, measure_hit_rate);
    if (progress) {
      const std::lock_guard<std::mutex> lock(progress_mutex);
      progress(++done, count);
    }
  });

  std::vector<CorefEvalResult> results;
  for (size_t p = 0; p < policies.size(); ++p) {
    std::vector<CorefSampleResult> per_sample;
    per_sample.reserve(size_t(count));
    for (std::vector<CorefSampleResult>& per_policy : scored) {
      per_sample.push_back(std::move(per_policy[p]));
    }
    results.push_back(summarize_coref(std::move(per_sample)));
  }
  return results;
}

}  // namespace kvlens
