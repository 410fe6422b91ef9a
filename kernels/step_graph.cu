// Recorded decode steps (see step_graph.cuh).
#include <algorithm>
#include <string>

#include "engine/common/error.h"
#include "kernels/dependent_launch.cuh"
#include "kernels/step_graph.cuh"

namespace kvlens::cuda {
namespace {

__global__ void set_step_kernel(StepState* state, int64_t position, SmallIds ids) {
  begin_dependent_grid();
  if (threadIdx.x == 0) state->position = position;
  for (int i = threadIdx.x; i < SmallIds::kCapacity; i += blockDim.x) state->ids[i] = ids.ids[i];
}

void check(cudaError_t status, const char* call) {
  if (status == cudaSuccess) return;
  cudaGetLastError();
  throw Error("cuda", call, "cudaSuccess", cudaGetErrorString(status));
}

}  // namespace

void launch_set_step(StepState* state, int64_t position, const SmallIds& ids, cudaStream_t stream) {
  launch_dependent(set_step_kernel, 1, 64, 0, stream, state, position, ids);
}

CudaStepGraph::CudaStepGraph(int device, cudaStream_t stream, cudaGraphExec_t exec,
                             StepState* state, int64_t rows, std::shared_ptr<void> keep_state)
    : device_(device),
      stream_(stream),
      exec_(exec),
      state_(state),
      rows_(rows),
      keep_state_(std::move(keep_state)) {}

CudaStepGraph::~CudaStepGraph() {
  cudaSetDevice(device_);
  cudaGraphExecDestroy(exec_);  // errors ignored: a destructor must not throw
}

void CudaStepGraph::replay(int64_t position, std::span<const int32_t> tokens) {
  if (int64_t(tokens.size()) != rows_)
    throw Error("cuda step graph", "tokens",
                std::to_string(rows_) + " token ids (the recorded rows)",
                std::to_string(tokens.size()));
  check(cudaSetDevice(device_), "cudaSetDevice");
  SmallIds ids;
  std::copy(tokens.begin(), tokens.end(), ids.ids);
  launch_set_step(state_, position, ids, stream_);
  check(cudaGetLastError(), "set_step");
  check(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
}

}  // namespace kvlens::cuda
