// Graph capture of a lone dense run's single-token step: its ops are the same at every position
// (only the position and the token change), so the backend records them once over the session's
// buffers (Backend::record_step: a CUDA graph) and replays them; a step over other buffers (the
// caches grew, a longrope table switched) is recorded again. Everything else runs forward_ops.
#include <span>

#include "engine/backend/tensor_views.h"
#include "engine/common/error.h"
#include "engine/session/decoder_session.h"

namespace kvlens {

bool DecoderSession::recordable_step(bool per_run, int64_t rows) const {
  // Dynamic NTK past its original context reads a table made for each position: op by op.
  return per_run && rows == 1 && runs() == 1 && !runs_[0].policy && options_.record_steps &&
         !capture_.unavailable &&
         model_->config().rope_table(position_ + 1) != ModelConfig::RopeTable::kPerLength;
}

StepCapture::Key DecoderSession::step_graph_key() const {
  const SessionRun& run = runs_[0];
  // longrope switches to its long table past the original context: a step recorded with the
  // short one is stale then.
  const bool long_rope =
      model_->config().rope_table(position_ + 1) == ModelConfig::RopeTable::kLong;
  return {hidden_.data,
          logits_.data,
          run.k_cache.empty() ? nullptr : run.k_cache[0].data,
          run.policy_logits.data,
          run.recorded_logits.data,
          run.k_cache.empty() ? 0 : run.k_cache[0].dim(1),
          long_rope ? model_->inv_freq_long.data : model_->inv_freq.data};
}

const DeviceTensor& DecoderSession::forward_rows(std::span<const int32_t> tokens, bool per_run) {
  const int64_t n = int64_t(tokens.size());
  if (!recordable_step(per_run, n)) return forward_ops(tokens, per_run);
  grow_caches(position_ + 1);
  ensure_scratch(1);
  const StepCapture::Key key = step_graph_key();
  const int64_t position = position_;
  if (!capture_.graph || !(key == capture_.key)) {
    capture_.graph.reset();
    if (!(key == capture_.unrecorded)) {
      // The first step over these buffers runs op by op (it allocates what steps keep).
      capture_.unrecorded = key;
      return forward_ops(tokens, per_run);
    }
    try {
      capture_.graph = backend_.record_step(position, 1, [&] { forward_ops(tokens, per_run); });
    } catch (const Error&) {
      capture_.graph.reset();  // an op the backend cannot record: this session runs op by op
    }
    if (!capture_.graph) {
      capture_.unavailable = true;
      position_ = position;  // a failed recording ran nothing
      return forward_ops(tokens, per_run);
    }
    capture_.key = key;
    // Recording ran forward_ops' host side (position_ advanced, logits_view_ set); the replay
    // below runs its ops.
    capture_.graph->replay(position, tokens);
    return logits_view_;
  }
  // What forward_ops does on the host for this step, then the recorded ops.
  settle();
  SessionRun& run = runs_[0];
  run.attention_logits.clear();
  if (options_.record_attention_logits) {
    for (size_t l = 0; l < size_t(model_->config().num_layers); ++l) record_layer_logits(run, l);
  }
  run.pending_observe = -1;
  plan_.order_by_cost();
  logits_view_ = tensor::view(logits_, {1, model_->config().vocab_size});
  capture_.graph->replay(position, tokens);
  position_ += 1;
  return logits_view_;
}

}  // namespace kvlens
