// The per-step metrics of POLICIES.md ("Metrics") as plain host functions with double accumulation,
// independent of any backend or session. A "row" is one (layer, head)'s data at step t over its
// candidates j = 0..t (cols = t + 1); a vocabulary row is one step's next-token logits [V].
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvlens {

// ---- Visibility sets -----------------------------------------------------------------------

// The oracle's set for one row at query-head granularity (what the `oracle` policy chooses):
// the forced columns of forced_columns() (the current token, then the first min(sinks, t)
// columns, then the most recent tokens, `window` counting the current one, truncated to `budget`
// by that priority) plus the top (budget - forced) remaining columns by logit, ties to the higher
// column (the more recent token), -inf (outside a sliding window) below every finite logit and
// NaN lowest. `budget` is B(t) (CommonKnobs::budget), clamped to [1, cols]. Returns [cols] 0/1.
// Throws kvlens::Error for an empty row.
std::vector<uint8_t> oracle_visible(std::span<const float> logits, int64_t budget, int64_t sinks,
                                    int64_t window);

// |S ∩ S_ref| / |S_ref| of two [cols] masks (nonzero = visible); NaN when S_ref is empty.
double recall(std::span<const uint8_t> visible, std::span<const uint8_t> reference);

// The top 50% of a row: the ceil(cols / 2) highest scores, ties to the higher column (the more
// recent token), NaN lowest. For odd cols the middle candidate counts as "top". Returns [cols] 0/1.
std::vector<uint8_t> top_half(std::span<const float> scores);

// The TokenButler paper's token classification accuracy: the fraction of the cols candidates
// whose membership in top_half(scores) equals their membership in top_half(logits). NaN for an
// empty row.
double top_half_agreement(std::span<const float> scores, std::span<const float> logits);

// ---- Next-token distribution (a vocabulary row of logits, [V]) --------------------------------

// log softmax in double, stable (the max is subtracted first). -inf logits give -inf; a row with
// a NaN, a +inf or no finite logit has no distribution and gives all NaN.
std::vector<double> log_softmax(std::span<const float> logits);

// KL(softmax(reference) || softmax(logits)) in nats; terms where the reference probability is 0
// count 0, a token the reference allows but `logits` excludes gives +inf. Both [V].
double kl_divergence(std::span<const float> reference_logits, std::span<const float> logits);

// The rank of `token`: tokens with a strictly higher logit plus those with an equal logit and a
// lower id (NaN below everything), so rank 0 is the argmax with ties to the lower id
// (torch.argmax).
int64_t token_rank(std::span<const float> logits, int32_t token);

struct TokenLogProb {
  int32_t token = 0;
  double log_prob = 0.0;
};

// The min(k, V) most likely tokens with their log-probabilities, most likely first, ties to the
// lower id (the order of token_rank).
std::vector<TokenLogProb> top_k_tokens(std::span<const float> logits, int64_t k);

// ---- Cross-head consensus (the TokenButler paper's Figure 8) ----------------------------------

// Pearson correlation of two rows over the columns where both are finite (the shared candidates);
// NaN with fewer than 2 shared columns or zero variance on them. The pairwise reference.
double pearson(std::span<const float> x, std::span<const float> y);

// The [M, M] row-major matrix of pearson() between every pair of M equally long rows; the diagonal
// is 1 (NaN for a row whose own correlation is undefined). Rows are grouped by their finite
// columns (one group when nothing is -inf, or when one sliding window hides the same columns of
// every row); for each pair of groups the rows are standardised once over the shared columns and
// correlated by blocked dot products, so a single group costs O(M^2 cols).
std::vector<double> pearson_matrix(const std::vector<std::span<const float>>& rows);

// The mean of the strict upper triangle of pearson_matrix(rows) (NaN pairs left out), without
// the matrix: for each pair of finite-column groups the sum of its pairs' correlations is a dot
// product of the groups' summed standardised rows, so the cost is O(G^2 M cols) for G groups
// (usually 1) instead of O(M^2 cols). NaN when no pair is defined (fewer than 2 rows, or no two
// rows with 2 shared finite columns and nonzero variance on them). pearson_matrix clamps each
// entry to [-1, 1] and this cannot, so the two differ by rounding only (about cols * 2^-53 per
// entry). Throws kvlens::Error for rows of unequal length.
double mean_pairwise_pearson(const std::vector<std::span<const float>>& rows);

// The [M, M] row-major matrix of Jaccard overlaps |A ∩ B| / |A ∪ B| of M equally long masks
// (nonzero = visible): 1 on the diagonal, NaN where both sets are empty.
std::vector<double> jaccard_matrix(const std::vector<std::span<const uint8_t>>& masks);

// The mean of the strict upper triangle of an [m, m] row-major matrix, NaN entries ignored; NaN
// when no entry is left (the consensus score).
double mean_upper_triangle(const std::vector<double>& matrix, int64_t m);

}  // namespace kvlens
