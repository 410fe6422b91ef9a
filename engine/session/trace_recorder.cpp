// Recording a lockstep run into a Trace. Per step: the session advances every run by one token,
// each traced run's layer rows (the first t + 1 columns of its [layers * H, stride] logits and of
// its policy's [H, stride] scores and masks) are copied to host memory behind the step's ops, and
// while the backend runs steps t + 1 and t + 2 the rows of step t are reduced to the step metrics
// before the trace applies its memory budget (three capture buffers).
// Rows of a layer a policy did not rank (Dense decision, or a run without a policy): visible is
// every candidate and scores are NaN; a skipped layer (tokenfilter) shows nothing visible. A
// policy that weights its sample (magicpig) has its log-weights recorded beside the mask.
#include "engine/session/trace_recorder.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <limits>

#include "engine/backend/tensor_views.h"
#include "engine/common/error.h"
#include "engine/model/tokenizer.h"
#include "engine/policy/registry.h"
#include "engine/trace/step_metrics.h"

namespace kvlens {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

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
    : TraceRecorder(model->model, {model}, tokenizer, std::move(tokens), std::move(policies),
                    std::move(options)) {}

TraceRecorder::TraceRecorder(std::shared_ptr<const Model> model,
                             std::vector<std::shared_ptr<const BackendModel>> shards,
                             const Tokenizer* tokenizer, std::vector<int32_t> tokens,
                             std::vector<PolicyConfig> policies, TraceOptions options)
    : model_(std::move(model)),
      shards_(std::move(shards)),
      tokenizer_(tokenizer),
      tokens_(std::move(tokens)),
      policies_(std::move(policies)),
      options_(std::move(options)) {
  const ModelConfig& c = config();
  if (policies_.empty()) throw Error("trace", "policies", "at least one policy");
  if (shards_.empty()) throw Error("trace", "model", "a model on at least one backend");
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
  const bool has_reference =
      std::any_of(policies_.begin(), policies_.end(),
                  [](const PolicyConfig& p) { return is_reference_policy(p.id); });
  const int64_t runs = int64_t(policies_.size()) + (has_reference ? 0 : 1);
  const SessionOptions session_options = {.record_attention_logits = true};
  if (ranks() == 1)
    session_ = std::make_unique<DecoderSession>(shards_.front(), session_options, runs);
  else
    split_ = std::make_unique<TensorParallelSession>(model_, shards_, session_options, runs);

  trace_.model = {model_->dir, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size};
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
    if (is_reference_policy(config.id)) {
      if (reference_run_ == int64_t(policies_.size())) reference_run_ = int64_t(r);
      continue;
    }
    if (split_) {
      split_->set_policy(int64_t(r), config, options_.prefill);
      continue;
    }
    session_->set_policy(int64_t(r),
                         make_run_policy(config, session_->policy_shape(), rank_backend(0)),
                         options_.prefill);
  }
}

const SessionRun& TraceRecorder::run_in_flight(int64_t rank, int64_t run) const {
  return split_ ? split_->rank_session(rank).run_in_flight(run) : session_->run_in_flight(run);
}

TraceRecorder::~TraceRecorder() {
  for (Capture& capture : captures_) {
    try {
      for (auto& fence : capture.fences) fence->wait();  // the copies land before capture.host goes
    } catch (...) {  // NOLINT(bugprone-empty-catch): a failed device writes nothing more
    }
  }
}

