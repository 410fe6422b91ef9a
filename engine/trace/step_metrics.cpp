// The per-step metrics of POLICIES.md over host rows: oracle sets and recall, top-50% agreement,
// next-token divergence and ranks over [V] logits, and the [M, M] cross-head consensus matrices
// (Pearson of true-logit rows, Jaccard of visible sets).
#include "engine/trace/step_metrics.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <unordered_map>

#include "engine/backend/policy_op_math.h"
#include "engine/common/error.h"
#include "engine/policy/policy.h"

namespace kvlens {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

void require_same_size(size_t a, size_t b, const std::string& field) {
  if (a != b) {
    throw Error("step_metrics", field, "rows of equal length",
                std::to_string(a) + " and " + std::to_string(b));
  }
}

// Marks the k columns of `scores` with the highest select_top_k keys (ties to the higher column,
// NaN lowest) among those not yet chosen. The same key as the backends' select_top_k, so a set
// chosen here is the one the engine would choose from the same scores.
void choose_top(std::span<const float> scores, int64_t k, std::vector<uint8_t>& chosen) {
  if (k <= 0) return;
  std::vector<uint64_t> keys;
  keys.reserve(scores.size());
  for (size_t j = 0; j < scores.size(); ++j)
    if (!chosen[j]) keys.push_back(top_k_key(scores[j], uint32_t(j)));
  if (int64_t(keys.size()) > k) {
    std::nth_element(keys.begin(), keys.begin() + (k - 1), keys.end(), std::greater<uint64_t>());
    keys.resize(size_t(k));
  }
  for (uint64_t key : keys) chosen[uint32_t(key)] = 1;
}

// token_rank's total order: true when token a is ranked ahead of token b.
bool ranks_ahead(std::span<const float> logits, int64_t a, int64_t b) {
  const float xa = logits[size_t(a)], xb = logits[size_t(b)];
  const bool nan_a = std::isnan(xa), nan_b = std::isnan(xb);
  if (nan_a != nan_b) return nan_b;
  if (!nan_a && xa != xb) return xa > xb;
  return a < b;
}

// Rows restricted to a set of shared columns, each centred and scaled to unit norm so that the
// Pearson correlation of two rows is their dot product; stored column-major (z[c * n + i]) so the
// tiles of gram() read contiguous runs. A row with zero variance is not `defined`.
struct StandardisedRows {
  size_t n = 0;  // rows
  std::vector<double> z;
  std::vector<uint8_t> defined;

  void assign(const std::vector<std::span<const float>>& rows, const std::vector<int64_t>& which,
              const std::vector<size_t>& columns) {
    n = which.size();
    z.resize(columns.size() * n);
    defined.assign(n, 0);
    std::vector<const float*> data(n);
    std::vector<double> mean(n), inv(n, 0.0);
    for (size_t i = 0; i < n; ++i) {
      data[i] = rows[size_t(which[i])].data();
      for (size_t c : columns) mean[i] += data[i][c];
      mean[i] /= double(columns.size());
      double norm2 = 0.0;
      for (size_t c : columns) {
        const double centred = double(data[i][c]) - mean[i];
        norm2 += centred * centred;
      }
      // A constant row centres to exact zeros (the mean of equal floats is exact in double).
      if (!(norm2 > 0.0)) continue;
      defined[i] = 1;
      inv[i] = 1.0 / std::sqrt(norm2);
    }
    // Written a column at a time: row by row, consecutive stores would stride n doubles (4 KiB
    // for 512 rows), a cache line and often a page per element.
    for (size_t k = 0; k < columns.size(); ++k) {
      double* out = z.data() + k * n;
      for (size_t i = 0; i < n; ++i)
        out[i] = defined[i] ? (double(data[i][columns[k]]) - mean[i]) * inv[i] : 0.0;
    }
  }

  // One pass over z: the sum of the defined rows (one entry per shared column, summed in row
  // order), the sum of their |z_a|^2 (their count up to rounding, but summed as stored so that a
  // pair sum derived from it carries the same rounding as the dot products it replaces) and their
  // count.
  struct Sums {
    std::vector<double> row_sum;
    double squared_norms = 0.0;
    int64_t defined = 0;
  };
  Sums sums() const {
    const size_t columns = n == 0 ? 0 : z.size() / n;
    Sums s;
    s.row_sum.assign(columns, 0.0);
    s.defined = std::count(defined.begin(), defined.end(), uint8_t(1));
    for (size_t c = 0; c < columns; ++c) {
      const double* zc = z.data() + c * n;
      double sum = 0.0, squares = 0.0;
      for (size_t i = 0; i < n; ++i) {
        if (!defined[i]) continue;
        sum += zc[i];
        squares += zc[i] * zc[i];
      }
      s.row_sum[c] = sum;
      s.squared_norms += squares;
    }
    return s;
  }
};

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (size_t k = 0; k < a.size(); ++k) sum += a[k] * b[k];
  return sum;
}

