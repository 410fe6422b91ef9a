// The per-step metrics of POLICIES.md (engine/trace/step_metrics.h) on small rows whose answers
// are worked out by hand in the comments: oracle sets (and the engine's oracle policy on random
// rows), recall, top-50% agreement, KL / rank / top-k over vocabulary rows, Pearson and Jaccard
// matrices and the consensus mean.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "engine/trace/step_metrics.h"
#include "tests/support/error_message.h"
#include "tests/support/policy_harness.h"

using namespace kvlens;

namespace {

const float kNegInf = -INFINITY;

std::set<int64_t> members(const std::vector<uint8_t>& mask) {
  std::set<int64_t> out;
  for (size_t j = 0; j < mask.size(); ++j)
    if (mask[j]) out.insert(int64_t(j));
  return out;
}

std::vector<uint8_t> mask_of(size_t cols, const std::set<int64_t>& set) {
  std::vector<uint8_t> mask(cols, 0);
  for (int64_t j : set) mask[size_t(j)] = 1;
  return mask;
}

// m rows of `cols` values: one shared normal signal times a per-row weight (1, 2 or 3, negated
// where negative(a)) plus unit noise and `offset`, so rows correlate strongly with either sign.
template <typename Negative>
std::vector<std::vector<float>> signal_rows(size_t m, size_t cols, uint32_t seed, Negative negative,
                                            float offset) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> signal(cols);
  for (float& v : signal) v = normal(rng);
  std::vector<std::vector<float>> data(m, std::vector<float>(cols));
  for (size_t a = 0; a < m; ++a) {
    const float w = float(1 + a % 3) * (negative(a) ? -1.0f : 1.0f);
    for (size_t c = 0; c < cols; ++c) data[a][c] = w * signal[c] + normal(rng) + offset;
  }
  return data;
}

}  // namespace

TEST_CASE(
    "step metrics: oracle_visible: forced columns, then the best logits with ties to the recent",
    "[metrics]") {
  // t = 7, B = 4, one sink, window 1: forced {0, 7}; 2 more from cols 1..6 = 1 3 3 0 3 2:
  // three 3s tie at cols 2, 3, 5 and the two most recent win (5, 3). The sink's own -2 does
  // not matter.
  const std::vector<float> tied = {-2, 1, 3, 3, 0, 3, 2, -1};
  CHECK(members(oracle_visible(tied, 4, 1, 1)) == std::set<int64_t>{0, 3, 5, 7});
  // window 0 counts like 1 (the current token is always in).
  CHECK(members(oracle_visible(tied, 4, 1, 0)) == std::set<int64_t>{0, 3, 5, 7});
  // No sinks: col 0's -2 is not forced; 3 picks among 0..6: the three 3s.
  CHECK(members(oracle_visible(tied, 4, 0, 1)) == std::set<int64_t>{2, 3, 5, 7});
  // A budget above the candidates is clamped to all of them, below 1 to the current token.
  CHECK(members(oracle_visible(tied, 20, 1, 1)).size() == 8);
  CHECK(members(oracle_visible(tied, 0, 4, 4)) == std::set<int64_t>{7});
  CHECK_THAT(test::error_message([] { oracle_visible({}, 1, 0, 0); }),
             Catch::Contains("oracle_visible"));
}

TEST_CASE("step metrics: oracle_visible: a budget below sinks + window truncates by priority",
          "[metrics]") {
  // t = 9; col 4 has by far the best logit, so any set without it was forced.
  const std::vector<float> row = {0, 0, 0, 0, 10, 9, 0, 0, 0, 0};
  // sinks 4 + window 4 = 8 > B = 5: current (9), then all 4 sinks; no room for the window.
  CHECK(members(oracle_visible(row, 5, 4, 4)) == std::set<int64_t>{0, 1, 2, 3, 9});
  // B = 3: current, then only the first 2 sinks.
  CHECK(members(oracle_visible(row, 3, 4, 4)) == std::set<int64_t>{0, 1, 9});
  CHECK(members(oracle_visible(row, 1, 4, 4)) == std::set<int64_t>{9});
  // sinks 2, window 4, B = 5: current + 2 sinks leave 2 of the window's 3 earlier tokens (7, 8).
  CHECK(members(oracle_visible(row, 5, 2, 4)) == std::set<int64_t>{0, 1, 7, 8, 9});
  // sinks 2, window 3, B = 6: forced {0, 1, 7, 8, 9}, one free slot: col 4 (10).
  CHECK(members(oracle_visible(row, 6, 2, 3)) == std::set<int64_t>{0, 1, 4, 7, 8, 9});
  // Early step t = 2 with 4 sinks: the sinks are the first min(4, t) = 2 columns; with B = 2
  // only the first sink fits besides the current token, though col 1 has the better logit.
  CHECK(members(oracle_visible(std::vector<float>{0, 5, 0}, 3, 4, 1)) ==
        std::set<int64_t>{0, 1, 2});
  CHECK(members(oracle_visible(std::vector<float>{0, 5, 0}, 2, 4, 1)) == std::set<int64_t>{0, 2});
}

