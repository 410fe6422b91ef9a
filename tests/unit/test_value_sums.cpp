// The weighted value sums under a policy's scattered mask, and the masked softmax: every output
// must be exactly the documented chain (fma in ascending j over the keys of nonzero weight, or
// the same with separate roundings on the portable kernels), whatever mix of full, empty and
// scattered blocks the row holds and however many keys a head takes (the AVX2 kernel collects a
// scattered block's taken keys in per-head lists, flushed before they overflow and before a full
// block). weights: [nq][stride]; values: [cols][head_dim].
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_dot_kernels.h"
#include "tests/support/random_values.h"

using namespace kvlens;
using kvlens::test::random_values;

namespace {

// The documented sum of one output: start, then each nonzero weight's product added in ascending
// j, fused on the AVX2 kernels, rounded twice on the portable ones.
float chained_sum(bool fused, float start, const float* w, const float* values, int64_t head_dim,
                  int64_t d, int64_t begin, int64_t end) {
  float sum = start;
  for (int64_t j = begin; j < end; ++j) {
    if (w[j] == 0.0f) continue;
    const float v = values[j * head_dim + d];
    if (fused) {
      sum = std::fma(w[j], v, sum);
    } else {
      const float product = w[j] * v;
      sum = sum + product;
    }
  }
  return sum;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Weights for nq heads over cols keys: each 8-key block is, at random, all taken by every head,
// empty, or scattered with each head's own pattern (so the heads' lists differ in length).
std::vector<float> block_mix_weights(int nq, int64_t cols, uint32_t seed, double scattered) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> weight(0.01f, 1.0f);
  std::uniform_real_distribution<double> pick(0.0, 1.0);
  std::vector<float> weights(size_t(nq * cols), 0.0f);
  for (int64_t j0 = 0; j0 < cols; j0 += 8) {
    const double kind = pick(rng);
    for (int i = 0; i < nq; ++i)
      for (int64_t j = j0; j < std::min(cols, j0 + 8); ++j) {
        const bool taken = kind < scattered ? pick(rng) < 0.5 : kind < scattered + 0.1;
        weights[size_t(i * cols + j)] = taken ? weight(rng) : 0.0f;
      }
  }
  return weights;
}

// Behind weight 0, NaN and inf must not reach the sums: every row hides keys 17 and 18, whose
// values become NaN and inf.
void hide_bad_values(std::vector<float>& weights, int rows, int64_t cols,
                     std::vector<float>& values, int64_t head_dim) {
  for (int i = 0; i < rows; ++i)
    weights[size_t(i * cols + 17)] = weights[size_t(i * cols + 18)] = 0.0f;
  for (int64_t d = 0; d < head_dim; ++d) {
    values[size_t(17 * head_dim + d)] = std::numeric_limits<float>::quiet_NaN();
    values[size_t(18 * head_dim + d)] = std::numeric_limits<float>::infinity();
  }
}

}  // namespace

TEST_CASE("weighted value sums under scattered masks are the fma chain over the taken keys",
          "[backend][attention_kernels]") {
  for (const bool simd : {true, false}) {
    const DotKernels kernels = pick_dot_kernels(simd);
    const bool fused = std::string(kernels.isa) != "generic";
    INFO(kernels.isa);
    // head_dim 32: chunks of 4 registers; 40 and 20: narrower chunks and scalar columns; 64: the
    // wide chunk of a lone head. nq 1, 2, 3 and 4 take every head grouping of the kernels.
    for (const int64_t head_dim : {32, 40, 20, 64}) {
      for (const int nq : {1, 2, 3, 4}) {
        // 1500 keys of mostly scattered blocks: a head takes about 750, so its list fills and
        // flushes several times; the row starts and ends off the 8-key grid.
        const int64_t cols = 1500, begin = 3, end = 1497;
        std::vector<float> weights = block_mix_weights(nq, cols, 7 + uint32_t(nq), 0.8);
        std::vector<float> values = random_values(size_t(cols * head_dim), 9);
        hide_bad_values(weights, nq, cols, values, head_dim);
        INFO("head_dim " << head_dim << ", nq " << nq);
        std::vector<float> scales(static_cast<size_t>(nq));
        for (int i = 0; i < nq; ++i) scales[size_t(i)] = 0.5f + 0.125f * float(i);
        const int64_t out_stride = head_dim + 3;
        std::vector<float> out(size_t(nq * out_stride), 42.0f);
        kernels.weighted_values(weights.data(), cols, nq, values.data(), head_dim, begin, end,
                                scales.data(), out.data(), out_stride);
        // The accumulating form, the range cut at an odd key and continued.
        std::vector<float> sums(size_t(nq * head_dim));
        for (int i = 0; i < nq; ++i)
          for (int64_t d = 0; d < head_dim; ++d)
            sums[size_t(i * head_dim + d)] = 0.25f * float(d - i);
        const std::vector<float> starts = sums;
        const int64_t cut = 613;
        kernels.weighted_values_accumulate(weights.data(), cols, nq, values.data(), head_dim, begin,
                                           cut, sums.data(), head_dim);
        kernels.weighted_values_accumulate(weights.data(), cols, nq, values.data(), head_dim, cut,
                                           end, sums.data(), head_dim);
        int64_t mismatches = 0;
        for (int i = 0; i < nq; ++i) {
          const float* w = weights.data() + i * cols;
          for (int64_t d = 0; d < head_dim; ++d) {
            const float sum = chained_sum(fused, 0.0f, w, values.data(), head_dim, d, begin, end);
            const float want = sum * scales[size_t(i)];
            const float got = out[size_t(i * out_stride + d)];
            const float want_sum = chained_sum(fused, starts[size_t(i * head_dim + d)], w,
                                               values.data(), head_dim, d, begin, end);
            const float got_sum = sums[size_t(i * head_dim + d)];
            REQUIRE(std::isfinite(got));
            if (!same_bits(got, want) || !same_bits(got_sum, want_sum)) {
              ++mismatches;
              UNSCOPED_INFO("head " << i << " column " << d << ": " << got << " vs " << want
                                    << ", sums " << got_sum << " vs " << want_sum);
            }
          }
          for (int64_t d = head_dim; d < out_stride; ++d)
            REQUIRE(out[size_t(i * out_stride + d)] == 42.0f);  // untouched
        }
        CHECK(mismatches == 0);
      }
    }
  }
}

