// Effective sparsity (POLICIES.md): 1 - visible / candidates per (step, layer, head), averaged
// over steps, layers and heads; also per layer and per head. hidden_sum: [layers * heads] sums of
// the hidden fraction over the steps counted. A dense layer counts 0, a skipped one 1.
#pragma once

#include <cstdint>
#include <vector>

namespace kvlens {

struct SparsityStats {
  int64_t layers = 0, heads = 0;
  int64_t steps = 0;  // (step) count per (layer, head) cell
  std::vector<double> hidden_sum;

  void reset(int64_t layer_count, int64_t head_count);
  // Adds one step of one layer: visible[h] tokens seen by head h out of `candidates`.
  void add_layer(int64_t layer, const std::vector<int64_t>& visible, int64_t candidates);
  void add_dense_layer(int64_t layer);
  void add_skipped_layer(int64_t layer);
  void end_step() { ++steps; }
  void merge(const SparsityStats& other);  // same shape, or this one empty

  double overall() const;                 // NaN when no step was counted
  std::vector<double> per_layer() const;  // [layers]
  std::vector<double> per_head() const;   // [heads], averaged over layers
};

}  // namespace kvlens
