// A decode over a model split across a tensor-parallel group of backends (issue 44; the split:
// engine/arch/tensor_parallel.h): one DecoderSession per rank over its shard, each stepped by a
// host thread of its own, the ranks meeting in the all-reduces after o_proj and down_proj. Every
// rank computes the whole residual stream and the logits [rows, vocab], the same bits on each
// (the all-reduce gives every rank the same sum); rank 0's are returned. Per rank and layer the
// KV cache is [G / R (at least 1), capacity, D]: each GPU holds only its heads' keys and values.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/session/decoder_session.h"
#include "engine/session/scoring.h"

namespace kvlens {

// The shards of `model` on `backends`: rank r's on backends[r], a backend whose
// tensor_parallel_rank() is r in a group of backends.size() (uploaded by every rank at once).
// Throws kvlens::Error naming the config field a split cannot divide, or a backend out of place.
std::vector<std::shared_ptr<const BackendModel>> upload_tensor_parallel(
    std::shared_ptr<const Model> model, std::span<Backend* const> backends,
    const UploadOptions& options = {});

// Throws kvlens::Error naming the policy when a shard cannot run it as one GPU would: its rule
// may read other heads' state (neither PolicyInfo::per_head_rule nor reduces_heads: a plug-in,
// whose rule is its own code), it gathers heads through collectives (reduces_heads: tova,
// lazyllm, tokenfilter, Ada-KV's budgets) in a session of several runs, or it selects per KV
// group (granularity=kv_head, sparq, rocketkv, seerattention) while the ranks split KV groups
// (more ranks than KV heads). The reference policy always can.
void check_tensor_parallel_policy(const PolicyConfig& policy, const ModelConfig& config,
                                  int64_t ranks, int64_t runs = 1);

class TensorParallelSession {
 public:
  // shards: upload_tensor_parallel's of `model`, rank order. Each rank's session gets `options`
  // and `runs`.
  TensorParallelSession(std::shared_ptr<const Model> model,
                        std::vector<std::shared_ptr<const BackendModel>> shards,
                        SessionOptions options = {}, int64_t runs = 1);
  ~TensorParallelSession();
  TensorParallelSession(const TensorParallelSession&) = delete;
  TensorParallelSession& operator=(const TensorParallelSession&) = delete;

  int64_t ranks() const { return int64_t(sessions_.size()); }
  int64_t runs() const { return sessions_.front()->runs(); }
  int64_t position() const { return sessions_.front()->position(); }
  // `policy` in run `run` on every rank (each over its heads), from `first_step` on
  // (DecoderSession::set_policy). check_tensor_parallel_policy first.
  void set_policy(int64_t run, const PolicyConfig& policy, int64_t first_step = 0);
  // DecoderSession::forward / forward_runs on every rank; rank 0's logits (its backend's memory,
  // valid until the next forward). A rank that fails stops the others (abort_collectives) and
  // its error is rethrown; the session is then unusable.
  const DeviceTensor& forward(std::span<const int32_t> tokens);
  const DeviceTensor& forward_runs(std::span<const int32_t> tokens);
  void reset();
  // Rank 0's backend, where the returned logits live.
  Backend& lead_backend() const { return *shards_.front()->backend; }
  // Rank r's session: its runs' per-head state covers the heads shard_heads(config, r, R) says.
  const DecoderSession& rank_session(int64_t rank) const { return *sessions_.at(size_t(rank)); }
  // Run `run`'s effective sparsity over every head of the model: each rank's (layer, head) cells
  // at its heads' place, the cells one backend would have counted.
  SparsityStats sparsity(int64_t run) const;

 private:
  class RankThreads;
  // work(r) on rank r's thread for every rank at once; returns when all are done.
  void on_every_rank(const std::function<void(int64_t rank)>& work);

  std::shared_ptr<const Model> model_;  // the whole model (its config: what the split divides)
  std::vector<std::shared_ptr<const BackendModel>> shards_;
  std::unique_ptr<RankThreads> threads_;
  std::vector<std::unique_ptr<DecoderSession>> sessions_;
  bool failed_ = false;
};

// generate_greedy (scoring.h) over a tensor-parallel group: the same tokens as one backend's
// within its arithmetic (the sums of o_proj and down_proj are taken in another order).
std::vector<int32_t> generate_greedy_tensor_parallel(
    std::shared_ptr<const Model> model,
    const std::vector<std::shared_ptr<const BackendModel>>& shards, std::span<const int32_t> prompt,
    const GenerateOptions& options);

// `shards` (upload_tensor_parallel's of `model`) led by one BackendModel: rank 0's shard with
// BackendModel::tensor_parallel set, so that score_tokens_lockstep and the evals on it step every
// rank (TensorParallelSession) and read the logits on rank 0's backend. Throws kvlens::Error for
// no shards.
std::shared_ptr<const BackendModel> lead_tensor_parallel(
    std::shared_ptr<const Model> model, std::vector<std::shared_ptr<const BackendModel>> shards);

}  // namespace kvlens