void TraceRecorder::enqueue_step(int64_t t) {
  Capture& capture = captures_[size_t(t % kCaptures)];
  Backend& lead = rank_backend(0);
  const std::span<const int32_t> token(&tokens_[size_t(t)], 1);
  const DeviceTensor& logits = split_ ? split_->forward(token) : session_->forward(token);
  try {
    const ModelConfig& c = config();
    const int64_t L = c.num_layers, H = c.num_heads, cols = t + 1;
    const int64_t runs = split_ ? split_->runs() : session_->runs();
    // Each rank holds H / ranks heads of every layer: rows h of rank r are heads r * Hr + h.
    const int64_t Hr = H / ranks();
    // The layout: next-token logits, then per traced run its logits and scores (F32), then the
    // masks (U8), so every F32 block stays 4-byte aligned.
    size_t bytes = size_t(runs * c.vocab_size) * sizeof(float);
    const size_t layer_floats = size_t(H * cols) * sizeof(float);
    capture.runs.assign(policies_.size(), {});
    for (size_t r = 0; r < policies_.size(); ++r) {
      // As queued: the device is still working on this step (no wait for its counts). Every
      // rank decides each layer alike (the same rule, step and budget).
      const SessionRun& run = run_in_flight(0, int64_t(r));
      RunRows& rows = capture.runs[r];
      rows.decisions.assign(size_t(L), LayerDecision::Dense);
      if (run.policy && t >= run.first_step) rows.decisions = run.decisions;
      rows.logits_at = bytes;
      bytes += size_t(L) * layer_floats;
      rows.scores_at.assign(size_t(L), kNone);
      rows.visible_at.assign(size_t(L), kNone);
      rows.weights_at.assign(size_t(L), kNone);
      for (size_t l = 0; l < size_t(L); ++l) {
        if (rows.decisions[l] == LayerDecision::Dense) continue;
        rows.scores_at[l] = bytes;
        bytes += layer_floats;
        // The weights of this step's select (the policy's buffer is next written by step t + 1's,
        // queued behind this copy).
        if (rows.decisions[l] == LayerDecision::Masked && run.policy->log_weights(int64_t(l))) {
          rows.weights_at[l] = bytes;
          bytes += layer_floats;
        }
      }
    }
    for (RunRows& rows : capture.runs) {
      rows.gate_at.assign(size_t(L), kNone);
      for (size_t l = 0; l < size_t(L); ++l) {
        if (rows.decisions[l] == LayerDecision::Masked) {
          rows.visible_at[l] = bytes;
          bytes += size_t(H * cols);
        } else if (rows.decisions[l] == LayerDecision::Gated) {
          rows.gate_at[l] = bytes++;  // Dense or Skipped: the gate says, once it is here
        }
      }
    }
    if (bytes > capture.capacity) {
      capture.host.reset();
      capture.capacity = bytes + bytes / 2;  // steps grow by a column: amortise the growth
      capture.host = lead.alloc_host(capture.capacity);
    }
    auto* host = static_cast<std::byte*>(capture.host.get());
    lead.rows_to_host_async(logits, runs, c.vocab_size, host);
    capture.fences.clear();
    for (int64_t rank = 0; rank < ranks(); ++rank) {
      Backend& backend = rank_backend(rank);
      const size_t head_floats = size_t(rank * Hr * cols) * sizeof(float);
      const size_t head_bytes = size_t(rank * Hr * cols);
      for (size_t r = 0; r < policies_.size(); ++r) {
        const SessionRun& run = run_in_flight(rank, int64_t(r));
        const RunRows& rows = capture.runs[r];
        if (ranks() == 1) {
          backend.rows_to_host_async(run.recorded_logits, L * H, cols, host + rows.logits_at);
        } else {
          for (int64_t l = 0; l < L; ++l) {
            backend.rows_to_host_async(tensor::row_range(run.recorded_logits, l * Hr, Hr), Hr, cols,
                                       host + rows.logits_at + l * layer_floats + head_floats);
          }
        }
        for (size_t l = 0; l < size_t(L); ++l) {
          if (rows.scores_at[l] != kNone)
            backend.rows_to_host_async(run.scores[l], Hr, cols,
                                       host + rows.scores_at[l] + head_floats);
          if (rows.visible_at[l] != kNone)
            backend.rows_to_host_async(run.visible[l], Hr, cols,
                                       host + rows.visible_at[l] + head_bytes);
          if (rows.weights_at[l] != kNone)
            backend.rows_to_host_async(*run.policy->log_weights(int64_t(l)), Hr, cols,
                                       host + rows.weights_at[l] + head_floats);
          if (rows.gate_at[l] != kNone && rank == 0)
            backend.rows_to_host_async(*run.policy->gate(int64_t(l)), 1, 1, host + rows.gate_at[l]);
        }
      }
      capture.fences.push_back(backend.fence());
    }
    queued_ = t + 1;
  } catch (const std::exception& e) {
    broken_ =
        "step " + std::to_string(t) + " ran but its rows could not be read back (" + e.what() + ")";
    throw;
  }
}

