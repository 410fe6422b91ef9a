// Split-context decode attention (see decode_attention.cuh). Scratch layout for S slices:
// max[S, H] | sum[S, H] | acc[S, H, D] (the slice's unnormalised weighted values), then under a
// mask the visible-key lists: count[G, chunks] | index[G, capacity] (partial_floats, list_counts).
#include "kernels/decode_attention.cuh"
#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"

#include <algorithm>
#include <cstdlib>
#include <type_traits>

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMinSliceKeys = 32;
constexpr int kBlocksPerSm = 3;   // decode_slices_kernel's launch bound
constexpr int kUnroll = 4;        // key / value rows each lane has in flight
constexpr int kHeadsPerPass = 4;  // query heads whose weighted values a lane accumulates at once
constexpr int64_t kSharedFloats = 48 * 1024 / 4;  // the default dynamic shared memory limit

// Blocks per SM the slices aim at (KVLENS_ATTENTION_BLOCKS_PER_SM, for measuring): the kernel's
// launch bound, so that a long context's slices run in one wave (H200, 1B shape, 16K context:
// 1.81 ms a step with 3, 1.96 with 2, 1.99 with 4, 1.91 with 6).
int64_t blocks_per_sm() {
  static const int64_t value = [] {
    const char* text = std::getenv("KVLENS_ATTENTION_BLOCKS_PER_SM");
    const int64_t parsed = text != nullptr ? std::atoll(text) : 0;
    return parsed > 0 && parsed <= 64 ? parsed : int64_t(kBlocksPerSm);
  }();
  return value;
}

// Shared floats besides the slice's weights: the group's queries and the per-warp partial sums.
int64_t fixed_shared_floats(int64_t group, int64_t head_dim) {
  return group * head_dim + int64_t(kWarps) * kHeadsPerPass * head_dim;
}

// How a context splits: about `target` slices (the SM count's worth of blocks over the KV
// heads), each a multiple of kMinSliceKeys keys and at most max_width (what shared memory holds).
// The grid has `slices` blocks per KV head, enough for any context of the cache; a step uses the
// first ones, as many as its context needs (used_slices), so a recorded step replays at any
// position with the arithmetic of an unrecorded one and short contexts are not cut into crumbs.
struct SlicePlan {
  int64_t target = 0, max_width = 0, slices = 0;
};

__host__ __device__ __forceinline__ int64_t slice_width(int64_t keys, const SlicePlan& plan) {
  int64_t count = plan.target;
  const int64_t most = (keys + kMinSliceKeys - 1) / kMinSliceKeys;
  if (count > most) count = most;
  const int64_t least = (keys + plan.max_width - 1) / plan.max_width;
  if (count < least) count = least;
  if (count < 1) count = 1;
  const int64_t width = (keys + count - 1) / count;
  return width < kMinSliceKeys ? kMinSliceKeys
                               : (width + kMinSliceKeys - 1) / kMinSliceKeys * kMinSliceKeys;
}

__host__ __device__ __forceinline__ int64_t used_slices(int64_t keys, const SlicePlan& plan) {
  const int64_t width = slice_width(keys, plan);
  return (keys + width - 1) / width;
}

// The most keys a query can see in this cache (the window's, with one).
int64_t most_keys(const AttentionArgs& a) {
  return a.window > 0 && a.window < a.capacity ? a.window : a.capacity;
}

// The plan depends on the cache (capacity, window, heads) alone. slices 0: the group's queries
// and the narrowest slice's weights do not fit in shared memory. A key's width budget holds its
// weights and, for a masked run over a list, its index; the lists' chunk positions (at most
// kThreads + 1) come off the top.
SlicePlan slice_plan(const AttentionArgs& a, int sm_count) {
  SlicePlan plan;
  const int64_t group = a.heads / a.kv_heads;
  plan.max_width = (kSharedFloats - fixed_shared_floats(group, a.head_dim) - (kThreads + 1)) /
                   (group + 1) / kMinSliceKeys * kMinSliceKeys;
  if (plan.max_width < kMinSliceKeys) return plan;
  // Rounded down: one wave. Rounded up, 3 x 132 / 8 KV heads asked for 400 blocks where 396
  // are resident, and the 4 left over ran as a second wave of their own.
  plan.target = blocks_per_sm() * int64_t(sm_count > 0 ? sm_count : 132) / a.kv_heads;
  if (plan.target < 1) plan.target = 1;
  const int64_t keys = most_keys(a);
  const int64_t least = (keys + plan.max_width - 1) / plan.max_width;
  plan.slices = plan.target > least ? plan.target : least;
  return plan;
}