// Rows grouped by their finite columns: all of them, usually, or one sliding window hiding the
// same columns of every row. Two groups share one set of columns for all their pairs, so a row
// needs standardising only once per group pair, not once per pair.
struct FiniteColumnGroups {
  std::vector<std::vector<int64_t>> members;  // row indices
  std::vector<std::string> finite;            // each group's finite columns, one 0/1 char each
};

// Throws kvlens::Error naming `field` when the rows differ in length.
FiniteColumnGroups group_by_finite_columns(const std::vector<std::span<const float>>& rows,
                                           const std::string& field) {
  FiniteColumnGroups groups;
  if (rows.empty()) return groups;
  const size_t cols = rows[0].size();
  for (const auto& row : rows) require_same_size(cols, row.size(), field);
  // String keys: GCC 12 misreports the memcmp of vector<uint8_t>'s <=> (-Wstringop-overread).
  std::unordered_map<std::string, size_t> group_of;
  std::string mask(cols, '\0');
  for (size_t a = 0; a < rows.size(); ++a) {
    for (size_t c = 0; c < cols; ++c) mask[c] = char(std::isfinite(rows[a][c]));
    const auto [it, added] = group_of.try_emplace(mask, groups.members.size());
    if (added) {
      groups.members.emplace_back();
      groups.finite.push_back(mask);
    }
    groups.members[it->second].push_back(int64_t(a));
  }
  return groups;
}

// visit(g, h, zg, zh) for every group pair g <= h, both groups standardised over the columns they
// share (zh is zg when g == h). Pairs with fewer than 2 shared columns are skipped: every
// correlation across them is undefined.
template <class Visit>
void for_each_group_pair(const std::vector<std::span<const float>>& rows,
                         const FiniteColumnGroups& groups, Visit&& visit) {
  const size_t count = groups.members.size();
  const size_t cols = rows.empty() ? 0 : rows[0].size();
  std::vector<size_t> shared;
  StandardisedRows zg, zh;
  for (size_t g = 0; g < count; ++g) {
    for (size_t h = g; h < count; ++h) {
      shared.clear();
      for (size_t c = 0; c < cols; ++c)
        if (groups.finite[g][c] && groups.finite[h][c]) shared.push_back(c);
      if (shared.size() < 2) continue;
      zg.assign(rows, groups.members[g], shared);
      if (g != h) zh.assign(rows, groups.members[h], shared);
      visit(g, h, zg, g == h ? zg : zh);
    }
  }
}

// emit(i, j, a_i . b_j) for every defined pair (only j > i when a and b are the same rows), in
// T x T tiles (8 KiB of accumulators, resident in L1) with one rank-1 update per column: the inner
// loop has no reduction, so it vectorises without reassociating, and every pair is still summed in
// column order.
template <class Emit>
void gram(const StandardisedRows& a, const StandardisedRows& b, bool same, Emit&& emit) {
  constexpr size_t T = 32;
  const size_t columns = a.n == 0 ? 0 : a.z.size() / a.n;
  std::vector<double> acc(T * T);
  for (size_t i0 = 0; i0 < a.n; i0 += T) {
    const size_t ti = std::min(T, a.n - i0);
    for (size_t j0 = same ? i0 : 0; j0 < b.n; j0 += T) {
      const size_t tj = std::min(T, b.n - j0);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t c = 0; c < columns; ++c) {
        const double* za = a.z.data() + c * a.n + i0;
        const double* zb = b.z.data() + c * b.n + j0;
        for (size_t i = 0; i < ti; ++i) {
          const double zai = za[i];
          double* out = acc.data() + i * T;
          for (size_t j = 0; j < tj; ++j) out[j] += zai * zb[j];
        }
      }
      for (size_t i = 0; i < ti; ++i) {
        if (!a.defined[i0 + i]) continue;
        for (size_t j = 0; j < tj; ++j) {
          if ((same && j0 + j <= i0 + i) || !b.defined[j0 + j]) continue;
          emit(i0 + i, j0 + j, std::clamp(acc[i * T + j], -1.0, 1.0));
        }
      }
    }
  }
}

}  // namespace

