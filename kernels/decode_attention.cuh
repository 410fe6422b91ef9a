// Split-context attention of one decode query row (flash-decoding): q[1, H, D] over the cache
// [G, capacity, D]. Pass 1: one block per (KV head, slice of the visible key range) scores its keys
// for every query head of the group (each key read once for the group), writes the pre-softmax
// logits where wanted and leaves a partial softmax (max, sum, weighted values) per query head.
// Pass 2 merges the slices. Efficient from a handful of keys to the whole cache.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention.cuh"

namespace kvlens::cuda {

// Whether the split kernel takes `args`: rows == 1 and a KV-head group whose queries and a
// slice of weights fit in shared memory (otherwise launch_attention does it).
bool decode_attention_fits(const AttentionArgs& args, int sm_count);
// Floats of scratch launch_decode_attention needs for `args` (rows == 1).
int64_t decode_attention_scratch_floats(const AttentionArgs& args, int sm_count);

// decode_attention_fits(args) must hold. `scratch` holds decode_attention_scratch_floats(args,
// sm_count) floats. Logits (when args.logits is set) are bit-identical to the attention_logits op's
// and to launch_attention's: the same per-lane products and butterfly sum (warp_dot).
void launch_decode_attention(const AttentionArgs& args, float* scratch, int sm_count,
                             cudaStream_t stream);

}  // namespace kvlens::cuda
