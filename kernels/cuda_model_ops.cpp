// The CUDA backend's decoder ops (engine/backend/backend.h): embeddings, products (the
// weight-streaming GEMV of kernels/gemv.cu for decode rows, cuBLAS for many rows), norms, RoPE,
// the KV cache and attention, argmax and log-probabilities; argument checks name op and operand.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/policy_op_math.h"
#include "engine/common/error.h"
#include "kernels/cuda_backend_impl.h"
#include "kernels/decode_attention.cuh"
#include "kernels/gemv.cuh"
#include "kernels/matmul.cuh"
#include "kernels/norm_ops.cuh"
#include "kernels/reductions.cuh"
#include "kernels/rope.cuh"

namespace kvlens::cuda {
namespace {

// launch(first, end, dtype) for each stretch [first, end) of consecutive runs whose caches share
// a dtype (a kernel is instantiated per cache dtype; a lockstep step's runs are one stretch).
template <typename Run, typename Launch>
void for_cache_dtype_stretches(std::span<const Run> runs, Launch&& launch) {
  for (size_t first = 0; first < runs.size();) {
    const DType dtype = runs[first].k_cache->dtype;
    size_t end = first + 1;
    while (end < runs.size() && runs[end].k_cache->dtype == dtype) ++end;
    launch(first, end, dtype);
    first = end;
  }
}

// From this many rows of at least this width a fused norm is run as the rmsnorm op first (see
// rmsnorm_matmul_many). Narrower rows keep the fused kernel: normalising 10 rows of 256 in every
// block costs less than the launch it saves (the demo model's coref eval, 10 runs, is bound by
// launches).
constexpr int64_t kSeparateNormRows = 4;
constexpr int64_t kSeparateNormWidth = 1024;

// Whether the products read the normalised rows from `normed` (the norm run first, once) rather
// than normalise x in every block; `normed` must then suit the warp kernel as x did.
bool norm_first(int64_t rows, int64_t width, const DeviceTensor& normed) {
  return rows >= kSeparateNormRows && width >= kSeparateNormWidth &&
         reinterpret_cast<uintptr_t>(normed.data) % 16 == 0;
}

// A gated activation's operands (silu_mul, gelu_tanh_mul): F32 gate, up and out of one size.
void require_gated(const DeviceTensor& gate, const DeviceTensor& up, const DeviceTensor& out,
                   const std::string& op) {
  require(gate, DType::F32, op, "gate");
  require(up, DType::F32, op, "up");
  require(out, DType::F32, op, "out");
  require_elements(up, elements(gate), op, "up");
  require_elements(out, elements(gate), op, "out");
}

}  // namespace

void CudaBackend::embed(const DeviceTensor& table, std::span<const int32_t> ids,
                        DeviceTensor& out) {
  const std::string op = "embed";
  require_weight(table, op, "table");
  if (table.shape.size() != 2) bad_argument(op + ": table", "[vocab, E]", describe(table));
  require(out, DType::F32, op, "out");
  const int64_t vocab = table.dim(0);
  const int64_t width = table.dim(1);
  const int64_t rows = int64_t(ids.size());
  require_elements(out, rows * width, op, "out");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      bad_argument(cat({op, ": ids[", std::to_string(i), "]"}),
                   cat({"a token id in [0, ", std::to_string(vocab), ")"}), std::to_string(ids[i]));
  if (rows == 0) return;
  activate();
  // A step's few ids travel in the kernel's arguments (no copy to order before it); a
  // recorded step reads the ids its replay sets.
  cuda::SmallIds small;
  const bool by_value = rows <= cuda::SmallIds::kCapacity;
  if (by_value) std::copy(ids.begin(), ids.end(), small.ids);
  const int32_t* device_ids = nullptr;
  if (capture_.active) {
    if (rows != capture_.rows)
      bad_argument(op + ": ids (recording a step)",
                   cat({std::to_string(capture_.rows), " ids (the recorded rows)"}),
                   std::to_string(rows));
    device_ids = step_state()->ids;
  } else if (!by_value) {
    device_ids = stage(ids);
  }
  cuda::launch_embed(table.data, table.dtype, width, device_ids, small, rows, out.as<float>(),
                     stream());
  check_launch("embed");
}

void CudaBackend::matmul(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y) {
  const ProductShape shape = product_shape("matmul", x, w, y);
  if (shape.rows == 0 || shape.out == 0) return;
  activate();
  if (shape.rows <= cuda::kMaxGemvRows) {
    // Decode (one row per run): stream the weights once at memory bandwidth.
    const DeviceTensor* const ws[] = {&w};
    DeviceTensor* const ys[] = {&y};
    launch_products(x, ws, ys, shape, false);
    return;
  }
  gemm(x, w, y, shape);
}

// q, k and v (or gate and up) of a decode step: one launch, each product with matmul's bits.
void CudaBackend::matmul_many(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                              std::span<DeviceTensor* const> ys) {
  ProductShape shape;
  if (!decode_products("matmul_many", x, ws, ys, shape)) {
    Backend::matmul_many(x, ws, ys);
    return;
  }
  if (shape.out == 0) return;
  activate();
  launch_products(x, ws, ys, shape, false);
}

// The residual add as the product's last step (one addition per element, add_inplace's bits).
void CudaBackend::matmul_add(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& scratch,
                             DeviceTensor& acc) {
  const ProductShape shape = product_shape("matmul_add", x, w, acc);
  if (shape.rows < 1 || shape.rows > cuda::kMaxGemvRows || shape.out == 0) {
    Backend::matmul_add(x, w, scratch, acc);
    return;
  }
  activate();
  const DeviceTensor* const ws[] = {&w};
  DeviceTensor* const ys[] = {&acc};
  launch_products(x, ws, ys, shape, true);
}

// The norm in the products' kernel where the rows fit in its shared memory (the bits of
// rmsnorm then matmul_many, normed included), for fewer than kSeparateNormRows rows or rows
// narrower than kSeparateNormWidth: every block of the fused kernel normalises all the rows
// again, which at 8 rows of 2048 (lockstep, 1B shape) was about a quarter of the gate/up
// kernel's instructions (ncu, H100), so there the rmsnorm op runs first, once.
void CudaBackend::rmsnorm_matmul_many(const DeviceTensor& x, const DeviceTensor& norm_weight,
                                      float eps, DeviceTensor& normed,
                                      std::span<const DeviceTensor* const> ws,
                                      std::span<DeviceTensor* const> ys) {
  ProductShape shape;
  if (!decode_products("rmsnorm_matmul_many", x, ws, ys, shape) ||
      !norm_fusable(x, ws, norm_weight, normed, shape)) {
    Backend::rmsnorm_matmul_many(x, norm_weight, eps, normed, ws, ys);
    return;
  }
  activate();
  if (norm_first(shape.rows, shape.in, normed)) {
    rmsnorm(x, norm_weight, eps, normed);
    launch_products(normed, ws, ys, shape, false);
    return;
  }
  launch_products(x, ws, ys, shape, false, &norm_weight, eps, &normed);
}

void CudaBackend::rmsnorm_gate_up(const DeviceTensor& x, const DeviceTensor& norm_weight, float eps,
                                  DeviceTensor& normed, const DeviceTensor& w_gate,
                                  const DeviceTensor& w_up, DeviceTensor& gate, DeviceTensor& up,
                                  DeviceTensor& act) {
  const DeviceTensor* const ws[] = {&w_gate, &w_up};
  DeviceTensor* const ys[] = {&gate, &up};
  ProductShape shape;
  const bool fused = decode_products("rmsnorm_gate_up", x, ws, ys, shape) &&
                     norm_fusable(x, ws, norm_weight, normed, shape) &&
                     w_gate.shape == w_up.shape && act.dtype == DType::F32 &&
                     elements(act) == elements(gate);
  if (!fused) {
    Backend::rmsnorm_gate_up(x, norm_weight, eps, normed, w_gate, w_up, gate, up, act);
    return;
  }
  activate();
  DeviceTensor* const act_out[] = {&act};
  if (norm_first(shape.rows, shape.in, normed)) {
    rmsnorm(x, norm_weight, eps, normed);
    launch_products(normed, ws, act_out, shape, false, nullptr, 0.0f, nullptr, true);
    return;
  }
  launch_products(x, ws, act_out, shape, false, &norm_weight, eps, &normed, true);
}

void CudaBackend::rmsnorm(const DeviceTensor& x, const DeviceTensor& weight, float eps,
                          DeviceTensor& y) {
  const std::string op = "rmsnorm";
  require(x, DType::F32, op, "x");
  require_weight(weight, op, "weight");
  require(y, DType::F32, op, "y");
  const int64_t width = elements(weight);
  if (width == 0 || elements(x) % width != 0)
    bad_argument(op + ": x", cat({"rows of ", std::to_string(width)}), describe(x));
  require_elements(y, elements(x), op, "y");
  activate();
  cuda::launch_rmsnorm(x.as<float>(), weight.data, weight.dtype, elements(x) / width, width, eps,
                       y.as<float>(), stream());
  check_launch("rmsnorm");
}

void CudaBackend::rope(DeviceTensor& x, std::span<const int64_t> positions,
                       const DeviceTensor& inv_freq, float scale) {
  rope_rows(x, nullptr, positions, inv_freq, scale);
}

void CudaBackend::rope_pair(DeviceTensor& q, DeviceTensor& k, std::span<const int64_t> positions,
                            const DeviceTensor& inv_freq, float scale) {
  rope_rows(q, &k, positions, inv_freq, scale);
}

void CudaBackend::silu_mul(const DeviceTensor& gate, const DeviceTensor& up, DeviceTensor& out) {
  require_gated(gate, up, out, "silu_mul");
  activate();
  cuda::launch_silu_mul(gate.as<float>(), up.as<float>(), elements(gate), out.as<float>(),
                        stream());
  check_launch("silu_mul");
}

void CudaBackend::gelu_tanh_mul(const DeviceTensor& gate, const DeviceTensor& up,
                                DeviceTensor& out) {
  require_gated(gate, up, out, "gelu_tanh_mul");
  activate();
  cuda::launch_gelu_tanh_mul(gate.as<float>(), up.as<float>(), elements(gate), out.as<float>(),
                             stream());
  check_launch("gelu_tanh_mul");
}

void CudaBackend::soft_cap(DeviceTensor& x, float cap) {
  const std::string op = "soft_cap";
  require(x, DType::F32, op, "x");
  if (!(cap > 0.0f) || !std::isfinite(cap))
    bad_argument(op + ": cap", "a finite number > 0", std::to_string(cap));
  activate();
  cuda::launch_soft_cap(x.as<float>(), elements(x), cap, stream());
  check_launch("soft_cap");
}

void CudaBackend::layer_norm(const DeviceTensor& x, const DeviceTensor& weight,
                             const DeviceTensor& bias, float eps, DeviceTensor& y) {
  const std::string op = "layer_norm";
  require(x, DType::F32, op, "x");
  require_weight(weight, op, "weight");
  require_weight(bias, op, "bias");
  require(y, DType::F32, op, "y");
  const int64_t width = elements(weight);
  if (width == 0 || elements(bias) != width || elements(x) % width != 0)
    bad_argument(op + ": x", cat({"rows of ", std::to_string(width), " and a bias as wide"}),
                 describe(x) + ", bias " + describe(bias));
  require_elements(y, elements(x), op, "y");
  if (weight.dtype != bias.dtype) bad_argument(op + ": bias", "the weight's dtype", describe(bias));
  activate();
  cuda::launch_layer_norm(x.as<float>(), weight.data, bias.data, weight.dtype, elements(x) / width,
                          width, eps, y.as<float>(), stream());
  check_launch("layer_norm");
}

void CudaBackend::bias_activation(DeviceTensor& x, const DeviceTensor* bias, Activation act) {
  const std::string op = "bias_activation";
  require(x, DType::F32, op, "x");
  int64_t width = elements(x);
  if (bias != nullptr) {
    require_weight(*bias, op, "bias");
    width = elements(*bias);
    if (width == 0 || elements(x) % width != 0)
      bad_argument(op + ": x", cat({"rows of ", std::to_string(width)}), describe(x));
  }
  activate();
  const int kind = act == Activation::Gelu ? 1 : act == Activation::Silu ? 2 : 0;
  cuda::launch_bias_activation(x.as<float>(), elements(x), bias ? bias->data : nullptr,
                               bias ? bias->dtype : DType::F32, width, kind, stream());
  check_launch("bias_activation");
}

void CudaBackend::add_inplace(DeviceTensor& x, const DeviceTensor& y) {
  const std::string op = "add_inplace";
  require(x, DType::F32, op, "x");
  require(y, DType::F32, op, "y");
  require_elements(y, elements(x), op, "y");
  activate();
  cuda::launch_add_inplace(x.as<float>(), y.as<float>(), elements(x), stream());
  check_launch("add_inplace");
}

// kv_append's checks, and its kernel's arguments.
cuda::AppendArgs CudaBackend::append_args(const DeviceTensor& k, const DeviceTensor& v,
                                          DeviceTensor& k_cache, DeviceTensor& v_cache,
                                          int64_t first_position) const {
  const std::string op = "kv_append";
  // An empty v_cache: keys alone (Backend::kv_append).
  const bool keys_only = v_cache.empty();
  const CacheShape cache =
      keys_only ? cache_shape(k_cache, op, "k_cache") : cache_shape(k_cache, v_cache, op);
  require(k, DType::F32, op, "k");
  if (!keys_only) require(v, DType::F32, op, "v");
  const int64_t row_elements = cache.kv_heads * cache.head_dim;
  if (row_elements == 0 || elements(k) % row_elements != 0)
    bad_argument(
        op + ": k",
        cat({"[n, ", std::to_string(cache.kv_heads), ", ", std::to_string(cache.head_dim), "]"}),
        describe(k));
  if (!keys_only) require_elements(v, elements(k), op, "v");
  const int64_t rows = elements(k) / row_elements;
  if (first_position < 0 || first_position + rows > cache.capacity)
    bad_argument(op, cat({"positions inside the cache capacity ", std::to_string(cache.capacity)}),
                 cat({std::to_string(first_position), " + ", std::to_string(rows), " rows"}));
  cuda::AppendArgs args;
  args.k = k.as<float>();
  args.v = keys_only ? nullptr : v.as<float>();
  args.k_cache = k_cache.data;
  args.v_cache = keys_only ? nullptr : v_cache.data;
  args.rows = rows;
  args.kv_heads = cache.kv_heads;
  args.head_dim = cache.head_dim;
  args.capacity = cache.capacity;
  args.first_position = first_position;
  args.step_position = step_position(first_position, op);
  return args;
}

void CudaBackend::kv_append(const DeviceTensor& k, const DeviceTensor& v, DeviceTensor& k_cache,
                            DeviceTensor& v_cache, int64_t first_position) {
  const cuda::AppendArgs args = append_args(k, v, k_cache, v_cache, first_position);
  activate();
  cuda::launch_kv_append({&args, 1}, k_cache.dtype, stream());
  check_launch("kv_append");
}

// Every run checked first; runs whose caches share a dtype in one launch (all of them, in a
// lockstep step).
void CudaBackend::kv_append_runs(std::span<const RunAppend> runs, int64_t first_position) {
  thread_local std::vector<cuda::AppendArgs> args;  // reused: every layer of a lockstep step
  args.clear();
  for (const RunAppend& run : runs)
    args.push_back(append_args(*run.k, *run.v, *run.k_cache, *run.v_cache, first_position));
  if (args.empty()) return;
  activate();
  for_cache_dtype_stretches(runs, [&](size_t first, size_t end, DType dtype) {
    cuda::launch_kv_append(std::span(args).subspan(first, end - first), dtype, stream());
    check_launch("kv_append");
  });
}

// kv_append's checks and rope's for each run; runs whose caches share a dtype in one launch.
void CudaBackend::rope_append_runs(std::span<const RunRopeAppend> runs, int64_t position,
                                   const DeviceTensor& inv_freq, float scale) {
  const std::string op = "rope_append_runs";
  require(inv_freq, DType::F32, op, "inv_freq");
  const int64_t rotary_dim = 2 * elements(inv_freq);
  thread_local std::vector<cuda::RopeAppendArgs> args;  // reused: every layer of every step
  args.clear();
  for (const RunRopeAppend& run : runs) {
    if (run.q == nullptr || run.k == nullptr || run.v == nullptr || run.k_cache == nullptr ||
        run.v_cache == nullptr)
      bad_argument(op + ": runs", "q, k, v and both caches for every run", "a null tensor");
    require(*run.q, DType::F32, op, "q");
    const cuda::AppendArgs append =
        append_args(*run.k, *run.v, *run.k_cache, *run.v_cache, position);
    const int64_t D = append.head_dim;
    if (append.rows != 1 || append.v_cache == nullptr)
      bad_argument(op + ": k", "one row [1, G, D] and a value cache", describe(*run.k));
    if (run.q->shape.size() != 3 || run.q->dim(0) != 1 || run.q->dim(2) != D || rotary_dim == 0 ||
        rotary_dim > D)
      bad_argument(op + ": q",
                   cat({"one row [1, heads, ", std::to_string(D),
                        "], D >= ", std::to_string(rotary_dim), " rotated channels"}),
                   describe(*run.q));
    cuda::RopeAppendArgs& a = args.emplace_back();
    a.q = run.q->as<float>();
    a.k = run.k->as<float>();
    a.v = append.v;
    a.k_cache = append.k_cache;
    a.v_cache = append.v_cache;
    a.q_heads = elements(*run.q) / D;
    a.kv_heads = append.kv_heads;
    a.head_dim = D;
    a.capacity = append.capacity;
    a.position = position;
    a.step_position = append.step_position;
  }
  if (args.empty()) return;
  activate();
  for_cache_dtype_stretches(runs, [&](size_t first, size_t end, DType dtype) {
    cuda::launch_rope_append(std::span(args).subspan(first, end - first), rotary_dim,
                             inv_freq.as<float>(), scale, dtype, stream());
    check_launch("rope_append_runs");
  });
}

// The arguments every attention call shares (q, caches, out, positions), checked under `op`.
cuda::AttentionArgs CudaBackend::attention_args(const std::string& op, const DeviceTensor& q,
                                                const DeviceTensor& k_cache,
                                                const DeviceTensor& v_cache, int64_t first_position,
                                                int64_t window, DeviceTensor& out) const {
  const CacheShape cache = cache_shape(k_cache, v_cache, op);
  require(q, DType::F32, op, "q");
  require(out, DType::F32, op, "out");
  if (q.shape.size() != 3 || q.dim(2) != cache.head_dim || cache.kv_heads == 0 ||
      q.dim(1) % cache.kv_heads != 0)
    bad_argument(op + ": q",
                 cat({"[n, H, ", std::to_string(cache.head_dim), "] with H a multiple of ",
                      std::to_string(cache.kv_heads), " KV heads"}),
                 describe(q));
  const int64_t rows = q.dim(0);
  require_elements(out, elements(q), op, "out");
  const int64_t context = first_position + rows;
  if (first_position < 0 || context > cache.capacity)
    bad_argument(op, cat({"positions inside the cache capacity ", std::to_string(cache.capacity)}),
                 cat({std::to_string(first_position), " + ", std::to_string(rows), " rows"}));
  cuda::AttentionArgs args;
  args.q = q.as<float>();
  args.k_cache = k_cache.data;
  args.v_cache = v_cache.data;
  args.cache_dtype = k_cache.dtype;
  args.out = out.as<float>();
  args.mask_stride = context;
  args.rows = rows;
  args.heads = q.dim(1);
  args.kv_heads = cache.kv_heads;
  args.head_dim = cache.head_dim;
  args.capacity = cache.capacity;
  args.first_position = first_position;
  args.window = window;
  args.context = context;
  args.logits_stride = context;
  // head_dim^-0.5 rounded to F32 once, as transformers multiplies F32 scores by the Python
  // float `scaling`.
  args.scale = attention_scale(cache.head_dim);
  return args;
}

void CudaBackend::attention(const DeviceTensor& q, const DeviceTensor& k_cache,
                            const DeviceTensor& v_cache, int64_t first_position, int64_t window,
                            Visibility visible, DeviceTensor& out, DeviceTensor* logits_out) {
  const std::string op = "attention";
  cuda::AttentionArgs args = attention_args(op, q, k_cache, v_cache, first_position, window, out);
  const int64_t rows = args.rows, heads = args.heads, context = args.context;
  const bool want_logits = logits_out != nullptr && !logits_out->empty();
  if (want_logits) {
    require(*logits_out, DType::F32, op, "logits_out");
    const std::vector<int64_t>& shape = logits_out->shape;
    if (shape.size() != 3 || shape[0] != rows || shape[1] != heads || shape[2] < context)
      bad_argument(op + ": logits_out",
                   cat({"F32 [", std::to_string(rows), ", ", std::to_string(heads),
                        ", S >= ", std::to_string(context), "]"}),
                   describe(*logits_out));
  }
  if (visible.mask != nullptr) {
    const DeviceTensor& mask = *visible.mask;
    require(mask, DType::U8, op, "visibility mask");
    if (rows != 1) bad_argument(op + ": visibility mask", "n == 1", std::to_string(rows));
    if (mask.shape.size() != 2 || mask.dim(0) != heads || mask.dim(1) != context)
      bad_argument(op + ": visibility mask",
                   cat({"U8 [", std::to_string(heads), ", ", std::to_string(context), "]"}),
                   describe(mask));
  }
  if (rows == 0) return;
  activate();
  args.logits = want_logits ? logits_out->as<float>() : nullptr;
  args.mask = visible.mask ? visible.mask->as<uint8_t>() : nullptr;
  args.logits_stride = want_logits ? logits_out->dim(2) : context;
  const int64_t floats = cuda::decode_attention_scratch_floats(args, sm_count_);
  if (capture_.active) {
    // Only the split decode kernel replays at other positions (it reads the position on the
    // device); the per-row kernel sizes its work by the context. Logits replay into the same
    // rows, so they must be as wide as the cache (any later context fits).
    if (floats == 0 || (want_logits && logits_out->dim(2) < args.capacity))
      bad_argument(op,
                   "an op of an unrecorded step (rows > 1, logits narrower than the cache, or "
                   "a head group the split kernel does not take)",
                   "a step being recorded");
    args.step_position = step_position(first_position, op);
  }
  if (floats > 0) {
    float* parts =
        static_cast<float*>(lane().attention_parts.get(device_, size_t(floats) * sizeof(float)));
    cuda::launch_decode_attention(args, parts, sm_count_, stream());
  } else {
    cuda::launch_attention(args, stream());
  }
  check_launch("attention");
}

// Each run by the split decode attention under its mask (rows [H, stride] of the session's
// masks): the logits are computed inside, with attention_logits' bits, and the key and value rows
// no head of a KV head sees are not read. The runs go in one launch of each kernel where they
// share a shape (a coref sample's runs: an eval of short contexts is bound by launches), with the
// bits of each alone. A run the split kernel does not take (a head group it has no shape for),
// or one wanting probabilities, goes the default way, alone.
void CudaBackend::attention_masked_runs(std::span<const RunAttention> runs, int64_t shared,
                                        int64_t position, int64_t window) {
  const std::string op = "attention_masked_runs";
  thread_local std::vector<cuda::DecodeRun> decode;
  thread_local std::vector<int64_t> floats;
  decode.clear();
  floats.clear();
  for (const RunAttention& run : runs) {
    if (run.q == nullptr || run.k_cache == nullptr || run.v_cache == nullptr ||
        run.out == nullptr || run.probs != nullptr || capture_.active) {
      Backend::attention_masked_runs(std::span(&run, 1), shared, position, window);
      continue;
    }
    cuda::AttentionArgs args =
        attention_args(op, *run.q, *run.k_cache, *run.v_cache, position, window, *run.out);
    if (args.rows != 1) bad_argument(op + ": q", "one row", describe(*run.q));
    if (run.visible != nullptr) {
      const RowShape mask =
          row_shape(*run.visible, DType::U8, args.heads, position + 1, op, "visible");
      args.mask = run.visible->as<uint8_t>();
      args.mask_stride = mask.stride;
    }
    const int64_t needed = cuda::decode_attention_scratch_floats(args, sm_count_);
    if (needed == 0) {
      Backend::attention_masked_runs(std::span(&run, 1), shared, position, window);
      continue;
    }
    decode.push_back({args, nullptr});
    floats.push_back(needed);
  }
  if (decode.empty()) return;
  activate();
  int64_t total = 0;
  for (const int64_t f : floats) total += f;
  float* parts =
      static_cast<float*>(lane().attention_parts.get(device_, size_t(total) * sizeof(float)));
  for (size_t i = 0; i < decode.size(); ++i) {
    decode[i].scratch = parts;
    parts += floats[i];
  }
  cuda::launch_decode_attention_runs(decode, sm_count_, stream());
  check_launch("attention_masked_runs");
}

void CudaBackend::argmax_rows(const DeviceTensor& x, std::span<int32_t> out) {
  const std::string op = "argmax_rows";
  const int64_t rows = int64_t(out.size());
  const int64_t cols = logit_columns(x, rows, op);
  if (rows == 0) return;
  activate();
  auto* device_out = static_cast<int32_t*>(lane().results.get(device_, out.size_bytes()));
  cuda::launch_argmax_rows(x.as<float>(), rows, cols, device_out, stream());
  check_launch("argmax_rows");
  copy_results(device_out, out.data(), out.size_bytes());
}

void CudaBackend::log_prob_rows(const DeviceTensor& x, std::span<const int32_t> targets,
                                std::span<double> out) {
  const std::string op = "log_prob_rows";
  if (targets.size() != out.size())
    bad_argument(op + ": out", std::to_string(targets.size()) + " values (one per target)",
                 std::to_string(out.size()));
  const int64_t rows = int64_t(out.size());
  const int64_t cols = logit_columns(x, rows, op);
  for (size_t i = 0; i < targets.size(); ++i)
    if (targets[i] < 0 || targets[i] >= cols)
      bad_argument(cat({op, ": targets[", std::to_string(i), "]"}),
                   cat({"a token id in [0, ", std::to_string(cols), ")"}),
                   std::to_string(targets[i]));
  if (rows == 0) return;
  activate();
  const int32_t* device_targets = stage(targets);
  auto* device_out = static_cast<double*>(lane().results.get(device_, out.size_bytes()));
  cuda::launch_log_prob_rows(x.as<float>(), rows, cols, device_targets, device_out, stream());
  check_launch("log_prob_rows");
  copy_results(device_out, out.data(), out.size_bytes());
}

// Decode products of one input (every weight of one dtype, 1..kMaxGemvRows rows, at most
// kMaxGemvProducts of them): checks them and sums their widths into shape.out; false where
// the gemv kernel does not take them (then the caller falls back to the generic path).
bool CudaBackend::decode_products(const std::string& op, const DeviceTensor& x,
                                  std::span<const DeviceTensor* const> ws,
                                  std::span<DeviceTensor* const> ys, ProductShape& shape) {
  if (ws.size() != ys.size())
    bad_argument(op + ": ys", std::to_string(ws.size()) + " outputs (one per weight)",
                 std::to_string(ys.size()));
  bool fits = ws.size() <= size_t(cuda::kMaxGemvProducts) && !ws.empty();
  shape = ProductShape{};
  for (size_t i = 0; i < ws.size(); ++i) {
    const ProductShape one = product_shape(op, x, *ws[i], *ys[i]);
    fits = fits && one.rows >= 1 && one.rows <= cuda::kMaxGemvRows && ws[i]->dtype == ws[0]->dtype;
    shape.rows = one.rows;
    shape.in = one.in;
    shape.out += one.out;
  }
  return fits;
}

// Whether an RMSNorm over x's rows (and a SiLU pair) can run inside the products' kernel: the
// warp kernel takes the operands (gemv_fusable; the scalar fallback fuses nothing) and the
// rows fit in its shared memory.
bool CudaBackend::norm_fusable(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                               const DeviceTensor& norm_weight, const DeviceTensor& normed,
                               const ProductShape& shape) {
  cuda::GemvProducts products;
  for (size_t i = 0; i < ws.size(); ++i) products.w[i] = ws[i]->data;
  products.count = int(ws.size());
  // (the fused kernel is built for a norm weight in F32 or in the products' dtype)
  return (norm_weight.dtype == DType::F32 || norm_weight.dtype == ws[0]->dtype) &&
         elements(norm_weight) == shape.in && normed.dtype == DType::F32 &&
         elements(normed) == elements(x) && cuda::gemv_stages_rows(shape.rows, shape.in) &&
         cuda::gemv_fusable(x.as<float>(), products, ws[0]->dtype, shape.rows, shape.in);
}

void CudaBackend::launch_products(const DeviceTensor& x, std::span<const DeviceTensor* const> ws,
                                  std::span<DeviceTensor* const> ys, const ProductShape& shape,
                                  bool accumulate, const DeviceTensor* norm_weight, float eps,
                                  DeviceTensor* normed, bool silu_pair) {
  cuda::GemvCall call;
  call.x = x.as<float>();
  call.rows = shape.rows;
  call.in = shape.in;
  call.w_dtype = ws[0]->dtype;
  call.accumulate = accumulate;
  call.silu_pair = silu_pair;
  for (size_t i = 0; i < ws.size(); ++i) {
    call.products.w[i] = ws[i]->data;
    call.products.y[i] = silu_pair ? ys[0]->as<float>() : ys[i]->as<float>();
    call.products.out[i] = ws[i]->dim(0);
  }
  call.products.count = int(ws.size());
  call.weights_uploaded = std::all_of(ws.begin(), ws.end(),
                                      [](const DeviceTensor* w) { return is_uploaded_weight(*w); });
  if (norm_weight != nullptr) {
    call.norm_weight = norm_weight->data;
    call.norm_dtype = norm_weight->dtype;
    call.norm_uploaded = is_uploaded_weight(*norm_weight);
    call.eps = eps;
    call.normed = normed->as<float>();
  }
  cuda::launch_gemv(call, sm_count_, stream());
  check_launch("gemv");
}

// Logit rows for argmax / log_prob: x [rows, V] F32; returns V.
int64_t CudaBackend::logit_columns(const DeviceTensor& x, int64_t rows, const std::string& op) {
  require(x, DType::F32, op, "x");
  const int64_t cols = x.shape.empty() ? 0 : x.shape.back();
  if (cols <= 0 || cols > INT32_MAX || rows * cols != elements(x))
    bad_argument(op + ": x", std::to_string(rows) + " rows of logits", describe(x));
  return cols;
}

// The operands of y[n, out] = x[n, in] * w[out, in]^T, checked.
CudaBackend::ProductShape CudaBackend::product_shape(const std::string& op, const DeviceTensor& x,
                                                     const DeviceTensor& w, const DeviceTensor& y) {
  require(x, DType::F32, op, "x");
  require_weight(w, op, "w");
  require(y, DType::F32, op, "y");
  if (w.shape.size() != 2) bad_argument(op + ": w", "[out, in]", describe(w));
  const int64_t out_features = w.dim(0);
  const int64_t in_features = w.dim(1);
  if (in_features == 0 || elements(x) % in_features != 0)
    bad_argument(op + ": x", cat({"rows of ", std::to_string(in_features)}), describe(x));
  const int64_t rows = elements(x) / in_features;
  require_elements(y, rows * out_features, op, "y");
  if (rows > INT_MAX || in_features > INT_MAX || out_features > INT_MAX)
    bad_argument(op, "dimensions below 2^31 (cuBLAS int API)", describe(x) + " x " + describe(w));
  return {rows, in_features, out_features};
}

// Many rows (a prefill chunk): cuBLAS SGEMM; BF16/F16 weights over slices of output features
// widened to F32 in a bounded scratch buffer (exact widening, the F32 products the CPU
// reference computes).
void CudaBackend::gemm(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y,
                       const ProductShape& shape) {
  // One cuBLAS handle for every lane: its stream is set per call, under the lock.
  std::lock_guard<std::mutex> lock(blas_mutex_);
  check_cublas(cublasSetStream(blas_.get(), stream()), "cublasSetStream");
  if (w.dtype == DType::F32) {
    check_cublas(cuda::sgemm_x_wt(blas_.get(), x.as<float>(), w.as<float>(), y.as<float>(),
                                  shape.rows, shape.in, shape.out, shape.out),
                 "cublasSgemm");
    return;
  }
  constexpr int64_t kWidenedElements = int64_t(1) << 24;  // 64 MiB of F32
  const int64_t slice = std::max<int64_t>(1, kWidenedElements / shape.in);
  float* widened = static_cast<float*>(
      lane().widen.get(device_, size_t(std::min(slice, shape.out) * shape.in) * sizeof(float)));
  const size_t element_bytes = dtype_size(w.dtype);
  for (int64_t first = 0; first < shape.out; first += slice) {
    const int64_t count = std::min(slice, shape.out - first);
    cuda::launch_widen_to_f32(
        static_cast<const char*>(w.data) + size_t(first * shape.in) * element_bytes, w.dtype,
        count * shape.in, widened, stream());
    check_launch("widen_to_f32");
    check_cublas(cuda::sgemm_x_wt(blas_.get(), x.as<float>(), widened, y.as<float>() + first,
                                  shape.rows, shape.in, count, shape.out),
                 "cublasSgemm");
  }
}

// While a step is being recorded: the device copy of its position, which the recorded kernels
// read (`position` must be the recorded one); null otherwise.
// rope of x, and of x2 where given, in one launch.
void CudaBackend::rope_rows(DeviceTensor& x, DeviceTensor* x2, std::span<const int64_t> positions,
                            const DeviceTensor& inv_freq, float scale) {
  const std::string op = "rope";
  require(inv_freq, DType::F32, op, "inv_freq");
  // The rotated channels come from inv_freq [R/2], the head dimension from a 3-D x [n, heads,
  // D] (else D = R), the heads from x's size.
  const int64_t rotary_dim = 2 * elements(inv_freq);
  const int64_t rows = int64_t(positions.size());
  auto heads_of = [&](const DeviceTensor& t, const char* name, int64_t head_dim) {
    require(t, DType::F32, op, name);
    if (rotary_dim == 0 || rotary_dim > head_dim || (rows == 0 && elements(t) != 0) ||
        (rows > 0 && elements(t) % (rows * head_dim) != 0))
      bad_argument(op + ": " + name,
                   cat({"[", std::to_string(rows), ", heads, ", std::to_string(head_dim),
                        "], D >= ", std::to_string(rotary_dim)}),
                   describe(t));
    return rows > 0 ? elements(t) / (rows * head_dim) : 0;
  };
  const int64_t head_dim = x.shape.size() == 3 ? x.shape[2] : rotary_dim;
  const int64_t heads = heads_of(x, "x", head_dim);
  int64_t heads2 = 0;
  if (x2 != nullptr) {
    if ((x2->shape.size() == 3 ? x2->shape[2] : rotary_dim) != head_dim)
      bad_argument(op + ": k", cat({"[n, heads, ", std::to_string(head_dim), "]"}), describe(*x2));
    heads2 = heads_of(*x2, "k", head_dim);
  }
  if (rows == 0 || (heads == 0 && heads2 == 0)) return;
  activate();
  // A step's rows share one position and a chunk's are consecutive: then the kernel derives
  // them from two values passed by value, with no host-to-device copy to order first.
  const int64_t first = positions[0];
  const int64_t stride = rows > 1 ? positions[1] - positions[0] : 0;
  bool arithmetic = stride == 0 || stride == 1;
  for (int64_t i = 2; i < rows && arithmetic; ++i)
    arithmetic = positions[size_t(i)] == first + i * stride;
  const int64_t* recorded = nullptr;
  if (capture_.active) {
    if (!arithmetic || stride != 0)
      bad_argument(op + ": positions (recording a step)", "the recorded step's position",
                   "several positions");
    recorded = step_position(first, op);
  }
  const int64_t* device_positions = arithmetic ? nullptr : stage(positions);
  float* first_rows = heads > 0 ? x.as<float>() : x2->as<float>();
  const int64_t first_heads = heads > 0 ? heads : heads2;
  cuda::launch_rope(first_rows, first_heads, heads > 0 && x2 ? x2->as<float>() : nullptr,
                    heads > 0 ? heads2 : 0, rows, head_dim, rotary_dim, device_positions, first,
                    stride, recorded, inv_freq.as<float>(), scale, stream());
  check_launch("rope");
}

}  // namespace kvlens::cuda
