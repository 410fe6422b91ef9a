// StepCapture: the state of graph capture, apart from the decode loop. A lone dense run's
// single-token step is the same ops at every position, so the backend may record it once
// (Backend::record_step: a CUDA graph) and replay it; the recording holds the addresses of the
// session's buffers, so it is valid only while they are the same (Key).
#pragma once

#include <cstdint>
#include <memory>

#include "engine/backend/backend.h"

namespace kvlens {

struct StepCapture {
  // The addresses a recorded step holds: a step recorded over other buffers is stale.
  struct Key {
    const void* hidden = nullptr;
    const void* logits = nullptr;
    const void* cache = nullptr;
    const void* policy_logits = nullptr;
    const void* recorded_logits = nullptr;
    int64_t capacity = 0;
    const void* rope = nullptr;  // the inv_freq table the step reads (longrope: short or long)
    bool operator==(const Key&) const = default;
  };
  std::unique_ptr<StepGraph> graph;  // the recording, or null
  Key key;                           // the buffers `graph` holds
  Key unrecorded;            // the last step run op by op: a step over the same buffers is recorded
  bool unavailable = false;  // the backend cannot record: never tried again
};

}  // namespace kvlens