TEST_CASE("step metrics: oracle_visible: -inf columns rank below every finite logit", "[metrics]") {
  // A sliding window hid cols 0..2. B = 3, no sinks: current 7, then 2 (col 5) and the later 1
  // (col 7 is taken, so col 3).
  const std::vector<float> row = {kNegInf, kNegInf, kNegInf, 1, 0.5f, 2, 0, 1};
  CHECK(members(oracle_visible(row, 3, 0, 1)) == std::set<int64_t>{3, 5, 7});
  // B = 7: every finite column (3..6 besides 7), then 2 of the three -inf ones, the recent ones.
  CHECK(members(oracle_visible(row, 7, 0, 1)) == std::set<int64_t>{1, 2, 3, 4, 5, 6, 7});
  // A sink is forced even where its logit is -inf (as in the policy).
  CHECK(members(oracle_visible(row, 3, 1, 1)) == std::set<int64_t>{0, 5, 7});
}

TEST_CASE("step metrics: oracle_visible matches the engine's oracle policy on random tied rows",
          "[metrics]") {
  // Small integer logits make many ties (equal logits give bit-equal probabilities in the
  // engine, distinct ones distinct probabilities), and some rows start with -inf columns.
  test::Harness h;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> value(-2, 2), hidden(0, 5);
  int compared = 0;
  for (double sparsity : {0.3, 0.5, 0.8}) {
    for (auto [sinks, window] :
         std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {4, 0}, {2, 3}, {3, 6}}) {
      const std::vector<std::string> args = {"sinks=" + std::to_string(sinks),
                                             "window=" + std::to_string(window)};
      auto policy = h.make("oracle", sparsity, args);
      CommonKnobs knobs;
      knobs.sparsity = sparsity;
      knobs.sinks = sinks;
      knobs.window = window;
      for (int64_t t = 0; t < test::kStride; ++t) {
        std::vector<std::vector<float>> rows(4, std::vector<float>(size_t(t + 1)));
        for (size_t r = 0; r < 4; ++r) {
          for (float& x : rows[r]) x = float(value(rng));
          const int64_t hide = r % 2 == 1 ? std::min<int64_t>(hidden(rng), t) : 0;
          for (int64_t j = 0; j < hide; ++j) rows[r][size_t(j)] = kNegInf;
        }
        h.set_logits(rows);
        const auto sets = h.run(*policy, t);
        for (size_t r = 0; r < 4; ++r) {
          INFO("sparsity " << sparsity << " sinks " << sinks << " window " << window << " t " << t
                           << " head " << r);
          CHECK(members(oracle_visible(rows[r], knobs.budget(t), sinks, window)) == sets[r]);
          ++compared;
        }
      }
    }
  }
  CHECK(compared == 3 * 4 * 16 * 4);
}

TEST_CASE("step metrics: recall against a reference set", "[metrics]") {
  // S = {0, 2, 3}, S_ref = {0, 1, 2}: the intersection {0, 2} over |S_ref| = 3.
  const std::vector<uint8_t> s = {1, 0, 1, 1, 0}, ref = {1, 1, 1, 0, 0};
  CHECK(recall(s, ref) == Approx(2.0 / 3.0));
  CHECK(recall(ref, ref) == 1.0);
  CHECK(recall(std::vector<uint8_t>(5, 0), ref) == 0.0);
  CHECK(std::isnan(recall(s, std::vector<uint8_t>(5, 0))));  // nothing to recall
  CHECK(recall(std::vector<uint8_t>{7, 0}, std::vector<uint8_t>{3, 0}) == 1.0);  // nonzero = in
  CHECK_THAT(test::error_message([&] { recall(s, std::vector<uint8_t>{1}); }),
             Catch::Contains("recall"));
}

