// Backend: the small set of operations the decoder needs, implemented by the CPU reference
// backend (engine/backend/cpu/cpu_backend) and the CUDA backend (kernels/). All activations are
// F32; weights may stay F32, BF16 or F16 in backend memory. Shapes below are row-major.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend/op_extension.h"
#include "engine/common/dtype.h"
#include "engine/common/tensor_view.h"

namespace kvlens {

class Backend;

// The attention logit scale every backend applies, head_dim^-0.5 rounded to F32 once
// (transformers multiplies the F32 scores by the Python float `scaling`).
inline float attention_scale(int64_t head_dim) {
  return float(1.0 / std::sqrt(double(head_dim)));
}

// A tensor in a backend's memory (host memory for the CPU backend, device memory for CUDA).
// Copies share storage; storage is released when the last copy goes.
struct DeviceTensor {
  std::shared_ptr<void> storage;  // owner (may be empty when aliasing mapped host memory)
  void* data = nullptr;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  // The backend's own copy of the contents in a layout of its choosing (the CPU backend's matmul
  // panels of a weight), made by upload_weight. Views copy it along, so a backend checks that it
  // still describes `data` and `shape` before it uses it.
  std::shared_ptr<const void> backend_layout;

  int64_t numel() const;
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(size_t i) const { return shape.at(i); }
  bool empty() const { return data == nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// Which cached positions each head may attend to at one decode step. Empty = all of
// [window_begin, position]. Otherwise mask[h * context + j] != 0 means head h sees key j.
struct Visibility {
  const DeviceTensor* mask = nullptr;  // U8 [heads, context] in backend memory
};

// A single-token step recorded by Backend::record_step, replayed at later positions (on the GPU:
// one CUDA graph launch instead of hundreds of kernel launches).
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Runs the recorded ops as at `position` with these token ids (one per recorded row).
  virtual void replay(int64_t position, std::span<const int32_t> tokens) = 0;
};

class Backend {
 public:
  Backend();
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  // The name op extensions are registered under ("cpu", "cuda").
  virtual std::string name() const = 0;
  // Whether DeviceTensor::data of this backend is host memory the CPU may read and write (the
  // CPU backend), or device memory (CUDA). A policy plug-in that reads host memory only gets
  // copies on a backend without it.
  virtual bool host_memory() const { return true; }
  // The queue the calling thread's ops go to (a cudaStream_t on CUDA: a task of run_tasks has
  // its own), for work of a plug-in's own ordered with them; null where there is none.
  virtual void* native_stream() { return nullptr; }

  // --- op extensions (op_extension.h) ---
  // This backend's instance of the extension interface T (an OpExtension with a
  // `static constexpr std::string_view kExtensionName`), made by the factory registered for
  // (T::kExtensionName, name()) on the first call and kept until the backend goes: later calls
  // return the same object. Thread-safe. Throws kvlens::Error naming the extension and the
  // backend when no factory is registered. A caller fetches it once (a policy in its
  // constructor), not per step.
  template <typename T>
  T& extension() {
    OpExtension& instance = extension_named(T::kExtensionName);
    T* typed = dynamic_cast<T*>(&instance);
    if (typed == nullptr) wrong_extension_type(T::kExtensionName);
    return *typed;
  }
  OpExtension& extension_named(std::string_view extension);

