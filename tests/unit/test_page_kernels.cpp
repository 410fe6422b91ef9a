// Quest's page kernels: the AVX2 page bounds and page best/cost against the portable ones (the
// same bits; a zero maximum compared by its ranking key, which ignores the sign) for head_dim
// with and without a tail, page counts around the 8-page blocks, page sizes that are and are not
// multiples of 8, a short last page, NaN, infinite and tied scores. Summaries: [pages][head_dim].
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/backend/cpu/cpu_dot_kernels.h"
#include "engine/backend/policy_op_math.h"
#include "tests/support/random_values.h"

using namespace kvlens;
using kvlens::test::random_values;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE("page bounds: the AVX2 and portable kernels give the same bits", "[backend][pages]") {
  const DotKernels simd = pick_dot_kernels(true), generic = pick_dot_kernels(false);
  if (simd.page_bounds == generic.page_bounds) WARN("no AVX2 on this CPU: nothing to compare");
  const int64_t head_dim = GENERATE(8, 32, 64, 12);
  const int64_t pages = GENERATE(1, 7, 8, 9, 16, 33);
  const bool max_only = GENERATE(false, true);
  INFO("head_dim " << head_dim << " pages " << pages << " max_only " << max_only);
  auto q = random_values(size_t(head_dim), 81, 2.0f);
  auto lows = random_values(size_t(pages * head_dim), 82, 1.5f);
  auto highs = lows;
  const auto spread = random_values(size_t(pages * head_dim), 83, 1.0f);
  for (size_t i = 0; i < highs.size(); ++i) highs[i] += std::fabs(spread[i]);
  // A zero query channel against an infinite summary (0 * inf = NaN), a NaN key summary, and a
  // -0 query channel: the comparisons and blends must treat them as the scalar code does.
  q[1] = 0.0f;
  q[2] = -0.0f;
  if (pages > 2) {
    highs[size_t(1 * head_dim + 1)] = kInf;
    lows[size_t(2 * head_dim + 3)] = kNaN;
    highs[size_t((pages - 1) * head_dim + 4)] = kInf;
    lows[size_t((pages - 1) * head_dim + 4)] = -kInf;
  }
  const float scale = attention_scale(head_dim);
  std::vector<float> want(static_cast<size_t>(pages)), got(static_cast<size_t>(pages));
  generic.page_bounds(q.data(), lows.data(), highs.data(), pages, head_dim, max_only, scale,
                      want.data());
  simd.page_bounds(q.data(), lows.data(), highs.data(), pages, head_dim, max_only, scale,
                   got.data());
  for (int64_t p = 0; p < pages; ++p) {
    INFO("page " << p);
    CHECK(std::memcmp(&want[size_t(p)], &got[size_t(p)], sizeof(float)) == 0);
    // And both are page_bound itself, page by page.
    const float one = page_bound(q.data(), lows.data() + p * head_dim, highs.data() + p * head_dim,
                                 head_dim, max_only, scale);
    CHECK(std::memcmp(&one, &got[size_t(p)], sizeof(float)) == 0);
  }
}

TEST_CASE("page best and cost: the AVX2 and portable kernels agree", "[backend][pages]") {
  const DotKernels simd = pick_dot_kernels(true), generic = pick_dot_kernels(false);
  const int64_t page_size = GENERATE(1, 3, 8, 16, 24);
  const int64_t cols = GENERATE(1, 5, 16, 17, 100, 513);
  INFO("page_size " << page_size << " cols " << cols);
  auto scores = random_values(size_t(cols), 91, 3.0f);
  std::vector<uint8_t> chosen(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) chosen[size_t(j)] = uint8_t((j * 7 + j / 5) % 3 == 0);
  // A page all NaN, a page with NaN among numbers, ties, infinities, +0 against -0.
  for (int64_t j = 0; j < cols; ++j) {
    const int64_t page = j / page_size, offset = j % page_size;
    if (page == 1) scores[size_t(j)] = kNaN;
    if (page == 2 && offset % 2 == 0) scores[size_t(j)] = kNaN;
    if (page == 3) scores[size_t(j)] = 0.5f;
    if (page == 4 && offset == page_size - 1) scores[size_t(j)] = kInf;
    if (page == 5) scores[size_t(j)] = offset % 2 ? -0.0f : -1.0f;
    if (page == 6) scores[size_t(j)] = offset % 2 ? 0.0f : -0.0f;
    if (page == 7) scores[size_t(j)] = -kInf;
  }
  const int64_t pages = (cols + page_size - 1) / page_size;
  std::vector<float> want_best(static_cast<size_t>(pages)), got_best(static_cast<size_t>(pages));
  std::vector<int32_t> want_cost(static_cast<size_t>(pages)), got_cost(static_cast<size_t>(pages));
  generic.page_best(scores.data(), chosen.data(), cols, page_size, want_best.data(),
                    want_cost.data());
  simd.page_best(scores.data(), chosen.data(), cols, page_size, got_best.data(), got_cost.data());
  for (int64_t p = 0; p < pages; ++p) {
    INFO("page " << p);
    CHECK(top_k_key(got_best[size_t(p)], 0) == top_k_key(want_best[size_t(p)], 0));
    CHECK(std::isnan(got_best[size_t(p)]) == std::isnan(want_best[size_t(p)]));
    CHECK(got_cost[size_t(p)] == want_cost[size_t(p)]);
    // By definition: the fmax of the page and its open columns.
    const int64_t j0 = p * page_size, j1 = std::min(cols, j0 + page_size);
    float best = -kInf;
    bool all_nan = true;
    int32_t open = 0;
    for (int64_t j = j0; j < j1; ++j) {
      if (!std::isnan(scores[size_t(j)])) {
        best = std::max(best, scores[size_t(j)]);
        all_nan = false;
      }
      open += chosen[size_t(j)] == 0;
    }
    CHECK(got_cost[size_t(p)] == open);
    if (all_nan) {
      CHECK(std::isnan(got_best[size_t(p)]));
    } else {
      CHECK(got_best[size_t(p)] == best);
    }
  }
}