TEST_CASE("step metrics: top-half agreement, odd and even rows, ties to the recent", "[metrics]") {
  // Even, cols 4, top 2. True {0, 1} (4, 3); predicted {3, 1} (4, 3). Cols 1 and 2 agree
  // (in / out), 0 and 3 do not: 2 / 4.
  const std::vector<float> z4 = {4, 3, 2, 1}, s4 = {1, 3, 2, 4};
  CHECK(members(top_half(z4)) == std::set<int64_t>{0, 1});
  CHECK(top_half_agreement(s4, z4) == 0.5);
  // Odd, cols 5, top ceil(5 / 2) = 3. True: 5 (col 1), then the three 2s at 2, 3, 4 tie and
  // 4, 3 win: {1, 3, 4}. Predicted: 9 (col 0), then the 1s at 1, 2, 3 tie and 3, 2 win:
  // {0, 2, 3}. Only col 3 agrees (in both): 1 / 5.
  const std::vector<float> z5 = {0, 5, 2, 2, 2}, s5 = {9, 1, 1, 1, 0};
  CHECK(members(top_half(z5)) == std::set<int64_t>{1, 3, 4});
  CHECK(members(top_half(s5)) == std::set<int64_t>{0, 2, 3});
  CHECK(top_half_agreement(s5, z5) == 0.2);
  CHECK(top_half_agreement(z5, z5) == 1.0);
  // One candidate is its own top half; -inf columns fall in the bottom half.
  CHECK(top_half_agreement(std::vector<float>{3}, std::vector<float>{-1}) == 1.0);
  CHECK(members(top_half(std::vector<float>{kNegInf, kNegInf, 0, -5})) == std::set<int64_t>{2, 3});
  CHECK(std::isnan(top_half_agreement({}, {})));
}

TEST_CASE("step metrics: log_softmax and KL divergence of next-token rows", "[metrics]") {
  // Tolerances: every value is a handful of double operations on exactly representable inputs,
  // so 1e-12 relative leaves room only for libm's last-bit differences.
  const std::vector<double> ls = log_softmax(std::vector<float>{1, 2, 3});
  const double lse = 3.0 + std::log(1.0 + std::exp(-1.0) + std::exp(-2.0));
  CHECK(ls[0] == Approx(1.0 - lse).epsilon(1e-12));
  CHECK(ls[2] == Approx(3.0 - lse).epsilon(1e-12));
  // Stable: exp(1000) overflows, the shifted form does not.
  const std::vector<double> big = log_softmax(std::vector<float>{1000, 1000});
  CHECK(big[0] == Approx(-std::log(2.0)).epsilon(1e-12));
  const std::vector<double> masked = log_softmax(std::vector<float>{kNegInf, 0});
  CHECK(masked[0] == -INFINITY);
  CHECK(masked[1] == 0.0);
  CHECK(std::isnan(log_softmax(std::vector<float>{kNegInf, kNegInf})[1]));
  CHECK(std::isnan(log_softmax(std::vector<float>{NAN, 0})[1]));

  // Equal rows: every term is p * (lp - lp) = 0 exactly.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(1000);
  for (float& x : row) x = normal(rng);
  CHECK(kl_divergence(row, row) == 0.0);

  // p = softmax(0, 0) = (1/2, 1/2), q = softmax(a, 0) with a = ln 3 rounded to float:
  // KL(p || q) = sum p (ln p - ln q) = -ln 2 - (a - L) / 2 - (0 - L) / 2 = -ln 2 - a / 2 + L,
  // L = ln(1 + e^a). With a = ln 3 exactly this is ln 2 - ln(3) / 2 = ln(4 / 3) / 2.
  const float a = float(std::log(3.0));
  const double L = std::log(1.0 + std::exp(double(a)));
  const std::vector<float> p = {0, 0}, q = {a, 0};
  CHECK(kl_divergence(p, q) == Approx(-std::log(2.0) - double(a) / 2 + L).epsilon(1e-12));
  CHECK(kl_divergence(p, q) == Approx(0.5 * std::log(4.0 / 3.0)).epsilon(1e-6));  // a's rounding
  // Reverse: q = (3/4, 1/4) over p: 3/4 ln(3/2) + 1/4 ln(1/2) = 0.1308..., not 0.1438...
  CHECK(kl_divergence(q, p) == Approx(0.75 * std::log(1.5) + 0.25 * std::log(0.5)).epsilon(1e-6));
  CHECK(kl_divergence(q, p) != Approx(kl_divergence(p, q)).epsilon(1e-3));
  // 0 log 0 = 0: p = (1, 0) against (1/2, 1/2) is ln 2; the reverse puts mass where p has none.
  const std::vector<float> one_hot = {0, kNegInf}, uniform = {0, 0};
  CHECK(kl_divergence(one_hot, uniform) == Approx(std::log(2.0)).epsilon(1e-12));
  CHECK(kl_divergence(uniform, one_hot) == INFINITY);
  CHECK_THAT(test::error_message([&] { kl_divergence(p, std::vector<float>{0}); }),
             Catch::Contains("kl_divergence"));
}

