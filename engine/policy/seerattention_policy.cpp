// seerattention (SeerAttention-R, Gao et al. 2025; docs/policies/seerattention.md): a learned
// block gate for decoding. The cache is cut into blocks of block_size tokens; per KV head the
// gate scores each block from the current query through its own small projections, and whole
// blocks, best first, fill the common B(t) as quest's pages do. The gate (seer_gate.h) is trained
// by tools/train_seer_gate.py and read from beside the model when the policy is made.
//
// The rule at step t, layer l (not a dense layer), KV head g (group = H / G query heads):
// - Block summaries: kmax_b, kmin_b [D], the channel-wise max and min of the cached (post-RoPE)
//   keys of block b (quest's page_minmax_update: exact, the same bits on every backend).
// - Block key: kb = rmsnorm(Wmax_g kmax_b + Wmin_g kmin_b) [d]; gate query: qg = rmsnorm(Wq_g
//   [q_h for h in g's group, concatenated]) [d]; gate logit a_b = qg . kb / sqrt(d).
// - Scores: every column j of block b gets a_b in each query head of group g (so the heads of a
//   group choose alike, as the authors' gate, one per KV head). These are the policy's predicted
//   logits: a_b is trained so that softmax over blocks matches each block's share of the
//   attention, i.e. log(share) + c; a token then stands for its block (log(share / block_size)
//   differs from a_b by a constant, which neither the softmax nor a ranking sees).
// - Selection: the forced tokens (sinks, the current block's tokens or `window`, whichever
//   reaches further back), then whole blocks best first while they fit the rest of B(t)
//   (BudgetedPolicy::select_budgeted with page_size = block_size). Nothing is evicted.
// - How: per layer the block keys are kept per token in a [G, stride, d] buffer (a block's key
//   copied to its columns), so one attention_logits over it scores every column; each step
//   recomputes only the blocks that gained columns (the current one; every block after a dense
//   prompt). Every op is an existing backend op.
// - Tensor parallelism: the gate file holds every KV head of the whole model; a shard holding
//   whole KV groups (PolicyInfo::reads_kv_groups: the gate query reads a group's query heads
//   together) uploads its KV heads' weights (PolicyShape::first_kv_head ..) and chooses as one
//   GPU would.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/tensor_views.h"
#include "engine/common/error.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/model_files.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/quest_ops.h"
#include "engine/policy/seer_gate.h"

namespace kvlens {
namespace {

struct GateWeights {  // one KV head's, on the backend
  DeviceTensor q_proj, k_max_proj, k_min_proj, q_norm, k_norm;
};

DeviceTensor upload(Backend& backend, const std::shared_ptr<const SeerGate>& gate,
                    const std::string& name, const float* values, std::vector<int64_t> shape) {
  TensorView view;
  view.name = name;
  view.dtype = DType::F32;
  view.shape = std::move(shape);
  view.data = reinterpret_cast<const std::byte*>(values);
  view.bytes = size_t(view.numel()) * sizeof(float);
  view.file = gate->config.source;
  return backend.upload_weight(view, std::const_pointer_cast<SeerGate>(gate));
}

class SeerAttentionPolicy final : public BudgetedPolicy {
 public:
  SeerAttentionPolicy(const PolicyShape& shape, Backend& backend, CommonKnobs knobs,
                      std::shared_ptr<const SeerGate> gate)
      : BudgetedPolicy(shape, backend, knobs),
        ops_(quest_ops(backend)),
        gate_(std::move(gate)),
        block_(gate_->config.block_size),
        dim_(gate_->config.gate_dim),
        filled_(size_t(shape.layers), 0) {
    const int64_t G = shape.kv_heads, D = shape.head_dim, group = shape.heads / shape.kv_heads;
    // The file's groups are the whole model's: a shard must hold whole ones.
    if (group != shape.whole_heads() / shape.whole_kv_heads())
      throw Error("policy seerattention", "tensor parallel",
                  "whole KV groups on each GPU (the gate reads a group's " +
                      std::to_string(shape.whole_heads() / shape.whole_kv_heads()) +
                      " query heads together)",
                  std::to_string(group) + " query heads of a group");
    weights_.resize(size_t(shape.layers));
    for (int64_t l = 0; l < shape.layers; ++l) {
      const bool ranked = l >= knobs_.dense_layers;  // dense layers keep nothing
      page_min_.push_back(ranked ? backend.alloc(DType::F32, {G, pages(shape.stride), D})
                                 : DeviceTensor{});
      page_max_.push_back(ranked ? backend.alloc(DType::F32, {G, pages(shape.stride), D})
                                 : DeviceTensor{});
      block_keys_.push_back(ranked ? backend.alloc(DType::F32, {G, shape.stride, dim_})
                                   : DeviceTensor{});
      if (!ranked) continue;
      const SeerGateLayer& w = gate_->layers[size_t(l)];
      const std::string at = "layers." + std::to_string(l) + ".";
      for (int64_t g = 0; g < G; ++g) {
        const int64_t file_g = shape.first_kv_head + g;  // the whole model's KV head
        GateWeights head;
        head.q_proj = upload(backend, gate_, at + "q_proj.weight",
                             w.q_proj.data() + file_g * dim_ * group * D, {dim_, group * D});
        head.k_max_proj = upload(backend, gate_, at + "k_max_proj.weight",
                                 w.k_max_proj.data() + file_g * dim_ * D, {dim_, D});
        head.k_min_proj = upload(backend, gate_, at + "k_min_proj.weight",
                                 w.k_min_proj.data() + file_g * dim_ * D, {dim_, D});
        head.q_norm =
            upload(backend, gate_, at + "q_norm.weight", w.q_norm.data() + file_g * dim_, {dim_});
        head.k_norm =
            upload(backend, gate_, at + "k_norm.weight", w.k_norm.data() + file_g * dim_, {dim_});
        weights_[size_t(l)].push_back(std::move(head));
      }
    }
    alloc_block_scratch(shape.stride);
    gate_q_ = backend.alloc(DType::F32, {G, dim_});
    gate_q_normed_ = backend.alloc(DType::F32, {G, dim_});
    gate_q_heads_ = backend.alloc(DType::F32, {1, shape.heads, dim_});
  }

