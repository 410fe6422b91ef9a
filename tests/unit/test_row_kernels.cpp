// The policy ops' row kernels against their portable versions and the contract's arithmetic:
// squared_norms (key_anchor_scores' key and anchor lengths) for lengths with and without a tail
// of dim % 8, row counts around the 8-row blocks, and values whose squares overflow, underflow or
// are NaN. Rows: [count][dim].
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/backend/cpu/cpu_dot_kernels.h"
#include "tests/support/random_values.h"

using namespace kvlens;
using kvlens::test::random_values;

TEST_CASE("squared_norms: the AVX2 and portable kernels give the contract's bits",
          "[backend][row_kernels]") {
  const DotKernels simd = pick_dot_kernels(true), generic = pick_dot_kernels(false);
  if (simd.squared_norms == generic.squared_norms)
    WARN("no AVX2 on this CPU: the portable kernel is checked alone");
  const int64_t dim = GENERATE(1, 7, 8, 12, 32, 67);
  const int64_t count = GENERATE(1, 7, 8, 9, 17, 64);
  INFO("dim " << dim << " count " << count);
  auto rows = random_values(size_t(count * dim), 91, 3.0f);
  // Squares that overflow to inf, underflow to 0, a NaN, and signed zeros.
  rows[0] = 3e20f;
  if (rows.size() > 3) rows[3] = 1e-30f;
  if (rows.size() > 9) rows[9] = std::numeric_limits<float>::quiet_NaN();
  if (rows.size() > 20) rows[20] = -0.0f;
  // The contract spelled out: lanes d mod 8 over whole blocks, the fixed fold, then the tail.
  std::vector<float> want(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const float* v = rows.data() + i * dim;
    float lanes[8] = {};
    const int64_t whole = dim / 8 * 8;
    for (int64_t d = 0; d < whole; ++d) lanes[d % 8] = lanes[d % 8] + v[d] * v[d];
    float sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
                ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (int64_t d = whole; d < dim; ++d) sum = sum + v[d] * v[d];
    want[size_t(i)] = sum;
  }
  for (const DotKernels* kernels : {&simd, &generic}) {
    INFO("kernels " << kernels->isa);
    std::vector<float> got(static_cast<size_t>(count), -1.0f);
    kernels->squared_norms(rows.data(), count, dim, got.data());
    CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
  }
}