// The first key a query at `position` sees: the window's first, or 0.
__host__ __device__ __forceinline__ int64_t first_visible_key(const AttentionArgs& a,
                                                              int64_t position) {
  return a.window > 0 && position - a.window + 1 > 0 ? position - a.window + 1 : 0;
}

struct Window {
  int64_t position, lo, keys;
};
__device__ __forceinline__ Window visible_window(const AttentionArgs& a) {
  Window w;
  w.position = a.step_position != nullptr ? *a.step_position : a.first_position;
  w.lo = first_visible_key(a, w.position);
  w.keys = w.position - w.lo + 1;
  return w;
}

// A masked decode over at least this many keys first lists the keys each KV head's group sees
// (visible_keys_kernel) and cuts its slices over that list, so a run attends over about the keys
// it kept; below it the slices walk the whole range, skipping rows no head sees (a list is one
// more launch, 3-5 us a layer, which a short context does not repay: a slice of a 4096-key
// context is 84 keys).
constexpr int64_t kIndexedFromKeys = 8192;
// The list is built in chunks of positions, a block each (kListThreads threads, kListPer keys a
// thread): chunk c's visible keys, ascending, at index[g, c * kListChunk ..], and their count.
// A slice finds its keys from the chunks' counts (at most kThreads chunks: a block scans them).
constexpr int kListThreads = 256;
constexpr int kListPer = 8;
constexpr int64_t kListChunk = int64_t(kListThreads) * kListPer;

__host__ __device__ __forceinline__ int64_t list_chunks(const AttentionArgs& a) {
  return (a.capacity + kListChunk - 1) / kListChunk;
}

// Whether this run's slices go over its listed keys: masked, not a recorded step (a masked
// run is never recorded: attention_masked_runs), over a long enough range, in a cache whose
// chunks one block can scan.
__host__ __device__ __forceinline__ bool indexed(const AttentionArgs& a) {
  if (a.mask == nullptr || a.step_position != nullptr || list_chunks(a) >= kThreads) return false;
  return a.first_position - first_visible_key(a, a.first_position) + 1 >= kIndexedFromKeys;
}

// A run's scratch, in floats: max[S, H] | sum[S, H] | acc[S, H, D], then under a mask the key
// lists as int32: count[G, list_chunks] | index[G, capacity].
__host__ __device__ __forceinline__ int64_t partial_floats(const SlicePlan& plan,
                                                           const AttentionArgs& a) {
  return plan.slices * a.heads * (a.head_dim + 2);
}
__host__ __device__ __forceinline__ int32_t* list_counts(float* scratch, const SlicePlan& plan,
                                                         const AttentionArgs& a) {
  return reinterpret_cast<int32_t*>(scratch + partial_floats(plan, a));
}
__host__ __device__ __forceinline__ const int32_t* list_counts(const float* scratch,
                                                               const SlicePlan& plan,
                                                               const AttentionArgs& a) {
  return reinterpret_cast<const int32_t*>(scratch + partial_floats(plan, a));
}
__host__ __device__ __forceinline__ int64_t list_ints(const AttentionArgs& a) {
  return a.kv_heads * (list_chunks(a) + a.capacity);
}

// The exclusive prefix of `value` over a block of kWarpsOf * 32 threads, and the block's total.
// `warp_sums` holds kWarpsOf ints; every thread of the block calls it.
template <int kWarpsOf>
__device__ __forceinline__ int block_exclusive_scan(int value, int* warp_sums, int& total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  int before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kWarpsOf; ++w) {
    const int sum = warp_sums[w];
    before += w < warp ? sum : 0;
    total += sum;
  }
  __syncthreads();  // warp_sums may be rewritten by the next call
  return before + inclusive - value;
}

