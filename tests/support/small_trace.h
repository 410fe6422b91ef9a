// A hand-made trace for the view and query tests: 2 layers x 2 heads, 6 tokens, `steps` steps of
// two runs (dense, and "h2o" with layer 0 dense and layer 1 masked), every value known in closed
// form (small_trace.cpp says how), so tests can compute expectations by hand.
#pragma once

#include <cstdint>

#include "engine/trace/trace.h"

namespace kvlens::test {

inline constexpr int64_t kSmallLayers = 2, kSmallHeads = 2, kSmallTokens = 6;

// logit(run, step, head h = layer * 2 + head, column c) = 0.5 * c * (h + 1) - run * c * 0.25,
// -inf at column 0 of head 3; scores = logit / 2 + 1 on run 1's masked layer 1 (NaN elsewhere, as
// the recorder leaves rows no policy ranked); visible (run 1, layer 1) where
// (c + h) % 2 == 0 or c == step; dense rows see everything. Steps in [1, 6].
Trace make_small_trace(int64_t steps = 5);

}  // namespace kvlens::test
