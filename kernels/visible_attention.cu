// attention_visible on the GPU, split over the context so that every SM has work at any length
// (see policy_ops.cuh); caches of at most kWholeKeys positions take one kernel, a block per head
// over every column. Otherwise three kernels per call: each head's max visible logit; per (slice,
// head) the exponentials exp(logit - max) (the probabilities before normalisation, written in
// place), their sum and the slice's weighted value sum; then per head the total, the output and the
// probabilities scaled by 1 / total. Exponentials use the head's overall max, as the CPU
// reference does, so the probabilities agree with it to rounding of the sums alone.
// The slice count depends on the cache's capacity and the head count only, and each slice's
// width on the context (known on the device), so a captured step replays at any position with
// the arithmetic of an uncaptured one. Scratch: max[H] | slice_sum[S, H] | slice_acc[S, H, D].
#include <algorithm>

#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kMinSliceKeys = 64;
constexpr int64_t kMaxSliceKeys = 8192;
// Up to this capacity a call is one kernel (visible_whole_kernel): at 512 tokens on an H100 it
// takes 17 us where the split's three took 19 us (4 + 10 + 5), and a policy run makes a call in
// every layer, so two launches a layer go (the coref eval, bound by launches: 7.8 -> 6.5 s).
// Decided by the capacity, so a captured step does what an uncaptured one does.
constexpr int64_t kWholeKeys = 1024;
constexpr int kWholeThreads = 1024;  // 16 key lanes for a head dimension of 64

// About eight blocks per SM over all heads, at most one per kMinSliceKeys keys of the cache and
// at most kMaxSliceKeys keys a slice (its weights stay within the default shared memory).
int64_t slice_count(const VisibleAttentionArgs& a, int sm_count) {
  const int64_t sms = sm_count > 0 ? sm_count : 132;
  int64_t slices = (8 * sms + a.heads - 1) / a.heads;
  const int64_t most = (a.capacity + kMinSliceKeys - 1) / kMinSliceKeys;
  if (slices > most) slices = most;
  const int64_t least = (a.capacity + kMaxSliceKeys - 1) / kMaxSliceKeys;
  if (slices < least) slices = least;
  return slices < 1 ? 1 : slices;
}

// Keys per slice for `cols` columns over `slices` slices: a multiple of 32.
__host__ __device__ __forceinline__ int64_t slice_width(int64_t cols, int64_t slices) {
  const int64_t keys = (cols + slices - 1) / slices;
  return keys < 32 ? 32 : (keys + 31) / 32 * 32;
}

__device__ __forceinline__ int64_t column_count(const VisibleAttentionArgs& a) {
  return a.step_position != nullptr ? *a.step_position + 1 : a.cols;
}

__device__ __forceinline__ bool seen_at(const VisibleAttentionArgs& a, int64_t h, int64_t j) {
  return a.visible.data == nullptr || a.visible.data[h * a.visible.stride + j] != 0;
}

// Head h's largest visible logit over columns [0, cols), by the whole block. fmaxf skips NaN, as
// std::max(max, NaN) does on the CPU.
__device__ float visible_max(const VisibleAttentionArgs& a, int64_t h, int64_t cols,
                             float* scratch) {
  const float* row = a.logits.data + h * a.logits.stride;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    if (seen_at(a, h, j)) m = fmaxf(m, row[j]);
  return block_reduce(m, MaxOp{}, -INFINITY, scratch);
}

// Column j's unnormalised probability exp(logit - m) for head h with max m; 0 where hidden,
// where the logit is -inf, and everywhere when nothing finite is visible (m = -inf).
__device__ __forceinline__ float visible_weight(const VisibleAttentionArgs& a, int64_t h, int64_t j,
                                                float m) {
  const float logit = a.logits.data[h * a.logits.stride + j];
  return (m != -INFINITY && seen_at(a, h, j) && logit != -INFINITY) ? expf(logit - m) : 0.0f;
}