// One block per (chunk of kListChunk positions, KV head, run) of an indexed run: the keys of the
// chunk in [lo, position] that some head of the group sees, ascending, into the chunk's part of
// the list, and their count; -inf logits for every head of the group at the chunk's other keys up
// to position (none of which a slice visits). Chunks wholly before lo only write logits.
template <int kRuns>
__global__ void __launch_bounds__(kListThreads)
    visible_keys_kernel(const __grid_constant__ RunBatch<DecodeRun, kRuns> batch, SlicePlan plan) {
  begin_dependent_grid();
  const AttentionArgs& a = batch_run(batch).args;
  if (!indexed(a)) return;
  __shared__ int warp_sums[kListThreads / 32];
  const int64_t chunk = blockIdx.x, g = blockIdx.y;
  const int64_t group = a.heads / a.kv_heads;
  const Window w = visible_window(a);
  const int64_t j0 = chunk * kListChunk + int64_t(threadIdx.x) * kListPer;
  unsigned flags = 0;
  for (int64_t h = 0; h < group; ++h) {
    const uint8_t* row = a.mask + (g * group + h) * a.mask_stride;
#pragma unroll
    for (int k = 0; k < kListPer; ++k) {
      const int64_t j = j0 + k;
      if (j >= w.lo && j <= w.position && row[j] != 0) flags |= 1u << k;
    }
  }
  if (a.logits != nullptr) {
    for (int k = 0; k < kListPer; ++k) {
      if (j0 + k > w.position || (flags >> k & 1u) != 0) continue;
      for (int64_t h = 0; h < group; ++h)
        a.logits[(g * group + h) * a.logits_stride + j0 + k] = -INFINITY;
    }
  }
  if (chunk * kListChunk + kListChunk <= w.lo) return;  // (uniform: no list entries)
  int total = 0;
  int at = block_exclusive_scan<kListThreads / 32>(__popc(flags), warp_sums, total);
  int32_t* const counts = list_counts(batch_run(batch).scratch, plan, a);
  int32_t* const index = counts + a.kv_heads * list_chunks(a) + g * a.capacity + chunk * kListChunk;
  for (int k = 0; k < kListPer; ++k)
    if ((flags >> k & 1u) != 0) index[at++] = int32_t(j0 + k);
  if (threadIdx.x == 0) counts[g * list_chunks(a) + chunk] = total;
}

// The keys an indexed run's group sees, from its chunks' counts (every thread of the block gets
// the total; `prefix`, when given, gets each chunk's first list position, list_chunks(a) + 1 ints).
// A block of kWarpsOf warps, at least list_chunks(a) + 1 threads.
template <int kWarpsOf>
__device__ __forceinline__ int listed_keys(const float* scratch, const SlicePlan& plan,
                                           const AttentionArgs& a, int64_t g, int* warp_sums,
                                           int* prefix) {
  const Window w = visible_window(a);
  const int64_t first_chunk = w.lo / kListChunk, chunks = w.position / kListChunk + 1;
  const int32_t* counts = list_counts(scratch, plan, a) + g * list_chunks(a);
  const int c = int(threadIdx.x);
  const int mine = c >= first_chunk && c < chunks ? counts[c] : 0;
  int total = 0;
  const int before = block_exclusive_scan<kWarpsOf>(mine, warp_sums, total);
  if (prefix != nullptr && c <= list_chunks(a)) prefix[c] = before;
  return total;
}

