// kvlens-cli bench --gpus N / --devices LIST: decode steps of a model split over a
// tensor-parallel group (engine/session/tensor_parallel_session.h), against the time each GPU
// takes to read its own shard's weights once (issue 44 item 2: at most 1.5x that; a model on 2
// GPUs faster than on one).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "app/session/common_options.h"
#include "engine/model/model.h"
#include "engine/policy/policy.h"

namespace kvlens::cli {

struct TensorParallelBench {
  std::string model_dir;
  int64_t context = 0, warmup = 0, steps = 0;
  int copy_repeats = 5;
  PolicyConfig policy;  // the reference: plain decode
  bool json = false;
  // Every step op by op on every rank (SessionOptions::record_steps off): against the recorded
  // steps, what the graphs save, and whether the ranks' recordings (NCCL inside) took.
  bool op_by_op = false;
};

// Prints the figures (text, or one JSON object with --json); returns the exit code.
int run_tensor_parallel_bench(const session::CommonOptions& common,
                              std::shared_ptr<const Model> model, std::span<const int> devices,
                              const TensorParallelBench& bench);

}  // namespace kvlens::cli