  // --- memory ---
  // Makes weights usable by the backend. The CPU backend aliases the mapped file (F32/BF16) and
  // converts F16 to F32, and keeps matrices repacked for its matmul too; device backends copy.
  // `keep_alive` owns the host memory behind `view`.
  virtual DeviceTensor upload_weight(const TensorView& view, std::shared_ptr<void> keep_alive) = 0;
  virtual DeviceTensor alloc(DType dtype, std::vector<int64_t> shape) = 0;  // zero-filled
  // Whether the ops that read or write a KV cache (kv_append, attention, attention_logits,
  // attention_visible, and the extensions' cache ops: key_anchor_scores, page_minmax_update,
  // anchor_cosine_update) take caches of `dtype`: F32 always; the CUDA backend also BF16 and F16
  // (stored rounded to nearest even, read widened exactly, all arithmetic in F32).
  virtual bool supports_cache_dtype(DType dtype) const { return dtype == DType::F32; }
  // True when a and b (the same dtype and shape) hold the same bytes and the backend can tell
  // cheaply; false when they differ or it cannot tell without a synchronization (the default).
  // A hint that lets a lockstep session compute once what several runs would compute alike.
  virtual bool same_bytes(const DeviceTensor& /*a*/, const DeviceTensor& /*b*/) { return false; }
  virtual void to_host(const DeviceTensor& src, void* host, size_t bytes) = 0;
  virtual void from_host(DeviceTensor& dst, const void* host, size_t bytes) = 0;
  // Copies `rows` rows of `row_elems` elements each from src[src_row..] to dst[dst_row..]; src
  // and dst have one dtype (any: F32 rows, U8 masks, a KV cache in the model's dtype).
  virtual void copy_rows(const DeviceTensor& src, int64_t src_row, DeviceTensor& dst,
                         int64_t dst_row, int64_t rows, int64_t row_elems) = 0;

  // copy_rows from src into every tensor of `dsts` (the same rows of each). A dst may be src
  // itself with dst_row == src_row (nothing to copy there) but must not otherwise overlap src.
  // Backends may store the copies once until they are written: the CPU backend maps whole pages
  // of the rows copy-on-write from one snapshot (a dense prefill in every lockstep run's cache is
  // then read from one place).
  virtual void broadcast_rows(const DeviceTensor& src, int64_t src_row,
                              std::span<DeviceTensor* const> dsts, int64_t dst_row, int64_t rows,
                              int64_t row_elems) {
    for (DeviceTensor* dst : dsts) {
      if (dst->data != src.data || dst_row != src_row)
        copy_rows(src, src_row, *dst, dst_row, rows, row_elems);
    }
  }

