// Free generation under several policies at once: from one prompt, every run decodes greedily on
// its own (its argmax fed back) under its own policy, all runs in one lockstep session, and each
// run's continuation is compared with dense's (the reference) to mark where it first departs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/session/scoring.h"

namespace kvlens::session {

// One run's continuation.
struct GeneratedText {
  std::string spec;                 // run_spec of the run ("dense", "h2o@0.3")
  std::vector<int32_t> ids;         // the new tokens only
  std::vector<std::string> pieces;  // what each new token adds to the text (empty: no tokenizer)
  std::string text;                 // the continuation's text (empty: no tokenizer)
  // Index into ids of the first token that differs from dense's continuation; -1 where it never
  // does (dense itself, or a run that agrees throughout).
  int64_t first_departure = -1;
};

struct GenerationOptions {
  int64_t max_new = 32;
  bool stop_at_eos = true;  // a run ends at its EOS token (the others go on)
  // After the prompt and after each generated step: (positions done, positions in all).
  ProgressFn progress;
  // After each generated step, every listed run's continuation so far (departures included).
  std::function<void(const std::vector<GeneratedText>&)> on_step;
  // Set (from any thread) to stop after the current step; what was generated is returned.
  const std::atomic<bool>* cancel = nullptr;
};

// The first index where `ids` and `reference` differ, or where the shorter one ends when one is
// a strict prefix of the other; -1 when they are equal.
int64_t first_departure(std::span<const int32_t> ids, std::span<const int32_t> reference);

// Each run of `runs` (resolve_policy_runs) decodes `prompt` then max_new tokens of its own, the
// policy applied at every step, the prompt's included (as generate_greedy: a run alone gives
// exactly generate_greedy's ids). Dense is always decoded for the departure marks, listed or not;
// results follow `runs`. Throws kvlens::Error for an empty prompt or run list, or a prompt whose
// ids the model does not have.
std::vector<GeneratedText> generate_runs(std::shared_ptr<const BackendModel> model,
                                         std::span<const int32_t> prompt,
                                         const std::vector<PolicyConfig>& runs,
                                         const GenerationOptions& options = {});

}  // namespace kvlens::session
