// Twilight's top-p pruning kernel: TopPOps (engine/policy/top_p_ops.h) on the GPU with
// top_p_math.h's arithmetic (the CPU's bits). The launcher only enqueues on `stream`; the
// extension (top_p_ops_cuda.cpp) checks the arguments first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/policy_ops.cuh"

namespace kvlens::cuda {

// top_p_prune: one block per row. Thread 0 sums the softmax mass in column order (the CPU's
// order); the prefix is taken in passes of up to 1024 keys (the next ones below the last taken,
// found by a radix select and sorted in shared memory), thread 0 adding their weights in key
// order as the CPU does (exact: keys are a strict order), then every thread clears its columns
// outside the prefix.
struct TopPPruneArgs {
  RowsRef<const float> scores;  // [rows, stride]
  RowsRef<uint8_t> visible;     // [rows, stride]
  int64_t rows = 0, cols = 0, sink_end = 0, recent_begin = 0;
  float top_p = 1.0f;
};
void launch_top_p_prune(const TopPPruneArgs& args, cudaStream_t stream);

}  // namespace kvlens::cuda
