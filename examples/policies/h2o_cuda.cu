/* h2o as a CUDA plug-in: the rule of h2o.c (kvlens's built-in h2o) on device memory, with its
 * own kernels queued on the session's stream, so a CUDA session never copies anything to the
 * host for it. Built only where nvcc is (examples/policies/CMakeLists.txt); declares
 * KVLENS_ACCEPTS_CUDA alone, so a CPU session refuses it with a clear error (h2o.c runs there).
 * State per layer in device memory: accumulated [H, stride] F32, kept [R, stride] U8. */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvlens/policy_plugin.h"

namespace {

struct State {
  int64_t layers = 0, heads = 0, rows = -1, group = 1, stride = 0;
  double heavy_frac = 0.5;
  int64_t sinks = 0;
  int kv_select = 0;
  float** accumulated = nullptr;  // host array of device pointers
  uint8_t** kept = nullptr;
};

bool ok(cudaError_t status, const char* what, char* error, size_t size) {
  if (status == cudaSuccess) return true;
  snprintf(error, size, "%s: %s", what, cudaGetErrorString(status));
  return false;
}

// scores[h, j] = accumulated[h, j]; eligible[r, j] = kept[r, j] (j < cols).
__global__ void copy_state(const float* accumulated, const uint8_t* kept, int64_t own_stride,
                           float* scores, uint8_t* eligible, int64_t stride, int64_t heads,
                           int64_t rows, int64_t cols) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t r = i / cols, j = i % cols;
  if (r < heads) scores[r * stride + j] = accumulated[r * own_stride + j];
  if (r < rows) eligible[r * stride + j] = kept[r * own_stride + j];
}

// The eviction of this step's set (sinks kept), then accumulated = (kept ? accumulated : 0) +
// probabilities, per query head; a KV head's row is updated by its group's first query head.
__global__ void observe_kernel(float* accumulated, uint8_t* kept, int64_t own_stride,
                               const float* probabilities, const uint8_t* visible, int64_t stride,
                               int64_t heads, int64_t group, int kv_select, int64_t sinks,
                               int64_t cols) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t h = i / cols, j = i % cols;
  if (h >= heads) return;
  const int64_t r = kv_select ? h / group : h;
  uint8_t keep = kept[r * own_stride + j];
  if (!kv_select || h % group == 0) {
    keep = (keep && visible[h * stride + j]) || j < sinks ? 1 : 0;
    kept[r * own_stride + j] = keep;
  }
  float& sum = accumulated[h * own_stride + j];
  sum = (kv_select || keep ? sum : 0.0f) + probabilities[h * stride + j];
}

void destroy(void* opaque) {
  State* s = static_cast<State*>(opaque);
  for (int64_t l = 0; l < s->layers; ++l) {
    if (s->accumulated) cudaFree(s->accumulated[l]);
    if (s->kept) cudaFree(s->kept[l]);
  }
  free(s->accumulated);
  free(s->kept);
  delete s;
}

void* create(const kvlens_model_shape* shape, const double* values, char* error,
             size_t error_size) {
  if (shape->memory != KVLENS_MEMORY_CUDA) {
    snprintf(error, error_size, "device memory only (run h2o_c on the CPU)");
    return nullptr;
  }
  State* s = new State;
  s->layers = shape->layers;
  s->heads = shape->heads;
  s->group = shape->heads / shape->kv_heads;
  s->heavy_frac = values[0];
  s->accumulated = static_cast<float**>(calloc(size_t(s->layers), sizeof(float*)));
  s->kept = static_cast<uint8_t**>(calloc(size_t(s->layers), sizeof(uint8_t*)));
  return s;
}

