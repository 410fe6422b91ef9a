// Teacher-forced scoring and greedy generation over DecoderSession (and, for a model led over
// a tensor-parallel group, over TensorParallelSession).
#include "engine/session/scoring.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "engine/common/error.h"
#include "engine/policy/registry.h"
#include "engine/session/tensor_parallel_session.h"
#include "engine/trace/step_metrics.h"

namespace kvlens {
namespace {

// Reads back the rows a step's policies scored and adds their hit rates to each run's stats:
// per run, its true logits [layers * H, cols] (SessionRun::recorded_logits, where TraceRecorder
// reads them too) and the scores [H, cols] of its Masked layers, in one host buffer behind one
// fence.
class HitRateReader {
 public:
  // `max_columns`: the text's length, the widest step's columns.
  HitRateReader(Backend& backend, int64_t max_columns)
      : backend_(backend), max_columns_(max_columns) {}

  // After a single-token forward at position t (session.position() == t + 1).
  void add_step(const DecoderSession& session, std::vector<ScoreResult>& results) {
    const int64_t t = session.position() - 1, cols = t + 1;
    const ModelConfig& c = session.model().config();
    const int64_t L = c.num_layers, H = c.num_heads;
    const size_t row_bytes = size_t(cols) * sizeof(float);
    queued_.clear();
    size_t bytes = 0;
    for (int64_t r = 0; r < session.runs(); ++r) {
      const SessionRun& run = session.run(r);  // settled: its Gated layers resolved
      if (!run.policy || t < run.first_step) continue;
      const size_t logits_at = bytes;  // the run's true logits, if any layer is queued
      for (int64_t l = 0; l < L; ++l) {
        if (run.decisions[size_t(l)] != LayerDecision::Masked) continue;
        if (bytes == logits_at) bytes += size_t(L * H) * row_bytes;
        queued_.push_back({size_t(r), size_t(l), logits_at, bytes});
        bytes += size_t(H) * row_bytes;
      }
    }
    if (queued_.empty()) return;
    if (bytes > capacity_) {
      // Steps grow by a column, and a new buffer can be costly (page-locked memory on CUDA, whose
      // release waits for the device): the whole text's worst case (every run's logits and
      // scores of every layer) for the first 1024 columns, then doubling up to the text's.
      const auto worst = [&](int64_t columns) {
        return size_t(session.runs() * 2 * L * H * columns) * sizeof(float);
      };
      const int64_t first = std::min<int64_t>(max_columns_, 1024);
      capacity_ = std::min(worst(max_columns_), std::max(2 * bytes, worst(first)));
      host_.reset();
      host_ = backend_.alloc_host(capacity_);
    }
    auto* host = static_cast<std::byte*>(host_.get());
    size_t last_run = ~size_t(0);
    for (const QueuedRows& q : queued_) {
      const SessionRun& run = session.run(int64_t(q.run));
      if (q.run != last_run) {
        backend_.rows_to_host_async(run.recorded_logits, L * H, cols, host + q.logits_at);
        last_run = q.run;
      }
      backend_.rows_to_host_async(run.scores[q.layer], H, cols, host + q.scores_at);
    }
    backend_.fence()->wait();
    // Each queued layer's rows on a thread of the backend (its tasks run in order on the calling
    // thread where that is already one of an eval's concurrent samples), summed in queue order so
    // the totals do not depend on the threads.
    layer_sums_.assign(queued_.size(), 0.0);
    backend_.run_tasks(int64_t(queued_.size()), [&](int64_t i) {
      const QueuedRows& q = queued_[size_t(i)];
      const auto* logits = reinterpret_cast<const float*>(host + q.logits_at);
      const auto* scores = reinterpret_cast<const float*>(host + q.scores_at);
      double sum = 0.0;
      for (int64_t h = 0; h < H; ++h) {
        const std::span<const float> true_row(logits + (int64_t(q.layer) * H + h) * cols,
                                              size_t(cols));
        sum += top_half_agreement({scores + h * cols, size_t(cols)}, true_row);
      }
      layer_sums_[size_t(i)] = sum;
    });
    for (size_t i = 0; i < queued_.size(); ++i) {
      HitRateStats& stats = results[queued_[i].run].hit_rate;
      stats.sum += layer_sums_[i];
      stats.rows += H;
    }
  }

