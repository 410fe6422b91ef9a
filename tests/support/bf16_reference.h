// The bundled demo model against transformers in BF16 (tests/fixtures/demo_bf16_reference.json,
// written by tools/make_bf16_reference.py): one backend's run of it, compared and summarised so
// that the CPU parity test and the CUDA test check the same things with their own tolerances.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/session/decoder_session.h"

namespace kvlens::test {

struct Bf16PromptComparison {
  std::string prompt;
  bool prompt_ids_match = false;
  // Greedy continuations (max_new tokens, no stop at EOS): kvlens' and transformers' BF16 and
  // F32 ones; -1 where they agree throughout, else the first step that differs.
  int first_difference_bf16 = -1;
  int first_difference_f32 = -1;
  // transformers' BF16 top-1/top-2 margin at first_difference_bf16 (a near tie when small).
  double bf16_margin_there = 0.0;
  // Teacher-forced on transformers' BF16 continuation, over the reference's top ids of every
  // step: the largest |kvlens - transformers BF16| and |kvlens - transformers F32| logit gaps,
  // and the reference's own |BF16 - F32| gap (what BF16 rounding alone does).
  double gap_to_bf16 = 0.0, gap_to_f32 = 0.0, reference_bf16_f32_gap = 0.0;
};

// Runs every prompt of the reference on `model` (any backend, any weight and cache dtypes).
std::vector<Bf16PromptComparison> compare_with_bf16_reference(
    const std::shared_ptr<const BackendModel>& model);

}  // namespace kvlens::test