// Every layer's buffers widened to the step's stride (new columns: 0 accumulated, kept), on the
// session's stream.
bool ensure_stride(State* s, const kvlens_step* step, char* error, size_t size) {
  if (s->rows < 0) {
    s->rows = step->selection_rows;
    s->kv_select = step->kv_head_granularity;
  }
  if (step->stride <= s->stride) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(step->stream);
  const int64_t to = step->stride, from = s->stride;
  for (int64_t l = 0; l < s->layers; ++l) {
    float* sums = nullptr;
    uint8_t* kept = nullptr;
    if (!ok(cudaMallocAsync(&sums, size_t(s->heads * to) * sizeof(float), stream), "cudaMalloc",
            error, size) ||
        !ok(cudaMallocAsync(&kept, size_t(s->rows * to), stream), "cudaMalloc", error, size))
      return false;
    cudaMemsetAsync(sums, 0, size_t(s->heads * to) * sizeof(float), stream);
    cudaMemsetAsync(kept, 1, size_t(s->rows * to), stream);
    if (from > 0) {
      cudaMemcpy2DAsync(sums, size_t(to) * sizeof(float), s->accumulated[l],
                        size_t(from) * sizeof(float), size_t(from) * sizeof(float),
                        size_t(s->heads), cudaMemcpyDeviceToDevice, stream);
      cudaMemcpy2DAsync(kept, size_t(to), s->kept[l], size_t(from), size_t(from), size_t(s->rows),
                        cudaMemcpyDeviceToDevice, stream);
      cudaFreeAsync(s->accumulated[l], stream);
      cudaFreeAsync(s->kept[l], stream);
    }
    s->accumulated[l] = sums;
    s->kept[l] = kept;
  }
  s->stride = to;
  return ok(cudaGetLastError(), "growing the state", error, size);
}

int32_t select_step(void* opaque, const kvlens_step* step, kvlens_answer* answer, char* error,
                    size_t size) {
  State* s = static_cast<State*>(opaque);
  if (!ensure_stride(s, step, error, size)) return KVLENS_FAILED;
  const int64_t l = step->layer, cols = step->cols;
  s->sinks = step->sinks;
  const int64_t total = (s->heads > s->rows ? s->heads : s->rows) * cols;
  copy_state<<<unsigned((total + 255) / 256), 256, 0, static_cast<cudaStream_t>(step->stream)>>>(
      s->accumulated[l], s->kept[l], s->stride, answer->scores, answer->eligible, step->stride,
      s->heads, s->rows, cols);
  if (!ok(cudaGetLastError(), "copy_state", error, size)) return KVLENS_FAILED;
  answer->recent = step->budget - int64_t(floor(s->heavy_frac * double(step->budget)));
  return KVLENS_SCORES;
}

int32_t observe(void* opaque, const kvlens_observation* seen, char* error, size_t size) {
  State* s = static_cast<State*>(opaque);
  const int64_t total = s->heads * seen->cols;
  observe_kernel<<<unsigned((total + 255) / 256), 256, 0,
                   static_cast<cudaStream_t>(seen->stream)>>>(
      s->accumulated[seen->layer], s->kept[seen->layer], s->stride, seen->probabilities,
      seen->visible, seen->stride, s->heads, s->group, s->kv_select,
      s->sinks < seen->cols ? s->sinks : seen->cols, seen->cols);
  return ok(cudaGetLastError(), "observe_kernel", error, size) ? 0 : 1;
}

const kvlens_param params[] = {
    {"heavy_frac", KVLENS_PARAM_FLOAT, "Fraction of the budget for heavy hitters", 0.5, 0.0, 1.0,
     nullptr, 0},
};

const kvlens_policy_plugin plugin = {
    KVLENS_POLICY_ABI_VERSION,
    sizeof(kvlens_policy_plugin),
    "h2o_cuda",
    "eviction (H2O), CUDA plug-in",
    "Keeps the most recent tokens and the heavy hitters by accumulated attention; evicted "
    "tokens never return (kvlens's h2o rule, as a CUDA plug-in with its own kernels).",
    params,
    1,
    KVLENS_NEEDS_PROBABILITIES | KVLENS_NEEDS_ELIGIBLE,
    KVLENS_ACCEPTS_CUDA,
    0,
    create,
    destroy,
    select_step,
    observe,
    {nullptr, nullptr, nullptr, nullptr},
};

}  // namespace

extern "C" KVLENS_PLUGIN_EXPORT const kvlens_policy_plugin* kvlens_policy_plugin_v1(void) {
  return &plugin;
}
