// Split-context decode attention (see decode_attention.cuh). Scratch layout for S slices:
// max[S, H] | sum[S, H] | acc[S, H, D] (the slice's unnormalised weighted values).
#include "kernels/decode_attention.cuh"
#include "kernels/device_common.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMinSliceKeys = 32;
constexpr int64_t kSharedFloats = 48 * 1024 / 4;  // the default dynamic shared memory limit

struct Plan {
  int64_t lo = 0, keys = 0, slice_keys = 0, slices = 0;
};

int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

Plan plan(const AttentionArgs& a, int sm_count) {
  Plan p;
  const int64_t position = a.first_position;
  p.lo = a.window > 0 && position - a.window + 1 > 0 ? position - a.window + 1 : 0;
  p.keys = position - p.lo + 1;
  const int64_t group = a.heads / a.kv_heads;
  // Shared memory: the group's queries [group, D] and one slice's weights [group, slice_keys].
  const int64_t max_slice =
      (kSharedFloats - group * a.head_dim) / group / kMinSliceKeys * kMinSliceKeys;
  // About two blocks per SM over all KV heads, each slice at least kMinSliceKeys keys.
  const int64_t wanted_slices =
      (2 * int64_t(sm_count > 0 ? sm_count : 132) + a.kv_heads - 1) / a.kv_heads;
  int64_t slice = round_up((p.keys + wanted_slices - 1) / wanted_slices, kMinSliceKeys);
  if (slice > max_slice) slice = max_slice;
  p.slice_keys = slice;
  if (slice < kMinSliceKeys) return p;  // does not fit: no scratch, launch_attention does it
  p.slices = (p.keys + slice - 1) / slice;
  return p;
}

// Shared (dynamic): q[group, D] | weights[group, slice_keys].
template <typename C>
__global__ void __launch_bounds__(kThreads)
    decode_slices_kernel(AttentionArgs a, int64_t lo, int64_t slice_keys, float* scratch,
                         int64_t slices) {
  extern __shared__ float shared[];
  const int64_t D = a.head_dim;
  const int64_t group = a.heads / a.kv_heads;
  const int64_t g = blockIdx.y;
  const int64_t slice = blockIdx.x;
  const int64_t position = a.first_position;
  const int64_t start = lo + slice * slice_keys;
  const int64_t end = start + slice_keys - 1 < position ? start + slice_keys - 1 : position;
  const int count = int(end - start + 1);
  float* q = shared;
  float* weights = shared + group * D;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;

  for (int64_t i = threadIdx.x; i < group * D; i += blockDim.x) q[i] = a.q[g * group * D + i];
  if (a.logits != nullptr && slice == 0) {
    // Keys before the window's first: not visible (rows == 1, so none lies past position).
    for (int64_t h = 0; h < group; ++h)
      for (int64_t j = threadIdx.x; j < lo; j += blockDim.x)
        a.logits[(g * group + h) * a.context + j] = -INFINITY;
  }
  __syncthreads();

  const C* keys = static_cast<const C*>(a.k_cache) + g * a.capacity * D;
  const C* values = static_cast<const C*>(a.v_cache) + g * a.capacity * D;
  // Scores: one warp per key, read once for every query head of the group (group_dots: the
  // bits of warp_dot), lanes over the head dimension.
  for (int jj = warp; jj < count; jj += kWarps) {
    const int64_t j = start + jj;
    auto emit = [&](int64_t h, float dot) {
      const int64_t head = g * group + h;
      const bool seen = a.mask == nullptr || a.mask[head * a.mask_stride + j];
      const float logit = seen ? dot * a.scale : -INFINITY;
      if (lane == 0) {
        weights[h * slice_keys + jj] = logit;
        if (a.logits != nullptr) a.logits[head * a.context + j] = logit;
      }
    };
    if (D <= kMaxGroupDotDim) {
      group_dots(q, group, keys + j * D, D, lane, emit);
    } else {
      for (int64_t h = 0; h < group; ++h) emit(h, warp_dot(q + h * D, keys + j * D, D, lane));
    }
  }
  __syncthreads();

  float* slice_max = scratch;
  float* slice_sum = scratch + slices * a.heads;
  float* slice_acc = scratch + 2 * slices * a.heads;
  // The slice's softmax pieces per head: one warp per head.
  for (int64_t h = warp; h < group; h += kWarps) {
    float* w = weights + h * slice_keys;
    float m = -INFINITY;
    for (int jj = lane; jj < count; jj += 32) m = fmaxf(m, w[jj]);
    m = warp_reduce(m, MaxOp{});
    float l = 0.0f;
    for (int jj = lane; jj < count; jj += 32) {
      const float e = m == -INFINITY ? 0.0f : expf(w[jj] - m);  // nothing visible: all zero
      w[jj] = e;
      l += e;
    }
    l = warp_reduce(l, SumOp{});
    if (lane == 0) {
      slice_max[slice * a.heads + g * group + h] = m;
      slice_sum[slice * a.heads + g * group + h] = l;
    }
  }
  __syncthreads();
  // Weighted values: a thread per (head, dimension); consecutive dimensions read one value row.
  for (int64_t i = threadIdx.x; i < group * D; i += blockDim.x) {
    const int64_t h = i / D;
    const int64_t d = i % D;
    const float* w = weights + h * slice_keys;
    const C* v = values + start * D + d;
    float acc = 0.0f;
    for (int jj = 0; jj < count; ++jj) acc += w[jj] * to_f32(v[int64_t(jj) * D]);
    slice_acc[(slice * a.heads + g * group + h) * D + d] = acc;
  }
}