 private:
  struct QueuedRows {
    size_t run, layer, logits_at, scores_at;  // byte offsets into host_
  };
  Backend& backend_;
  std::vector<QueuedRows> queued_;
  std::vector<double> layer_sums_;  // per queued layer: the sum of its heads' hit rates
  int64_t max_columns_;
  std::shared_ptr<void> host_;
  size_t capacity_ = 0;
};

}  // namespace

double HitRateStats::mean() const {
  return rows > 0 ? sum / double(rows) : std::numeric_limits<double>::quiet_NaN();
}

ScoreResult score_tokens(std::shared_ptr<const BackendModel> model, std::span<const int32_t> tokens,
                         const ScoreOptions& options) {
  return std::move(score_tokens_lockstep(std::move(model), tokens,
                                         std::span<const PolicyConfig>(&options.policy, 1), options)
                       .front());
}

namespace {

// What the scoring loop steps: the runs of one DecoderSession, or of a TensorParallelSession
// (every rank stepped, the logits on rank 0's backend).
class ScoredRuns {
 public:
  virtual ~ScoredRuns() = default;
  virtual Backend& lead_backend() = 0;
  virtual const DeviceTensor& forward(std::span<const int32_t> tokens) = 0;
  // After a single-token step: each run's hit rate over the rows its policy scored.
  virtual void add_hit_rates(std::vector<ScoreResult>& results) = 0;
  virtual SparsityStats sparsity(int64_t run) const = 0;
};

class OneBackendRuns final : public ScoredRuns {
 public:
  OneBackendRuns(std::shared_ptr<const BackendModel> model, std::span<const PolicyConfig> policies,
                 const ScoreOptions& options, bool record, int64_t tokens)
      : backend_(*model->backend),
        session_(model, {.record_attention_logits = record}, int64_t(policies.size())),
        hit_rates_(backend_, tokens) {
    for (size_t r = 0; r < policies.size(); ++r) {
      std::unique_ptr<Policy> policy =
          make_run_policy(policies[r], session_.policy_shape(), backend_);
      if (policy) session_.set_policy(int64_t(r), std::move(policy), options.prefill);
    }
  }
  Backend& lead_backend() override { return backend_; }
  const DeviceTensor& forward(std::span<const int32_t> tokens) override {
    return session_.forward(tokens);
  }
  void add_hit_rates(std::vector<ScoreResult>& results) override {
    hit_rates_.add_step(session_, results);
  }
  SparsityStats sparsity(int64_t run) const override { return session_.run(run).sparsity; }

 private:
  Backend& backend_;
  DecoderSession session_;
  HitRateReader hit_rates_;
};

// Each rank reads its heads' rows on its own backend; the runs' sums and row counts over the
// ranks are those of every head.
class TensorParallelRuns final : public ScoredRuns {
 public:
  TensorParallelRuns(const TensorParallelShards& group, std::span<const PolicyConfig> policies,
                     const ScoreOptions& options, bool record, int64_t tokens)
      : session_(group.model, group.shards, {.record_attention_logits = record},
                 int64_t(policies.size())) {
    for (size_t r = 0; r < policies.size(); ++r)
      session_.set_policy(int64_t(r), policies[r], options.prefill);
    for (const auto& shard : group.shards) hit_rates_.emplace_back(*shard->backend, tokens);
  }
  Backend& lead_backend() override { return session_.lead_backend(); }
  const DeviceTensor& forward(std::span<const int32_t> tokens) override {
    return session_.forward(tokens);
  }
  void add_hit_rates(std::vector<ScoreResult>& results) override {
    for (int64_t r = 0; r < session_.ranks(); ++r)
      hit_rates_[size_t(r)].add_step(session_.rank_session(r), results);
  }
  SparsityStats sparsity(int64_t run) const override { return session_.sparsity(run); }