TEST_CASE("masked softmax: visible columns get the unmasked kernel's bits, hidden ones exactly 0",
          "[backend][attention_kernels]") {
  for (const bool simd : {true, false}) {
    const DotKernels kernels = pick_dot_kernels(simd);
    INFO(kernels.isa);
    const int64_t cols = 203;
    std::vector<float> logits = random_values(size_t(cols), 21, 6.0f);
    logits[40] = -std::numeric_limits<float>::infinity();  // a visible -inf column
    std::mt19937 rng(22);
    std::vector<uint8_t> seen(static_cast<size_t>(cols));
    for (auto& s : seen) s = uint8_t(rng() % 2);
    seen[40] = 1;
    // The same row with the hidden columns set to -inf, unmasked: the hidden columns then weigh
    // exactly 0 through exp's underflow, the others as under the mask.
    std::vector<float> hidden_as_inf = logits;
    for (int64_t j = 0; j < cols; ++j)
      if (!seen[size_t(j)]) hidden_as_inf[size_t(j)] = -std::numeric_limits<float>::infinity();
    for (const int64_t begin : {int64_t(0), int64_t(5)}) {
      std::vector<float> masked(size_t(cols), 9.0f), reference(size_t(cols), 9.0f);
      const float total =
          kernels.softmax_weights(logits.data(), seen.data(), begin, cols, masked.data());
      const float want_total =
          kernels.softmax_weights(hidden_as_inf.data(), nullptr, begin, cols, reference.data());
      CHECK(same_bits(total, want_total));
      for (int64_t j = begin; j < cols; ++j) {
        INFO("column " << j);
        REQUIRE(same_bits(masked[size_t(j)], reference[size_t(j)]));
        if (!seen[size_t(j)]) REQUIRE(same_bits(masked[size_t(j)], 0.0f));
      }
      for (int64_t j = 0; j < begin; ++j) REQUIRE(masked[size_t(j)] == 9.0f);
    }
  }
}

TEST_CASE("the rows kernel's sums over shared values are each row's fma chain, bit for bit",
          "[backend][attention_kernels]") {
  const DotKernels kernels = pick_dot_kernels(true);
  if (!kernels.weighted_values_rows) {
    SUCCEED("this CPU has no AVX-512: the rows kernel is not in its set");
    return;
  }
  // head_dim 32: whole 32-column chunks; 48 and 16: a 16-column chunk; 128: four chunks. Row
  // counts up to 20 take calls of every share size (1 to 8 rows).
  for (const int64_t head_dim : {32, 48, 16, 128}) {
    for (const int rows : {1, 2, 3, 5, 8, 9, 10, 17, 20}) {
      INFO("head_dim " << head_dim << ", rows " << rows);
      const int64_t cols = 300, begin = 5, end = 291;  // off the 8-key grid at both ends
      std::vector<float> weights = block_mix_weights(rows, cols, 31 + uint32_t(rows), 0.6);
      std::vector<float> values = random_values(size_t(cols * head_dim), 33);
      hide_bad_values(weights, rows, cols, values, head_dim);
      // A NaN weight must reach its row's sums.
      if (rows > 2) weights[size_t(2 * cols + 100)] = std::numeric_limits<float>::quiet_NaN();
      // Rows in separate buffers, their sums starting from their own values.
      std::vector<const float*> row_weights;
      std::vector<float*> row_sums;
      std::vector<std::vector<float>> sums(static_cast<size_t>(rows));
      for (int i = 0; i < rows; ++i) {
        row_weights.push_back(weights.data() + i * cols);
        sums[size_t(i)].resize(size_t(head_dim));
        for (int64_t d = 0; d < head_dim; ++d) sums[size_t(i)][size_t(d)] = 0.125f * float(d - i);
        row_sums.push_back(sums[size_t(i)].data());
      }
      const std::vector<std::vector<float>> starts = sums;
      // Cut at an odd key and continued, as the blocks of the common rows are.
      kernels.weighted_values_rows(row_weights.data(), values.data(), row_sums.data(), rows,
                                   head_dim, begin, 133);
      kernels.weighted_values_rows(row_weights.data(), values.data(), row_sums.data(), rows,
                                   head_dim, 133, end);
      int64_t mismatches = 0;
      for (int i = 0; i < rows; ++i) {
        for (int64_t d = 0; d < head_dim; ++d) {
          const float want = chained_sum(true, starts[size_t(i)][size_t(d)], row_weights[size_t(i)],
                                         values.data(), head_dim, d, begin, end);
          const float got = sums[size_t(i)][size_t(d)];
          if (i == 2 && rows > 2) {
            REQUIRE(std::isnan(got));
          } else if (!same_bits(got, want)) {
            ++mismatches;
            UNSCOPED_INFO("row " << i << " column " << d << ": " << got << " vs " << want);
          }
        }
      }
      CHECK(mismatches == 0);
    }
  }
}