// The weighted value sums of `count` keys: threads are (key lane, dimension) pairs (key lanes x
// the head dimension rounded up to 32); key lane l sums the keys jj = l, l + lanes, ... of
// values[jj, :] with weights[jj] (shared memory), then the lanes' sums are added in lane order
// and store(i, total) receives dimension i. Every value below count is read and a hidden key
// (weight 0) is skipped by a select, so the loads of several keys are in flight at once (a branch
// around them made each wait for the one before: 43 us a call at 512 tokens on an H100). Reuses
// `weights` for the lanes' sums (lanes * D floats), so it must hold that many.
template <typename C, typename Store>
__device__ void weighted_value_sums(const C* values, float* weights, int count, int64_t D,
                                    Store store) {
  const int64_t dims = (D + 31) / 32 * 32;
  const int64_t lanes = blockDim.x / dims;
  const int64_t key_lane = threadIdx.x / dims;
  const int64_t d = threadIdx.x % dims;
  float sum = 0.0f;
  if (key_lane < lanes && d < D) {
#pragma unroll 8
    for (int jj = int(key_lane); jj < count; jj += int(lanes)) {
      const float w = weights[jj];
      const float value = to_f32(values[int64_t(jj) * D + d]);
      sum = w != 0.0f ? fmaf(w, value, sum) : sum;
    }
  }
  __syncthreads();  // `weights` is reused for the lanes' sums
  float* lane_sums = weights;
  if (key_lane < lanes && d < D) lane_sums[key_lane * D + d] = sum;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    float total = 0.0f;
    for (int64_t l = 0; l < lanes; ++l) total += lane_sums[l * D + i];
    store(i, total);
  }
}

// One block per head.
__global__ void visible_max_kernel(VisibleAttentionArgs a, float* head_max) {
  begin_dependent_grid();
  __shared__ float scratch[32];
  const float m = visible_max(a, blockIdx.x, column_count(a), scratch);
  if (threadIdx.x == 0) head_max[blockIdx.x] = m;
}

// Grid (slices, heads); blockDim = key lanes x the head dimension rounded up to 32.
template <typename C>
__global__ void visible_slice_kernel(VisibleAttentionArgs a, const float* head_max, int64_t slices,
                                     float* slice_sum, float* slice_acc) {
  begin_dependent_grid();
  extern __shared__ float weights[];
  __shared__ float scratch[32];
  const int64_t h = blockIdx.y;
  const int64_t slice = blockIdx.x;
  const int64_t D = a.head_dim;
  const int64_t g = h / (a.heads / a.kv_heads);
  const int64_t cols = column_count(a);
  const int64_t slice_keys = slice_width(cols, slices);
  const int64_t start = slice * slice_keys;
  if (start >= cols) return;  // past the context: the merge does not read this slice
  const int count = int(cols - start < slice_keys ? cols - start : slice_keys);
  // Nothing finite visible (m = -inf): every weight 0, and the merge writes zeros.
  const float m = head_max[h];
  float* probs = a.probs.data ? a.probs.data + h * a.probs.stride : nullptr;
  float partial = 0.0f;
  for (int jj = threadIdx.x; jj < count; jj += blockDim.x) {
    const int64_t j = start + jj;
    const float e = visible_weight(a, h, j, m);
    weights[jj] = e;
    partial += e;
    if (probs) probs[j] = e;  // scaled by 1 / total in the merge
  }
  partial = block_reduce(partial, SumOp{}, 0.0f, scratch);  // also publishes `weights`
  if (threadIdx.x == 0) slice_sum[slice * a.heads + h] = partial;
  if (a.out == nullptr) return;
  const C* values = static_cast<const C*>(a.v_cache) + (g * a.capacity + start) * D;
  weighted_value_sums(values, weights, count, D, [&](int64_t i, float total) {
    slice_acc[(slice * a.heads + h) * D + i] = total;
  });
}

// Key lanes of a block of at most `threads` threads as (key lane, dimension) pairs: whole
// multiples of the head dimension rounded up to 32.
int64_t value_lanes(int64_t head_dim, int64_t threads) {
  const int64_t dims = (head_dim + 31) / 32 * 32;
  return dims >= threads ? 1 : threads / dims;
}