std::vector<uint8_t> oracle_visible(std::span<const float> logits, int64_t budget, int64_t sinks,
                                    int64_t window) {
  const int64_t cols = int64_t(logits.size());
  if (cols == 0) throw Error("step_metrics", "oracle_visible: logits", "at least one column", "0");
  const int64_t t = cols - 1;
  budget = std::clamp<int64_t>(budget, 1, cols);
  sinks = std::max<int64_t>(sinks, 0);
  // The oracle policy passes recent = 1 and the window knob: max(1, window) and window give the
  // same forced set, since both count the current token.
  const ForcedColumns forced = forced_columns(t, budget, sinks, window);
  std::vector<uint8_t> visible(size_t(cols), 0);
  std::fill(visible.begin(), visible.begin() + forced.sink_end, 1);
  std::fill(visible.begin() + forced.recent_begin, visible.end(), 1);
  // The engine ranks by F32 probabilities, which order like the logits except where two distinct
  // logits round to one probability (e.g. both underflow to 0 far below the max); ranking by the
  // logits is the set the rule means, and the two agree outside such near-ties.
  choose_top(logits, budget - forced.count(t), visible);
  return visible;
}

double recall(std::span<const uint8_t> visible, std::span<const uint8_t> reference) {
  require_same_size(visible.size(), reference.size(), "recall: visible and reference");
  int64_t both = 0, ref = 0;
  for (size_t j = 0; j < reference.size(); ++j) {
    if (!reference[j]) continue;
    ++ref;
    if (visible[j]) ++both;
  }
  return ref == 0 ? kNaN : double(both) / double(ref);
}

std::vector<uint8_t> top_half(std::span<const float> scores) {
  std::vector<uint8_t> top(scores.size(), 0);
  choose_top(scores, int64_t((scores.size() + 1) / 2), top);
  return top;
}

double top_half_agreement(std::span<const float> scores, std::span<const float> logits) {
  require_same_size(scores.size(), logits.size(), "top_half_agreement: scores and logits");
  if (scores.empty()) return kNaN;
  // top_half's sets by threshold: the keys are distinct (each holds its column), so a column is
  // in the top half exactly when its key is at least the ceil(n / 2)-th largest. Evaluations
  // call this for every scored row of every step: no allocation after a thread's first rows.
  thread_local std::vector<uint64_t> score_keys, logit_keys, selected;
  const size_t n = scores.size(), k = (n + 1) / 2;
  score_keys.resize(n);
  logit_keys.resize(n);
  for (size_t j = 0; j < n; ++j) {
    score_keys[j] = top_k_key(scores[j], uint32_t(j));
    logit_keys[j] = top_k_key(logits[j], uint32_t(j));
  }
  auto kth_largest = [&](const std::vector<uint64_t>& keys) {
    selected.assign(keys.begin(), keys.end());
    std::nth_element(selected.begin(), selected.begin() + ptrdiff_t(k - 1), selected.end(),
                     std::greater<uint64_t>());
    return selected[k - 1];
  };
  const uint64_t score_cut = kth_largest(score_keys), logit_cut = kth_largest(logit_keys);
  int64_t agree = 0;
  for (size_t j = 0; j < n; ++j)
    agree += (score_keys[j] >= score_cut) == (logit_keys[j] >= logit_cut);
  return double(agree) / double(n);
}

std::vector<double> log_softmax(std::span<const float> logits) {
  double max = -kInf;
  bool defined = true;
  for (float x : logits) {
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) defined = false;
    max = std::max(max, double(x));
  }
  std::vector<double> out(logits.size(), kNaN);
  if (!defined || !std::isfinite(max)) return out;
  double sum = 0.0;  // >= 1: the max contributes exp(0)
  for (float x : logits) sum += std::exp(double(x) - max);
  const double lse = max + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = double(logits[i]) - lse;
  return out;
}

double kl_divergence(std::span<const float> reference_logits, std::span<const float> logits) {
  require_same_size(reference_logits.size(), logits.size(), "kl_divergence: logits");
  const std::vector<double> lp = log_softmax(reference_logits), lq = log_softmax(logits);
  double kl = 0.0;
  for (size_t i = 0; i < lp.size(); ++i) {
    if (lp[i] == -kInf) continue;  // 0 * log 0 = 0, also where q is 0
    kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  }
  // KL >= 0; rounding over a large vocabulary can leave a few ulps below zero for near-equal rows.
  return std::isnan(kl) ? kl : std::max(kl, 0.0);
}

int64_t token_rank(std::span<const float> logits, int32_t token) {
  const int64_t v = int64_t(logits.size());
  if (token < 0 || token >= v) {
    throw Error("step_metrics", "token_rank: token", "an id in [0, " + std::to_string(v) + ")",
                std::to_string(token));
  }
  int64_t rank = 0;
  for (int64_t i = 0; i < v; ++i) rank += ranks_ahead(logits, i, token);
  return rank;
}