  // --- ops (F32 activations) ---
  // out[n, E] = table[ids[n], :] (table F32/BF16/F16 [vocab, E]). ids are host values, checked.
  virtual void embed(const DeviceTensor& table, std::span<const int32_t> ids,
                     DeviceTensor& out) = 0;
  // y[n, out] = x[n, in] * w[out, in]^T  (w in any weight dtype).
  virtual void matmul(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y) = 0;
  // ys[i][n, out_i] = x[n, in] * ws[i][out_i, in]^T for each i: products of one input (q, k and
  // v; gate and up), each with the bits of matmul. A backend may run them as one (the CUDA
  // backend's decode products: one launch); the default calls matmul for each.
  virtual void matmul_many(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                           std::span<DeviceTensor* const> ys);
  // acc[n, out] += x[n, in] * w[out, in]^T (a projection added to the residual stream), with the
  // bits of matmul into `scratch` (acc's shape) followed by add_inplace(acc, scratch), which is
  // the default; a backend may add as it writes the product and leave scratch alone.
  virtual void matmul_add(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& scratch,
                          DeviceTensor& acc) {
    matmul(x, w, scratch);
    add_inplace(acc, scratch);
  }
  // normed = rmsnorm(x, norm_weight, eps), then ys[i] = normed * ws[i]^T: the layer's input norm
  // and its q/k/v products, or the final norm and the lm_head. The default runs rmsnorm and
  // matmul_many; a backend may fuse them (the CUDA backend's decode products: one launch) but
  // gives their bits, normed included.
  virtual void rmsnorm_matmul_many(const DeviceTensor& x, const DeviceTensor& norm_weight,
                                   float eps, DeviceTensor& normed,
                                   std::span<const DeviceTensor* const> ws,
                                   std::span<DeviceTensor* const> ys) {
    rmsnorm(x, norm_weight, eps, normed);
    matmul_many(normed, ws, ys);
  }
  // The MLP's input: normed = rmsnorm(x), act = silu(normed * w_gate^T) * (normed * w_up^T).
  // The default runs rmsnorm, matmul_many into gate and up, and silu_mul; a backend may fuse
  // them (gate and up then unwritten) but gives act's and normed's bits.
  virtual void rmsnorm_gate_up(const DeviceTensor& x, const DeviceTensor& norm_weight, float eps,
                               DeviceTensor& normed, const DeviceTensor& w_gate,
                               const DeviceTensor& w_up, DeviceTensor& gate, DeviceTensor& up,
                               DeviceTensor& act) {
    rmsnorm(x, norm_weight, eps, normed);
    const DeviceTensor* const weights[] = {&w_gate, &w_up};
    DeviceTensor* const outputs[] = {&gate, &up};
    matmul_many(normed, weights, outputs);
    silu_mul(gate, up, act);
  }
  // y[n, E] = x * rsqrt(mean(x^2) + eps) * weight, per row (weight [E] any weight dtype).
  virtual void rmsnorm(const DeviceTensor& x, const DeviceTensor& weight, float eps,
                       DeviceTensor& y) = 0;
  // In place on x[n, heads, D]: rotate-half RoPE at positions[n] (host values) of each head's
  // first R = 2 * inv_freq.numel() channels (inv_freq[R/2] F32, backend memory; R <= D, the D of
  // a 3-D x, else R), channels R..D-1 passing through (partial rotary, phi3). cos and sin are
  // multiplied by `scale` in F32 (yarn / longrope attention factor) before they are applied.
  virtual void rope(DeviceTensor& x, std::span<const int64_t> positions,
                    const DeviceTensor& inv_freq, float scale) = 0;
  // rope of the queries and the keys of the same rows (one launch where the backend can).
  virtual void rope_pair(DeviceTensor& q, DeviceTensor& k, std::span<const int64_t> positions,
                         const DeviceTensor& inv_freq, float scale) {
    rope(q, positions, inv_freq, scale);
    rope(k, positions, inv_freq, scale);
  }
  // Every channel rotated (R == D), unscaled.
  void rope(DeviceTensor& x, std::span<const int64_t> positions, const DeviceTensor& inv_freq) {
    rope(x, positions, inv_freq, 1.0f);
  }
  // out[n, F] = silu(gate) * up
  virtual void silu_mul(const DeviceTensor& gate, const DeviceTensor& up, DeviceTensor& out) = 0;
  // out[n, F] = gelu_tanh(gate) * up (GeGLU: torch's gelu(approximate="tanh"), computed in double
  // and rounded to F32 before the product, as torch rounds it).
  virtual void gelu_tanh_mul(const DeviceTensor& gate, const DeviceTensor& up,
                             DeviceTensor& out) = 0;
  // In place on x (F32): x = tanh(x / cap) * cap, each step rounded to F32 as torch computes it
  // (logit soft-capping). cap > 0. Infinities stay: a masked attention logit (-inf, outside a
  // sliding window) stays masked, as the mask torch adds after the cap keeps it.
  virtual void soft_cap(DeviceTensor& x, float cap) = 0;
  // y[n, E] = (x - mean) / sqrt(var + eps) * weight + bias per row (LayerNorm, biased variance,
  // as torch; weight and bias [E] in any weight dtype). y may be x.
  virtual void layer_norm(const DeviceTensor& x, const DeviceTensor& weight,
                          const DeviceTensor& bias, float eps, DeviceTensor& y) = 0;
  // In place on x[n, F]: x = act(x + bias), bias [F] in any weight dtype or null (none). Gelu is
  // the exact erf form (torch's nn.GELU default); Silu is x * sigmoid(x).
  enum class Activation { None, Gelu, Silu };
  virtual void bias_activation(DeviceTensor& x, const DeviceTensor* bias, Activation act) = 0;
  // x += y (same shape)
  virtual void add_inplace(DeviceTensor& x, const DeviceTensor& y) = 0;
  // Writes k[n, G, D] and v[n, G, D] into cache rows [G, capacity, D] at positions
  // first_position .. first_position + n - 1. An empty v_cache (no storage) writes the keys only
  // (v is then not read): caches of keys alone, as a learned predictor's importance keys.
  virtual void kv_append(const DeviceTensor& k, const DeviceTensor& v, DeviceTensor& k_cache,
                         DeviceTensor& v_cache, int64_t first_position) = 0;
  // kv_append for several runs of one layer at one position (a lockstep step), each run's rows
  // into its own caches: exactly what kv_append does per run (the default), in one launch where
  // the backend can.
  struct RunAppend {
    const DeviceTensor* k = nullptr;
    const DeviceTensor* v = nullptr;
    DeviceTensor* k_cache = nullptr;
    DeviceTensor* v_cache = nullptr;
  };
  virtual void kv_append_runs(std::span<const RunAppend> runs, int64_t first_position) {
    for (const RunAppend& run : runs)
      kv_append(*run.k, *run.v, *run.k_cache, *run.v_cache, first_position);
  }
  // A decode step's RoPE and cache append for several runs of one layer: each run's query row
  // q [1, H, D] and key row k [1, G, D] rotated in place at `position` (rope_pair), then k and v
  // appended there (kv_append_runs). What the default does, in one launch where the backend can
  // (on the GPU one wait between kernels fewer per layer).
  struct RunRopeAppend {
    DeviceTensor* q = nullptr;
    DeviceTensor* k = nullptr;
    const DeviceTensor* v = nullptr;
    DeviceTensor* k_cache = nullptr;
    DeviceTensor* v_cache = nullptr;
  };
  virtual void rope_append_runs(std::span<const RunRopeAppend> runs, int64_t position,
                                const DeviceTensor& inv_freq, float scale);
  // Causal attention of q[n, H, D] (positions first_position..+n-1) over the cache
  // [G, capacity, D] (GQA: query head h reads KV head h / (H/G)). Query row i sees keys
  // j in [max(0, p_i - window + 1), p_i] when window > 0, else [0, p_i], intersected with
  // `visible` (only for n == 1). out[n, H, D]. When logits_out ([n, H, S], S >= context) is
  // non-empty, columns [0, context) of its row (i, h) receive the pre-softmax scaled logits (-inf
  // where not visible), context = last p + 1; columns past context are left as they were (rows
  // as wide as the cache keep a recorded step's logits at fixed addresses).
  virtual void attention(const DeviceTensor& q, const DeviceTensor& k_cache,
                         const DeviceTensor& v_cache, int64_t first_position, int64_t window,
                         Visibility visible, DeviceTensor& out, DeviceTensor* logits_out) = 0;
  // Row-wise argmax of x[n, V] into host memory (ties toward the lower index, like torch).
  virtual void argmax_rows(const DeviceTensor& x, std::span<int32_t> out) = 0;
  // Row-wise log-softmax value of targets: out[i] = log softmax(x[i])[target[i]] (host spans).
  virtual void log_prob_rows(const DeviceTensor& x, std::span<const int32_t> targets,
                             std::span<double> out) = 0;
  // Records the ops that `record` issues as one single-token step at `position` over `rows` rows
  // (one token each), without running them, and returns the recording; null where the backend
  // records nothing (the default: `record` is then not called). While recording, every position
  // the ops are given must be `position` (a column count position + 1), and embed's ids are
  // taken from the replay, not from the call; an op that cannot be recorded throws (the caller
  // then runs the step itself). The recording holds the tensors' addresses: it is valid while
  // they are. The caller replays it for this step too.
  virtual std::unique_ptr<StepGraph> record_step(int64_t /*position*/, int64_t /*rows*/,
                                                 const std::function<void()>& /*record*/) {
    return nullptr;
  }
  // The yardstick of `bench`: bytes per second (1e9 B/s) copied by a copy of `bytes` bytes
  // within the backend's memory, median of `repeats` after an untimed one. Each byte is read once
  // and written once, so the memory moves twice that. The default copies host memory
  // (measure_copy_bandwidth_gbps); the CUDA backend copies device memory, timed by events.
  virtual double copy_bandwidth_gbps(size_t bytes, int repeats);
  // Blocks until queued work is done (no-op on the CPU) and delivers deferred results; called
  // from a task of run_tasks, the work and results that task queued.
  virtual void synchronize() {}

