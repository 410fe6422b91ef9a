// The AVX-512 attention logits and softmax kernels against the AVX2 ones: the same bits for every
// query count (pairs, an odd one left over), head_dim (multiples of 8 with and without a
// compile-time path, a tail, one past the pair kernel's limit), key range and mask, and for
// NaN, infinite and tied inputs. logits rows: [nq][row_stride]; keys: [cols][head_dim].
#include <catch2/catch.hpp>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/backend/cpu/cpu_dot_kernels.h"
#include "engine/backend/cpu/cpu_matmul.h"
#include "tests/support/random_values.h"

using namespace kvlens;
using kvlens::test::random_values;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

bool same_bytes(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("attention logits: the AVX-512 and AVX2 kernels give the same bits",
          "[backend][attention_kernels]") {
  if (!cpu_has_avx512f()) WARN("no AVX-512 on this CPU: its attention kernels are not exercised");
  const DotKernels widest = pick_dot_kernels(true, true), avx2 = pick_dot_kernels(true, false);
  INFO(widest.isa << " vs " << avx2.isa);
  const int nq = GENERATE(1, 2, 3, 4, 5);
  const int64_t head_dim = GENERATE(8, 32, 40, 64, 128, 136, 12, 264);
  const int64_t cols = GENERATE(1, 7, 8, 9, 70, 203);
  INFO("nq " << nq << " head_dim " << head_dim << " cols " << cols);
  const int64_t q_stride = head_dim + 3, row_stride = cols + 5;
  const auto q = random_values(size_t(nq * q_stride), 71, 2.0f);
  auto keys = random_values(size_t(cols * head_dim), 72, 2.0f);
  if (cols > 8) {
    keys[size_t(3 * head_dim)] = std::numeric_limits<float>::quiet_NaN();
    keys[size_t(5 * head_dim + 1)] = kInf;
    keys[size_t(6 * head_dim)] = 1e30f;  // overflows to inf in the products
  }
  for (const int64_t lo : {int64_t(0), std::min<int64_t>(3, cols - 1)}) {
    for (const int64_t hi : {cols - 1, (cols - 1 + lo) / 2}) {
      auto run = [&](const DotKernels& kernels) {
        std::vector<float> rows(size_t(nq * row_stride), 7.0f);
        kernels.attention_logits(q.data(), q_stride, nq, keys.data(), head_dim, lo, hi, 0.125f,
                                 rows.data(), row_stride);
        return rows;
      };
      INFO("lo " << lo << " hi " << hi);
      REQUIRE(same_bytes(run(widest), run(avx2)));
    }
  }
}

TEST_CASE("softmax weights: the AVX-512 and AVX2 kernels give the same bits",
          "[backend][attention_kernels]") {
  if (!cpu_has_avx512f()) WARN("no AVX-512 on this CPU: its softmax kernel is not exercised");
  const DotKernels widest = pick_dot_kernels(true, true), avx2 = pick_dot_kernels(true, false);
  INFO(widest.isa << " vs " << avx2.isa);
  const int64_t cols = GENERATE(1, 5, 8, 16, 17, 24, 40, 203, 577);
  const bool masked = GENERATE(false, true);
  INFO("cols " << cols << " masked " << masked);
  std::vector<float> logits = random_values(size_t(cols), 81, 8.0f);
  std::mt19937 rng(82);
  std::vector<uint8_t> seen(static_cast<size_t>(cols));
  for (auto& s : seen) s = uint8_t(rng() % 2);
  if (cols > 20) {
    logits[2] = -kInf;
    logits[9] = std::numeric_limits<float>::quiet_NaN();
    logits[17] = logits[18] = 30.0f;  // a tied maximum
    seen[17] = 1;
  }
  for (const int64_t begin : {int64_t(0), std::min<int64_t>(3, cols - 1), cols / 2}) {
    for (const int64_t end : {cols, std::max(begin + 1, cols - 2)}) {
      auto run = [&](const DotKernels& kernels) {
        std::vector<float> weights(size_t(cols) + 1, 9.0f);
        weights.back() = kernels.softmax_weights(logits.data(), masked ? seen.data() : nullptr,
                                                 begin, end, weights.data());
        return weights;
      };
      INFO("begin " << begin << " end " << end);
      REQUIRE(same_bytes(run(widest), run(avx2)));
    }
  }
  // Every logit hidden or -inf: all weights 0 and a total of 0 from both.
  std::vector<float> hidden_everywhere(size_t(cols), -kInf);
  std::vector<float> a(size_t(cols) + 1), b(size_t(cols) + 1);
  a.back() = widest.softmax_weights(hidden_everywhere.data(), nullptr, 0, cols, a.data());
  b.back() = avx2.softmax_weights(hidden_everywhere.data(), nullptr, 0, cols, b.data());
  REQUIRE(same_bytes(a, b));
  REQUIRE(a.back() == 0.0f);
}

TEST_CASE("logits at listed columns: each kernel set's own logits, nothing else written",
          "[backend][attention_kernels]") {
  // A policy that chooses before the logits gets them at its visible columns only; each kernel
  // set must give there exactly the logits its full kernel gives (the AVX-512 set's are the
  // AVX2 ones'), and leave every other column as it was.
  const int64_t head_dim = GENERATE(8, 32, 36, 40, 64, 7, 128);
  const int64_t cols = GENERATE(1, 9, 70, 203);
  INFO("head_dim " << head_dim << " cols " << cols);
  const auto q = random_values(size_t(head_dim), 81, 2.0f);
  const auto keys = random_values(size_t(cols * head_dim), 82, 2.0f);
  std::mt19937 rng(83);
  std::vector<uint8_t> visible(static_cast<size_t>(cols));
  for (uint8_t& v : visible) v = uint8_t(rng() % 3 == 0 ? 0 : 1 + rng() % 200);
  for (const bool avx512 : {true, false}) {
    for (const bool simd : {true, false}) {
      const DotKernels kernels = pick_dot_kernels(simd, avx512);
      INFO(kernels.isa);
      // The visible columns of [1, cols) (a range that starts off a block of 8).
      std::vector<int32_t> columns(static_cast<size_t>(cols + 8), -1);
      const int64_t count = kernels.visible_columns(visible.data(), 1, cols, columns.data());
      std::vector<int32_t> want_columns;
      for (int64_t j = 1; j < cols; ++j)
        if (visible[size_t(j)] != 0) want_columns.push_back(int32_t(j));
      REQUIRE(count == int64_t(want_columns.size()));
      CHECK(std::vector<int32_t>(columns.begin(), columns.begin() + count) == want_columns);

      std::vector<float> full(static_cast<size_t>(cols)), at(static_cast<size_t>(cols), 12345.0f);
      kernels.attention_logits(q.data(), head_dim, 1, keys.data(), head_dim, 0, cols - 1, 0.3f,
                               full.data(), cols);
      kernels.attention_logits_at(q.data(), keys.data(), head_dim, columns.data(), count, 0.3f,
                                  at.data());
      for (int64_t j = 0; j < cols; ++j) {
        INFO("column " << j);
        const bool listed = j >= 1 && visible[size_t(j)] != 0;
        if (listed) {
          CHECK(std::memcmp(&at[size_t(j)], &full[size_t(j)], sizeof(float)) == 0);
        } else {
          CHECK(at[size_t(j)] == 12345.0f);
        }
      }
    }
  }
}
