// TraceRecorder: runs several policies in lockstep over one text (teacher forcing, one token per
// step) and records each step into a Trace: every run's per-(layer, head) true logits, visible set
// and scores, the next-token top-k and the step metrics (KL and rank against a dense reference run
// that the recorder adds when the policies do not include dense).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/thread_pool.h"
#include "engine/session/decoder_session.h"
#include "engine/session/tensor_parallel_session.h"
#include "engine/trace/trace.h"

namespace kvlens {

struct TraceOptions {
  int64_t top_k = 10;
  uint64_t memory_budget = Trace::kDefaultMemoryBudget;
  std::vector<int32_t> selected_heads;  // layer * heads + head, kept past the budget
  // The first `prefill` tokens are processed densely (prefill + decode); 0: decode simulation.
  int64_t prefill = 0;
};

class TraceRecorder {
 public:
  ~TraceRecorder();  // waits for a step whose rows are still on their way
  // `tokens` is the whole text (at most max_position_embeddings); `tokenizer` (may be null)
  // gives the tokens' text. Throws kvlens::Error for an empty policy list, a bad policy config,
  // a bad token or a text too long for the model.
  TraceRecorder(std::shared_ptr<const BackendModel> model, const Tokenizer* tokenizer,
                std::vector<int32_t> tokens, std::vector<PolicyConfig> policies,
                TraceOptions options = {});
  // The same over a model split across a tensor-parallel group (upload_tensor_parallel's
  // `shards` of `model`): each rank's rows are copied to their heads' place, so the trace holds
  // every head as one backend's would. Policies as TensorParallelSession::set_policy takes them.
  TraceRecorder(std::shared_ptr<const Model> model,
                std::vector<std::shared_ptr<const BackendModel>> shards, const Tokenizer* tokenizer,
                std::vector<int32_t> tokens, std::vector<PolicyConfig> policies,
                TraceOptions options = {});

  // Feeds the next token to every run and records the step. False when the text is done. The
  // backend runs the following steps while this one is recorded (their rows reach host memory
  // asynchronously, into one of three buffers), so the session is up to two steps ahead of the
  // trace.
  bool step();
  bool done() const { return trace_.step_count() >= int64_t(tokens_.size()); }
  int64_t steps_total() const { return int64_t(tokens_.size()); }
  const Trace& trace() const { return trace_; }
  // The runs recorded, as resolved (one per trace run, in order).
  const std::vector<PolicyConfig>& policies() const { return policies_; }
  Trace& trace() { return trace_; }
  // The next-token logits [vocab] of traced run `run` at the step the last step() recorded (host
  // memory of the recorder, valid until the next step()); empty before the first step.
  std::span<const float> output_logits(int64_t run) const;

 private:
  // One step's rows in host memory the backend fills while it goes on (a capture buffer).
  struct RunRows {
    // Per layer, as queued (Dense before the policy's first step; Gated: see gate_at).
    std::vector<LayerDecision> decisions;
    size_t logits_at = 0;                       // byte offset of [layers * H, cols] F32
    std::vector<size_t> scores_at, visible_at;  // per layer: [H, cols] F32 / U8, or kNone
    std::vector<size_t> weights_at;  // per layer: the policy's log-weights [H, cols] F32, or kNone
    std::vector<size_t> gate_at;     // per Gated layer: its gate byte, or kNone
  };
  struct Capture {
    std::shared_ptr<void> host;
    size_t capacity = 0;
    std::vector<std::unique_ptr<Backend::Fence>> fences;  // one per rank; empty: nothing queued
    std::vector<RunRows> runs;  // per traced run; the next-token logits [runs, vocab] at 0
  };
  static constexpr size_t kNone = ~size_t(0);
  // Steps the session with token t and queues the copies of its rows into a free capture.
  void enqueue_step(int64_t t);
  StepRecord record_run(const Capture& capture, int64_t run, int64_t t,
                        std::span<const float> logits_row, std::span<const float> dense_row);

  // The rank sessions and their rows: rank r's run state, its backend.
  int64_t ranks() const { return int64_t(shards_.size()); }
  const SessionRun& run_in_flight(int64_t rank, int64_t run) const;
  Backend& rank_backend(int64_t rank) const { return *shards_[size_t(rank)]->backend; }
  const ModelConfig& config() const { return model_->config; }

  std::shared_ptr<const Model> model_;  // the whole model (its config: the trace's shape)
  std::vector<std::shared_ptr<const BackendModel>> shards_;  // one (the model) or one per rank
  const Tokenizer* tokenizer_;                               // may be null: ids without text
  std::vector<int32_t> tokens_;
  std::vector<PolicyConfig> policies_;
  std::vector<CommonKnobs> knobs_;  // per traced run (the oracle of recall uses its sinks, window)
  TraceOptions options_;
  std::unique_ptr<DecoderSession> session_;       // one backend
  std::unique_ptr<TensorParallelSession> split_;  // a tensor-parallel group
  int64_t reference_run_ = 0;                     // the dense run KL and ranks compare against
  Trace trace_;
  static constexpr int64_t kCaptures = 3;  // steps t, t + 1 and t + 2
  Capture captures_[kCaptures];
  int64_t queued_ = 0;  // the steps before this one have run (or are queued) in the session
  const float* last_logits_ = nullptr;  // [runs, vocab] of the last recorded step (its capture)
  // Set when a step ran but its rows could not be queued: the session is past the trace then.
  std::string broken_;
  ThreadPool pool_;  // a step's rows are reduced to its metrics on these threads
};

}  // namespace kvlens