TEST_CASE("step metrics: token rank and top-k tokens with ties to the lower id", "[metrics]") {
  // Order: 3 (id 1), 3 (id 2), 3 (id 4), 2 (id 3), 1 (id 0).
  const std::vector<float> logits = {1, 3, 3, 2, 3};
  CHECK(token_rank(logits, 1) == 0);
  CHECK(token_rank(logits, 2) == 1);
  CHECK(token_rank(logits, 4) == 2);
  CHECK(token_rank(logits, 3) == 3);
  CHECK(token_rank(logits, 0) == 4);
  // NaN ranks below everything, -inf above it.
  const std::vector<float> odd = {NAN, kNegInf, 0};
  CHECK(token_rank(odd, 2) == 0);
  CHECK(token_rank(odd, 1) == 1);
  CHECK(token_rank(odd, 0) == 2);
  CHECK_THAT(test::error_message([&] { token_rank(logits, 5); }), Catch::Contains("token_rank"));

  const std::vector<TokenLogProb> top = top_k_tokens(logits, 4);
  REQUIRE(top.size() == 4);
  CHECK(top[0].token == 1);
  CHECK(top[1].token == 2);
  CHECK(top[2].token == 4);
  CHECK(top[3].token == 3);
  // log p = x - ln(e^1 + e^2 + 3 e^3); 1e-12: a few exactly rounded double operations.
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + 3.0 * std::exp(3.0));
  CHECK(top[0].log_prob == Approx(3.0 - lse).epsilon(1e-12));
  CHECK(top[3].log_prob == Approx(2.0 - lse).epsilon(1e-12));
  CHECK(top_k_tokens(logits, 10).size() == 5);
  CHECK(top_k_tokens(logits, 0).empty());
}

