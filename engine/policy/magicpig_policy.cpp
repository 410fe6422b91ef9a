// magicpig (MagicPIG, Chen et al. 2024; docs/policies/magicpig.md): LSH sampling with importance
// weights, an estimator of the attention rather than a top-k. Per layer: SimHash codes F32
// [G, stride, tables] of every key (hashed once, when the layer first sees it), one set of seeded
// hyperplanes F32 [tables * bits, D] shared by all layers and heads (as the authors' one
// hash_func), and the step's log-weights F32 [H, stride] that the session adds to the logits of
// the visible keys before the softmax (Policy::log_weights).
//
// The rule at step t, layer l (not a dense layer):
// - Forced. Sinks and the recent window (the current token included) are visible with weight 1;
//   the budget B(t) does not truncate them (it is an expected value here, see below).
// - Sample. Every other key j of query head h is visible when h's query and j's key share their
//   bucket in at least 2 of the `tables` tables of `bits` bits (MagicPIG's collision threshold).
// - Weight. A sampled key's logit gains ln(1 / p_j), p_j the probability that it is sampled given
//   the angle theta between q and k_j (u = 1 - theta / pi, p = 1 - (1 - u^K)^L - L u^K
//   (1 - u^K)^(L - 1)): the softmax over the visible keys is then the self-normalised
//   importance-sampling estimate of the dense attention. p is floored at 1e-4. `weights=false`
//   attends over the same sample unweighted (an ablation: what the correction buys).
// - Budget. `bits` = 0 picks K from the nominal sparsity s: the K in 1..20 whose p at u = 1/2
//   (orthogonal q and k) is nearest 1 - s. So the budget is an expected share, not a cap.
// - A layer whose candidates are all forced, or where B(t) covers every candidate (s = 0), is
//   dense (the exact attention, log-weights absent).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/policy/magicpig_math.h"
#include "engine/policy/magicpig_ops.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

// Hyperplane entries: standard normal values (Box-Muller over random_unit's grid), computed on
// the host so every backend gets the same bytes. Stream tag: "magicpig" in ASCII.
constexpr uint64_t kPlaneStream = 0x6d61676963706967ull;

std::vector<float> gaussian_planes(uint64_t seed, int64_t rows, int64_t dim) {
  std::vector<float> planes(size_t(rows * dim));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t d = 0; d < dim; ++d) {
      // 1 - u1 lies in (0, 1]: the logarithm stays finite.
      const double u1 = 1.0 - double(random_unit(seed, kPlaneStream, uint64_t(r), uint64_t(2 * d)));
      const double u2 = double(random_unit(seed, kPlaneStream, uint64_t(r), uint64_t(2 * d + 1)));
      planes[size_t(r * dim + d)] =
          float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
  }
  return planes;
}