bool TraceRecorder::step() {
  if (done()) return false;
  if (!broken_.empty())
    throw Error("trace", "recording", "a recorder whose steps all read back", broken_);
  const int64_t t = trace_.step_count();
  Capture& capture = captures_[size_t(t % kCaptures)];
  if (queued_ <= t) enqueue_step(t);
  for (auto& fence : capture.fences) fence->wait();
  // The backend runs the next steps while this one is recorded (two queued, so that it has work
  // while the host waits for a step and queues another); a failure there is reported once this
  // step is in the trace.
  std::exception_ptr next_failed;
  try {
    while (queued_ < int64_t(tokens_.size()) && queued_ <= t + kCaptures - 1) enqueue_step(queued_);
  } catch (...) {
    next_failed = std::current_exception();
  }
  const int64_t vocab = config().vocab_size;
  const auto* all_logits = static_cast<const float*>(capture.host.get());
  auto row_of = [&](int64_t run) {
    return std::span<const float>(all_logits + run * vocab, size_t(vocab));
  };
  std::vector<StepRecord> records;
  for (int64_t r = 0; r < int64_t(policies_.size()); ++r)
    records.push_back(record_run(capture, r, t, row_of(r), row_of(reference_run_)));
  capture.fences.clear();
  last_logits_ = all_logits;
  trace_.add_step(std::move(records));
  if (next_failed) std::rethrow_exception(next_failed);
  return true;
}

std::span<const float> TraceRecorder::output_logits(int64_t run) const {
  if (!last_logits_) return {};
  if (run < 0 || run >= int64_t(policies_.size()))
    throw Error("trace", "run", "a traced run in [0, " + std::to_string(policies_.size()) + ")",
                std::to_string(run));
  const int64_t vocab = config().vocab_size;
  return {last_logits_ + run * vocab, size_t(vocab)};
}