// A cache of at most kWholeKeys positions: one block per head does the three kernels' work over
// every column (the max, the exponentials and their sum, the weighted values by key lanes added in
// lane order, then the scaling). Shared (dynamic): the weights [max(capacity, lanes * D)].
template <typename C, int kRuns>
__global__ void __launch_bounds__(kWholeThreads)
    visible_whole_kernel(const __grid_constant__ RunBatch<VisibleAttentionArgs, kRuns> batch) {
  begin_dependent_grid();
  const VisibleAttentionArgs& a = batch_run(batch);
  extern __shared__ float weights[];
  __shared__ float scratch[32];
  const int64_t h = blockIdx.x;
  const int64_t D = a.head_dim;
  const int64_t g = h / (a.heads / a.kv_heads);
  const int count = int(column_count(a));
  float* probs = a.probs.data ? a.probs.data + h * a.probs.stride : nullptr;
  const float m = visible_max(a, h, count, scratch);
  float partial = 0.0f;
  for (int j = threadIdx.x; j < count; j += blockDim.x) {
    const float e = visible_weight(a, h, j, m);
    weights[j] = e;
    partial += e;
  }
  const float total = block_reduce(partial, SumOp{}, 0.0f, scratch);  // also publishes `weights`
  // Nothing finite visible: zeros, as attention gives.
  const float inv = m == -INFINITY ? 0.0f : 1.0f / total;
  if (probs)
    for (int j = threadIdx.x; j < count; j += blockDim.x) probs[j] = weights[j] * inv;
  if (a.out == nullptr) return;
  const C* values = static_cast<const C*>(a.v_cache) + g * a.capacity * D;
  weighted_value_sums(values, weights, count, D,
                      [&](int64_t i, float value) { a.out[h * D + i] = value * inv; });
}

// One block per head: the total over the slices in use, the output and the probabilities.
// head_max null: no column at all (zeros). Every step reads all slices at once (threads over the
// slices, then over (slice group, dimension) pairs): a few memory latencies at any slice count.
// Shared (dynamic): sums[groups, D].
constexpr int kMergeThreads = 256;
__global__ void __launch_bounds__(kMergeThreads)
    visible_merge_kernel(VisibleAttentionArgs a, const float* head_max, int64_t slices,
                         const float* slice_sum, const float* slice_acc) {
  begin_dependent_grid();
  extern __shared__ float sums[];
  __shared__ float scratch[32];
  const int64_t h = blockIdx.x;
  const int64_t D = a.head_dim;
  const int64_t cols = head_max != nullptr ? column_count(a) : 0;
  const int64_t width = cols > 0 ? slice_width(cols, slices) : 1;
  const int64_t used = cols > 0 ? (cols + width - 1) / width : 0;
  float total = 0.0f;
  for (int64_t s = threadIdx.x; s < used; s += blockDim.x) total += slice_sum[s * a.heads + h];
  total = block_reduce(total, SumOp{}, 0.0f, scratch);
  const bool none = head_max == nullptr || head_max[h] == -INFINITY;  // zeros, as attention gives
  const float inv = none ? 0.0f : 1.0f / total;
  if (a.out != nullptr) {
    merge_slices(used, D, inv, sums, a.out + h * D, [&](float acc, int64_t s, int64_t d) {
      return acc + slice_acc[(s * a.heads + h) * D + d];
    });
  }
  if (a.probs.data != nullptr) {
    float* probs = a.probs.data + h * a.probs.stride;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) probs[j] *= inv;
  }
}

// Dynamic shared memory of visible_merge_kernel.
size_t merge_shared_bytes(int64_t head_dim) {
  const int64_t groups = head_dim >= kMergeThreads ? 1 : kMergeThreads / head_dim;
  return size_t(groups * head_dim) * sizeof(float);
}