  bool reads_logits(const LayerStep& /*step*/) const override { return false; }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    for (std::vector<DeviceTensor>* summaries : {&page_min_, &page_max_})
      for (DeviceTensor& summary : *summaries)
        summary = widen_middle(backend_, summary, pages(stride));
    for (DeviceTensor& keys : block_keys_) keys = widen_middle(backend_, keys, stride);
    alloc_block_scratch(stride);
  }
  int64_t state_bytes() const override {
    return BudgetedPolicy::state_bytes() + tensor_bytes(page_min_) + tensor_bytes(page_max_) +
           tensor_bytes(block_keys_) +
           tensor_bytes({block_key_, block_key_scratch_, block_key_normed_, gate_q_, gate_q_normed_,
                         gate_q_heads_});
  }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    if (dense_layer(step)) return LayerDecision::Dense;
    const size_t l = size_t(step.layer);
    const int64_t t = step.step, cols = step.cols();
    // As quest: the blocks that gained columns since this layer's last step (columns_to_refresh).
    const int64_t begin = columns_to_refresh(filled_[l], t, cols);
    ops_.page_minmax_update(*step.k_cache, begin, cols, block_, page_min_[l], page_max_[l]);
    update_block_keys(l, begin / block_, cols);
    gate_query(l, *step.q);
    backend_.attention_logits(gate_q_heads_, block_keys_[l], t, 0, scores);

    // On a sliding-window layer the budget is the window's, and Dense is the whole window.
    const int64_t budget = knobs_.budget(step);
    if (budget >= step.candidates()) return LayerDecision::Dense;
    const int64_t current_block = t % block_ + 1;  // tokens of the block holding t
    select_budgeted(step, current_block, at_selection_rows(scores, cols), nullptr, visible, budget,
                    block_);
    return LayerDecision::Masked;
  }

 private:
  int64_t pages(int64_t stride) const { return (stride + block_ - 1) / block_; }

  void alloc_block_scratch(int64_t stride) {
    for (DeviceTensor* scratch : {&block_key_, &block_key_scratch_, &block_key_normed_}) {
      *scratch = backend_.alloc(DType::F32, {pages(stride), dim_});
    }
  }