StepRecord TraceRecorder::record_run(const Capture& capture, int64_t run_index, int64_t t,
                                     std::span<const float> logits_row,
                                     std::span<const float> dense_row) {
  const ModelConfig& c = config();
  const int64_t L = c.num_layers, H = c.num_heads, cols = t + 1;
  const RunRows& rows = capture.runs[size_t(run_index)];
  const auto* host = static_cast<const std::byte*>(capture.host.get());

  StepRecord record;
  record.columns = cols;
  record.decisions = rows.decisions;
  for (size_t l = 0; l < size_t(L); ++l) {
    if (record.decisions[l] != LayerDecision::Gated) continue;
    record.decisions[l] = gated_decision(*reinterpret_cast<const uint8_t*>(host + rows.gate_at[l]));
  }
  record.visible_counts.assign(size_t(L * H), int32_t(cols));
  record.kept_heads.resize(size_t(L * H));
  for (int64_t i = 0; i < L * H; ++i) record.kept_heads[size_t(i)] = int32_t(i);
  // The true logits: [L * H, cols], packed by the copy.
  const auto* logits = reinterpret_cast<const float*>(host + rows.logits_at);
  const size_t row_elements = size_t(L * H * cols);
  std::vector<std::span<const float>> head_rows;
  for (int64_t i = 0; i < L * H; ++i) head_rows.emplace_back(logits + i * cols, size_t(cols));
  StepMetrics& m = record.metrics;
  // The step's rows fill megabytes of fresh pages (a step of the 1B shape: 2.3 MB), each array on
  // a thread of its own, beside the cross-head consensus, which reads the true logits where the
  // copy left them: on a slow host these were most of a recorded step's time one after another.
  pool_.for_each(4, [&](int64_t task) {
    switch (task) {
      case 0:
        if (cols >= 2) m.consensus = mean_pairwise_pearson(head_rows);
        break;
      case 1:
        record.logits.assign(logits, logits + row_elements);
        break;
      case 2:
        record.scores.assign(row_elements, std::numeric_limits<float>::quiet_NaN());
        break;
      default:
        record.visible.assign(row_elements, 1);
        break;
    }
  });

  // A sliding-window layer (gemma3's local ones) shows the keys before its window hidden, whatever
  // the decision (a Masked row's mask has them hidden already: the session's select_run).
  auto attendable = [&](int64_t layer) {
    const int64_t window = c.layer_window(layer);
    return window > 0 ? std::min<int64_t>(cols, window) : cols;
  };
  for (int64_t l = 0; l < L; ++l) {
    if (attendable(l) == cols || record.decisions[size_t(l)] != LayerDecision::Dense) continue;
    for (int64_t h = 0; h < H; ++h) {
      std::fill_n(record.visible.data() + (l * H + h) * cols, cols - attendable(l), uint8_t(0));
      record.visible_counts[size_t(l * H + h)] = int32_t(attendable(l));
    }
  }

  // Log-weights (magicpig) where the run weighted a layer: 0 in every other layer's rows.
  for (int64_t l = 0; l < L; ++l) {
    if (rows.weights_at[size_t(l)] == kNone) continue;
    if (record.log_weights.empty()) record.log_weights.assign(row_elements, 0.0f);
    const auto* weights = reinterpret_cast<const float*>(host + rows.weights_at[size_t(l)]);
    std::copy_n(weights, H * cols, record.log_weights.data() + l * H * cols);
  }

  double recall_sum = 0.0, agreement_sum = 0.0, hidden_sum = 0.0;
  int64_t recall_rows = 0, agreement_rows = 0;
  const CommonKnobs& knobs = knobs_[size_t(run_index)];
  // Per (layer, head) row: its recall and top-half agreement (NaN where undefined), computed on
  // the recorder's threads (the oracle sorts each row; a step of the 1B shape has 512 of them),
  // then summed in row order as one thread would.
  std::vector<double> row_recall(size_t(L * H), kNaN), row_agreement(size_t(L * H), kNaN);
  const bool all_dense = std::all_of(record.decisions.begin(), record.decisions.end(),
                                     [](LayerDecision d) { return d == LayerDecision::Dense; });
  if (!all_dense)
    pool_.parallel_for(0, L, [&](int64_t first_layer, int64_t end_layer) {
      for (int64_t l = first_layer; l < end_layer; ++l) {
        const LayerDecision decision = record.decisions[size_t(l)];
        if (decision == LayerDecision::Dense) continue;
        const auto* scores = reinterpret_cast<const float*>(host + rows.scores_at[size_t(l)]);
        std::copy_n(scores, H * cols, record.scores.data() + l * H * cols);
        const uint8_t* masks =
            decision == LayerDecision::Masked
                ? reinterpret_cast<const uint8_t*>(host + rows.visible_at[size_t(l)])
                : nullptr;
        for (int64_t h = 0; h < H; ++h) {
          const size_t at = size_t((l * H + h) * cols);
          uint8_t* visible = record.visible.data() + at;
          if (decision == LayerDecision::Skipped) {
            std::fill_n(visible, cols, uint8_t(0));
            record.visible_counts[size_t(l * H + h)] = 0;
            continue;
          }
          int32_t count = 0;
          for (int64_t j = 0; j < cols; ++j) {
            visible[j] = masks[h * cols + j] != 0;
            count += visible[j];
          }
          record.visible_counts[size_t(l * H + h)] = count;
          const std::span<const float> true_row(record.logits.data() + at, size_t(cols));
          // The oracle at the same count of visible tokens, with the run's forced columns: how many
          // of the tokens the true attention would have kept the policy kept.
          const std::vector<uint8_t> oracle =
              oracle_visible(true_row, std::max(1, count), knobs.sinks, knobs.window);
          row_recall[size_t(l * H + h)] = recall({visible, size_t(cols)}, oracle);
          row_agreement[size_t(l * H + h)] =
              top_half_agreement({record.scores.data() + at, size_t(cols)}, true_row);
        }
      }
    });
  for (int64_t i = 0; i < L * H; ++i) {
    const double r = row_recall[size_t(i)], a = row_agreement[size_t(i)];
    if (std::isfinite(r)) recall_sum += r, ++recall_rows;
    if (std::isfinite(a)) agreement_sum += a, ++agreement_rows;
  }
  // Over the keys each layer attends to (a sliding-window layer's window).
  for (int64_t i = 0; i < L * H; ++i)
    hidden_sum += 1.0 - double(record.visible_counts[size_t(i)]) / double(attendable(i / H));

  m.effective_sparsity = hidden_sum / double(L * H);
  if (recall_rows > 0) m.recall_vs_oracle = recall_sum / double(recall_rows);
  if (agreement_rows > 0) m.classification_accuracy = agreement_sum / double(agreement_rows);
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