class MagicpigPolicy final : public Policy {
 public:
  MagicpigPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs, int64_t bits,
                 int64_t tables, uint64_t seed, bool weighted)
      : backend_(backend),
        ops_(magicpig_ops(backend)),
        knobs_(knobs),
        bits_(bits),
        weighted_(weighted) {
    const std::vector<float> host = gaussian_planes(seed, tables * bits, shape.head_dim);
    planes_ = backend.alloc(DType::F32, {tables * bits, shape.head_dim});
    backend.from_host(planes_, host.data(), host.size() * sizeof(float));
    codes_.resize(size_t(shape.layers));
    log_weights_.resize(size_t(shape.layers));
    filled_.assign(size_t(shape.layers), 0);
    masked_.assign(size_t(shape.layers), false);
    for (int64_t l = knobs.dense_layers; l < shape.layers; ++l) {
      codes_[size_t(l)] = backend.alloc(DType::F32, {shape.kv_heads, shape.stride, tables});
      log_weights_[size_t(l)] = backend.alloc(DType::F32, {shape.heads, shape.stride});
    }
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    const size_t l = size_t(step.layer);
    masked_[l] = false;
    if (step.layer < knobs_.dense_layers || knobs_.budget(step) >= step.candidates())
      return LayerDecision::Dense;
    const int64_t t = step.step, cols = step.cols();
    const int64_t sinks = step.first_candidate >= knobs_.sinks ? 0 : knobs_.sinks;
    // No budget truncates the forced columns: the budget is the sample's expected size.
    const ForcedColumns forced = forced_columns(t, cols, sinks, knobs_.window);
    // The forced candidates (a sliding-window layer's start at first_candidate may cut into the
    // sinks or the window): all of them forced is the exact attention.
    const int64_t first = step.first_candidate;
    const int64_t forced_candidates = std::max<int64_t>(0, forced.sink_end - first) +
                                      (t + 1 - std::max(first, forced.recent_begin));
    if (forced_candidates >= step.candidates()) return LayerDecision::Dense;
    // Keys are hashed once: those the cache gained since this layer's last sparse step.
    const int64_t begin = columns_to_refresh(filled_[l], t, cols);
    ops_.hash_keys(*step.k_cache, begin, cols, planes_, bits_, codes_[l]);
    ops_.lsh_sample(*step.q, *step.k_cache, codes_[l], planes_, bits_, cols, forced.sink_end,
                    forced.recent_begin, visible, log_weights_[l], scores);
    masked_[l] = true;
    return LayerDecision::Masked;
  }

  const DeviceTensor* log_weights(int64_t layer) const override {
    return weighted_ && masked_[size_t(layer)] ? &log_weights_[size_t(layer)] : nullptr;
  }

  void grow(int64_t stride) override {
    for (DeviceTensor& codes : codes_) codes = widen_middle(backend_, codes, stride);
    for (DeviceTensor& rows : log_weights_)
      if (!rows.empty() && stride > rows.dim(1)) rows = widen_columns(backend_, rows, stride);
  }

  int64_t state_bytes() const override {
    return tensor_bytes(codes_) + tensor_bytes(log_weights_) + tensor_bytes({planes_});
  }

 private:
  Backend& backend_;
  MagicpigOps& ops_;
  CommonKnobs knobs_;
  int64_t bits_;
  bool weighted_;  // false: the sample attended unweighted (the `weights` ablation)
  DeviceTensor planes_;
  std::vector<DeviceTensor> codes_, log_weights_;  // per layer (empty for dense layers)
  std::vector<int64_t> filled_;
  std::vector<bool> masked_;  // whether the layer's last select sampled (its weights are set)
};

}  // namespace

int64_t magicpig_bits_for(double sparsity, int64_t tables) {
  int64_t best = 1;
  double best_gap = 2.0;
  for (int64_t k = 1; k <= 20; ++k) {
    const double gap = std::fabs(double(magicpig_probability(0.5f, k, tables)) - (1.0 - sparsity));
    if (gap < best_gap) best = k, best_gap = gap;
  }
  return best;
}

double magicpig_expected_share(int64_t bits, int64_t tables) {
  return double(magicpig_probability(0.5f, bits, tables));
}

PolicyInfo magicpig_policy_info() {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<ParamSpec> specs = with_common_specs(
      {{"tables",
        ParamType::Int,
        "L: hash tables; a key is sampled when it shares the query's bucket in at least 2",
        "150",
        2,
        1024,
        {}},
       {"bits",
        ParamType::Int,
        "K: bits per table (0: the K whose expected sampled share of orthogonal keys is nearest "
        "1 - sparsity)",
        "0",
        0,
        20,
        {}},
       {"seed", ParamType::Int, "Seed of the random hyperplanes", "0", 0, inf, {}},
       {"weights",
        ParamType::Bool,
        "Weight each sampled key by 1/p (the estimator); false attends over the same sample "
        "unweighted (an ablation)",
        "true",
        0,
        0,
        {}}});
  // The authors keep 64 local tokens exact beside 4 sinks.
  for (ParamSpec& spec : specs) {
    if (spec.name == "window") {
      spec.default_value = std::string("64");
      spec.description = std::string(
          "Most recent tokens always visible with weight 1, the current one included "
          "(MagicPIG keeps 64)");
    }
  }
  PolicyInfo info{
      "magicpig",
      "LSH sampling (MagicPIG)",
      "Keys sharing the query's SimHash bucket in at least 2 of L tables are sampled and "
      "weighted by 1 / their sampling probability; sinks and the window stay exact.",
      specs,
      /*reference=*/false,
      /*needs_predictor=*/false,
      /*predicts_logits=*/false};
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_magicpig_policy(const PolicyShape& shape, Backend& backend,
                                             const ParamValues& params, double sparsity) {
  const int64_t tables = params.get_int("tables");
  int64_t bits = params.get_int("bits");
  if (bits == 0) bits = magicpig_bits_for(sparsity, tables);
  return std::make_unique<MagicpigPolicy>(shape, backend, read_common_knobs(params, sparsity), bits,
                                          tables, uint64_t(params.get_int("seed")),
                                          params.get_bool("weights"));
}

}  // namespace kvlens
