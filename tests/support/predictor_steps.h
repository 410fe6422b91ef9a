// Steps a text through a DecoderSession under the tokenbutler policy and collects the predicted
// logits it ranked by: rows[step][layer][h * (step + 1) + j] for layers 1..N-1 (layer 0 empty),
// heads h and keys j <= step. Shared by the parity (against PyTorch) and cuda (against the CPU)
// tests.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/model.h"

namespace kvlens::test {

using PredictedRows = std::vector<std::vector<std::vector<float>>>;

// Tokens [0, prefill) go in as one dense chunk (prefill + decode; 0: the decode simulation), the
// rest one step each under tokenbutler with the given sparsity; rows of the prefill steps stay
// empty.
PredictedRows tokenbutler_predicted_rows(Backend& backend, std::shared_ptr<const Model> model,
                                         const std::vector<int32_t>& tokens, int64_t prefill = 0,
                                         double sparsity = 0.5);

}  // namespace kvlens::test