TEST_CASE("step metrics: pearson on rows of known correlation, -inf columns excluded",
          "[metrics]") {
  const std::vector<float> x = {1, 2, 3, 4, 5};
  const std::vector<float> lin = {3, 5, 7, 9, 11};  // 2x + 1
  const std::vector<float> neg = {-1, -2, -3, -4, -5};
  const std::vector<float> flat = {2, 2, 2, 2, 2};
  // Finite on cols 1..3 only: (1, 3, 2) against x's (2, 3, 4). Centred: (-1, 1, 0) and
  // (-1, 0, 1): sum of products 1, sums of squares 2 and 2, r = 1 / 2; against neg: -1 / 2.
  const std::vector<float> part = {kNegInf, 1, 3, 2, kNegInf};
  const std::vector<float> lone = {kNegInf, kNegInf, kNegInf, kNegInf, 7};
  // Tolerance 1e-12: r of 5 small integers; only the final sqrt and division round.
  CHECK(pearson(x, lin) == Approx(1.0).epsilon(1e-12));
  CHECK(pearson(x, neg) == Approx(-1.0).epsilon(1e-12));
  CHECK(std::isnan(pearson(x, flat)));
  CHECK(pearson(x, part) == Approx(0.5).epsilon(1e-12));
  CHECK(pearson(part, neg) == Approx(-0.5).epsilon(1e-12));
  CHECK(std::isnan(pearson(x, lone)));  // one shared column
  CHECK(std::isnan(pearson(lone, lone)));

  const std::vector<std::span<const float>> rows = {x, lin, neg, flat, part};
  const std::vector<double> r = pearson_matrix(rows);
  REQUIRE(r.size() == 25);
  const double nan = NAN;
  const std::vector<double> expected = {
      1,   1,   -1,   nan, 0.5,   //
      1,   1,   -1,   nan, 0.5,   //
      -1,  -1,  1,    nan, -0.5,  //
      nan, nan, nan,  nan, nan,   //
      0.5, 0.5, -0.5, nan, 1,     //
  };
  for (size_t i = 0; i < 25; ++i) {
    INFO("entry " << i / 5 << ", " << i % 5);
    if (std::isnan(expected[i]))
      CHECK(std::isnan(r[i]));
    else
      CHECK(r[i] == Approx(expected[i]).epsilon(1e-12));
  }
  // Upper triangle: 1, -1, 0.5 / -1, 0.5 / -0.5 (the rest NaN): -0.5 / 6.
  CHECK(mean_upper_triangle(r, 5) == Approx(-0.5 / 6.0).epsilon(1e-12));
  CHECK(pearson_matrix({}).empty());
}

TEST_CASE("step metrics: pearson_matrix: the grouped fast path agrees with pairwise pearson",
          "[metrics]") {
  // 70 rows (three 32-row tiles, the last partial) of 300 columns: a shared signal with per-row
  // weights of either sign plus noise, so |r| >= about 0.4 and relative errors stay meaningful.
  const size_t m = 70, cols = 300;
  std::vector<std::vector<float>> data = signal_rows(
      m, cols, 99, [](size_t a) { return a % 2 != 0; }, 10.0f);

  // Compares every entry with pairwise pearson() (1 on a defined diagonal); returns how many
  // entries were defined.
  auto compare = [&](const std::vector<std::vector<float>>& values) {
    const std::vector<std::span<const float>> rows(values.begin(), values.end());
    const std::vector<double> fast = pearson_matrix(rows);
    REQUIRE(fast.size() == m * m);
    int64_t defined = 0;
    for (size_t a = 0; a < m; ++a) {
      for (size_t b = 0; b < m; ++b) {
        const double f = fast[a * m + b];
        double ref = pearson(rows[a], rows[b]);
        if (a == b && !std::isnan(ref)) ref = 1.0;
        INFO("pair " << a << ", " << b);
        if (std::isnan(ref)) {
          CHECK(std::isnan(f));
          continue;
        }
        // Both sum at most 300 products of magnitude <= 1 in double: rounding stays below
        // 300 * 2^-53 = 3e-14 absolute, under 1e-12 relative for |r| >= 0.03 (here >= ~0.4).
        CHECK(std::abs(f - ref) <= 1e-12 * std::abs(ref));
        CHECK(std::abs(ref) > 0.3);
        ++defined;
      }
    }
    return defined;
  };

  SECTION("mixed groups") {
    // Rows 5, 6 and 50 lose the same first 40 columns (one group, sharing 40..299 with the
    // finite rows), row 40 has scattered -inf (a group of its own), row 41 keeps one finite
    // column (NaN everywhere) and row 17 is constant (NaN everywhere).
    std::vector<std::vector<float>> values = data;
    for (size_t a : {5, 6, 50})
      for (size_t c = 0; c < 40; ++c) values[a][c] = kNegInf;
    for (size_t c = 100; c < 300; c += 7) values[40][c] = kNegInf;
    std::fill(values[41].begin(), values[41].end() - 1, kNegInf);
    std::fill(values[17].begin(), values[17].end(), 3.5f);
    CHECK(compare(values) == int64_t((m - 2) * (m - 2)));
  }
  SECTION("one sliding window over every row") {
    // Columns 0..99 hidden everywhere: one group over the remaining 200; row 3 is constant on
    // them (its hidden part does not count).
    std::vector<std::vector<float>> values = data;
    for (auto& row : values) std::fill(row.begin(), row.begin() + 100, kNegInf);
    std::fill(values[3].begin() + 100, values[3].end(), -1.25f);
    CHECK(compare(values) == int64_t((m - 1) * (m - 1)));
  }
}

