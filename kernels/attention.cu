// KV-cache append and attention of q[rows, H, D] over caches [G, capacity, D]. The attention
// kernel runs one block per (query row, head) and walks the visible keys in tiles with an online
// softmax, so nothing of size `context` is kept except the optional logits output.
#include "kernels/attention.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kAppendThreads = 256;
constexpr int kThreads = 128;  // 4 warps
constexpr int kWarps = kThreads / 32;
constexpr int kTile = 256;  // keys scored per pass; their weights live in shared memory

// One thread per element of k/v [rows, G, D]: element (r, g, d) goes to cache[g, p0 + r, d].
template <typename C, int kRuns>
__global__ void kv_append_kernel(const __grid_constant__ RunBatch<AppendArgs, kRuns> batch) {
  begin_dependent_grid();
  const AppendArgs& a = batch_run(batch);
  const int64_t head_dim = a.head_dim, kv_heads = a.kv_heads;
  const int64_t count = a.rows * kv_heads * head_dim;
  const int64_t first_position = a.step_position != nullptr ? *a.step_position : a.first_position;
  C* k_cache = static_cast<C*>(a.k_cache);
  C* v_cache = static_cast<C*>(a.v_cache);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % head_dim;
    const int64_t g = (i / head_dim) % kv_heads;
    const int64_t r = i / (head_dim * kv_heads);
    const int64_t dst = (g * a.capacity + first_position + r) * head_dim + d;
    k_cache[dst] = from_f32<C>(a.k[i]);
    if (v_cache != nullptr) v_cache[dst] = from_f32<C>(a.v[i]);
  }
}

// Shared memory (dynamic): q[D] | acc[D] | weights[kTile].
// The running max `m` and sum `l` are block-uniform: every thread derives them from the same
// block reductions, so the control flow that depends on them is uniform too.
template <typename C>
__global__ void attention_kernel(AttentionArgs a) {
  begin_dependent_grid();
  extern __shared__ float shared[];
  __shared__ float scratch[32];
  const int64_t D = a.head_dim;
  float* q = shared;
  float* acc = shared + D;
  float* weights = shared + 2 * D;

  const int64_t row = blockIdx.x / a.heads;
  const int64_t h = blockIdx.x % a.heads;
  const int64_t g = h / (a.heads / a.kv_heads);  // GQA: consecutive query heads share a KV head
  const int64_t position = a.first_position + row;
  const int64_t lo = a.window > 0 && position - a.window + 1 > 0 ? position - a.window + 1 : 0;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int lanes = key_lanes(D);
  const int sub = lane % lanes;
  const int keys_per_warp = 32 / lanes;
  const float* q_row = a.q + (row * a.heads + h) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) q[d] = q_row[d], acc[d] = 0.0f;

  float* logits = a.logits ? a.logits + (row * a.heads + h) * a.logits_stride : nullptr;
  if (logits) {
    // Keys outside [lo, position] (outside the window, or in the future of this row).
    for (int64_t j = threadIdx.x; j < a.context; j += blockDim.x)
      if (j < lo || j > position) logits[j] = -INFINITY;
  }
  const uint8_t* mask = a.mask ? a.mask + h * a.mask_stride : nullptr;
  const C* keys = static_cast<const C*>(a.k_cache) + g * a.capacity * D;
  const C* values = static_cast<const C*>(a.v_cache) + g * a.capacity * D;
  __syncthreads();

  float m = -INFINITY;  // running max of the logits seen so far
  float l = 0.0f;       // running sum of exp(logit - m)
  for (int64_t start = lo; start <= position; start += kTile) {
    const int count = int(position - start + 1 < kTile ? position - start + 1 : kTile);
    // Score: key_lanes(D) lanes per key (key_dot); `first` is warp-uniform, so every lane
    // reaches the shuffles.
    for (int first = warp * keys_per_warp; first < count; first += kWarps * keys_per_warp) {
      const int jj = first + lane / lanes;
      const int64_t j = start + jj;
      const bool visible = jj < count && (!mask || mask[j]);
      const float dot = key_dot(q, keys + (visible ? j : 0) * D, D, sub, lanes, visible);
      if (jj < count && sub == 0) {
        const float logit = visible ? dot * a.scale : -INFINITY;
        weights[jj] = logit;
        if (logits) logits[j] = logit;
      }
    }
    __syncthreads();
    float tile_max = -INFINITY;
    for (int jj = threadIdx.x; jj < count; jj += blockDim.x)
      tile_max = fmaxf(tile_max, weights[jj]);
    tile_max = block_reduce(tile_max, MaxOp{}, -INFINITY, scratch);
    const float new_m = fmaxf(m, tile_max);
    if (new_m == -INFINITY) continue;  // nothing visible yet; block-uniform
    // Rescale what was accumulated under the old max (exp(-inf) = 0 on the first visible tile).
    const float correction = expf(m - new_m);
    float tile_sum = 0.0f;
    for (int jj = threadIdx.x; jj < count; jj += blockDim.x) {
      const float e = expf(weights[jj] - new_m);  // invisible keys: exp(-inf) = 0
      weights[jj] = e;
      tile_sum += e;
    }
    tile_sum = block_reduce(tile_sum, SumOp{}, 0.0f, scratch);  // also publishes `weights`
    l = l * correction + tile_sum;
    m = new_m;
    // Weighted sum of values: each thread owns dimensions d (coalesced value reads per key).
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      float sum = acc[d] * correction;
      for (int jj = 0; jj < count; ++jj) sum += weights[jj] * to_f32(values[(start + jj) * D + d]);
      acc[d] = sum;
    }
    __syncthreads();  // `weights` is rewritten by the next tile
  }
  // A row with no visible key has no softmax; it gets zeros rather than NaN.
  float* out = a.out + (row * a.heads + h) * D;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[d] = acc[d] * inv;
}

}  // namespace

void launch_kv_append(std::span<const AppendArgs> runs, DType cache_dtype, cudaStream_t stream) {
  int64_t count = 0;
  for (const AppendArgs& run : runs)
    count = std::max(count, run.rows * run.kv_heads * run.head_dim);
  if (count <= 0) return;
  dispatch_weight(cache_dtype, [&](auto tag) {
    using C = decltype(tag);
    for_run_batches(runs, [&]<int kRuns>(const RunBatch<AppendArgs, kRuns>& batch, int runs_in) {
      const dim3 grid(grid_for(count, kAppendThreads), 1, unsigned(runs_in));
      launch_dependent(kv_append_kernel<C, kRuns>, grid, kAppendThreads, 0, stream, batch);
    });
  });
}

void launch_attention(const AttentionArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.heads <= 0) return;
  const size_t shared_bytes = size_t(2 * args.head_dim + kTile) * sizeof(float);
  dispatch_weight(args.cache_dtype, [&](auto tag) {
    launch_dependent(attention_kernel<decltype(tag)>, unsigned(args.rows * args.heads), kThreads,
                     shared_bytes, stream, args);
  });
}

}  // namespace kvlens::cuda
