// The demo model (BF16 weights) against transformers in BF16 and F32 (tests/fixtures/
// demo_bf16_reference.json, tools/make_bf16_reference.py on the GPU machine), on the CPU: the F32
// reference path (BF16 weights widened exactly, F32 activations and cache).
//
// Tolerances: kvlens' CPU path computes what transformers computes after model.float(), up to
// summation order over 8 layers of 256-688 term dot products: 1e-4 relative on logits below 20 is
// 2e-3. transformers' BF16 run rounds every activation and its cache to BF16 (8 significant bits);
// its logits move from the F32 ones by the reference's own gap (0.1-0.2 here), so ours may be that
// far from them, plus the F32 tolerance. Greedy: the F32 continuation is reproduced exactly; the
// BF16 one up to the first step where transformers' BF16 logits nearly tie (a top-1/top-2 margin
// within the BF16-vs-F32 gap), where rounding alone decides.
#include <catch2/catch.hpp>

#include "engine/backend/backend.h"
#include "engine/model/model.h"
#include "tests/support/bf16_reference.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

TEST_CASE("demo model in BF16: the CPU path against transformers BF16 and F32", "[parity][demo]") {
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto cpu = make_cpu_backend();
  const auto resident = upload_model(model, *cpu);
  REQUIRE(resident->weight_dtype() == DType::BF16);
  REQUIRE(resident->kv_cache_dtype == DType::F32);
  constexpr double kF32Tolerance = 2e-3;
  for (const test::Bf16PromptComparison& c : test::compare_with_bf16_reference(resident)) {
    INFO(c.prompt);
    WARN("cpu: |kvlens - hf f32| "
         << c.gap_to_f32 << ", |kvlens - hf bf16| " << c.gap_to_bf16 << " (hf bf16 vs f32 "
         << c.reference_bf16_f32_gap << "); greedy differs from hf bf16 at "
         << c.first_difference_bf16 << " (margin " << c.bf16_margin_there << "), from hf f32 at "
         << c.first_difference_f32);
    CHECK(c.prompt_ids_match);
    CHECK(c.gap_to_f32 <= kF32Tolerance);
    CHECK(c.gap_to_bf16 <= c.reference_bf16_f32_gap + kF32Tolerance);
    CHECK(c.first_difference_f32 == -1);
    if (c.first_difference_bf16 >= 0) CHECK(c.bf16_margin_there <= c.reference_bf16_f32_gap);
  }
}