// One block per query head: merge the slices under the overall max.
__global__ void decode_merge_kernel(AttentionArgs a, const float* scratch, int64_t slices) {
  const int64_t head = blockIdx.x;
  const int64_t D = a.head_dim;
  const float* slice_max = scratch;
  const float* slice_sum = scratch + slices * a.heads;
  const float* slice_acc = scratch + 2 * slices * a.heads;
  float m = -INFINITY;
  for (int64_t s = 0; s < slices; ++s) m = fmaxf(m, slice_max[s * a.heads + head]);
  float l = 0.0f;
  for (int64_t s = 0; s < slices; ++s) {
    const float sm = slice_max[s * a.heads + head];
    if (sm != -INFINITY) l += slice_sum[s * a.heads + head] * expf(sm - m);
  }
  // A head with no visible key has no softmax; it gets zeros rather than NaN.
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t s = 0; s < slices; ++s) {
      const float sm = slice_max[s * a.heads + head];
      if (sm != -INFINITY) acc += slice_acc[(s * a.heads + head) * D + d] * expf(sm - m);
    }
    a.out[head * D + d] = acc * inv;
  }
}

}  // namespace

int64_t decode_attention_scratch_floats(const AttentionArgs& args, int sm_count) {
  if (args.rows != 1 || args.heads <= 0 || args.kv_heads <= 0 || args.head_dim <= 0 ||
      args.heads % args.kv_heads != 0)
    return 0;
  const Plan p = plan(args, sm_count);
  if (p.slice_keys < kMinSliceKeys) return 0;
  return p.slices * args.heads * (args.head_dim + 2);
}

void launch_decode_attention(const AttentionArgs& args, float* scratch, int sm_count,
                             cudaStream_t stream) {
  const Plan p = plan(args, sm_count);
  const int64_t group = args.heads / args.kv_heads;
  const size_t shared_bytes = size_t(group * (args.head_dim + p.slice_keys)) * sizeof(float);
  const dim3 grid(unsigned(p.slices), unsigned(args.kv_heads));
  dispatch_weight(args.cache_dtype, [&](auto tag) {
    decode_slices_kernel<decltype(tag)>
        <<<grid, kThreads, shared_bytes, stream>>>(args, p.lo, p.slice_keys, scratch, p.slices);
  });
  const int merge_threads = args.head_dim >= 128 ? 128 : (args.head_dim > 32 ? 64 : 32);
  decode_merge_kernel<<<unsigned(args.heads), merge_threads, 0, stream>>>(args, scratch, p.slices);
}

}  // namespace kvlens::cuda
