// KeyDiff's kernel (keydiff_kernels.cuh): the policy's op extension on the CUDA backend
// (cuda_policy_ops.cpp). Keys: k_cache [kv_heads, capacity, D]; members U8 and out F32 [rows,
// stride].
#include <cooperative_groups.h>

#include <algorithm>

#include "engine/backend/policy_op_math.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/policy/keydiff_kernels.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kAnchorThreads = 256;
constexpr int kAnchorWarps = kAnchorThreads / 32;
constexpr int kMostSegments = 8;  // blocks a row at most: the portable cluster size

// One lane's chunk of 8 channels of a key, loaded without a branch: 16-byte words where D is a
// multiple of 8 (kVector), else element by element with the index clamped to the row. A chunk
// at or past D loads the row's first chunk and widens to zeros, as does a key past the columns.
template <typename C, bool kVector>
struct KeyWords;
template <typename C>
struct KeyWords<C, true> {
  uint4 words[kChunkWords<C>];
  __device__ __forceinline__ void load(const C* row, int64_t D, int64_t d0) {
    const C* chunk = row + (d0 < D ? d0 : 0);
#pragma unroll
    for (int w = 0; w < kChunkWords<C>; ++w)
      words[w] = *reinterpret_cast<const uint4*>(chunk + w * kPerWord<C>);
  }
  __device__ __forceinline__ void widen(int64_t D, int64_t d0, bool valid,
                                        float (&out)[kKeyChunk]) const {
    widen_chunk<C>(words, out);
    if (!valid || d0 >= D) {
#pragma unroll
      for (int i = 0; i < kKeyChunk; ++i) out[i] = 0.0f;
    }
  }
};
template <typename C>
struct KeyWords<C, false> {
  C elements[kKeyChunk];
  __device__ __forceinline__ void load(const C* row, int64_t D, int64_t d0) {
#pragma unroll
    for (int i = 0; i < kKeyChunk; ++i) elements[i] = row[d0 + i < D ? d0 + i : D - 1];
  }
  __device__ __forceinline__ void widen(int64_t D, int64_t d0, bool valid,
                                        float (&out)[kKeyChunk]) const {
#pragma unroll
    for (int i = 0; i < kKeyChunk; ++i) out[i] = valid && d0 + i < D ? to_f32(elements[i]) : 0.0f;
  }
};

