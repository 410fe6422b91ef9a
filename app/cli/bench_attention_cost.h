// kvlens-cli bench --attention-cost: what each policy run's attention costs over the keys it
// kept at the last step, against the dense attention over every key of the same caches: issue
// 43's "a sparse run pays only for what it keeps". Op-level timing, outside the step.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/session/decoder_session.h"

namespace kvlens::cli {

struct AttentionCost {
  int64_t run = 0;
  double kept_share = 0.0;  // visible (head, key) pairs / attended pairs, masked layers
  // keys some head of a KV head's group sees / keys, masked layers: the share of the cache a
  // grouped-query kernel must read (a key one head of the group keeps is read for the group)
  double read_share = 0.0;
  int64_t masked_layers = 0;    // layers whose last decision was Masked
  int64_t fused_layers = 0;     // layers the session attended by attention_masked_runs
  double masked_seconds = 0.0;  // one step's attention over the run's last decisions
  double dense_seconds = 0.0;   // the dense attention op over the same caches, every layer
};

// Per run of `session` with a policy: the attention of its last step's decisions, by the calls
// the session made (per layer: a Masked layer's over its visible set, a Dense or Gated one's over
// every key, in one attention_masked_runs call where the session used it, else logits then
// softmax; a Skipped one nothing), against the fused dense attention op of
// every layer, each the median over `repeats` of one whole step's calls, timed by the wall clock
// between two synchronizations (the GPU's queue runs behind the host, so this is its time).
std::vector<AttentionCost> measure_attention_cost(const DecoderSession& session, Backend& backend,
                                                  int repeats);

}  // namespace kvlens::cli
