// Teacher-forced scoring and greedy generation over DecoderSession.
#include "engine/session/scoring.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "engine/common/error.h"
#include "engine/policy/registry.h"
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

std::vector<ScoreResult> score_tokens_lockstep(std::shared_ptr<const BackendModel> model,
                                               std::span<const int32_t> tokens,
                                               std::span<const PolicyConfig> policies,
                                               const ScoreOptions& options) {
  const int64_t n = int64_t(tokens.size());
  if (n == 0) throw Error("input", "tokens", "at least one token to score");
  if (policies.empty()) throw Error("input", "policies", "at least one policy to score under");
  const auto runs = int64_t(policies.size());
  Backend& backend = *model->backend;
  // The hit rate needs the true logits of the policies' steps. A recording session records a
  // dense chunk's too ([chunk, H, context] per layer), so an all-dense text is not recorded (it
  // has no scored row) and prefill chunks are kept short while recording.
  const bool record = options.hit_rate &&
                      std::any_of(policies.begin(), policies.end(),
                                  [](const PolicyConfig& p) { return !is_reference_policy(p.id); });
  constexpr int64_t kRecordedChunk = 16;
  const int64_t chunk = std::clamp<int64_t>(
      options.chunk, 1, record ? kRecordedChunk : std::numeric_limits<int64_t>::max());
  DecoderSession session(model, {.record_attention_logits = record}, runs);
  HitRateReader hit_rates(backend, n);
  // Reference (dense) runs take the plain attention path; every other policy steps one token at a
  // time from options.prefill on (the decode simulation when it is 0).
  bool any_policy = false;
  for (int64_t r = 0; r < runs; ++r) {
    std::unique_ptr<Policy> policy =
        make_run_policy(policies[size_t(r)], session.policy_shape(), backend);
    if (!policy) continue;  // the reference: the plain path
    session.set_policy(r, std::move(policy), options.prefill);
    any_policy = true;
  }
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
    const DeviceTensor& logits = session.forward(tokens.subspan(size_t(begin), size_t(rows)));
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
    if (record && per_run) hit_rates.add_step(session, results);
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
    result.sparsity = session.run(r).sparsity;
    double total = 0.0;
    for (const double value : result.nll) total += value;
    result.ppl = result.nll.empty() ? std::numeric_limits<double>::quiet_NaN()
                                    : std::exp(total / double(result.nll.size()));
  }
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