// Shared (dynamic): q[group, D] | partial[kWarps, kHeadsPerPass, D] | weights[group, slice_keys].
// Lanes work in aligned teams of key_lanes(D), a team per key or value row, each lane on an
// 8-element chunk (16 bytes of a BF16 row); kUnroll rows per lane are loaded before any is used.
// Group: the query heads per KV head as a constant (0: read from `a`). With it the per-head loops
// unroll and the heads' butterflies interleave; at run time they ran one after another and the
// kernel was bound by their latency and loop overhead, not by the cache's bytes (H100, 8B shape
// at 8192 tokens: 51 -> 44 us a layer for 34 MB, the step 7.86 -> 7.61 ms). Requesting the
// slice's rows into L2 up front (cp.async.bulk.prefetch) changed nothing, for the same reason.
// Batched (kRuns > 1, blockIdx.z the run): runs of one plan, each with its own scratch.
template <typename C, int Lanes, int Group, int kRuns>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    decode_slices_kernel(const __grid_constant__ RunBatch<DecodeRun, kRuns> batch, SlicePlan plan) {
  begin_dependent_grid();
  const AttentionArgs& a = batch_run(batch).args;
  float* scratch = batch_run(batch).scratch;
  extern __shared__ float shared[];
  const int64_t D = a.head_dim;
  const int64_t group = Group > 0 ? int64_t(Group) : a.heads / a.kv_heads;
  const int64_t g = blockIdx.y;
  const int64_t slice = blockIdx.x;
  const Window window = visible_window(a);
  const int64_t lo = window.lo;
  // The keys the slices share out: [lo, position], or an indexed run's list of the keys its
  // group sees (visible_keys_kernel); row jj of this slice is key key_of(jj).
  const bool by_index = indexed(a);
  __shared__ int warp_sums[kWarps];
  float* q = shared;
  float* partial = q + group * D;
  int* const chunk_first = reinterpret_cast<int*>(partial + int64_t(kWarps) * kHeadsPerPass * D);
  const int64_t chunk_ints = by_index ? list_chunks(a) + 1 : 0;
  const int64_t keys_shared =
      by_index ? listed_keys<kWarps>(scratch, plan, a, g, warp_sums, chunk_first) : window.keys;
  const int64_t slice_keys = slice_width(keys_shared, plan);
  const int64_t slices = plan.slices;
  float* const slice_max = scratch;  // the scratch's layout: see the top of the file
  float* const slice_sum = scratch + slices * a.heads;
  float* const slice_acc = scratch + 2 * slices * a.heads;
  const int64_t first = slice * slice_keys;
  if (first >= keys_shared) return;  // past the keys: the merge does not read this slice
  const int count = int(slice_keys < keys_shared - first ? slice_keys : keys_shared - first);
  const int64_t start = lo + first, end = start + count - 1;  // (unindexed)
  float* weights = reinterpret_cast<float*>(chunk_first + chunk_ints);
  // An indexed slice's keys, staged once: each row's load then waits on shared memory, not on a
  // load of its index (two dependent trips to memory a batch of rows).
  int* const slice_index = reinterpret_cast<int*>(weights + group * slice_keys);
  if (by_index) {
    __syncthreads();  // chunk_first, from listed_keys
    const int32_t* listed =
        list_counts(scratch, plan, a) + a.kv_heads * list_chunks(a) + g * a.capacity;
    const int64_t first_chunk = lo / kListChunk, chunks = window.position / kListChunk + 1;
    for (int64_t c = first_chunk; c < chunks; ++c) {
      const int64_t from = chunk_first[c] > first ? chunk_first[c] : first;
      const int64_t to = chunk_first[c + 1] < first + count ? chunk_first[c + 1] : first + count;
      for (int64_t p = from + threadIdx.x; p < to; p += blockDim.x)
        slice_index[p - first] = listed[c * kListChunk + (p - chunk_first[c])];
    }
  }
  auto key_of = [&](int jj) -> int64_t { return by_index ? slice_index[jj] : start + jj; };
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  constexpr int lanes = Lanes;  // key_lanes(D), a constant so that the shuffles unroll
  const int sub = lane % lanes;
  const int64_t d0 = int64_t(sub) * kKeyChunk;
  const bool has_chunk = d0 < D;
  constexpr int rows_per_warp = 32 / lanes;
  const int rows_per_pass = kWarps * rows_per_warp;
  const int first_row = warp * rows_per_warp + lane / lanes;

  // Under a mask (unindexed: a short context), a slice of which no head of the group sees a key
  // is done at once: its partial
  // softmax is what the passes below would leave (max -inf, sum 0, weighted values 0) and its
  // logits are -inf, so no bit changes; a run whose kept keys lie together (StreamingLLM's sinks
  // and recent window) then pays little for the rest of the context.
  if (a.mask != nullptr && !by_index) {
    bool seen = false;
    for (int64_t h = 0; h < group; ++h) {
      const uint8_t* row = a.mask + (g * group + h) * a.mask_stride + start;
      for (int jj = threadIdx.x; jj < count; jj += blockDim.x) seen = seen || row[jj] != 0;
    }
    if (!__syncthreads_or(seen)) {
      const int64_t first_head = g * group;
      for (int64_t i = threadIdx.x; i < group * D; i += blockDim.x)
        slice_acc[(slice * a.heads + first_head) * D + i] = 0.0f;
      if (threadIdx.x < group) {
        slice_max[slice * a.heads + first_head + threadIdx.x] = -INFINITY;
        slice_sum[slice * a.heads + first_head + threadIdx.x] = 0.0f;
      }
      if (a.logits != nullptr) {
        const int64_t from = slice == 0 ? 0 : start;  // slice 0 also covers the keys before lo
        for (int64_t h = 0; h < group; ++h)
          for (int64_t j = from + threadIdx.x; j <= end; j += blockDim.x)
            a.logits[(first_head + h) * a.logits_stride + j] = -INFINITY;
      }
      return;
    }
  }

  const C* keys = static_cast<const C*>(a.k_cache) + g * a.capacity * D;
  const C* values = static_cast<const C*>(a.v_cache) + g * a.capacity * D;
  for (int64_t i = threadIdx.x; i < group * D; i += blockDim.x) q[i] = a.q[g * group * D + i];
  if (a.logits != nullptr && slice == 0 && !by_index) {
    // Keys before the window's first: not visible (rows == 1, so none lies past position); an
    // indexed run's list kernel wrote them.
    for (int64_t h = 0; h < group; ++h)
      for (int64_t j = threadIdx.x; j < lo; j += blockDim.x)
        a.logits[(g * group + h) * a.logits_stride + j] = -INFINITY;
  }
  __syncthreads();

  // Under a mask, a key row no head of the group sees is not read (its logits are -inf, its
  // weights 0): a sparse run reads the rows it keeps (the union over the group's heads).
  auto group_sees = [&](int jj) {
    if (a.mask == nullptr || by_index) return true;  // (a listed key is seen)
    const uint8_t* column = a.mask + g * group * a.mask_stride + start + jj;
    for (int64_t h = 0; h < group; ++h)
      if (column[h * a.mask_stride] != 0) return true;
    return false;
  };

  // Scores (key_dot's arithmetic: the bits of attention_logits and launch_attention), kUnroll
  // rows per lane loaded before any is used. `base` minus the lane's row offset is the same for
  // every lane of the warp, so all of them reach the shuffles.
  for (int base = first_row; base - (lane / lanes) < count; base += kUnroll * rows_per_pass) {
    float chunk[kUnroll][kKeyChunk];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int jj = base + u * rows_per_pass;
      if (jj < count && group_sees(jj)) {
        load_chunk(keys + key_of(jj) * D, D, d0, chunk[u]);
      } else {
#pragma unroll
        for (int i = 0; i < kKeyChunk; ++i) chunk[u][i] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int jj = base + u * rows_per_pass;
      const bool in_slice = jj < count;
      auto store_logit = [&](int64_t h, float dot) {
        const int64_t head = g * group + h;
        const int64_t j = key_of(jj);
        const bool seen = a.mask == nullptr || a.mask[head * a.mask_stride + j];
        const float logit = seen ? dot * a.scale : -INFINITY;
        weights[h * slice_keys + jj] = logit;
        if (a.logits != nullptr) a.logits[head * a.logits_stride + j] = logit;
      };
      if constexpr (Group > 1 && (Group & (Group - 1)) == 0) {
        // The group's dots summed together (spread_sum: the bits of lanes_sum, a third of its
        // shuffles at a group of 4 and 8 lanes), each lane left with its heads' sums to store.
        float dots[Group];
#pragma unroll
        for (int h = 0; h < Group; ++h)
          dots[h] = in_slice && has_chunk ? full_chunk_dot(q + h * D + d0, chunk[u]) : 0.0f;
        constexpr int kSteps = log2_exact(lanes);
        const int first = spread_sum<Group, lanes / 2, kSteps, true>(dots, sub);
        constexpr int held = spread_sum_held(Group, kSteps);
        // (fewer heads than lanes: lanes that differ in the low bits hold copies; one stores)
        const bool stores = Group >= lanes || (sub & (lanes / Group - 1)) == 0;
        if (in_slice && stores) {
#pragma unroll
          for (int k = 0; k < held; ++k) store_logit(first + k, dots[k]);
        }
      } else {
#pragma unroll
        for (int64_t h = 0; h < group; ++h) {
          const float dot = lanes_sum(
              in_slice && has_chunk ? full_chunk_dot(q + h * D + d0, chunk[u]) : 0.0f, lanes);
          if (in_slice && sub == 0) store_logit(h, dot);
        }
      }
    }
  }
  __syncthreads();

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

  // Weighted values, kHeadsPerPass query heads at a time: each lane sums its chunk over its rows,
  // then the rows of a warp are summed by shuffles and the warps' sums in shared memory.
  for (int64_t h0 = 0; h0 < group; h0 += kHeadsPerPass) {
    float acc[kHeadsPerPass][kKeyChunk];
#pragma unroll
    for (int hh = 0; hh < kHeadsPerPass; ++hh)
#pragma unroll
      for (int i = 0; i < kKeyChunk; ++i) acc[hh][i] = 0.0f;
    for (int base = first_row; base - (lane / lanes) < count; base += kUnroll * rows_per_pass) {
      float chunk[kUnroll][kKeyChunk];
      bool weighted[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int jj = base + u * rows_per_pass;
        // (a row whose weights in this pass's heads are all 0 adds nothing: under a mask it is
        // not read; without one every row is, as before)
        weighted[u] = jj < count;
        if (weighted[u] && a.mask != nullptr) {
          bool any = false;
#pragma unroll
          for (int hh = 0; hh < kHeadsPerPass; ++hh)
            any = any || (h0 + hh < group && weights[(h0 + hh) * slice_keys + jj] != 0.0f);
          weighted[u] = any;
        }
        if (weighted[u]) load_chunk(values + key_of(jj) * D, D, d0, chunk[u]);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int jj = base + u * rows_per_pass;
        if (!weighted[u]) continue;
#pragma unroll
        for (int hh = 0; hh < kHeadsPerPass; ++hh) {
          if (h0 + hh >= group) continue;
          const float w = weights[(h0 + hh) * slice_keys + jj];
#pragma unroll
          for (int i = 0; i < kKeyChunk; ++i) acc[hh][i] = fmaf(w, chunk[u][i], acc[hh][i]);
        }
      }
    }
    // The warp's rows summed (offsets lanes, 2 lanes, .. 16) for all heads and elements at once
    // (spread_sum), each lane left with `held` of the sums to store.
    constexpr int kValues = kHeadsPerPass * kKeyChunk;
    constexpr int kRowSteps = log2_exact(32 / lanes);
    float sums[kValues];
#pragma unroll
    for (int hh = 0; hh < kHeadsPerPass; ++hh)
#pragma unroll
      for (int i = 0; i < kKeyChunk; ++i) sums[hh * kKeyChunk + i] = acc[hh][i];
    const int first = spread_sum<kValues, lanes, kRowSteps, false>(sums, lane);
    static_assert(kValues >= 32, "every lane is left with distinct sums");
    constexpr int held = spread_sum_held(kValues, kRowSteps);
    if (has_chunk) {
#pragma unroll
      for (int k = 0; k < held; ++k) {
        const int hh = (first + k) / kKeyChunk, i = (first + k) % kKeyChunk;
        partial[(int64_t(warp) * kHeadsPerPass + hh) * D + d0 + i] = sums[k];
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kHeadsPerPass * int(D); i += blockDim.x) {
      const int hh = i / int(D);
      if (h0 + hh >= group) continue;
      float sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) sum += partial[int64_t(w) * kHeadsPerPass * D + i];
      slice_acc[(slice * a.heads + g * group + h0 + hh) * D + i % int(D)] = sum;
    }
    __syncthreads();  // `partial` is rewritten by the next pass
  }
}