  // --- read-back while later ops run (a trace's capture, into rotating buffers) ---
  // Host memory that rows_to_host_async may fill while the backend works on (page-locked on
  // CUDA, where a copy into pageable memory would wait for the device).
  virtual std::shared_ptr<void> alloc_host(size_t bytes);
  // host[r * cols + j] = src[r, j] for r < rows, j < cols, src seen as rows of S = its last
  // dimension (F32 or U8 rows, cols <= S): queued after the ops issued so far, complete once a
  // fence() issued after it has been waited for. `host` (from alloc_host) must stay until then.
  // The default copies at once.
  virtual void rows_to_host_async(const DeviceTensor& src, int64_t rows, int64_t cols, void* host);
  // A point in the queue of ops: wait() returns once every op issued before fence() is done.
  class Fence {
   public:
    virtual ~Fence() = default;
    virtual void wait() = 0;
  };
  // The default (a backend whose ops are done when they return) is passed at once.
  virtual std::unique_ptr<Fence> fence();
  // Calls task(i) for i in [0, count): independent pieces of work that touch disjoint tensors and
  // may issue ops of their own (the lockstep runs of one layer, or whole sessions: the samples of
  // an eval). The CPU backend spreads them over its threads, each task's ops then running on the
  // thread that took it; the CUDA backend over host threads that each issue into a stream of their
  // own, ordered after the ops before the call and before the ops after it; the default runs them
  // in order. A call from inside a task runs its tasks in order on that task's thread. The first
  // exception thrown by a task is rethrown after all have finished.
  virtual void run_tasks(int64_t count, const std::function<void(int64_t)>& task) {
    for (int64_t i = 0; i < count; ++i) task(i);
  }
  // Whether run_tasks, called here and now, would run its tasks in order on the calling thread
  // (inside a task, or a backend of one thread): a caller with several runs' work then does better
  // to issue it as the ops' batched forms (the _runs ops) than task by task.
  virtual bool runs_tasks_in_order() const { return true; }
  // How many groups of runs a lockstep step may split into once the runs' rows differ: each
  // group then goes through the remaining layers as one task of run_tasks, with its own pass over
  // the `layers` layers' `layer_weight_bytes` of weights. 1 (the default): no split, every op
  // takes every run.
  virtual int64_t lockstep_groups(int64_t /*runs*/, int64_t /*layer_weight_bytes*/,
                                  int64_t /*layers*/) const {
    return 1;
  }

