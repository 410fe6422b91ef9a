// Recording a lockstep run into a Trace. Per step: the session advances every run by one token,
// then each traced run's layer rows are read back ([H, stride] buffers, the first t + 1 columns)
// and reduced to the step metrics before the trace applies its memory budget.
// Rows of a layer a policy did not rank (Dense decision, or a run without a policy): visible is
// every candidate and scores are NaN; a skipped layer (tokenfilter) shows nothing visible.
#include "engine/trace/trace_recorder.h"

#include <algorithm>
#include <cmath>

#include "engine/common/error.h"
#include "engine/eval/step_metrics.h"
#include "engine/model/tokenizer.h"
#include "engine/policy/registry.h"

namespace kvlens {
namespace {

// The common knobs a run's oracle comparison uses; policies without them (dense) get defaults.
CommonKnobs knobs_of(const PolicyConfig& config) {
  const PolicyInfo& info = policy_info(config.id);
  const bool has_common = std::any_of(info.params.begin(), info.params.end(),
                                      [](const ParamSpec& spec) { return spec.name == "sinks"; });
  if (!has_common) return CommonKnobs{};
  return read_common_knobs(resolve_params(info.params, config.args, "policy " + config.id),
                           config.sparsity);
}

std::vector<std::string> describe_params(const PolicyConfig& config) {
  return resolve_params(policy_info(config.id).params, config.args, "policy " + config.id)
      .describe();
}

}  // namespace

TraceRecorder::TraceRecorder(std::shared_ptr<const BackendModel> model, const Tokenizer* tokenizer,
                             std::vector<int32_t> tokens, std::vector<PolicyConfig> policies,
                             TraceOptions options)
    : model_(std::move(model)),
      tokenizer_(tokenizer),
      tokens_(std::move(tokens)),
      policies_(std::move(policies)),
      options_(std::move(options)),
      session_(model_, {.record_attention_logits = true},
               int64_t(policies_.size()) +
                   (std::none_of(policies_.begin(), policies_.end(),
                                 [](const PolicyConfig& p) { return p.id == "dense"; })
                        ? 1
                        : 0)) {
  const ModelConfig& c = model_->config();
  if (policies_.empty()) throw Error("trace", "policies", "at least one policy");
  if (tokens_.empty()) throw Error("trace", "tokens", "at least one token");
  if (int64_t(tokens_.size()) > c.max_position_embeddings) {
    throw Error("trace", "tokens",
                "at most " + std::to_string(c.max_position_embeddings) +
                    " tokens (max_position_embeddings of " + c.source + ")",
                std::to_string(tokens_.size()));
  }
  for (const int32_t id : tokens_) {
    if (id < 0 || id >= c.vocab_size) {
      throw Error("trace", "token id", "an id in [0, " + std::to_string(c.vocab_size) + ")",
                  std::to_string(id));
    }
  }
  if (options_.top_k < 1)
    throw Error("trace", "top_k", "at least 1", std::to_string(options_.top_k));

  trace_.model = {model_->model->dir, c.num_layers, c.num_heads,
                  c.num_kv_heads,     c.head_dim,   c.vocab_size};
  trace_.top_k = options_.top_k;
  trace_.memory_budget = options_.memory_budget;
  trace_.selected_heads = options_.selected_heads;
  for (const int32_t id : tokens_) {
    trace_.tokens.push_back({id, tokenizer ? tokenizer->token_text(id) : std::to_string(id)});
  }
  // The dense reference is the first traced dense run, else the extra run after the traced ones.
  reference_run_ = int64_t(policies_.size());
  for (size_t r = 0; r < policies_.size(); ++r) {
    const PolicyConfig& config = policies_[r];
    validate_policy_config(config);
    trace_.runs.push_back({config.id, config.sparsity, describe_params(config), options_.prefill});
    knobs_.push_back(knobs_of(config));
    if (config.id == "dense") {
      if (reference_run_ == int64_t(policies_.size())) reference_run_ = int64_t(r);
      continue;
    }
    session_.set_policy(int64_t(r), make_policy(config, session_.policy_shape(), *model_->backend),
                        options_.prefill);
  }
}

bool TraceRecorder::step() {
  if (done()) return false;
  const int64_t t = trace_.step_count();
  Backend& backend = *model_->backend;
  const DeviceTensor& logits = session_.forward(std::span<const int32_t>(&tokens_[size_t(t)], 1));
  const int64_t vocab = model_->config().vocab_size;
  std::vector<float> all_logits(size_t(logits.numel()));
  backend.to_host(logits, all_logits.data(), all_logits.size() * sizeof(float));
  auto row_of = [&](int64_t run) {
    return std::vector<float>(all_logits.begin() + run * vocab,
                              all_logits.begin() + (run + 1) * vocab);
  };
  const std::vector<float> dense_row = row_of(reference_run_);
  std::vector<StepRecord> records;
  for (int64_t r = 0; r < int64_t(policies_.size()); ++r) {
    records.push_back(record_run(r, t, row_of(r), dense_row));
  }
  trace_.add_step(std::move(records));
  return true;
}

StepRecord TraceRecorder::record_run(int64_t run_index, int64_t t,
                                     const std::vector<float>& logits_row,
                                     const std::vector<float>& dense_row) {
  const SessionRun& run = session_.run(run_index);
  const ModelConfig& c = model_->config();
  const int64_t L = c.num_layers, H = c.num_heads, cols = t + 1;
  const bool policy_step = run.policy && t >= run.first_step;
  Backend& backend = *model_->backend;

  StepRecord record;
  record.columns = cols;
  record.decisions.assign(size_t(L), LayerDecision::Dense);
  record.visible_counts.assign(size_t(L * H), int32_t(cols));
  record.kept_heads.resize(size_t(L * H));
  for (int64_t i = 0; i < L * H; ++i) record.kept_heads[size_t(i)] = int32_t(i);
  record.logits.resize(size_t(L * H * cols));
  record.scores.assign(size_t(L * H * cols), std::numeric_limits<float>::quiet_NaN());
  record.visible.assign(size_t(L * H * cols), 1);

  const int64_t stride = policy_step ? run.visible[0].dim(1) : 0;
  double recall_sum = 0.0, agreement_sum = 0.0, hidden_sum = 0.0;
  int64_t recall_rows = 0, agreement_rows = 0;
  const CommonKnobs& knobs = knobs_[size_t(run_index)];
  for (int64_t l = 0; l < L; ++l) {
    // The true logits: [1, H, cols] packed by the session for this step.
    backend.to_host(run.attention_logits[size_t(l)], record.logits.data() + l * H * cols,
                    size_t(H * cols) * sizeof(float));
    const LayerDecision decision = policy_step ? run.decisions[size_t(l)] : LayerDecision::Dense;
    record.decisions[size_t(l)] = decision;
    if (decision == LayerDecision::Dense) continue;
    host_scores_.resize(size_t(H * stride));
    backend.to_host(run.scores[size_t(l)], host_scores_.data(),
                    host_scores_.size() * sizeof(float));
    if (decision == LayerDecision::Masked) {
      host_visible_.resize(size_t(H * stride));
      backend.to_host(run.visible[size_t(l)], host_visible_.data(), host_visible_.size());
    }
    for (int64_t h = 0; h < H; ++h) {
      const size_t at = size_t((l * H + h) * cols);
      std::copy_n(host_scores_.data() + h * stride, cols, record.scores.data() + at);
      uint8_t* visible = record.visible.data() + at;
      if (decision == LayerDecision::Skipped) {
        std::fill_n(visible, cols, uint8_t(0));
        record.visible_counts[size_t(l * H + h)] = 0;
        continue;
      }
      int32_t count = 0;
      for (int64_t j = 0; j < cols; ++j) {
        visible[j] = host_visible_[size_t(h * stride + j)] != 0;
        count += visible[j];
      }
      record.visible_counts[size_t(l * H + h)] = count;
      const std::span<const float> true_row(record.logits.data() + at, size_t(cols));
      // The oracle at the same count of visible tokens, with the run's forced columns: how many
      // of the tokens the true attention would have kept the policy kept.
      const std::vector<uint8_t> oracle =
          oracle_visible(true_row, std::max(1, count), knobs.sinks, knobs.window);
      const double r = recall({visible, size_t(cols)}, oracle);
      if (std::isfinite(r)) recall_sum += r, ++recall_rows;
      const double a = top_half_agreement({record.scores.data() + at, size_t(cols)}, true_row);
      if (std::isfinite(a)) agreement_sum += a, ++agreement_rows;
    }
  }
  for (const int32_t count : record.visible_counts)
    hidden_sum += 1.0 - double(count) / double(cols);

  StepMetrics& m = record.metrics;
  m.effective_sparsity = hidden_sum / double(L * H);
  if (recall_rows > 0) m.recall_vs_oracle = recall_sum / double(recall_rows);
  if (agreement_rows > 0) m.classification_accuracy = agreement_sum / double(agreement_rows);
  std::vector<std::span<const float>> rows;
  for (int64_t i = 0; i < L * H; ++i)
    rows.emplace_back(record.logits.data() + i * cols, size_t(cols));
  if (cols >= 2) m.consensus = mean_upper_triangle(pearson_matrix(rows), L * H);
  m.kl_vs_dense = kl_divergence(dense_row, logits_row);
  for (const TokenLogProb& entry : top_k_tokens(logits_row, options_.top_k)) {
    record.top.ids.push_back(entry.token);
    record.top.log_probs.push_back(float(entry.log_prob));
    if (tokenizer_) record.top.texts.push_back(tokenizer_->token_text(entry.token));
  }
  record.argmax = record.top.ids.empty() ? -1 : record.top.ids.front();
  if (t + 1 < int64_t(tokens_.size())) {
    const int32_t next = tokens_[size_t(t + 1)];
    m.nll = -log_softmax(logits_row)[size_t(next)];
    m.true_rank = token_rank(logits_row, next);
    m.dense_true_rank = token_rank(dense_row, next);
  }
  return record;
}

}  // namespace kvlens