// Three kernels per call (the module comment); no column at all: the merge alone (zeros).
void launch_split(const VisibleAttentionArgs& args, float* scratch, int sm_count,
                  cudaStream_t stream) {
  if (args.heads <= 0) return;
  if (args.cols <= 0 && args.step_position == nullptr) {
    // No column: every head sees nothing.
    launch_dependent(visible_merge_kernel, unsigned(args.heads), kMergeThreads,
                     merge_shared_bytes(args.head_dim), stream, args, nullptr, 0, nullptr, nullptr);
    return;
  }
  const int64_t slices = slice_count(args, sm_count);
  float* head_max = scratch;
  float* slice_sum = scratch + args.heads;
  float* slice_acc = slice_sum + slices * args.heads;
  launch_dependent(visible_max_kernel, unsigned(args.heads), kMaxThreads, 0, stream, args,
                   head_max);
  // Whole multiples of the 32-rounded head dimension, so that every thread has a (key lane,
  // dimension) pair; shared memory holds a slice's weights (as wide as the widest slice the
  // context can need: the capacity's, on a captured step), then the lanes' sums.
  const int64_t dims = (args.head_dim + 31) / 32 * 32;
  const int64_t lanes = value_lanes(args.head_dim, kMaxThreads);
  const int threads = int(lanes * dims);
  const int64_t widest =
      slice_width(args.step_position != nullptr ? args.capacity : args.cols, slices);
  const int64_t shared_floats = widest > lanes * args.head_dim ? widest : lanes * args.head_dim;
  const dim3 grid(unsigned(slices), unsigned(args.heads));
  dispatch_weight(args.cache_dtype, [&](auto tag) {
    launch_dependent(visible_slice_kernel<decltype(tag)>, grid, threads,
                     size_t(shared_floats) * sizeof(float), stream, args, head_max, slices,
                     slice_sum, slice_acc);
  });
  launch_dependent(visible_merge_kernel, unsigned(args.heads), kMergeThreads,
                   merge_shared_bytes(args.head_dim), stream, args, head_max, slices, slice_sum,
                   slice_acc);
}

// visible_whole_kernel over runs of the same head count, head dimension and cache dtype.
void launch_whole(std::span<const VisibleAttentionArgs> runs, cudaStream_t stream) {
  const VisibleAttentionArgs& first = runs[0];
  int64_t capacity = 0;
  for (const VisibleAttentionArgs& run : runs) capacity = std::max(capacity, run.capacity);
  const int64_t lanes = value_lanes(first.head_dim, kWholeThreads);
  const int threads = int(lanes * ((first.head_dim + 31) / 32 * 32));
  const int64_t floats = std::max(capacity, lanes * first.head_dim);
  dispatch_weight(first.cache_dtype, [&](auto tag) {
    using C = decltype(tag);
    for_run_batches(runs,
                    [&]<int kRuns>(const RunBatch<VisibleAttentionArgs, kRuns>& batch, int count) {
                      const dim3 grid(unsigned(first.heads), 1, unsigned(count));
                      launch_dependent(visible_whole_kernel<C, kRuns>, grid, threads,
                                       size_t(floats) * sizeof(float), stream, batch);
                    });
  });
}

}  // namespace

int64_t visible_attention_scratch_floats(const VisibleAttentionArgs& args, int sm_count) {
  if (args.heads <= 0) return 0;
  return args.heads + slice_count(args, sm_count) * args.heads * (1 + args.head_dim);
}

void launch_attention_visible(std::span<const VisibleAttentionArgs> runs, float* scratch,
                              int sm_count, cudaStream_t stream) {
  // Each run takes the path it would take alone (the capacity decides): runs that all take the
  // one kernel and are alike (a lockstep step's) share its launches; any other mix goes one run
  // at a time, the split's over the same scratch.
  const auto one_kernel = [](const VisibleAttentionArgs& run) {
    return run.heads > 0 && run.capacity <= kWholeKeys &&
           (run.cols > 0 || run.step_position != nullptr);
  };
  const auto alike = [&](const VisibleAttentionArgs& run) {
    return one_kernel(run) && run.heads == runs[0].heads && run.head_dim == runs[0].head_dim &&
           run.cache_dtype == runs[0].cache_dtype;
  };
  if (runs.empty()) return;
  if (std::all_of(runs.begin(), runs.end(), alike)) {
    launch_whole(runs, stream);
    return;
  }
  for (const VisibleAttentionArgs& run : runs) {
    if (one_kernel(run))
      launch_whole({&run, 1}, stream);
    else
      launch_split(run, scratch, sm_count, stream);
  }
}

}  // namespace kvlens::cuda
