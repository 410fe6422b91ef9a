// Checks that a TraceRecorder's rows are those of its own step: the recorder reads a step back
// while the backend runs the next ones (three buffers), so a row from the wrong buffer or the
// wrong step must show. The reference is a session stepped by hand with blocking reads.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/session/decoder_session.h"
#include "engine/session/trace_recorder.h"

namespace kvlens::test {

// Records `tokens` under `policies` (dense first, so no hidden run is added) with a TraceRecorder
// and steps a second session with the same policies by hand, comparing every step's logits,
// scores, masks and decisions of every run and layer for equality, bit for bit (the same backend
// and the same ops). Returns the number of compared steps.
int64_t check_trace_rows_match_session(const std::shared_ptr<const BackendModel>& model,
                                       const std::vector<int32_t>& tokens,
                                       const std::vector<PolicyConfig>& policies);

}  // namespace kvlens::test
