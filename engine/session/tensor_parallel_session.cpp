// TensorParallelSession: a host thread per rank (each issues its rank's ops, so the ranks' host
// work overlaps and a rank blocked in an all-reduce does not hold up another's launches), and the
// checks that keep every rank on the same sequence of collectives.
#include "engine/session/tensor_parallel_session.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "engine/arch/tensor_parallel.h"
#include "engine/common/error.h"
#include "engine/policy/registry.h"

namespace kvlens {

class TensorParallelSession::RankThreads {
 public:
  explicit RankThreads(int64_t ranks) {
    for (int64_t r = 0; r < ranks; ++r) threads_.emplace_back([this, r] { loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

  // work(r) on thread r for every r. on_error(r) runs on a rank's thread as soon as its work
  // throws (to release the others from a collective); the first error in time is rethrown.
  void run(const std::function<void(int64_t)>& work, const std::function<void(int64_t)>& on_error) {
    std::unique_lock lock(mutex_);
    work_ = &work;
    on_error_ = &on_error;
    first_error_ = nullptr;
    done_ = 0;
    ++generation_;
    start_.notify_all();
    finished_.wait(lock, [&] { return done_ == int64_t(threads_.size()); });
    if (first_error_) std::rethrow_exception(first_error_);
  }

 private:
  void loop(int64_t rank) {
    int64_t seen = 0;
    for (;;) {
      const std::function<void(int64_t)>* work = nullptr;
      const std::function<void(int64_t)>* on_error = nullptr;
      {
        std::unique_lock lock(mutex_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        work = work_;
        on_error = on_error_;
      }
      std::exception_ptr error;
      try {
        (*work)(rank);
      } catch (...) {
        error = std::current_exception();
        try {
          (*on_error)(rank);
        } catch (...) {
        }
      }
      std::lock_guard lock(mutex_);
      if (error && !first_error_) first_error_ = error;
      if (++done_ == int64_t(threads_.size())) finished_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable start_, finished_;
  std::vector<std::thread> threads_;
  const std::function<void(int64_t)>* work_ = nullptr;
  const std::function<void(int64_t)>* on_error_ = nullptr;
  std::exception_ptr first_error_;
  int64_t generation_ = 0;
  int64_t done_ = 0;
  bool stop_ = false;
};

std::vector<std::shared_ptr<const BackendModel>> upload_tensor_parallel(
    std::shared_ptr<const Model> model, std::span<Backend* const> backends,
    const UploadOptions& options) {
  const int64_t ranks = int64_t(backends.size());
  check_tensor_parallel(*model, ranks);
  for (int64_t r = 0; r < ranks; ++r) {
    const Backend& b = *backends[size_t(r)];
    if (b.tensor_parallel_ranks() != ranks || b.tensor_parallel_rank() != r) {
      throw Error("tensor parallel", "backend " + std::to_string(r),
                  "rank " + std::to_string(r) + " of a group of " + std::to_string(ranks),
                  "rank " + std::to_string(b.tensor_parallel_rank()) + " of " +
                      std::to_string(b.tensor_parallel_ranks()));
    }
  }
  std::vector<std::shared_ptr<const BackendModel>> shards(static_cast<size_t>(ranks));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        shards[size_t(r)] =
            upload_model(shard_model(model, r, ranks), *backends[size_t(r)], options);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return shards;
}

void check_tensor_parallel_policy(const PolicyConfig& policy, const ModelConfig& config,
                                  int64_t ranks, int64_t runs) {
  if (is_reference_policy(policy.id) || ranks == 1) return;
  const PolicyInfo& info = policy_info(policy.id);
  if (!info.per_head_rule && !info.reduces_heads) {
    std::string allowed;
    for (const PolicyInfo& i : policy_infos()) {
      if (!i.per_head_rule && !i.reduces_heads && !i.reference) continue;
      if (!allowed.empty()) allowed += ", ";
      allowed += i.id;
    }
    // Every built-in has one of the flags; a plug-in's rule is its own code, which may read any
    // head's rows: a shard, seeing only its heads, could not choose what one GPU would.
    const std::string source = policy_source(policy.id);
    throw Error("policy " + policy.id, "tensor parallel",
                "a policy whose rule stays within each head or sums over heads (" + allowed +
                    ") on more than one GPU",
                policy.id + (source.empty() ? ", whose rule reads other heads' state"
                                            : ", a plug-in (" + source +
                                                  ") whose rule may read every head's rows"));
  }
  if (info.reduces_heads && runs > 1) {
    throw Error("policy " + policy.id, "tensor parallel",
                "one run in the session (its sums over the GPUs' heads are collectives)",
                std::to_string(runs) + " runs");
  }
  const bool splits_groups = config.num_kv_heads < ranks;
  if (splits_groups && info.reads_kv_groups) {
    throw Error("policy " + policy.id, "tensor parallel",
                "at most " + std::to_string(config.num_kv_heads) +
                    " GPUs (its rule reads each KV group's query heads together)",
                std::to_string(ranks) + " GPUs sharing " + std::to_string(config.num_kv_heads) +
                    " KV heads");
  }
  for (const std::string& arg : policy.args) {
    if (splits_groups && arg == "granularity=kv_head") {
      throw Error("policy " + policy.id, "granularity",
                  "query_head when " + std::to_string(ranks) + " GPUs share " +
                      std::to_string(config.num_kv_heads) +
                      " KV heads (a GPU holds part of a group)",
                  "kv_head");
    }
  }
}

TensorParallelSession::TensorParallelSession(
    std::shared_ptr<const Model> model, std::vector<std::shared_ptr<const BackendModel>> shards,
    SessionOptions options, int64_t runs)
    : model_(std::move(model)), shards_(std::move(shards)) {
  if (shards_.empty()) throw Error("tensor parallel", "shards", "at least one");
  threads_ = std::make_unique<RankThreads>(int64_t(shards_.size()));
  sessions_.resize(shards_.size());
  on_every_rank([&](int64_t r) {
    sessions_[size_t(r)] = std::make_unique<DecoderSession>(shards_[size_t(r)], options, runs);
  });
}

TensorParallelSession::~TensorParallelSession() {
  // The sessions go on their own threads' watch: nothing of theirs is in flight after a forward.
  sessions_.clear();
  threads_.reset();
}

void TensorParallelSession::on_every_rank(const std::function<void(int64_t rank)>& work) {
  if (failed_) {
    throw Error("tensor parallel", "session", "no earlier failure",
                "a rank failed in an earlier call (start a new session)");
  }
  try {
    threads_->run(work, [&](int64_t r) { shards_[size_t(r)]->backend->abort_collectives(); });
  } catch (...) {
    failed_ = true;
    throw;
  }
}

void TensorParallelSession::set_policy(int64_t run, const PolicyConfig& policy,
                                       int64_t first_step) {
  // The whole model's config: a shard's KV heads do not say whether its group is split.
  check_tensor_parallel_policy(policy, model_->config, ranks(), runs());
  // Made on the calling thread (a bad parameter fails before any rank holds a policy), then set.
  std::vector<std::unique_ptr<Policy>> policies;
  for (int64_t r = 0; r < ranks(); ++r) {
    DecoderSession& s = *sessions_[size_t(r)];
    policies.push_back(make_run_policy(policy, s.policy_shape(), *shards_[size_t(r)]->backend));
  }
  if (!policies.front()) return;
  for (int64_t r = 0; r < ranks(); ++r)
    sessions_[size_t(r)]->set_policy(run, std::move(policies[size_t(r)]), first_step);
}

const DeviceTensor& TensorParallelSession::forward(std::span<const int32_t> tokens) {
  // Bad input fails here, before any rank has started (and no collective is left waiting).
  sessions_.front()->check_tokens(tokens, int64_t(tokens.size()));
  const DeviceTensor* logits = nullptr;
  on_every_rank([&](int64_t r) {
    const DeviceTensor& rank_logits = sessions_[size_t(r)]->forward(tokens);
    if (r == 0) logits = &rank_logits;
  });
  return *logits;
}

const DeviceTensor& TensorParallelSession::forward_runs(std::span<const int32_t> tokens) {
  if (int64_t(tokens.size()) != runs()) {
    throw Error("session", "tokens", "one token per run (" + std::to_string(runs()) + ")",
                std::to_string(tokens.size()));
  }
  sessions_.front()->check_tokens(tokens, 1);
  const DeviceTensor* logits = nullptr;
  on_every_rank([&](int64_t r) {
    const DeviceTensor& rank_logits = sessions_[size_t(r)]->forward_runs(tokens);
    if (r == 0) logits = &rank_logits;
  });
  return *logits;
}

void TensorParallelSession::reset() {
  on_every_rank([&](int64_t r) { sessions_[size_t(r)]->reset(); });
}

std::vector<int32_t> generate_greedy_tensor_parallel(
    std::shared_ptr<const Model> model,
    const std::vector<std::shared_ptr<const BackendModel>>& shards, std::span<const int32_t> prompt,
    const GenerateOptions& options) {
  if (prompt.empty()) throw Error("input", "prompt", "at least one token");
  TensorParallelSession session(std::move(model), shards);
  session.set_policy(0, options.policy);
  Backend& lead = session.lead_backend();
  return greedy_continuation(
      shards.front()->config(), prompt, options,
      [&](int32_t token) {
        const DeviceTensor& logits = session.forward(std::span<const int32_t>(&token, 1));
        int32_t next = 0;
        lead.argmax_rows(logits, std::span<int32_t>(&next, 1));
        if (options.progress)
          options.progress(session.position(), int64_t(prompt.size()) + options.max_new);
        return next;
      },
      [&] { return session.position(); });
}

SparsityStats TensorParallelSession::sparsity(int64_t run) const {
  const ModelConfig& c = model_->config;
  SparsityStats joined;
  // A run that counted nothing (the reference) keeps the empty stats one backend's has.
  if (sessions_.front()->run(run).sparsity.hidden_sum.empty()) return joined;
  joined.reset(c.num_layers, c.num_heads);
  for (int64_t r = 0; r < ranks(); ++r) {
    const SparsityStats& part = sessions_[size_t(r)]->run(run).sparsity;
    const int64_t first = shard_heads(c, r, ranks()).first_head;
    if (r == 0) joined.steps = part.steps;
    for (int64_t l = 0; l < part.layers; ++l) {
      for (int64_t h = 0; h < part.heads; ++h) {
        joined.hidden_sum[size_t(l * c.num_heads + first + h)] =
            part.hidden_sum[size_t(l * part.heads + h)];
      }
    }
  }
  return joined;
}

std::shared_ptr<const BackendModel> lead_tensor_parallel(
    std::shared_ptr<const Model> model, std::vector<std::shared_ptr<const BackendModel>> shards) {
  if (shards.empty()) throw Error("tensor parallel", "shards", "at least one");
  // A copy of rank 0's (its tensors share storage): the lead cannot be one of the shards it
  // holds (a shared_ptr cycle).
  auto lead = std::make_shared<BackendModel>(*shards.front());
  auto group = std::make_shared<TensorParallelShards>();
  group->model = std::move(model);
  group->shards = std::move(shards);
  lead->tensor_parallel = std::move(group);
  return lead;
}

}  // namespace kvlens