std::vector<TokenLogProb> top_k_tokens(std::span<const float> logits, int64_t k) {
  k = std::clamp<int64_t>(k, 0, int64_t(logits.size()));
  std::vector<int64_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), int64_t(0));
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int64_t a, int64_t b) { return ranks_ahead(logits, a, b); });
  const std::vector<double> log_probs = log_softmax(logits);
  std::vector<TokenLogProb> top(static_cast<size_t>(k));
  for (size_t i = 0; i < size_t(k); ++i) top[i] = {int32_t(ids[i]), log_probs[size_t(ids[i])]};
  return top;
}

double pearson(std::span<const float> x, std::span<const float> y) {
  require_same_size(x.size(), y.size(), "pearson: rows");
  int64_t n = 0;
  double mx = 0.0, my = 0.0;
  for (size_t j = 0; j < x.size(); ++j) {
    if (!std::isfinite(x[j]) || !std::isfinite(y[j])) continue;
    ++n;
    mx += x[j];
    my += y[j];
  }
  if (n < 2) return kNaN;
  mx /= double(n);
  my /= double(n);
  // Two passes: centring first keeps the sums of squares free of cancellation.
  double sxy = 0.0, sxx = 0.0, syy = 0.0;
  for (size_t j = 0; j < x.size(); ++j) {
    if (!std::isfinite(x[j]) || !std::isfinite(y[j])) continue;
    const double dx = double(x[j]) - mx, dy = double(y[j]) - my;
    sxy += dx * dy;
    sxx += dx * dx;
    syy += dy * dy;
  }
  if (!(sxx > 0.0) || !(syy > 0.0)) return kNaN;
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

std::vector<double> pearson_matrix(const std::vector<std::span<const float>>& rows) {
  const int64_t m = int64_t(rows.size());
  std::vector<double> r(size_t(m * m), kNaN);
  const FiniteColumnGroups groups = group_by_finite_columns(rows, "pearson_matrix: rows");
  // Each pair is a dot product of its standardised rows: one group costs O(M^2 cols). Pairs of
  // groups without 2 shared columns stay NaN, as initialised.
  for_each_group_pair(
      rows, groups,
      [&](size_t g, size_t h, const StandardisedRows& zg, const StandardisedRows& zh) {
        const bool same = g == h;
        gram(zg, zh, same, [&](size_t i, size_t j, double v) {
          const int64_t a = groups.members[g][i], b = groups.members[h][j];
          r[size_t(a * m + b)] = v;
          r[size_t(b * m + a)] = v;
        });
        if (same)
          for (size_t i = 0; i < groups.members[g].size(); ++i)
            if (zg.defined[i]) r[size_t(groups.members[g][i] * (m + 1))] = 1.0;
      });
  return r;
}

// mean_pairwise_pearson when every value is finite (no sliding window: a trace's usual step):
// one group over every column, each row read in order, nothing standardised is stored. The row
// sums run in kLanes interleaved partial sums so that they are not one chain of dependent adds
// (a trace computes this for every step, overlapped with the device's next step).
constexpr size_t kLanes = 8;

static double lanes_total(const double (&lanes)[kLanes]) {
  double total = 0.0;
  for (const double lane : lanes) total += lane;
  return total;
}

// sum over c < n of term(c), in kLanes interleaved partial sums (then added in lane order).
template <typename Term>
double lane_sum(size_t n, Term&& term) {
  double lanes[kLanes] = {};
  size_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (size_t k = 0; k < kLanes; ++k) lanes[k] += term(c + k);
  for (; c < n; ++c) lanes[c % kLanes] += term(c);
  return lanes_total(lanes);
}

static double mean_pairwise_pearson_finite(const std::vector<std::span<const float>>& rows) {
  const size_t cols = rows[0].size();
  if (cols < 2) return kNaN;
  std::vector<double> row_sum(cols, 0.0), z(cols);
  double squared_norms = 0.0;
  int64_t defined = 0;
  for (const std::span<const float> row : rows) {
    const float* x = row.data();
    const double mean = lane_sum(cols, [&](size_t c) { return double(x[c]); }) / double(cols);
    const double norm2 = lane_sum(cols, [&](size_t c) {
      const double centred = double(x[c]) - mean;
      return centred * centred;
    });
    if (!(norm2 > 0.0)) continue;  // constant: undefined, in no pair
    const double inv = 1.0 / std::sqrt(norm2);
    for (size_t c = 0; c < cols; ++c) {
      z[c] = (double(x[c]) - mean) * inv;
      row_sum[c] += z[c];
    }
    squared_norms += lane_sum(cols, [&](size_t c) { return z[c] * z[c]; });
    ++defined;
  }
  const double total = lane_sum(cols, [&](size_t c) { return row_sum[c] * row_sum[c]; });
  const int64_t pairs = defined * (defined - 1) / 2;
  return pairs == 0 ? kNaN : (total - squared_norms) / 2.0 / double(pairs);
}

double mean_pairwise_pearson(const std::vector<std::span<const float>>& rows) {
  if (rows.empty()) return kNaN;
  const bool all_finite = std::all_of(rows.begin(), rows.end(), [&](std::span<const float> row) {
    return row.size() == rows[0].size() &&
           std::all_of(row.begin(), row.end(), [](float x) { return std::isfinite(x); });
  });
  if (all_finite) return mean_pairwise_pearson_finite(rows);
  const FiniteColumnGroups groups = group_by_finite_columns(rows, "mean_pairwise_pearson: rows");
  // The sum of z_a . z_b over a block of pairs factors through the row sums, so a group pair
  // costs O(M cols) (its standardising) instead of O(M^2 cols). Undefined rows are left out of
  // both the sums and the counts, as their NaN entries are left out of mean_upper_triangle.
  double sum = 0.0;
  int64_t pairs = 0;
  for_each_group_pair(
      rows, groups,
      [&](size_t g, size_t h, const StandardisedRows& zg, const StandardisedRows& zh) {
        const StandardisedRows::Sums sg = zg.sums();
        if (g == h) {
          // |sum z|^2 counts every ordered pair and every row with itself: take the rows with
          // themselves away and halve.
          sum += (dot(sg.row_sum, sg.row_sum) - sg.squared_norms) / 2.0;
          pairs += sg.defined * (sg.defined - 1) / 2;
        } else {
          const StandardisedRows::Sums sh = zh.sums();
          sum += dot(sg.row_sum, sh.row_sum);
          pairs += sg.defined * sh.defined;
        }
      });
  // No per-entry clamp to [-1, 1] as in gram(): an entry leaves that range by rounding only, so
  // the clamp moves the mean by no more than the rounding already in it.
  return pairs == 0 ? kNaN : sum / double(pairs);
}

std::vector<double> jaccard_matrix(const std::vector<std::span<const uint8_t>>& masks) {
  const int64_t m = int64_t(masks.size());
  std::vector<double> r(size_t(m * m), kNaN);
  if (m == 0) return r;
  const size_t cols = masks[0].size();
  for (const auto& mask : masks) require_same_size(cols, mask.size(), "jaccard_matrix: masks");
  // Packed into 64-column words so a pair costs cols / 64 popcounts.
  const size_t words = (cols + 63) / 64;
  std::vector<uint64_t> bits(size_t(m) * words, 0);
  std::vector<int64_t> sizes(size_t(m), 0);
  for (int64_t a = 0; a < m; ++a) {
    uint64_t* w = bits.data() + size_t(a) * words;
    for (size_t c = 0; c < cols; ++c)
      if (masks[size_t(a)][c]) w[c / 64] |= uint64_t(1) << (c % 64);
    for (size_t k = 0; k < words; ++k) sizes[size_t(a)] += std::popcount(w[k]);
  }
  for (int64_t a = 0; a < m; ++a) {
    const uint64_t* wa = bits.data() + size_t(a) * words;
    for (int64_t b = a; b < m; ++b) {
      const uint64_t* wb = bits.data() + size_t(b) * words;
      int64_t both = 0;
      for (size_t k = 0; k < words; ++k) both += std::popcount(wa[k] & wb[k]);
      const int64_t either = sizes[size_t(a)] + sizes[size_t(b)] - both;
      const double v = either == 0 ? kNaN : double(both) / double(either);
      r[size_t(a * m + b)] = v;
      r[size_t(b * m + a)] = v;
    }
  }
  return r;
}

double mean_upper_triangle(const std::vector<double>& matrix, int64_t m) {
  if (m < 0 || int64_t(matrix.size()) != m * m) {
    throw Error("step_metrics", "mean_upper_triangle: matrix", "m * m entries",
                std::to_string(matrix.size()) + " for m = " + std::to_string(m));
  }
  double sum = 0.0;
  int64_t n = 0;
  for (int64_t a = 0; a < m; ++a)
    for (int64_t b = a + 1; b < m; ++b) {
      const double v = matrix[size_t(a * m + b)];
      if (std::isnan(v)) continue;
      sum += v;
      ++n;
    }
  return n == 0 ? kNaN : sum / double(n);
}

}  // namespace kvlens