// One block per query head: merge the slices under the overall max. Every step reads all slices
// at once (threads over the slices, then over (slice group, dimension) pairs), so the merge costs
// a few memory latencies at any slice count. Shared (dynamic): factor[slices] | sums[groups, D].
// 1024 threads: the 43 slices of an 8K context at D = 128 take two or three loads a thread, where
// 256 threads folded 22 each (H200: 1% off the step at 4096 and 16384 tokens).
constexpr int kMergeThreads = 1024;
template <int kRuns>
__global__ void __launch_bounds__(kMergeThreads)
    decode_merge_kernel(const __grid_constant__ RunBatch<DecodeRun, kRuns> batch, SlicePlan plan) {
  begin_dependent_grid();
  const AttentionArgs& a = batch_run(batch).args;
  const float* scratch = batch_run(batch).scratch;
  const int64_t slices = plan.slices;
  extern __shared__ float merge_shared[];
  __shared__ float reduce_scratch[32];
  __shared__ int list_warp_sums[kMergeThreads / 32];
  const int64_t head = blockIdx.x;
  const int64_t D = a.head_dim;
  const float* slice_max = scratch;
  const float* slice_sum = scratch + slices * a.heads;
  const float* slice_acc = scratch + 2 * slices * a.heads;
  const int64_t keys =
      indexed(a) ? listed_keys<kMergeThreads / 32>(scratch, plan, a, head / (a.heads / a.kv_heads),
                                                   list_warp_sums, nullptr)
                 : visible_window(a).keys;
  const int64_t used = used_slices(keys, plan);
  float* factor = merge_shared;
  float* sums = merge_shared + slices;
  float m = -INFINITY;
  for (int64_t s = threadIdx.x; s < used; s += blockDim.x)
    m = fmaxf(m, slice_max[s * a.heads + head]);
  m = block_reduce(m, MaxOp{}, -INFINITY, reduce_scratch);
  float l = 0.0f;
  for (int64_t s = threadIdx.x; s < used; s += blockDim.x) {
    const float sm = slice_max[s * a.heads + head];
    const float f = sm != -INFINITY ? expf(sm - m) : 0.0f;  // a slice with nothing visible: 0
    factor[s] = f;
    l += slice_sum[s * a.heads + head] * f;
  }
  l = block_reduce(l, SumOp{}, 0.0f, reduce_scratch);  // also publishes `factor`
  // A head with no visible key has no softmax; it gets zeros rather than NaN.
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  merge_slices(used, D, inv, sums, a.out + head * D, [&](float acc, int64_t s, int64_t d) {
    return fmaf(slice_acc[(s * a.heads + head) * D + d], factor[s], acc);
  });
}

}  // namespace

