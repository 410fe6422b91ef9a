// TraceRecorder: runs several policies in lockstep over one text (teacher forcing, one token per
// step) and records each step into a Trace: every run's per-(layer, head) true logits, visible set
// and scores, the next-token top-k and the step metrics (KL and rank against a dense reference run
// that the recorder adds when the policies do not include dense).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/decoder_session.h"
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
  // `tokens` is the whole text (at most max_position_embeddings); `tokenizer` (may be null)
  // gives the tokens' text. Throws kvlens::Error for an empty policy list, a bad policy config,
  // a bad token or a text too long for the model.
  TraceRecorder(std::shared_ptr<const BackendModel> model, const Tokenizer* tokenizer,
                std::vector<int32_t> tokens, std::vector<PolicyConfig> policies,
                TraceOptions options = {});

  // Feeds the next token to every run and records the step. False when the text is done.
  bool step();
  bool done() const { return trace_.step_count() >= int64_t(tokens_.size()); }
  int64_t steps_total() const { return int64_t(tokens_.size()); }
  const Trace& trace() const { return trace_; }
  Trace& trace() { return trace_; }

 private:
  StepRecord record_run(int64_t run, int64_t t, const std::vector<float>& logits_row,
                        const std::vector<float>& dense_row);

  std::shared_ptr<const BackendModel> model_;
  const Tokenizer* tokenizer_;  // may be null: ids without text
  std::vector<int32_t> tokens_;
  std::vector<PolicyConfig> policies_;
  std::vector<CommonKnobs> knobs_;  // per traced run (the oracle of recall uses its sinks, window)
  TraceOptions options_;
  DecoderSession session_;
  int64_t reference_run_ = 0;  // the dense run KL and ranks compare against
  Trace trace_;
  // Host scratch for one run's layer rows.
  std::vector<float> host_logits_, host_scores_;
  std::vector<uint8_t> host_visible_;
};

}  // namespace kvlens
