// Effective-sparsity bookkeeping.
#include "engine/policy/sparsity_stats.h"

#include <limits>

#include "engine/common/error.h"

namespace kvlens {

void SparsityStats::reset(int64_t layer_count, int64_t head_count) {
  layers = layer_count;
  heads = head_count;
  steps = 0;
  hidden_sum.assign(size_t(layers * heads), 0.0);
}

void SparsityStats::add_layer(int64_t layer, const std::vector<int64_t>& visible,
                              int64_t candidates) {
  for (int64_t h = 0; h < heads; ++h) {
    hidden_sum[size_t(layer * heads + h)] += 1.0 - double(visible[size_t(h)]) / double(candidates);
  }
}

void SparsityStats::add_dense_layer(int64_t) {}

void SparsityStats::add_skipped_layer(int64_t layer) {
  for (int64_t h = 0; h < heads; ++h) hidden_sum[size_t(layer * heads + h)] += 1.0;
}

void SparsityStats::merge(const SparsityStats& other) {
  if (other.steps == 0) return;
  if (steps == 0 && hidden_sum.empty()) reset(other.layers, other.heads);
  if (other.layers != layers || other.heads != heads) {
    throw Error("sparsity stats", "shape", "runs of one model", "different layer/head counts");
  }
  for (size_t i = 0; i < hidden_sum.size(); ++i) hidden_sum[i] += other.hidden_sum[i];
  steps += other.steps;
}

double SparsityStats::overall() const {
  if (steps == 0 || hidden_sum.empty()) return std::numeric_limits<double>::quiet_NaN();
  double total = 0.0;
  for (const double value : hidden_sum) total += value;
  return total / double(steps) / double(hidden_sum.size());
}

std::vector<double> SparsityStats::per_layer() const {
  std::vector<double> out(size_t(layers), 0.0);
  if (steps == 0) return out;
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t h = 0; h < heads; ++h) out[size_t(l)] += hidden_sum[size_t(l * heads + h)];
    out[size_t(l)] /= double(steps) * double(heads);
  }
  return out;
}

std::vector<double> SparsityStats::per_head() const {
  std::vector<double> out(size_t(heads), 0.0);
  if (steps == 0) return out;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t l = 0; l < layers; ++l) out[size_t(h)] += hidden_sum[size_t(l * heads + h)];
    out[size_t(h)] /= double(steps) * double(layers);
  }
  return out;
}

}  // namespace kvlens
