// The CUDA backend's class (kvlens::Backend on one GPU), shared by the files that define its
// members: cuda_backend.cpp (memory, copies, lanes, deferred counts, recorded steps),
// cuda_model_ops.cpp (the decoder's ops) and cuda_policy_ops.cpp (the token-selection ops).
// Shapes as in engine/backend/backend.h. Internal to kernels/ (and kernels/policy/, the policies'
// op extensions): the engine sees cuda_backend.h.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/host_reduce_group.h"
#include "engine/backend/thread_pool.h"
#include "kernels/attention.cuh"
#include "kernels/cuda_support.h"
#include "kernels/nccl_group.h"
#include "kernels/peer_all_reduce.h"
#include "kernels/step_graph.cuh"

namespace kvlens::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  // Makes this backend rank `rank` of `group` (make_cuda_backend_group), before any work; its
  // small sums go through `peers` where the GPUs reach each other (null: NCCL does them all).
  void join_group(std::shared_ptr<NcclGroup> group, std::shared_ptr<PeerReduceGroup> peers,
                  int rank) {
    nccl_ = std::move(group);
    peers_ = std::move(peers);
    rank_ = rank;
  }
  // The same through host memory (a group whose ranks share a GPU, which NCCL refuses): each
  // all-reduce waits for the stream, sums on the host, and copies back; no step is recorded.
  void join_host_group(std::shared_ptr<HostReduceGroup> group, int rank) {
    host_group_ = std::move(group);
    rank_ = rank;
  }
  int64_t tensor_parallel_ranks() const override {
    return nccl_ ? nccl_->ranks() : host_group_ ? host_group_->ranks() : 1;
  }
  int64_t tensor_parallel_rank() const override { return rank_; }
  void all_reduce_sum(DeviceTensor& partial) override;
  void abort_collectives() override {
    if (peers_) peers_->abort();
    if (nccl_) nccl_->abort();
    if (host_group_) host_group_->abort();
  }
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }

  // --- memory ---

  DeviceTensor upload_weight(const TensorView& view, std::shared_ptr<void> keep_alive) override;
  bool supports_cache_dtype(DType dtype) const override { return is_weight_dtype(dtype); }
  DeviceTensor alloc(DType dtype, std::vector<int64_t> shape) override;
  void to_host(const DeviceTensor& src, void* host, size_t bytes) override;
  std::shared_ptr<void> alloc_host(size_t bytes) override;
  void rows_to_host_async(const DeviceTensor& src, int64_t rows, int64_t cols, void* host) override;
  std::unique_ptr<Fence> fence() override;
  void from_host(DeviceTensor& dst, const void* host, size_t bytes) override;
  void copy_rows(const DeviceTensor& src, int64_t src_row, DeviceTensor& dst, int64_t dst_row,
                 int64_t rows, int64_t row_elems) override;

  // --- ops ---

  void embed(const DeviceTensor& table, std::span<const int32_t> ids, DeviceTensor& out) override;
  void matmul(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y) override;
  void matmul_many(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                   std::span<DeviceTensor* const> ys) override;
  void matmul_add(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& scratch,
                  DeviceTensor& acc) override;
  void rmsnorm_matmul_many(const DeviceTensor& x, const DeviceTensor& norm_weight, float eps,
                           DeviceTensor& normed, std::span<const DeviceTensor* const> ws,
                           std::span<DeviceTensor* const> ys) override;
  void rmsnorm_gate_up(const DeviceTensor& x, const DeviceTensor& norm_weight, float eps,
                       DeviceTensor& normed, const DeviceTensor& w_gate, const DeviceTensor& w_up,
                       DeviceTensor& gate, DeviceTensor& up, DeviceTensor& act) override;
  void rmsnorm(const DeviceTensor& x, const DeviceTensor& weight, float eps,
               DeviceTensor& y) override;
  using Backend::rope;
  void rope(DeviceTensor& x, std::span<const int64_t> positions, const DeviceTensor& inv_freq,
            float scale) override;
  void rope_pair(DeviceTensor& q, DeviceTensor& k, std::span<const int64_t> positions,
                 const DeviceTensor& inv_freq, float scale) override;
  void silu_mul(const DeviceTensor& gate, const DeviceTensor& up, DeviceTensor& out) override;
  void gelu_tanh_mul(const DeviceTensor& gate, const DeviceTensor& up, DeviceTensor& out) override;
  void soft_cap(DeviceTensor& x, float cap) override;
  void layer_norm(const DeviceTensor& x, const DeviceTensor& weight, const DeviceTensor& bias,
                  float eps, DeviceTensor& y) override;
  void bias_activation(DeviceTensor& x, const DeviceTensor* bias, Activation act) override;
  void add_inplace(DeviceTensor& x, const DeviceTensor& y) override;
  void kv_append(const DeviceTensor& k, const DeviceTensor& v, DeviceTensor& k_cache,
                 DeviceTensor& v_cache, int64_t first_position) override;
  void kv_append_runs(std::span<const RunAppend> runs, int64_t first_position) override;
  void rope_append_runs(std::span<const RunRopeAppend> runs, int64_t position,
                        const DeviceTensor& inv_freq, float scale) override;
  void attention(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                 int64_t first_position, int64_t window, Visibility visible, DeviceTensor& out,
                 DeviceTensor* logits_out) override;
  void argmax_rows(const DeviceTensor& x, std::span<int32_t> out) override;
  void log_prob_rows(const DeviceTensor& x, std::span<const int32_t> targets,
                     std::span<double> out) override;

  // --- token-selection (policy) ops (kernels/policy_ops.cu) ---

  void attention_logits(const DeviceTensor& q, const DeviceTensor& k_cache, int64_t position,
                        int64_t window, DeviceTensor& logits) override;
  void attention_visible(const DeviceTensor& logits, int64_t cols, const DeviceTensor* visible,
                         const DeviceTensor& v_cache, DeviceTensor& out,
                         DeviceTensor* probs) override;
  void attention_logits_runs(std::span<const RunAttention> runs, int64_t shared, int64_t position,
                             int64_t window) override;
  void attention_visible_runs(std::span<const RunAttention> runs, int64_t shared,
                              int64_t cols) override;
  void attention_masked_runs(std::span<const RunAttention> runs, int64_t shared, int64_t position,
                             int64_t window) override;
  bool fuses_masked_attention() const override { return true; }
  void select_top_k(const DeviceTensor& scores, int64_t cols, const DeviceTensor* eligible,
                    int64_t k, DeviceTensor& selected) override;
  void fill_columns(DeviceTensor& mask, int64_t begin, int64_t end, uint8_t value) override;
  void count_nonzero_rows(const DeviceTensor& mask, int64_t cols,
                          std::span<int64_t> counts) override;
  void mask_and(DeviceTensor& mask, const DeviceTensor& other, int64_t cols) override;
  void mark_columns(DeviceTensor& mask, int64_t cols, int64_t ones_end, int64_t ones_begin,
                    const DeviceTensor* keep) override;
  void mark_and_select_top_k(const DeviceTensor& scores, int64_t cols, const DeviceTensor* eligible,
                             int64_t ones_end, int64_t ones_begin, int64_t k,
                             DeviceTensor& selected) override;
  void keep_selected(DeviceTensor& kept, const DeviceTensor& selected, int64_t cols,
                     int64_t sinks) override;
  void accumulate_rows(DeviceTensor& acc, const DeviceTensor& x, const DeviceTensor* keep,
                       int64_t cols) override;
  void sum_row_groups(const DeviceTensor& x, int64_t cols, int64_t group,
                      DeviceTensor& out) override;
  void expand_row_groups(const DeviceTensor& mask, int64_t cols, int64_t group,
                         DeviceTensor& out) override;
  void random_rows(uint64_t seed, uint64_t stream_id, int64_t cols, DeviceTensor& out) override;
  void axpby_rows(DeviceTensor& y, float alpha, const DeviceTensor& x, float beta,
                  int64_t cols) override;
  void pool_rows(const DeviceTensor& x, int64_t cols, Pool pool, int64_t kernel,
                 DeviceTensor& out) override;
  void select_pages(const DeviceTensor& scores, int64_t cols, int64_t page_size, int64_t k,
                    DeviceTensor& selected) override;
  void zero_unless(DeviceTensor& rows, const DeviceTensor& keep) override;

  // --- for the policies' op extensions (kernels/policy/cuda_policy_ops.cpp) ---
  // Makes this backend's device current on the calling thread (before a launch).
  void activate() const { check_cuda(cudaSetDevice(device_), "cudaSetDevice"); }
  // The stream the calling thread's ops go to: its lane's inside a task of run_tasks, else the
  // main one (ordered with every other op of this backend, recorded by record_step).
  cudaStream_t stream() const { return lane().stream; }
  // One cache [G, capacity, D] of F32, BF16 or F16; with cols >= 0 it must hold that many
  // positions.
  struct CacheShape {
    int64_t kv_heads = 0, capacity = 0, head_dim = 0;
  };
  static CacheShape cache_shape(const DeviceTensor& cache, const std::string& op, const char* name,
                                int64_t cols = -1);

  std::unique_ptr<StepGraph> record_step(int64_t position, int64_t rows,
                                         const std::function<void()>& record) override;
  double copy_bandwidth_gbps(size_t bytes, int repeats) override;
  void synchronize() override;
  void count_nonzero_rows_deferred(const DeviceTensor& mask, int64_t cols,
                                   std::span<int64_t> counts) override;
  void count_nonzero_rows_deferred_many(std::span<const RowCount> masks) override;
  void count_nonfinite_rows_deferred(const DeviceTensor& x, int64_t cols,
                                     std::span<int64_t> counts) override;
  void run_tasks(int64_t count, const std::function<void(int64_t)>& task) override;
  bool runs_tasks_in_order() const override;

 private:
  // Products (cuda_model_ops.cpp): decode rows through the GEMV kernel, many rows through cuBLAS.
  struct ProductShape {
    int64_t rows = 0, in = 0, out = 0;
  };
  static bool decode_products(const std::string& op, const DeviceTensor& x,
                              std::span<const DeviceTensor* const> ws,
                              std::span<DeviceTensor* const> ys, ProductShape& shape);
  static bool norm_fusable(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                           const DeviceTensor& norm_weight, const DeviceTensor& normed,
                           const ProductShape& shape);
  void launch_products(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                       std::span<DeviceTensor* const> ys, const ProductShape& shape,
                       bool accumulate, const DeviceTensor* norm_weight = nullptr, float eps = 0.0f,
                       DeviceTensor* normed = nullptr, bool silu_pair = false);
  static ProductShape product_shape(const std::string& op, const DeviceTensor& x,
                                    const DeviceTensor& w, const DeviceTensor& y);
  void gemm(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y,
            const ProductShape& shape);
  void rope_rows(DeviceTensor& x, DeviceTensor* x2, std::span<const int64_t> positions,
                 const DeviceTensor& inv_freq, float scale);
  static int64_t logit_columns(const DeviceTensor& x, int64_t rows, const std::string& op);
  // The checks of kv_append, attention_logits and attention_visible, and their kernels'
  // arguments (heads == 0: nothing to launch), for the single-run and the _runs ops.
  cuda::AppendArgs append_args(const DeviceTensor& k, const DeviceTensor& v, DeviceTensor& k_cache,
                               DeviceTensor& v_cache, int64_t first_position) const;
  cuda::LogitArgs logit_args(const DeviceTensor& q, const DeviceTensor& k_cache, int64_t position,
                             int64_t window, DeviceTensor& logits) const;
  cuda::VisibleAttentionArgs visible_args(const DeviceTensor& logits, int64_t cols,
                                          const DeviceTensor* visible, const DeviceTensor& v_cache,
                                          DeviceTensor& out, DeviceTensor* probs) const;
  void launch_visible(std::span<const cuda::VisibleAttentionArgs> runs);
  // The checks and arguments every attention call shares (q, caches, out, positions).
  cuda::AttentionArgs attention_args(const std::string& op, const DeviceTensor& q,
                                     const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                     int64_t first_position, int64_t window,
                                     DeviceTensor& out) const;

  // Operands of the cache and page ops, shared by the model and policy ops (cuda_policy_ops.cpp).
  static void require_page_size(int64_t page_size, const std::string& op);
  static CacheShape cache_shape(const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                                const std::string& op);

  // The device, streams and host copies (cuda_backend.cpp).
  cuda::StepState* step_state() const { return static_cast<cuda::StepState*>(step_state_.get()); }
  const int64_t* step_position(int64_t position, const std::string& op) const;
  bool host_memory() const override { return false; }
  void* native_stream() override { return stream(); }

  // Copies host values (ids, positions, targets) to device memory for the next kernel.
  template <typename T>
  const T* stage(std::span<const T> host) {
    void* device = lane().staging.get(device_, host.size_bytes());
    check_cuda(
        cudaMemcpyAsync(device, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream()),
        "cudaMemcpyAsync");
    return static_cast<const T*>(device);
  }
  void copy_results(const void* device, void* host, size_t bytes);

  struct Deferred {
    size_t offset;
    std::span<int64_t> counts;
  };
  // count_nonzero_rows_deferred's counts in device memory, copied to pinned host memory behind
  // their kernels and on to the callers' spans by synchronize().
  struct DeferredBuffer {
    std::shared_ptr<void> device;
    std::unique_ptr<int64_t[], PinnedDeleter> host;
    size_t capacity = 0, used = 0;
    std::vector<Deferred> pending;
  };
  // A stream and the scratch buffers its ops reuse (ordered by that stream alone): the main
  // stream's, and one per host thread of run_tasks.
  struct Lane {
    Lane() = default;
    // A lane of run_tasks: a stream of its own and the event that marks its tasks' end.
    explicit Lane(const CudaBackend& backend) : owner(&backend) {
      backend.activate();
      cudaStream_t created = nullptr;
      check_cuda(cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags");
      owned_stream.reset(created);
      stream = created;
      check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
    }
    ~Lane() {
      if (done != nullptr) cudaEventDestroy(done);
    }
    Lane(const Lane&) = delete;
    Lane& operator=(const Lane&) = delete;
    const CudaBackend* owner = nullptr;  // (the main lane's is not asked)
    cudaStream_t stream = nullptr;
    std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter> owned_stream;
    cudaEvent_t done = nullptr;
    Scratch staging;          // host spans copied in
    Scratch results;          // argmax / log-prob values copied out
    Scratch widen;            // F32 slices of a BF16/F16 weight for many-row products
    Scratch attention_parts;  // the split attention kernels' per-slice softmax pieces
    Scratch bounce;           // overlapping copy_rows
    Scratch select_state;     // select_top_k's passes over one long row
    // count_nonzero_rows_deferred's buffers: the last has room, earlier ones filled up since the
    // last delivery.
    std::vector<DeferredBuffer> deferred;
  };
  // The calling thread's lane when it runs a task of this backend, else the main one (asked
  // for every op: one comparison).
  Lane& lane() {
    return current_lane_ != nullptr && current_lane_->owner == this ? *current_lane_ : main_lane_;
  }
  const Lane& lane() const {
    return current_lane_ != nullptr && current_lane_->owner == this ? *current_lane_ : main_lane_;
  }
  RowShape counted_rows(const DeviceTensor& mask, int64_t cols, std::span<int64_t> counts) const;
  int64_t* deferred_slots(std::span<int64_t> counts);
  static void queue_deferred_copy(const Lane& lane, cudaStream_t stream);
  static void deliver_deferred(Lane& lane);
  static int64_t lane_limit();
  int device_;
  std::shared_ptr<NcclGroup> nccl_;              // null: alone or host_group_
  std::shared_ptr<PeerReduceGroup> peers_;       // with nccl_, where the GPUs are peers
  std::shared_ptr<HostReduceGroup> host_group_;  // null: alone or nccl_
  int rank_ = 0;
  // Declaration order = reverse release order: buffers, then the cuBLAS handle, then its stream.
  std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter> stream_;
  std::unique_ptr<std::remove_pointer_t<cublasHandle_t>, CublasDeleter> blas_;
  std::mutex blas_mutex_;
  Lane main_lane_;  // stream_'s
  std::vector<std::unique_ptr<Lane>> lanes_;
  std::unique_ptr<ThreadPool> lane_pool_;
  cudaEvent_t fork_ = nullptr;              // the main stream's point the lanes start from
  static thread_local Lane* current_lane_;  // the lane of a run_tasks task on this thread
  int sm_count_ = 0;                        // streaming multiprocessors (kernel grid sizes)
  // A step being recorded (record_step) and the device state its replays set.
  struct Capture {
    bool active = false;
    int64_t position = 0, rows = 0;
  } capture_;
  std::shared_ptr<void> step_state_;
};

// The CUDA backend an op extension's factory was given (op extensions are registered under the
// backend's name, "cuda"); an error naming `extension` for any other backend.
CudaBackend& cuda_backend_of_extension(Backend& backend, std::string_view extension);

}  // namespace kvlens::cuda
