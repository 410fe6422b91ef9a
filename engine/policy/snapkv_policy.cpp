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
// The window sum is re-summed from the stored rows rather than kept as a running sum: per layer
// a ring holds the last w steps' probability rows (step s in slot s mod w; observe copies the
// row in with axpby_rows through a strided view). A running sum (add the new
// row, subtract the leaving one) would carry F32 residues ((a + b) - a != b) that differ between
// tokens, so two tokens with the same attention over the window would no longer tie and the tie
// rule (to the recent) would not hold. To keep the re-sum short, the slots form blocks of
// kBlockSlots: each block's sum (its slots added in slot order) is recomputed by observe when one
// of its slots changes, and select adds the block sums in block order. The window sum is thus a
// fixed function of the w slot rows (the same grouping for every token and step), so equal
// attention over the window still ties exactly. The ring is laid out block by block, each
// block's rows [H][its slots] and the block sums [H][blocks], so that each re-sum is one
// sum_row_groups pass (the rows added in order: the bits of adding them one by one).
// Slot columns a step never wrote are 0, so nothing needs clearing.
// At kv_head granularity the pooled per-head scores are summed over the group (pool, then sum).
// In the prefill + decode mode the prefill steps are dense and not observed: the window starts
// empty at the first policy step, so the first w decode steps rank by fewer rows (all scores 0 at
// the first one: ties to the recent, i.e. the oldest non-forced tokens go first).
// State per layer: ring [H * w, stride], block sums [H * blocks, stride] (rows of one tensor
// over all layers each), kept [R, stride] U8; one window-sum scratch [H, stride].
#include <algorithm>
#include <limits>
#include <string>

#include "engine/common/error.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/policy_factories.h"

namespace kvlens {
namespace {

// Row `row` of a [rows, stride] tensor and every `every`-th after it, `count` rows, as a
// [count, every * stride] tensor (a strided view: the ops touch only the first cols <= stride
// columns of each row, all inside the tensor).
DeviceTensor every_nth_row(const DeviceTensor& all, int64_t row, int64_t every, int64_t count) {
  DeviceTensor view = all;
  const int64_t stride = all.dim(1);
  view.data = all.as<float>() + row * stride;
  view.shape = {count, every * stride};
  return view;
}

// Rows [first, first + rows) of a 2-D tensor, as a tensor over the same storage.
DeviceTensor layer_rows(const DeviceTensor& all, int64_t first, int64_t rows) {
  DeviceTensor view = all;
  view.data = all.as<float>() + first * all.dim(1);
  view.shape = {rows, all.dim(1)};
  return view;
}

// Slots per block of the window sum: 8 balances the block's re-sum against the sum of blocks
// at the usual w = 16 or 32.
constexpr int64_t kBlockSlots = 8;

class SnapkvPolicy final : public BudgetedPolicy {
 public:
  SnapkvPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs, int64_t obs_window,
               Backend::Pool pool, int64_t kernel, bool protect_window)
      : BudgetedPolicy(shape, backend, knobs),
        obs_window_(obs_window),
        pool_(pool),
        kernel_(kernel),
        protect_window_(protect_window),
        blocks_((obs_window + kBlockSlots - 1) / kBlockSlots),
        window_sum_(backend.alloc(DType::F32, {shape.heads, shape.stride})) {
    // Every layer's ring and block sums in one tensor each: the large ones then sit in huge
    // pages on the CPU (a lockstep step touches hundreds of their rows).
    rings_ = backend.alloc(DType::F32, {shape.layers * obs_window * shape.heads, shape.stride});
    block_sums_ = backend.alloc(DType::F32, {shape.layers * shape.heads * blocks_, shape.stride});
    for (int64_t l = 0; l < shape.layers; ++l) {
      kept_.push_back(backend.alloc(DType::U8, {selection_rows(), shape.stride}));
      backend.fill_columns(kept_.back(), 0, shape.stride, 1);
    }
  }

  bool wants_probs() const override { return true; }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    const int64_t cols = step.cols();
    backend_.sum_row_groups(block_sums(l), cols, blocks_, window_sum_);
    backend_.pool_rows(window_sum_, cols, pool_, kernel_, scores);
    // The observation window t-w..t-1 plus the current token.
    const int64_t recent = protect_window_ ? obs_window_ + 1 : 1;
    select_budgeted(step, recent, at_selection_rows(scores, cols), &kept_[l], visible);
    evict_unselected(kept_[l], visible, cols);
    return LayerDecision::Masked;
  }

  void observe(const LayerStep& step, const DeviceTensor& probs) override {
    if (dense_layer(step)) return;
    const size_t l = size_t(step.layer);
    const int64_t cols = step.cols(), written = step.step % obs_window_;
    const int64_t block = written / kBlockSlots, slots = block_slots(block);
    const DeviceTensor rows = block_rows(l, block);
    DeviceTensor slot = every_nth_row(rows, written % kBlockSlots, slots, shape_.heads);
    backend_.axpby_rows(slot, 1.0f, probs, 0.0f, cols);
    // Re-sum the block holding the slot just written, its slots in order. Columns up to cols
    // cover everything any of its slots holds (older steps had fewer columns; the rest are 0).
    DeviceTensor sum = every_nth_row(block_sums(l), block, blocks_, shape_.heads);
    backend_.sum_row_groups(rows, cols, slots, sum);
  }

 private:
  int64_t obs_window_;
  Backend::Pool pool_;
  int64_t kernel_;
  bool protect_window_;
  // The slots of block b (kBlockSlots, fewer in a last partial block).
  int64_t block_slots(int64_t block) const {
    return std::min(kBlockSlots, obs_window_ - block * kBlockSlots);
  }
  // Layer l's block b of its ring: [H * block_slots(b), stride], head h's slots in rows
  // h * block_slots(b) ...
  DeviceTensor block_rows(size_t layer, int64_t block) const {
    const int64_t first = (int64_t(layer) * obs_window_ + block * kBlockSlots) * shape_.heads;
    return layer_rows(rings_, first, shape_.heads * block_slots(block));
  }
  // Layer l's block sums [H * blocks, stride], head h's in rows h * blocks ...
  DeviceTensor block_sums(size_t layer) const {
    const int64_t rows = shape_.heads * blocks_;
    return layer_rows(block_sums_, int64_t(layer) * rows, rows);
  }

  int64_t blocks_;
  DeviceTensor window_sum_;  // [H, stride] scratch
  // Every layer's, one after another (block_rows(), block_sums()).
  DeviceTensor rings_, block_sums_;
  std::vector<DeviceTensor> kept_;
};

}  // namespace

PolicyInfo snapkv_policy_info() {
  const double inf = std::numeric_limits<double>::infinity();
  return {"snapkv", "eviction (SnapKV, decode form)",
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