int64_t decode_attention_scratch_floats(const AttentionArgs& args, int sm_count) {
  if (args.rows != 1 || args.heads <= 0 || args.kv_heads <= 0 || args.head_dim <= 0 ||
      args.head_dim < kKeyChunk || args.head_dim > kMaxKeyChunkDim ||
      args.head_dim % kKeyChunk != 0 || args.heads % args.kv_heads != 0)
    return 0;
  const SlicePlan plan = slice_plan(args, sm_count);
  if (plan.slices == 0) return 0;
  const int64_t lists = args.mask != nullptr ? list_ints(args) : 0;
  return partial_floats(plan, args) + lists;  // (int32 list entries, one float each)
}

namespace {

// The runs of one call share a plan, a key count and a head group (decode_runs_alike).
void launch_decode_runs(std::span<const DecodeRun> runs, int sm_count, cudaStream_t stream) {
  const AttentionArgs& args = runs[0].args;
  const SlicePlan plan = slice_plan(args, sm_count);
  const int64_t group = args.heads / args.kv_heads;
  // Weights of the widest slice this call can see: the cache's on a captured step.
  const int64_t keys = args.step_position != nullptr
                           ? most_keys(args)
                           : args.first_position + 1 - first_visible_key(args, args.first_position);
  const bool any_indexed =
      std::any_of(runs.begin(), runs.end(), [](const DecodeRun& run) { return indexed(run.args); });
  // (an indexed run's slices also stage the chunks' first list positions and their keys' indices)
  const int64_t width = slice_width(keys, plan);
  const int64_t list_shared = any_indexed ? list_chunks(args) + 1 + width : 0;
  const size_t shared_bytes =
      size_t(fixed_shared_floats(group, args.head_dim) + group * width + list_shared) *
      sizeof(float);
  // (a head dimension over kMergeThreads: one group of threads striding over it)
  const int64_t groups = args.head_dim >= kMergeThreads ? 1 : kMergeThreads / args.head_dim;
  const size_t merge_bytes = size_t(plan.slices + groups * args.head_dim) * sizeof(float);
  for_run_batches(runs, [&]<int kRuns>(const RunBatch<DecodeRun, kRuns>& batch, int count) {
    if (any_indexed)
      launch_dependent(visible_keys_kernel<kRuns>,
                       dim3(unsigned(args.first_position / kListChunk + 1), unsigned(args.kv_heads),
                            unsigned(count)),
                       kListThreads, 0, stream, batch, plan);
    const dim3 grid(unsigned(plan.slices), unsigned(args.kv_heads), unsigned(count));
    dispatch_weight(args.cache_dtype, [&](auto tag) {
      using C = decltype(tag);
      auto launch = [&](auto kernel) {
        launch_dependent(kernel, grid, kThreads, shared_bytes, stream, batch, plan);
      };
      // Groups of 1 (multi-head), 4 and 8 (the Llama-3 shapes) as constants.
      auto with_group = [&](auto lanes_tag) {
        constexpr int L = decltype(lanes_tag)::value;
        switch (group) {
          case 1:
            return launch(decode_slices_kernel<C, L, 1, kRuns>);
          case 4:
            return launch(decode_slices_kernel<C, L, 4, kRuns>);
          case 8:
            return launch(decode_slices_kernel<C, L, 8, kRuns>);
          default:
            return launch(decode_slices_kernel<C, L, 0, kRuns>);
        }
      };
      // (1 and 2 lanes: the TokenButler predictor's heads of 8 and 16 dimensions, whose attention
      // over the context took 246 us a step at 4096 tokens in the one-block-per-row kernel)
      switch (key_lanes(args.head_dim)) {
        case 1:
          return with_group(std::integral_constant<int, 1>{});
        case 2:
          return with_group(std::integral_constant<int, 2>{});
        case 4:
          return with_group(std::integral_constant<int, 4>{});
        case 8:
          return with_group(std::integral_constant<int, 8>{});
        case 16:
          return with_group(std::integral_constant<int, 16>{});
        default:
          return with_group(std::integral_constant<int, 32>{});
      }
    });
    launch_dependent(decode_merge_kernel<kRuns>, dim3(unsigned(args.heads), 1, unsigned(count)),
                     kMergeThreads, merge_bytes, stream, batch, plan);
  });
}

}  // namespace

void launch_decode_attention(const AttentionArgs& args, float* scratch, int sm_count,
                             cudaStream_t stream) {
  const DecodeRun run{args, scratch};
  launch_decode_runs(std::span(&run, 1), sm_count, stream);
}

bool decode_runs_alike(const AttentionArgs& a, const AttentionArgs& b) {
  return a.rows == b.rows && a.heads == b.heads && a.kv_heads == b.kv_heads &&
         a.head_dim == b.head_dim && a.capacity == b.capacity && a.window == b.window &&
         a.first_position == b.first_position && a.cache_dtype == b.cache_dtype &&
         a.step_position == b.step_position;
}

void launch_decode_attention_runs(std::span<const DecodeRun> runs, int sm_count,
                                  cudaStream_t stream) {
  if (runs.empty()) return;
  for (const DecodeRun& run : runs) {
    if (!decode_runs_alike(run.args, runs[0].args)) {
      for (const DecodeRun& one : runs) launch_decode_runs(std::span(&one, 1), sm_count, stream);
      return;
    }
  }
  launch_decode_runs(runs, sm_count, stream);
}

}  // namespace kvlens::cuda
