// snapkv (SnapKV, decode form, POLICIES.md): the score of token j at step t is the attention
// probability it received over the previous obs_window steps t-w..t-1 (as computed under those
// steps' visible sets), summed per query head, then pooled along the key axis (pool = max or avg,
// odd pool_kernel, stride 1, same padding; avg divides by the kernel, padding counting as 0).
// When the candidates exceed B(t) the lowest scores are dropped among the tokens that are not
// forced; with protect_window (SnapKV's own rule) the observation window t-w..t-1 is forced
// (recent part w + 1 with the current token), without it (the TokenButler code) only the current
// token, the sinks and `window` are. The forced part is truncated to B(t) by POLICIES.md's
// priority, so a budget smaller than sinks + window keeps the current token, the sinks, then the
// most recent. Dropped tokens never return (also when a growing budget would force them again).
//
// The window sum is not a running sum (add the new row, subtract the leaving one): that would
// carry F32 residues ((a + b) - a != b) that differ between tokens, so two tokens with the same
// attention over the window would no longer tie and the tie rule (to the recent) would not hold.
// Instead the steps form chunks of w (step s is slot s mod w of chunk s / w), and the window of
// step t, slot i, is two partial sums: the suffix S_i of the previous chunk (its slots i .. w-1,
// folded from the last slot down) plus the prefix P of the current chunk (its slots 0 .. i-1,
// folded in step order); at slot 0 the window is S_0 alone. Each is a fixed function of the w
// rows, the same grouping for every token at a step, so equal attention over the window still
// ties exactly. Per layer the ring holds, in slot i, this chunk's probability row of step
// s = i once observed and the previous chunk's S_i until then: observe writes its row there (and
// adds it into P), and observe of the chunk's last slot turns the chunk's rows into suffixes in
// place (w - 1 row additions once per chunk). select adds P into slot i in place, as slot i's S_i
// is read for the last time at that step and observe overwrites it next. So a step costs about
// three row passes per head (the re-summed blocks of the earlier form cost twelve).
// Slot columns a step never wrote are 0 (older steps had fewer columns; the first chunk's
// suffixes and, in the prefill + decode mode, the slots before the first policy step were never
// written), so nothing needs clearing.
// At kv_head granularity the pooled per-head scores are summed over the group (pool, then sum).
// In the prefill + decode mode the prefill steps are dense and not observed: the window starts
// empty at the first policy step, so the first w decode steps rank by fewer rows (all scores 0 at
// the first one: ties to the recent, i.e. the oldest non-forced tokens go first).
// State per layer: ring [w * H, stride] (slot i's H rows together), prefix [H, stride] (rows of
// one tensor over all layers each), kept [R, stride] U8.
#include <algorithm>
#include <limits>
#include <string>

#include "engine/common/error.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

// Rows [first, first + rows) of a 2-D tensor, as a tensor over the same storage.
DeviceTensor layer_rows(const DeviceTensor& all, int64_t first, int64_t rows) {
  DeviceTensor view = all;
  view.data = all.as<float>() + first * all.dim(1);
  view.shape = {rows, all.dim(1)};
  return view;
}