TEST_CASE("step metrics: mean_pairwise_pearson on rows of known correlation", "[metrics]") {
  const std::vector<float> x = {1, 2, 3, 4, 5};
  const std::vector<float> lin = {3, 5, 7, 9, 11};      // 2x + 1
  const std::vector<float> steep = {-4, -1, 2, 5, 8};   // 3x - 7
  const std::vector<float> neg = {-1, -2, -3, -4, -5};  // -x
  const std::vector<float> flat = {2, 2, 2, 2, 2};
  const std::vector<float> part = {kNegInf, 1, 3, 2, kNegInf};  // r = 1/2 with x (see above)
  // Tolerance 1e-12: a handful of small integer rows; only the standardising and the final
  // division round.
  CHECK(mean_pairwise_pearson({x, lin, steep}) == Approx(1.0).epsilon(1e-12));
  CHECK(mean_pairwise_pearson({x, neg}) == Approx(-1.0).epsilon(1e-12));
  // Pairs 1, -1, -1: the mean over pairs, not over rows.
  CHECK(mean_pairwise_pearson({x, lin, neg}) == Approx(-1.0 / 3.0).epsilon(1e-12));
  // The constant row takes part in no pair: still 1, not 1 diluted by two zeros.
  CHECK(mean_pairwise_pearson({x, flat, lin}) == Approx(1.0).epsilon(1e-12));
  // Two groups: x, lin and neg over all 5 columns, part over 1..3. Pairs: x-lin 1, x-neg -1,
  // lin-neg -1, and part with x, lin, neg: 1/2, 1/2, -1/2. Sum -1/2 over 6 pairs.
  CHECK(mean_pairwise_pearson({x, lin, neg, part}) == Approx(-0.5 / 6.0).epsilon(1e-12));
  CHECK(std::isnan(mean_pairwise_pearson({})));
  CHECK(std::isnan(mean_pairwise_pearson({x})));
  CHECK(std::isnan(mean_pairwise_pearson({x, flat})));
  const std::vector<float> shorter = {1, 2, 3};
  CHECK_THAT(test::error_message([&] {
               mean_pairwise_pearson({x, shorter});
             }),
             Catch::Contains("mean_pairwise_pearson"));
}

TEST_CASE("step metrics: mean_pairwise_pearson agrees with the mean of pearson_matrix",
          "[metrics]") {
  // 40 rows of 70 columns: a shared signal with per-row weights of either sign plus noise, so the
  // mean is well away from 0 and a wrong sum or count shows.
  const size_t m = 40, cols = 70;
  std::vector<std::vector<float>> data = signal_rows(
      m, cols, 7, [](size_t a) { return a % 5 == 0; }, -3.0f);

  // Tolerance 1e-9 absolute: a matrix entry is a sum of <= 70 products of unit-norm rows, off by
  // about 70 * 2^-53 < 1e-14 (the clamp moves it no further); the factored sum squares row sums
  // of norm <= M over <= 70 columns, off by about (M + cols) * 2^-53 * M^2 < 3e-11 in all, or
  // < 1e-13 on the mean of M (M - 1) / 2 = 780 pairs. 1e-9 is far above both and far below any
  // real disagreement (one pair more or less moves the mean by ~1e-3).
  auto compare = [&](const std::vector<std::vector<float>>& values) {
    const std::vector<std::span<const float>> rows(values.begin(), values.end());
    const double reference = mean_upper_triangle(pearson_matrix(rows), int64_t(rows.size()));
    const double fast = mean_pairwise_pearson(rows);
    INFO("reference " << reference << ", mean_pairwise_pearson " << fast);
    if (std::isnan(reference)) {
      CHECK(std::isnan(fast));
    } else {
      CHECK(std::abs(fast - reference) <= 1e-9);
    }
    return reference;
  };

  SECTION("random rows, one group") {
    const double mean = compare(data);
    CHECK(std::abs(mean) > 0.1);
  }
  SECTION("-inf and NaN columns: three groups, and a constant row") {
    // Rows 10..19 lose the first 20 columns (a sliding window), rows 20..29 the first 35 and
    // have NaN at column 50: three groups with different shared columns per group pair. Row 3
    // is constant (no pairs); row 25 is constant on its own finite columns only.
    std::vector<std::vector<float>> values = data;
    for (size_t a = 10; a < 20; ++a) std::fill(values[a].begin(), values[a].begin() + 20, kNegInf);
    for (size_t a = 20; a < 30; ++a) {
      std::fill(values[a].begin(), values[a].begin() + 35, kNegInf);
      values[a][50] = NAN;
    }
    std::fill(values[3].begin(), values[3].end(), 1.5f);
    std::fill(values[25].begin() + 35, values[25].end(), 0.25f);
    values[25][50] = NAN;
    const double mean = compare(values);
    CHECK(std::abs(mean) > 0.1);
  }
  SECTION("a group sharing one column with the others") {
    // Rows 0..4 finite on the last column only (undefined everywhere), rows 5..9 on the last two
    // (defined among themselves, undefined against rows 0..4).
    std::vector<std::vector<float>> values = data;
    for (size_t a = 0; a < 5; ++a) std::fill(values[a].begin(), values[a].end() - 1, kNegInf);
    for (size_t a = 5; a < 10; ++a) std::fill(values[a].begin(), values[a].end() - 2, kNegInf);
    compare(values);
  }
  SECTION("a single row") {
    CHECK(std::isnan(compare({data[0]})));
  }
  SECTION("rows with one finite column") {
    std::vector<std::vector<float>> values = data;
    for (auto& row : values) std::fill(row.begin(), row.end() - 1, kNegInf);
    CHECK(std::isnan(compare(values)));
  }
  SECTION("empty rows") {
    CHECK(std::isnan(compare(std::vector<std::vector<float>>(m))));
    CHECK(std::isnan(compare({})));
  }
}