 private:
  TensorParallelSession session_;
  std::vector<HitRateReader> hit_rates_;
};

// The runs of `policies` in lockstep over `tokens`: one forward per chunk or step, every run's
// argmax and NLL read from its row.
std::vector<ScoreResult> score_runs(std::shared_ptr<const BackendModel> model,
                                    std::span<const int32_t> tokens,
                                    std::span<const PolicyConfig> policies,
                                    const ScoreOptions& options) {
  const int64_t n = int64_t(tokens.size());
  const auto runs = int64_t(policies.size());
  // The hit rate needs the true logits of the policies' steps. A recording session records a
  // dense chunk's too ([chunk, H, context] per layer), so an all-dense text is not recorded (it
  // has no scored row) and prefill chunks are kept short while recording.
  const bool any_policy = std::any_of(policies.begin(), policies.end(), [](const PolicyConfig& p) {
    return !is_reference_policy(p.id);
  });
  const bool record = options.hit_rate && any_policy;
  constexpr int64_t kRecordedChunk = 16;
  const int64_t chunk = std::clamp<int64_t>(
      options.chunk, 1, record ? kRecordedChunk : std::numeric_limits<int64_t>::max());
  // Reference (dense) runs take the plain attention path; every other policy steps one token at a
  // time from options.prefill on (the decode simulation when it is 0).
  std::unique_ptr<ScoredRuns> session;
  if (model->tensor_parallel)
    session =
        std::make_unique<TensorParallelRuns>(*model->tensor_parallel, policies, options, record, n);
  else
    session = std::make_unique<OneBackendRuns>(model, policies, options, record, n);
  Backend& backend = session->lead_backend();
  std::vector<ScoreResult> results(static_cast<size_t>(runs));
  for (ScoreResult& result : results) {
    result.tokens.assign(tokens.begin(), tokens.end());
    result.argmax.resize(size_t(n));
    result.nll.resize(size_t(n - 1));
  }
  std::vector<double> log_probs;
  std::vector<int32_t> argmax;
  for (int64_t begin = 0, rows = 0; begin < n; begin += rows) {
    rows = std::min(chunk, n - begin);
    if (any_policy) rows = begin < options.prefill ? std::min(rows, options.prefill - begin) : 1;
    const DeviceTensor& logits = session->forward(tokens.subspan(size_t(begin), size_t(rows)));
    // A chunk's logits are shared by every run; a step has one row per run.
    const bool per_run = rows == 1;
    argmax.resize(size_t(logits.dim(0)));
    backend.argmax_rows(logits, argmax);
    const int64_t scored = std::min(rows, n - 1 - begin);  // the very last row has no target
    if (scored > 0) {
      // Row i of a chunk predicts tokens[begin + i + 1]; every run's row predicts tokens[begin +
      // 1].
      std::vector<int32_t> targets;
      if (per_run) {
        targets.assign(size_t(logits.dim(0)), tokens[size_t(begin + 1)]);
      } else {
        targets.assign(tokens.begin() + begin + 1, tokens.begin() + begin + 1 + scored);
      }
      DeviceTensor scored_logits = logits;
      scored_logits.shape[0] = int64_t(targets.size());
      log_probs.resize(targets.size());
      backend.log_prob_rows(scored_logits, targets, log_probs);
    }
    if (record && per_run) session->add_hit_rates(results);
    for (int64_t r = 0; r < runs; ++r) {
      ScoreResult& result = results[size_t(r)];
      for (int64_t i = 0; i < rows; ++i) {
        const size_t row = size_t(per_run ? r : i);
        result.argmax[size_t(begin + i)] = argmax[row];
        if (i < scored) result.nll[size_t(begin + i)] = -log_probs[row];
      }
    }
    if (options.progress) options.progress(begin + rows, n);
  }
  for (int64_t r = 0; r < runs; ++r) {
    ScoreResult& result = results[size_t(r)];
    result.sparsity = session->sparsity(r);
    double total = 0.0;
    for (const double value : result.nll) total += value;
    result.ppl = result.nll.empty() ? std::numeric_limits<double>::quiet_NaN()
                                    : std::exp(total / double(result.nll.size()));
  }
  return results;
}

}  // namespace

std::vector<ScoreResult> score_tokens_lockstep(std::shared_ptr<const BackendModel> model,
                                               std::span<const int32_t> tokens,
                                               std::span<const PolicyConfig> policies,
                                               const ScoreOptions& options) {
  if (tokens.empty()) throw Error("input", "tokens", "at least one token to score");
  if (policies.empty()) throw Error("input", "policies", "at least one policy to score under");
  if (!model->tensor_parallel) return score_runs(std::move(model), tokens, policies, options);
  // Over a tensor-parallel group, a policy whose rule sums over heads takes collectives of its
  // own at each step, which runs stepped side by side would pair up differently on each rank: it
  // runs alone, the others in lockstep. Each run's result is the same either way.
  std::vector<size_t> together, alone;
  for (size_t r = 0; r < policies.size(); ++r) {
    const bool reduces = !is_reference_policy(policies[r].id) &&
                         policy_info(policies[r].id).reduces_heads && policies.size() > 1;
    (reduces ? alone : together).push_back(r);
  }
  std::vector<ScoreResult> results(policies.size());
  // Each pass over the text reports its share, so the caller sees one count that only grows
  // from 0 to the text's length.
  const int64_t n = int64_t(tokens.size());
  const int64_t passes = int64_t(alone.size()) + (together.empty() ? 0 : 1);
  int64_t pass = 0;
  const auto score_subset = [&](const std::vector<size_t>& subset) {
    std::vector<PolicyConfig> configs;
    for (const size_t r : subset) configs.push_back(policies[r]);
    ScoreOptions pass_options = options;
    if (options.progress) {
      pass_options.progress = [&, pass](int64_t done, int64_t) {
        options.progress((pass * n + done) / passes, n);
      };
    }
    std::vector<ScoreResult> scored = score_runs(model, tokens, configs, pass_options);
    for (size_t i = 0; i < subset.size(); ++i) results[subset[i]] = std::move(scored[i]);
    ++pass;
  };
  if (!together.empty()) score_subset(together);
  for (const size_t r : alone) score_subset({r});
  return results;
}

std::vector<int32_t> greedy_continuation(const ModelConfig& config, std::span<const int32_t> prompt,
                                         const GenerateOptions& options,
                                         const std::function<int32_t(int32_t)>& advance,
                                         const std::function<int64_t()>& position) {
  if (prompt.empty()) throw Error("input", "prompt", "at least one token");
  int32_t next = 0;
  for (const int32_t token : prompt) next = advance(token);
  std::vector<int32_t> generated;
  for (int64_t i = 0; i < options.max_new; ++i) {
    generated.push_back(next);
    if (options.on_token) options.on_token(next);
    const bool is_eos = std::find(config.eos_token_ids.begin(), config.eos_token_ids.end(),
                                  int64_t(next)) != config.eos_token_ids.end();
    if (options.stop_at_eos && is_eos) break;
    if (i + 1 < options.max_new) {
      if (position() >= config.max_position_embeddings) break;
      next = advance(next);
    }
  }
  return generated;
}

std::vector<int32_t> generate_greedy(std::shared_ptr<const BackendModel> model,
                                     std::span<const int32_t> prompt,
                                     const GenerateOptions& options) {
  if (prompt.empty()) throw Error("input", "prompt", "at least one token");
  Backend& backend = *model->backend;
  DecoderSession session(model);
  if (auto policy = make_run_policy(options.policy, session.policy_shape(), backend))
    session.set_policy(std::move(policy));
  const int64_t total = int64_t(prompt.size()) + options.max_new;
  return greedy_continuation(
      model->config(), prompt, options,
      [&](int32_t token) {
        const DeviceTensor& logits = session.forward(std::span<const int32_t>(&token, 1));
        int32_t next = 0;
        backend.argmax_rows(logits, std::span<int32_t>(&next, 1));
        if (options.progress) options.progress(session.position(), total);
        return next;
      },
      [&] { return session.position(); });
}

}  // namespace kvlens