class SnapkvPolicy final : public BudgetedPolicy {
 public:
  SnapkvPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs, int64_t obs_window,
               Backend::Pool pool, int64_t kernel, bool protect_window)
      : BudgetedPolicy(shape, backend, knobs),
        obs_window_(obs_window),
        pool_(pool),
        kernel_(kernel),
        protect_window_(protect_window) {
    // Every layer's ring and prefix in one tensor each: the large ones then sit in huge pages on
    // the CPU (a lockstep step touches hundreds of their rows).
    rings_ = backend.alloc(DType::F32, {shape.layers * obs_window * shape.heads, shape.stride});
    prefixes_ = backend.alloc(DType::F32, {shape.layers * shape.heads, shape.stride});
    for (int64_t l = 0; l < shape.layers; ++l) {
      kept_.push_back(backend.alloc(DType::U8, {selection_rows(), shape.stride}));
      backend.fill_columns(kept_.back(), 0, shape.stride, 1);
    }
  }

  // observe() ignores the dense layers (nothing is ever selected there).
  bool wants_probs(const LayerStep& step) const override { return !dense_layer(step); }

  // Chooses without this step's logits (see Policy::reads_logits).
  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    rings_ = widen_columns(backend_, rings_, stride);
    prefixes_ = widen_columns(backend_, prefixes_, stride);
    for (DeviceTensor& kept : kept_) kept = widen_columns(backend_, kept, stride, 1);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + tensor_bytes({rings_, prefixes_}) + tensor_bytes(kept_);
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    const int64_t cols = step.cols(), slot = step.step % obs_window_;
    // The window: S_slot of the previous chunk + the prefix of this one (empty at slot 0).
    DeviceTensor window = slot_rows(l, slot);
    if (slot > 0) backend_.axpby_rows(window, 1.0f, prefix_rows(l), 1.0f, cols);
    backend_.pool_rows(window, cols, pool_, kernel_, scores);
    // The observation window t-w..t-1 plus the current token.
    const int64_t recent = protect_window_ ? obs_window_ + 1 : 1;
    select_budgeted(step, recent, at_selection_rows(scores, cols), &kept_[l], visible);
    evict_unselected(kept_[l], visible, cols);
    return LayerDecision::Masked;
  }

  void observe(const LayerStep& step, const DeviceTensor& probs) override {
    if (dense_layer(step)) return;
    const size_t l = size_t(step.layer);
    const int64_t cols = step.cols(), slot = step.step % obs_window_;
    DeviceTensor row = slot_rows(l, slot), prefix = prefix_rows(l);
    backend_.axpby_rows(row, 1.0f, probs, 0.0f, cols);
    backend_.axpby_rows(prefix, 1.0f, probs, slot == 0 ? 0.0f : 1.0f, cols);
    if (slot + 1 < obs_window_) return;
    // The chunk is complete: its rows become the suffix sums the next chunk's windows start
    // from. Columns up to cols cover everything any of its rows holds.
    for (int64_t i = obs_window_ - 2; i >= 0; --i) {
      DeviceTensor suffix = slot_rows(l, i);
      backend_.axpby_rows(suffix, 1.0f, slot_rows(l, i + 1), 1.0f, cols);
    }
  }

 private:
  // Layer l's slot i of its ring: [H, stride].
  DeviceTensor slot_rows(size_t layer, int64_t slot) const {
    return layer_rows(rings_, (int64_t(layer) * obs_window_ + slot) * shape_.heads, shape_.heads);
  }
  // Layer l's prefix of the current chunk: [H, stride].
  DeviceTensor prefix_rows(size_t layer) const {
    return layer_rows(prefixes_, int64_t(layer) * shape_.heads, shape_.heads);
  }

  int64_t obs_window_;
  Backend::Pool pool_;
  int64_t kernel_;
  bool protect_window_;
  // Every layer's, one after another (slot_rows(), prefix_rows()).
  DeviceTensor rings_, prefixes_;
  std::vector<DeviceTensor> kept_;
};

}  // namespace

PolicyInfo snapkv_policy_info() {
  const double inf = std::numeric_limits<double>::infinity();
  PolicyInfo info{
      "snapkv", "eviction (SnapKV, decode form)",
      "Drops the tokens with the least attention over the last obs_window steps (pooled "
      "along the keys); the observation window is protected; evicted tokens never return.",
      with_common_specs(
          {{"obs_window",
            ParamType::Int,
            "Observation window w: scores sum the attention of the previous w steps (32; 16 "
            "is the other usual choice)",
            "32",
            1,
            inf,
            {}},
           {"pool",
            ParamType::Choice,
            "Pooling of the scores along the key axis: max (SnapKV, kernel 7) or avg "
            "(kernel 5 by convention; divides by the kernel)",
            "max",
            0,
            0,
            {"max", "avg"}},
           {"pool_kernel",
            ParamType::Int,
            "Pooling kernel size (odd; stride 1, same padding; 1 = no pooling)",
            "7",
            1,
            inf,
            {}},
           {"protect_window",
            ParamType::Bool,
            "Never drop the observation window's own tokens (SnapKV); off: the TokenButler "
            "code's variant",
            "true",
            -inf,
            inf,
            {}}})};
  info.per_head_rule = true;
  return info;
}

std::unique_ptr<Policy> make_snapkv_policy(const PolicyShape& shape, Backend& backend,
                                           const ParamValues& params, double sparsity) {
  const int64_t kernel = params.get_int("pool_kernel");
  if (kernel % 2 == 0)
    throw Error("policy snapkv", "pool_kernel", "an odd kernel size", std::to_string(kernel));
  return std::make_unique<SnapkvPolicy>(
      shape, backend, read_common_knobs(params, sparsity), params.get_int("obs_window"),
      params.get_choice("pool") == "avg" ? Backend::Pool::Average : Backend::Pool::Max, kernel,
      params.get_bool("protect_window"));
}

}  // namespace kvlens
