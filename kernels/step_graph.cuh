// Recorded decode steps of the CUDA backend: the ops of one single-token step captured into a CUDA
// graph and replayed at later positions. What changes from step to step (the position, the token
// ids) lives in a small device struct, StepState, that the recorded kernels read and that a
// one-thread kernel sets, in stream order, before each replay.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>

#include "engine/backend/backend.h"
#include "kernels/norm_ops.cuh"

namespace kvlens::cuda {

struct StepState {
  int64_t position = 0;
  int32_t ids[SmallIds::kCapacity] = {};
};

// state->position = position, state->ids[0..rows) = ids (enqueued on `stream`).
void launch_set_step(StepState* state, int64_t position, const SmallIds& ids, cudaStream_t stream);

// A captured step (owns the instantiated graph). replay() sets the StepState and launches it.
class CudaStepGraph final : public StepGraph {
 public:
  CudaStepGraph(int device, cudaStream_t stream, cudaGraphExec_t exec, StepState* state,
                int64_t rows, std::shared_ptr<void> keep_state);
  ~CudaStepGraph() override;
  void replay(int64_t position, std::span<const int32_t> tokens) override;

 private:
  int device_;
  cudaStream_t stream_;
  cudaGraphExec_t exec_;
  StepState* state_;
  int64_t rows_;
  std::shared_ptr<void> keep_state_;  // the StepState's device memory
};

}  // namespace kvlens::cuda
