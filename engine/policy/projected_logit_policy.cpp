// loki's and doublesparsity's shared selection (projected_logit_policy.h). Per layer: the basis
// [B, D, dims] and the projected keys [B, stride, dims], filled up to `filled_` columns.
#include "engine/policy/projected_logit_policy.h"

#include <algorithm>

#include "engine/policy/approx_logit_ops.h"
#include "engine/policy/budgeted_policy.h"

namespace kvlens {
namespace {

class ProjectedLogitPolicy final : public BudgetedPolicy {
 public:
  ProjectedLogitPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs,
                       const std::vector<std::vector<float>>& bases, int64_t rows, int64_t dims)
      : BudgetedPolicy(shape, backend, knobs),
        ops_(approx_logit_ops(backend)),
        rows_(rows),
        dims_(dims),
        filled_(size_t(shape.layers), 0) {
    for (int64_t l = 0; l < shape.layers; ++l) {
      // Dense layers never rank, so they keep neither basis nor keys.
      if (l < knobs_.dense_layers) {
        basis_.emplace_back();
        projected_.emplace_back();
        continue;
      }
      basis_.push_back(backend.alloc(DType::F32, {rows, shape.head_dim, dims}));
      const std::vector<float>& host = bases[size_t(l)];
      backend.from_host(basis_.back(), host.data(), host.size() * sizeof(float));
      projected_.push_back(backend.alloc(DType::F32, {rows, shape.stride, dims}));
    }
  }

  // Chooses by its own approximation, never this step's logits.
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  // The projected keys [B, stride, dims] gain columns; each row's keys are copied as they are.
  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    for (DeviceTensor& keys : projected_) keys = widen_middle(backend_, keys, stride);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + tensor_bytes(basis_) + tensor_bytes(projected_);
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    const int64_t t = step.step, cols = step.cols();
    // Project the keys gained since this layer's last step (columns_to_refresh says which).
    const int64_t begin = columns_to_refresh(filled_[l], t, cols);
    ops_.project_keys(*step.k_cache, begin, cols, basis_[l], projected_[l]);
    ops_.projected_logits(*step.q, basis_[l], projected_[l], cols, scores);
    select_budgeted(step, 1, at_selection_rows(scores, cols), nullptr, visible);
    return LayerDecision::Masked;
  }

 private:
  ApproxLogitOps& ops_;
  int64_t rows_, dims_;
  std::vector<int64_t> filled_;          // per layer: the columns projected_ covers
  std::vector<DeviceTensor> basis_;      // per layer [B, D, dims] F32
  std::vector<DeviceTensor> projected_;  // per layer [B, stride, dims] F32
};

}  // namespace

std::unique_ptr<Policy> make_projected_logit_policy(const PolicyShape& shape, Backend& backend,
                                                    CommonKnobs knobs,
                                                    const std::vector<std::vector<float>>& bases,
                                                    int64_t rows, int64_t dims) {
  return std::make_unique<ProjectedLogitPolicy>(shape, backend, knobs, bases, rows, dims);
}

}  // namespace kvlens