// A cluster of `segments` blocks per row (blockIdx.x the segment, blockIdx.y the row), each over
// a contiguous segment of the columns; `lanes` lanes per key (key_lanes: a lane holds kChunks
// chunks of 8 channels), so a warp takes 32 / lanes keys at once. Each batch asks for every key
// and member flag it will use before it waits for any (one round trip to L2 a batch, where a
// thread walking its keys' channels one load after another waited on dozens). Then:
//  1. each lane sums its channels of the normalised member keys of its segment it meets (norms by
//     a butterfly over the key's lanes), the lanes of a channel are summed across the warp's
//     keys, then the warps in order: the segment's sum and member count, which every block of the
//     cluster adds up in segment order from the others' shared memory: the anchor;
//  2. a second pass over the segment's keys: each key's dot with the anchor and its norm, by the
//     same butterfly, written by the key's first lane.
// Fixed assignment and order (the segment count is the launch's, from the row count and the
// columns alone): the result does not depend on scheduling, and a row's bits not on the rows
// beside it. One block a row took 17 us at 512 tokens on an H200 (32 rows: 32 of 132
// multiprocessors, each issuing 3,700 instructions a warp).
template <typename C, int kChunks, bool kVector>
__global__ void __launch_bounds__(kAnchorThreads) key_anchor_scores_kernel(KeyAnchorArgs a) {
  begin_dependent_grid();
  constexpr int kBatch = 4 / kChunks;  // keys a lane holds at once
  constexpr float kTiny = 1e-12f;
  extern __shared__ float shared[];  // warp_sums [kAnchorWarps][D] | segment_sum [D] | anchor [D]
  __shared__ unsigned scratch[32];
  __shared__ unsigned segment_count;
  const int64_t D = a.head_dim;
  float* warp_sums = shared;
  float* segment_sum = shared + kAnchorWarps * D;
  float* anchor = segment_sum + D;
  const int lanes = kChunks > 1 ? 32 : key_lanes(D);
  const int lane = int(threadIdx.x & 31), warp = int(threadIdx.x >> 5);
  const int part = lane % lanes, slot = lane / lanes;
  const int64_t per_pass = int64_t(kAnchorWarps) * (32 / lanes);  // keys a batch step covers
  const int64_t first_key = int64_t(warp) * (32 / lanes) + slot;
  const int segments = int(gridDim.x), segment = int(blockIdx.x);
  const int64_t width = (a.cols + segments - 1) / segments;
  const int64_t begin = segment * width < a.cols ? segment * width : a.cols;
  const int64_t end = begin + width < a.cols ? begin + width : a.cols;
  const int64_t r = blockIdx.y;
  const C* keys = static_cast<const C*>(a.k_cache) + (r / a.rows_per_group) * a.capacity * D;
  const uint8_t* member =
      a.members.data + (a.members_per_group ? r / a.rows_per_group : r) * a.members.stride;
  float* out = a.out.data + r * a.out.stride;
  auto channel = [&](int c) { return int64_t(part + c * lanes) * kKeyChunk; };
  // A key's lanes' sum of v, the same bits in each of them (an xor butterfly pairs the same terms).
  auto key_sum = [&](float v) {
    for (int offset = lanes / 2; offset > 0; offset >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  };
  // Branch-free (addresses clamped to the segment, the values past it zeroed afterwards), so
  // that the compiler issues every load of the batch before the first conversion waits: guarded
  // by branches, each load waited for the one before (one L2 round trip a key).
  auto load_batch = [&](int64_t base, float(&chunk)[kBatch][kChunks][kKeyChunk],
                        bool(&taken)[kBatch], bool members) {
    KeyWords<C, kVector> raw[kBatch][kChunks];
    uint8_t flag[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t j = base + b * per_pass + first_key;
      const int64_t at = j < end ? j : end - 1;
      flag[b] = members ? member[at] : uint8_t(1);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) raw[b][c].load(keys + at * D, D, channel(c));
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t j = base + b * per_pass + first_key;
      taken[b] = j < end && flag[b] != 0;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) raw[b][c].widen(D, channel(c), j < end, chunk[b][c]);
    }
  };

  float sums[kChunks][kKeyChunk] = {};
  unsigned count = 0;
  for (int64_t base = begin; base < end; base += per_pass * kBatch) {
    float chunk[kBatch][kChunks][kKeyChunk];
    bool taken[kBatch];
    load_batch(base, chunk, taken, true);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      float squared = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int i = 0; i < kKeyChunk; ++i) squared = fmaf(chunk[b][c][i], chunk[b][c][i], squared);
      squared = key_sum(squared);
      if (!taken[b]) continue;
      const float inverse = 1.0f / fmaxf(sqrtf(squared), kTiny);
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int i = 0; i < kKeyChunk; ++i) sums[c][i] = fmaf(chunk[b][c][i], inverse, sums[c][i]);
      if (part == 0) ++count;
    }
  }
  // The lanes of one channel across the warp's keys, the warps in order, then the segments.
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int i = 0; i < kKeyChunk; ++i)
      for (int offset = lanes; offset < 32; offset <<= 1)
        sums[c][i] += __shfl_xor_sync(0xffffffffu, sums[c][i], offset);
  if (slot == 0) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int i = 0; i < kKeyChunk; ++i)
        if (channel(c) + i < D) warp_sums[warp * D + channel(c) + i] = sums[c][i];
  }
  count = block_reduce(count, SumOp{}, 0u, scratch);  // also a barrier
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kAnchorWarps; ++w) sum += warp_sums[w * D + d];
    segment_sum[d] = sum;
  }
  if (threadIdx.x == 0) segment_count = count;
  // The segments' sums in segment order, from each block of the cluster's shared memory (one
  // segment: this block's, without cluster barriers).
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  auto segment_part = [&](auto* local, int s) {
    return segments > 1 ? cluster.map_shared_rank(local, s) : local;
  };
  if (segments > 1)
    cluster.sync();
  else
    __syncthreads();  // every segment's sums written
  unsigned members = 0;
  for (int s = 0; s < segments; ++s) members += *segment_part(&segment_count, s);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < segments; ++s) sum += segment_part(segment_sum, s)[d];
    anchor[d] = members > 0 ? sum / float(members) : 0.0f;
  }
  // The others' reads of this block's sums are done (it may exit); `anchor` is written.
  if (segments > 1)
    cluster.sync();
  else
    __syncthreads();
  float mine[kChunks][kKeyChunk];
  float anchor_squared = 0.0f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int i = 0; i < kKeyChunk; ++i) {
      mine[c][i] = channel(c) + i < D ? anchor[channel(c) + i] : 0.0f;
      anchor_squared = fmaf(mine[c][i], mine[c][i], anchor_squared);
    }
  const float anchor_norm = fmaxf(sqrtf(key_sum(anchor_squared)), kTiny);

  for (int64_t base = begin; base < end; base += per_pass * kBatch) {
    float chunk[kBatch][kChunks][kKeyChunk];
    bool taken[kBatch];
    load_batch(base, chunk, taken, false);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      float dot = 0.0f, squared = 0.0f;
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int i = 0; i < kKeyChunk; ++i) {
          dot = fmaf(mine[c][i], chunk[b][c][i], dot);
          squared = fmaf(chunk[b][c][i], chunk[b][c][i], squared);
        }
      dot = key_sum(dot);
      squared = key_sum(squared);
      if (taken[b] && part == 0)
        out[base + b * per_pass + first_key] = -dot / (fmaxf(sqrtf(squared), kTiny) * anchor_norm);
    }
  }
}

}  // namespace

void launch_key_anchor_scores(const KeyAnchorArgs& args, cudaStream_t stream) {
  if (args.rows <= 0 || args.cols <= 0) return;
  // Segments enough for about 128 blocks in all, none under 64 columns.
  const int64_t segments = std::clamp<int64_t>(
      std::min<int64_t>(128 / args.rows, (args.cols + 63) / 64), 1, kMostSegments);
  const size_t shared_bytes = size_t(kAnchorWarps + 2) * size_t(args.head_dim) * sizeof(float);
  dispatch_weight(args.cache_dtype, [&](auto tag) {
    using C = decltype(tag);
    auto launch = [&](auto kernel) {
      launch_dependent_cluster(kernel, dim3(unsigned(segments), unsigned(args.rows)),
                               kAnchorThreads, shared_bytes, stream, unsigned(segments), args);
    };
    auto with_chunks = [&]<int kChunks>() {
      if (args.head_dim % kKeyChunk == 0)
        launch(key_anchor_scores_kernel<C, kChunks, true>);
      else
        launch(key_anchor_scores_kernel<C, kChunks, false>);
    };
    if (args.head_dim <= kMaxKeyChunkDim)
      with_chunks.template operator()<1>();
    else if (args.head_dim <= 2 * kMaxKeyChunkDim)
      with_chunks.template operator()<2>();
    else
      with_chunks.template operator()<4>();
  });
}

}  // namespace kvlens::cuda