  // Blocks [first_block, ceil(cols / block)) of every KV head: their gate keys, copied to each
  // of their columns < cols (a doubling copy: log2(block) copies per block).
  void update_block_keys(size_t l, int64_t first_block, int64_t cols) {
    const int64_t G = shape_.kv_heads, D = shape_.head_dim, P = page_min_[l].dim(1);
    const int64_t stride = block_keys_[l].dim(1);
    const int64_t n = (cols + block_ - 1) / block_ - first_block;
    const DeviceTensor all_max = tensor::view(page_max_[l], {G * P, D});
    const DeviceTensor all_min = tensor::view(page_min_[l], {G * P, D});
    DeviceTensor key = tensor::row_range(block_key_, 0, n);
    DeviceTensor scratch = tensor::row_range(block_key_scratch_, 0, n);
    DeviceTensor normed = tensor::row_range(block_key_normed_, 0, n);
    for (int64_t g = 0; g < G; ++g) {
      const GateWeights& w = weights_[l][size_t(g)];
      backend_.matmul(tensor::row_range(all_max, g * P + first_block, n), w.k_max_proj, key);
      backend_.matmul_add(tensor::row_range(all_min, g * P + first_block, n), w.k_min_proj, scratch,
                          key);
      backend_.rmsnorm(key, w.k_norm, gate_->config.norm_eps, normed);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t first = (first_block + i) * block_;
        const int64_t count = std::min(block_, cols - first);
        const int64_t row = g * stride + first;
        backend_.copy_rows(normed, i, block_keys_[l], row, 1, dim_);
        for (int64_t done = 1; done < count;) {
          const int64_t copy = std::min(done, count - done);
          backend_.copy_rows(block_keys_[l], row, block_keys_[l], row + done, copy, dim_);
          done += copy;
        }
      }
    }
  }

  // gate_q_heads_[0, h, :] = the gate query of h's KV head.
  void gate_query(size_t l, const DeviceTensor& q) {
    const int64_t G = shape_.kv_heads, group = shape_.heads / G;
    const DeviceTensor grouped = tensor::view(q, {G, group * shape_.head_dim});
    DeviceTensor heads = tensor::view(gate_q_heads_, {shape_.heads, dim_});
    for (int64_t g = 0; g < G; ++g) {
      const GateWeights& w = weights_[l][size_t(g)];
      DeviceTensor raw = tensor::row_view(gate_q_, g);
      DeviceTensor normed = tensor::row_view(gate_q_normed_, g);
      backend_.matmul(tensor::row_view(grouped, g), w.q_proj, raw);
      backend_.rmsnorm(raw, w.q_norm, gate_->config.norm_eps, normed);
      for (int64_t h = 0; h < group; ++h) {
        backend_.copy_rows(gate_q_normed_, g, heads, g * group + h, 1, dim_);
      }
    }
  }

  QuestOps& ops_;  // page summaries (the block min/max), shared with quest
  std::shared_ptr<const SeerGate> gate_;
  int64_t block_, dim_;
  std::vector<int64_t> filled_;                    // per layer: the columns the summaries cover
  std::vector<std::vector<GateWeights>> weights_;  // per layer, per KV head (empty: dense)
  std::vector<DeviceTensor> page_min_, page_max_;  // per layer [G, P, D]
  std::vector<DeviceTensor> block_keys_;           // per layer [G, stride, d]: kb per column
  DeviceTensor block_key_, block_key_scratch_, block_key_normed_;  // [P, d] scratch
  DeviceTensor gate_q_, gate_q_normed_;                            // [G, d]
  DeviceTensor gate_q_heads_;                                      // [1, H, d]
};

}  // namespace

PolicyInfo seerattention_policy_info() {
  PolicyInfo info{
      "seerattention",
      "learned block gate (SeerAttention-R)",
      "Blocks of the cache scored by a learned gate (the block's key min/max and the query "
      "through small trained projections); the best whole blocks fill the budget, the "
      "current block always visible. Needs seer_gate.safetensors beside the model.",
      with_common_specs({}),
      /*reference=*/false,
      /*needs_predictor=*/false,
      /*predicts_logits=*/true};
  // Each KV group's blocks by its own gate, from its query heads together.
  info.per_head_rule = true;
  info.reads_kv_groups = true;
  return info;
}

std::unique_ptr<Policy> make_seerattention_policy(const PolicyShape& shape, Backend& backend,
                                                  const ParamValues& params, double sparsity) {
  // The gate beside the model or the one shipped for a known GGUF model (model_files.h); when
  // neither exists, load_seer_gate's error names the file beside the model and the tool.
  const ModelFileSearch search = find_model_file(shape, "seer_gate.safetensors");
  const std::string folder = search.found.empty()
                                 ? shape.model_dir
                                 : std::filesystem::path(search.found).parent_path().string();
  // The whole model's shape (the file's), also on a tensor-parallel shard.
  std::shared_ptr<const SeerGate> gate = load_seer_gate(folder, shape.layers, shape.whole_heads(),
                                                        shape.whole_kv_heads(), shape.head_dim);
  return std::make_unique<SeerAttentionPolicy>(shape, backend, read_common_knobs(params, sparsity),
                                               std::move(gate));
}

}  // namespace kvlens
