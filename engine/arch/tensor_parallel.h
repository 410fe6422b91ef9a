// Tensor parallelism (issue 44), Megatron-LM's split of a model over R ranks: rank r holds
// query heads [r * H/R, (r+1) * H/R) with their KV heads (a KV head replicated on R/G ranks where
// R > G), the same rows of wq, wk, wv (and their biases), those columns of wo, MLP rows
// [r * F/R, (r+1) * F/R) of w_gate and w_up and those columns of w_down; norms, embeddings and
// lm_head whole on every rank. o_proj and down_proj then sum over the ranks
// (arch::row_parallel_matmul). A shard is a Model whose config has H/R heads, max(1, G/R) KV
// heads and F/R intermediate columns, so a DecoderSession runs it unchanged.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/model/model.h"

namespace kvlens {

// Throws kvlens::Error naming the model folder and the config field a split into `ranks` cannot
// divide (num_attention_heads, num_key_value_heads, intermediate_size), or a rank count below 1.
void check_tensor_parallel(const Model& model, int64_t ranks);

// The query heads [first, first + count) of the whole model that rank `rank` of `ranks` holds,
// and its KV heads likewise (its one KV head where KV heads are replicated).
struct ShardHeads {
  int64_t first_head = 0, heads = 0;
  int64_t first_kv_head = 0, kv_heads = 0;
};
ShardHeads shard_heads(const ModelConfig& config, int64_t rank, int64_t ranks);

// Rank `rank`'s shard of `model` (check_tensor_parallel first). Row slices are views into the
// model's mapped files; column slices (wo, w_down) are host copies that the shard keeps alive.
// The shard keeps the model's TokenButler predictor, which scores every head of the model
// (the tokenbutler policy keeps its shard's rows), and records its heads' place in the whole
// model (Model::shard), where policies find their rows of the model's per-head files.
std::shared_ptr<const Model> shard_model(std::shared_ptr<const Model> model, int64_t rank,
                                         int64_t ranks);

}  // namespace kvlens
