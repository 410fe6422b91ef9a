// Split-context attention of one decode query row (flash-decoding): q[1, H, D] over the cache
// [G, capacity, D]. Pass 1: one block per (KV head, slice of the visible key range) scores its keys
// for every query head of the group (each key read once for the group, 16 bytes a lane), writes
// the pre-softmax logits where wanted and leaves a partial softmax (max, sum, weighted values) per
// query head. Pass 2 merges the slices. The slice count depends on the cache alone and the
// slice width on the position (read on the device in a captured step), so a recorded step
// replays with an unrecorded one's bits. Efficient from a handful of keys to the whole cache.
// Under a visibility mask over 8192 keys or more, a first pass lists the keys each KV head's
// group sees and the slices share out that list instead of the range, so a sparse run's
// attention shrinks with what it keeps.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "kernels/attention.cuh"

namespace kvlens::cuda {

// Floats of scratch the split kernel needs for `args`, or 0 when it does not take them (rows != 1,
// a head dimension over 256, or a KV-head group whose queries and a slice of weights do not fit
// in shared memory: then launch_attention does it).
int64_t decode_attention_scratch_floats(const AttentionArgs& args, int sm_count);
// Needs decode_attention_scratch_floats(args, sm_count) > 0; `scratch` holds that many floats.
// Logits (when args.logits is set) are bit-identical to the attention_logits op's and to
// launch_attention's: the same per-lane products and butterfly sum (key_dot).
void launch_decode_attention(const AttentionArgs& args, float* scratch, int sm_count,
                             cudaStream_t stream);

// Several runs' decode attention, each with its own `scratch` (decode_attention_scratch_floats
// of its args): one launch of each kernel for up to kBatchRuns runs that decode_runs_alike, with
// the bits of launching each alone (every block's work is its run's alone); runs that are not
// alike are launched one by one.
struct DecodeRun {
  AttentionArgs args;
  float* scratch = nullptr;
};
bool decode_runs_alike(const AttentionArgs& a, const AttentionArgs& b);
void launch_decode_attention_runs(std::span<const DecodeRun> runs, int sm_count,
                                  cudaStream_t stream);

}  // namespace kvlens::cuda
