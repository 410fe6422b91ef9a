// Co-reference accuracy / coverage (POLICIES.md, Metrics) of a model on generated benchmark
// samples: one teacher-forced pass per sample, argmax at each position that predicts a token of
// the final mention. Per sample: [n] tokens, answer tokens [answer_token_begin, answer_token_end).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/eval/coref_benchmark.h"
#include "engine/eval/coref_pools.h"
#include "engine/session/scoring.h"

namespace kvlens {

class Tokenizer;

// One sample's outcome. The keys of `kvlens-cli eval --per-sample` and of
// tools/eval_demo_model.py's per-sample records, so the two can be joined on `index`.
struct CorefSampleResult {
  int64_t index = 0;
  std::string answer;
  int64_t tokens = 0;  // length of the whole tokenized sample
  int64_t answer_token_begin = 0;
  int64_t answer_token_end = 0;
  int64_t correct_tokens = 0;  // answer tokens whose position's argmax was the true token
  bool all_correct = false;
  bool canonical = true;    // CorefTokens::canonical
  double answer_nll = 0.0;  // sum over the answer tokens of -log p(token | everything before), nats
  SparsityStats sparsity;   // this sample's policy steps
  HitRateStats hit_rate;    // this sample's scored rows (measured with measure_hit_rate only)

  int64_t answer_tokens() const { return answer_token_end - answer_token_begin; }
};

// Scores one marked sample under `policy` (decode simulation; dense by default). Throws
// kvlens::Error naming the sample when its tokens do not fit max_position_embeddings.
CorefSampleResult score_coref_sample(std::shared_ptr<const BackendModel> model,
                                     const CorefSample& sample, const CorefTokens& marked,
                                     const PolicyConfig& policy = {});
// One sample under several policies in lockstep, one result per policy. measure_hit_rate:
// ScoreOptions::hit_rate. dense_chunk: tokens per forward while every run is dense (0: the whole
// sample at once; 1: step by step, as a dense run goes beside any other policy, which a shard
// holding only a sample's dense runs passes to compute what the whole lockstep computes).
std::vector<CorefSampleResult> score_coref_sample_lockstep(
    std::shared_ptr<const BackendModel> model, const CorefSample& sample, const CorefTokens& marked,
    std::span<const PolicyConfig> policies, bool measure_hit_rate = false, int64_t dense_chunk = 0);

struct CorefEvalResult {
  double accuracy = 0.0;  // fraction of samples with every answer token right
  double coverage = 0.0;  // answer tokens right / answer tokens, over all samples
  int64_t samples = 0;
  int64_t answer_tokens = 0;
  SparsityStats sparsity;                     // merged over the samples' policy steps
  HitRateStats hit_rate;                      // merged over the samples (measure_hit_rate)
  std::vector<CorefSampleResult> per_sample;  // in index order
};

// A generated sample with its answer tokens marked: one work item of a coref eval.
struct MarkedCorefSample {
  CorefSample sample;
  CorefTokens marked;
};

// Samples first_index .. first_index + count - 1 of generate_coref_sample(pools, seed, i, hard),
// marked with `tokenizer`, each checked to fit `config` (the checks of evaluate_coref below).
std::vector<MarkedCorefSample> mark_coref_samples(const ModelConfig& config,
                                                  const CorefPools& pools,
                                                  const Tokenizer& tokenizer, uint64_t seed,
                                                  int64_t first_index, int64_t count, bool hard);

// One run's totals over its samples' results, given in index order (the order fixes the sums'
// rounding, so a sharded eval that gathers the same results gets the same bits).
CorefEvalResult summarize_coref(std::vector<CorefSampleResult> per_sample);

// Samples first_index .. first_index + count - 1 of generate_coref_sample(pools, seed, i, hard),
// marked with `tokenizer`. Every sample is generated and its length checked before any compute,
// so a too-long sample fails the run at once rather than after the others were scored. Samples
// are scored concurrently (Backend::run_tasks) with the results of scoring each alone.
// `progress` gets (samples done, count), one call at a time, done counting up from 1. Throws
// kvlens::Error for count < 1 or first_index < 0.
CorefEvalResult evaluate_coref(std::shared_ptr<const BackendModel> model, const CorefPools& pools,
                               const Tokenizer& tokenizer, uint64_t seed, int64_t first_index,
                               int64_t count, bool hard, const ProgressFn& progress,
                               const PolicyConfig& policy = {});
// The same for several policies in lockstep (each sample is read once, every policy a run of one
// DecoderSession); result[i] equals evaluate_coref with policies[i] alone.
std::vector<CorefEvalResult> evaluate_coref_lockstep(
    std::shared_ptr<const BackendModel> model, const CorefPools& pools, const Tokenizer& tokenizer,
    uint64_t seed, int64_t first_index, int64_t count, bool hard, const ProgressFn& progress,
    std::span<const PolicyConfig> policies, bool measure_hit_rate = false);

}  // namespace kvlens