  // --- tensor parallelism (engine/arch/tensor_parallel.h) ---
  // The group of backends this one shares a model with, each holding a shard of its heads and
  // MLP columns (Megatron-LM's split): its size (1: alone) and this backend's place in it.
  virtual int64_t tensor_parallel_ranks() const { return 1; }
  virtual int64_t tensor_parallel_rank() const { return 0; }
  // partial [rows, E] (F32 or BF16) holds this rank's share of a row-parallel product (o_proj,
  // down_proj over its heads and columns); afterwards every rank holds the sum over the ranks,
  // the same bits on each. Every rank calls it in the same order (from its own host thread);
  // alone it does nothing.
  virtual void all_reduce_sum(DeviceTensor& /*partial*/) {}
  // Releases every rank waiting in all_reduce_sum with an error, and fails the group's later
  // calls: a rank that failed (bad input, an error of its device) calls it so that the others do
  // not wait for it forever. Alone it does nothing.
  virtual void abort_collectives() {}

  // --- token-selection (policy) ops: one decode step (n == 1) of one layer ---
  // The ops several policies or the session share. An op that serves one policy is that
  // policy's op extension (engine/policy/*_ops.h: keydiff, quest, tokenfilter).
  // Row tensors are [rows, stride] row-major (F32 scores, U8 0/1 masks); only the first `cols`
  // columns (the candidates 0..t) are read or written, so policy state can live in buffers sized
  // for the whole context and grow without copies. Ties always go to the higher column (the more
  // recent token), so selections are deterministic and equal on every backend.
  //
  // logits[h, j] = q[0, h, :] . k_cache[h / (H/G), j, :] / sqrt(D) for j < cols = position + 1;
  // -inf for j outside the model's sliding window (window > 0).
  virtual void attention_logits(const DeviceTensor& q, const DeviceTensor& k_cache,
                                int64_t position, int64_t window, DeviceTensor& logits) = 0;
  // Attention of one query row per head restricted to visible columns: p = softmax of logits
  // over {j < cols : visible[h, j]} (renormalised; all cols when visible is null),
  // out[0, h, :] = sum_j p[h, j] v_cache[h / (H/G), j, :]. probs (optional) receives p, 0 where
  // not visible. A head with no finite visible logit gets zeros (as `attention` gives). An empty
  // `out` (no storage) skips the value pass: only probs (then required) is computed.
  virtual void attention_visible(const DeviceTensor& logits, int64_t cols,
                                 const DeviceTensor* visible, const DeviceTensor& v_cache,
                                 DeviceTensor& out, DeviceTensor* probs) = 0;
  // The two ops above for several runs of one layer at once (a lockstep step), whose caches
  // hold the same rows [0, shared) of every KV head (the common prompt, stored once): each run's
  // results are exactly those of the single-run op. attention_logits_runs writes every run's
  // logits (attention_logits with its q, k_cache and logits); attention_visible_runs its softmax
  // and value sum (attention_visible with its logits, visible, v_cache, out and probs, over the
  // same cols; out may not be empty). A backend may read the common rows once for all runs (the
  // CPU backend does, run 0's copy); the defaults run the single-run op per run. A run whose
  // `visible` is set when attention_logits_runs is called needs its logits at the visible
  // columns only: a backend may leave the others as they were (the CPU backend does; the
  // default computes them all), so only a visible-masked softmax may read that row.
  struct RunAttention {
    const DeviceTensor* q = nullptr;  // [1, H, D]
    const DeviceTensor* k_cache = nullptr;
    const DeviceTensor* v_cache = nullptr;
    DeviceTensor* logits = nullptr;         // [H, stride]
    const DeviceTensor* visible = nullptr;  // null: every column
    DeviceTensor* out = nullptr;            // [1, H, D]
    DeviceTensor* probs = nullptr;          // null: not wanted
  };
  virtual void attention_logits_runs(std::span<const RunAttention> runs, int64_t /*shared*/,
                                     int64_t position, int64_t window) {
    for (const RunAttention& run : runs)
      attention_logits(*run.q, *run.k_cache, position, window, *run.logits);
  }
  virtual void attention_visible_runs(std::span<const RunAttention> runs, int64_t /*shared*/,
                                      int64_t cols) {
    for (const RunAttention& run : runs)
      attention_visible(*run.logits, cols, run.visible, *run.v_cache, *run.out, run.probs);
  }
  // Both calls above in one, for runs that want no probabilities (probs null) and whose logits
  // nobody else reads: each run's out as attention_logits_runs then attention_visible_runs give
  // it, to the attention entries' tolerance (a backend may sum the softmax in another order).
  // Their logits rows are scratch: a backend may leave them unwritten. The default is those two
  // calls (the CPU backend's bits); the CUDA backend runs the split decode attention with each
  // run's mask, reading only the key and value rows some head of their KV head sees.
  virtual void attention_masked_runs(std::span<const RunAttention> runs, int64_t shared,
                                     int64_t position, int64_t window) {
    attention_logits_runs(runs, shared, position, window);
    attention_visible_runs(runs, shared, position + 1);
  }
  // Whether a session should send such runs to attention_masked_runs rather than with the others
  // through the two calls: false where it is those two calls anyway (the CPU, whose
  // attention_logits_runs reads the rows common to a lockstep group once for all its runs).
  virtual bool fuses_masked_attention() const { return false; }
  // Per row: among columns j < cols with selected[r, j] == 0 and (eligible null or
  // eligible[r, j] != 0), sets selected[r, j] = 1 for the k with the highest scores (ties to the
  // higher j; NaN ranks lowest). Fewer candidates than k: all of them. Columns already selected
  // (forced ones) are kept and do not count against k.
  virtual void select_top_k(const DeviceTensor& scores, int64_t cols, const DeviceTensor* eligible,
                            int64_t k, DeviceTensor& selected) = 0;
  // mask[r, begin:end] = value for every row (U8).
  virtual void fill_columns(DeviceTensor& mask, int64_t begin, int64_t end, uint8_t value) = 0;
  // counts[r] = how many of mask[r, 0:cols] are nonzero (U8 [rows, stride]; one count per row,
  // in host memory): a run's effective sparsity. The default reads the rows back and counts
  // them on the host; a backend may count where the mask lives.
  virtual void count_nonzero_rows(const DeviceTensor& mask, int64_t cols,
                                  std::span<int64_t> counts);
  // count_nonzero_rows without waiting for the device: `counts` (host memory the caller keeps)
  // holds the counts once the next synchronize() has returned, which the caller calls before it
  // reads them or lets them go. The default counts at once.
  virtual void count_nonzero_rows_deferred(const DeviceTensor& mask, int64_t cols,
                                           std::span<int64_t> counts) {
    count_nonzero_rows(mask, cols, counts);
  }
  // count_nonzero_rows_deferred of several masks (a step's masks of every run and layer), in one
  // launch where the backend can; the default counts each in turn.
  struct RowCount {
    const DeviceTensor* mask = nullptr;
    int64_t cols = 0;
    std::span<int64_t> counts;
  };
  virtual void count_nonzero_rows_deferred_many(std::span<const RowCount> masks) {
    for (const RowCount& m : masks) count_nonzero_rows_deferred(*m.mask, m.cols, m.counts);
  }
  // counts[r] = how many of x[r, 0:cols] are NaN or infinite (F32 [rows, stride]; host counts
  // that hold their values once the next synchronize() has returned): a plug-in's scores checked
  // without waiting for the device. The default reads the rows back and counts at once.
  virtual void count_nonfinite_rows_deferred(const DeviceTensor& x, int64_t cols,
                                             std::span<int64_t> counts);
  // mask[r, j] = (mask[r, j] && other[r, j]) for j < cols (U8 0/1, both [rows, stride]).
  virtual void mask_and(DeviceTensor& mask, const DeviceTensor& other, int64_t cols) = 0;
  // A selection's forced columns (sinks and recent tokens) less the evicted ones: for j < cols,
  // mask[r, j] = 1 where j < ones_end or ones_begin <= j (0 <= ones_end, ones_begin <= cols),
  // else 0, then 0 where keep[r, j] == 0 (keep optional, [rows, stride]). The default is
  // fill_columns then mask_and; a backend may write it in one pass (the CUDA backend: one launch
  // where the default makes four, in every budgeted policy's every layer).
  virtual void mark_columns(DeviceTensor& mask, int64_t cols, int64_t ones_end, int64_t ones_begin,
                            const DeviceTensor* keep) {
    fill_columns(mask, 0, cols, 0);
    fill_columns(mask, 0, ones_end, 1);
    fill_columns(mask, ones_begin, cols, 1);
    if (keep) mask_and(mask, *keep, cols);
  }
  // A budgeted selection in one op: mark_columns(selected, cols, ones_end, ones_begin, eligible)
  // (the forced columns less the evicted), then select_top_k(scores, cols, eligible, k,
  // selected) when k > 0 (the k best of the rest). The default calls the two; the CUDA backend
  // does both in one launch.
  virtual void mark_and_select_top_k(const DeviceTensor& scores, int64_t cols,
                                     const DeviceTensor* eligible, int64_t ones_end,
                                     int64_t ones_begin, int64_t k, DeviceTensor& selected) {
    mark_columns(selected, cols, ones_end, ones_begin, eligible);
    if (k > 0) select_top_k(scores, cols, eligible, k, selected);
  }
  // An eviction policy's kept set after a selection: kept[r, j] = kept[r, j] && selected[r, j],
  // then 1 for j < min(sinks, cols) (none for sinks <= 0; U8, both [rows, stride]). The default is
  // mask_and then fill_columns; the CUDA backend does it in one launch.
  virtual void keep_selected(DeviceTensor& kept, const DeviceTensor& selected, int64_t cols,
                             int64_t sinks) {
    mask_and(kept, selected, cols);
    fill_columns(kept, 0, sinks < cols ? sinks : cols, 1);
  }
  // acc[r, j] = acc[r, j] * keep[r, j] + x[r, j] for j < cols (F32; keep U8 optional: null keeps
  // everything). Accumulates attention and forgets the scores of evicted tokens in one pass.
  virtual void accumulate_rows(DeviceTensor& acc, const DeviceTensor& x, const DeviceTensor* keep,
                               int64_t cols) = 0;
  // out[g, j] = sum of x[r, j] over the `group` rows r = g*group .. g*group+group-1 (F32), j <
  // cols.
  virtual void sum_row_groups(const DeviceTensor& x, int64_t cols, int64_t group,
                              DeviceTensor& out) = 0;
  // out[r, j] = mask[r / group, j] (U8), j < cols: a per-KV-head selection seen by each query head.
  virtual void expand_row_groups(const DeviceTensor& mask, int64_t cols, int64_t group,
                                 DeviceTensor& out) = 0;
  // out[r, j] = a uniform value in [0, 1) that is a pure function of (seed, stream, r, j), the
  // same on every backend (random_unit in engine/backend/policy_op_math.h). j < cols.
  virtual void random_rows(uint64_t seed, uint64_t stream, int64_t cols, DeviceTensor& out) = 0;
  // y[r, j] = alpha * x[r', j] + beta * y[r, j] for j < cols (F32), with r' = r when x has
  // y's row count and r' = 0 when x has one row (a row broadcast to every row of y). Rounding is
  // fixed so both backends give the same bits: beta == 0 is y = alpha * x (y is not read, so
  // stale inf/NaN in y vanish, as in BLAS); otherwise y = fma(alpha, x, beta * y) (beta * y
  // rounded first, exact for beta = +-1). Sliding sums (beta 1, alpha +-1), copies (alpha 1,
  // beta 0) and scalings are all this one op.
  virtual void axpby_rows(DeviceTensor& y, float alpha, const DeviceTensor& x, float beta,
                          int64_t cols) = 0;
  // out[r, j] = pooled x[r, j - kernel/2 .. j + kernel/2] for j < cols (F32; stride 1, "same"
  // padding; columns outside [0, cols) are padding). kernel is odd and >= 1. Max: the largest
  // in-range value (fmax semantics: NaN ignored unless every value is NaN), like max_pool1d with
  // -inf padding. Average: the in-range values summed left to right starting from +0, divided by
  // kernel (padding counts as 0, count_include_pad as avg_pool1d's default). out must not
  // alias x.
  enum class Pool { Max, Average };
  virtual void pool_rows(const DeviceTensor& x, int64_t cols, Pool pool, int64_t kernel,
                         DeviceTensor& out) = 0;
  // Whole-page selection under a token budget, per row r (core, not quest's extension: the
  // shared BudgetedPolicy::select_into calls it for any policy that budgets by pages). Page p
  // (columns [p * page_size, (p + 1) * page_size) clipped to cols) ranks by its best score (fmax
  // over its columns: NaN ignored unless all are NaN) under top_k_key's order with the page index
  // as the tie-break (ties to the more recent page). Its cost is the number of its columns not yet
  // selected; pages costing 0 take no part. Pages are taken best first while the running cost stays
  // <= k; the first page that does not fit ends the choice (the top pages, as Quest takes them; the
  // budget it leaves is not spent on part of a page). A taken page gets every column selected;
  // columns already selected (forced ones) are kept. scores F32, selected U8, both [R, stride].
  virtual void select_pages(const DeviceTensor& scores, int64_t cols, int64_t page_size, int64_t k,
                            DeviceTensor& selected) = 0;
  // rows[...] = 0 where keep[0] == 0 (every element, exact zeros); unchanged otherwise. rows F32,
  // keep U8 [1, 1] in backend memory: a gated layer's attention output (core: the session
  // applies it for any policy whose gate() is set).
  virtual void zero_unless(DeviceTensor& rows, const DeviceTensor& keep) = 0;

 private:
  struct ExtensionCache;
  [[noreturn]] void wrong_extension_type(std::string_view extension) const;
  std::unique_ptr<ExtensionCache> extensions_;
};

// The CPU reference backend with `threads` worker threads (0 = hardware concurrency).
std::unique_ptr<Backend> make_cpu_backend(int threads = 0);

// Backend::extension<T>() with `CpuImpl` (constructed from the backend) registered for the CPU
// backend on the first call: the accessor a policy's op extension offers beside its CPU code
// (quest_ops(backend), ...), so the CPU side needs no registration call of its own.
template <typename T, typename CpuImpl>
T& extension_with_cpu(Backend& backend) {
  static std::once_flag registered;
  std::call_once(registered, [] {
    register_op_extension(std::string(T::kExtensionName), "cpu",
                          [](Backend& b) { return std::make_unique<CpuImpl>(b); });
  });
  return backend.extension<T>();
}

}  // namespace kvlens