TEST_CASE("step metrics: jaccard_matrix and the consensus mean ignoring NaN", "[metrics]") {
  // a = {0, 1, 4}, b = {0, 2, 4}: both {0, 4}, either {0, 1, 2, 4}: 2 / 4. c and d are empty.
  const std::vector<uint8_t> a = {1, 1, 0, 0, 1}, b = {1, 0, 9, 0, 1}, c(5, 0), d(5, 0);
  const std::vector<std::span<const uint8_t>> masks = {a, b, c, d};
  const std::vector<double> j = jaccard_matrix(masks);
  REQUIRE(j.size() == 16);
  CHECK(j[0 * 4 + 0] == 1.0);
  CHECK(j[0 * 4 + 1] == 0.5);
  CHECK(j[1 * 4 + 0] == 0.5);
  CHECK(j[0 * 4 + 2] == 0.0);  // 0 / 3
  CHECK(std::isnan(j[2 * 4 + 3]));
  CHECK(std::isnan(j[2 * 4 + 2]));
  // Upper triangle: 0.5, 0, 0, 0, 0 and one NaN: 0.5 / 5.
  CHECK(mean_upper_triangle(j, 4) == Approx(0.1));

  // Across 64-column words: multiples of 3 and of 2 below 130. |A| = 44, |B| = 65, both are
  // the multiples of 6 (22), either = 44 + 65 - 22 = 87.
  std::set<int64_t> threes, twos;
  for (int64_t k = 0; k < 130; ++k) {
    if (k % 3 == 0) threes.insert(k);
    if (k % 2 == 0) twos.insert(k);
  }
  const std::vector<uint8_t> ma = mask_of(130, threes), mb = mask_of(130, twos);
  CHECK(jaccard_matrix({ma, mb})[1] == Approx(22.0 / 87.0));

  // The consensus mean skips NaN and is NaN when nothing is left.
  const double nan = NAN;
  const std::vector<double> m3 = {1, 0.2, nan, 0.2, 1, 0.6, nan, 0.6, 1};
  CHECK(mean_upper_triangle(m3, 3) == Approx(0.4));
  CHECK(std::isnan(mean_upper_triangle({1, nan, nan, 1}, 2)));
  CHECK(std::isnan(mean_upper_triangle({1}, 1)));
  CHECK_THAT(test::error_message([&] { mean_upper_triangle(m3, 2); }),
             Catch::Contains("mean_upper_triangle"));
}
