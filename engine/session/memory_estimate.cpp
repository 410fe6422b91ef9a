// Memory estimates from a model's config and tensors, and the check against MemAvailable.
#include "engine/session/memory_estimate.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "engine/arch/tensor_parallel.h"
#include "engine/common/error.h"

namespace kvlens {

MemoryEstimate estimate_memory(const Model& model) {
  const ModelConfig& c = model.config;
  MemoryEstimate e;
  for (const std::string& name : model.weights.files->names()) {
    const TensorView tensor = model.weights.files->tensor(name);
    const int64_t count = tensor.numel();
    e.mapped_bytes += int64_t(tensor.bytes);
    e.cuda_weight_bytes += int64_t(tensor.bytes);
    if (tensor.dtype == DType::F16) e.cpu_weight_bytes += count * 4;  // widened once
    if (tensor.shape.size() == 2) {
      e.cpu_weight_bytes += count * (tensor.dtype == DType::BF16 ? 2 : 4);  // matmul panels
    }
  }
  const int64_t tokens = 1024;
  e.kv_cache_per_1k = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4 * tokens;
  const TensorView& matrix =
      model.weights.layers.empty() ? model.weights.embed : model.weights.layers.front().wq;
  e.cuda_kv_cache_per_1k = e.kv_cache_per_1k / 4 * int64_t(dtype_size(matrix.dtype));
  e.policy_rows_per_1k = ((c.num_layers + 2) * 4 + c.num_layers) * c.num_heads * tokens;
  e.trace_step_rows_at_1k = c.num_layers * c.num_heads * (4 + 4 + 1) * tokens;
  for (const LayerWeights& layer : model.weights.layers) {
    for (const TensorView* t :
         {&layer.wq, &layer.bq, &layer.wo, &layer.w_gate, &layer.w_up, &layer.w_down})
      e.cuda_split_bytes += int64_t(t->bytes);
    for (const TensorView* t : {&layer.wk, &layer.wv, &layer.bk, &layer.bv})
      e.cuda_kv_proj_bytes += int64_t(t->bytes);
  }
  e.kv_heads = std::max<int64_t>(1, c.num_kv_heads);
  return e;
}

int64_t MemoryEstimate::cuda_bytes_per_gpu(int64_t ranks, int64_t tokens, int64_t runs,
                                           double weight_scale) const {
  ranks = std::max<int64_t>(1, ranks);
  // Each GPU holds KV heads / ranks of every layer's, or one where ranks > KV heads.
  const int64_t kv_split = std::min(ranks, kv_heads);
  const int64_t whole = cuda_weight_bytes - cuda_split_bytes - cuda_kv_proj_bytes;
  const double weights =
      weight_scale * double(whole + cuda_split_bytes / ranks + cuda_kv_proj_bytes / kv_split);
  int64_t capacity = 256;  // the caches double from 256 positions
  while (capacity < tokens) capacity *= 2;
  const int64_t caches =
      std::max<int64_t>(runs, 1) * cuda_kv_cache_per_1k * capacity / 1024 / kv_split;
  return int64_t(weights) + caches;
}

int64_t gpus_needed_split(const Model& model, const MemoryEstimate& estimate, int64_t tokens,
                          int64_t device_bytes, double weight_scale, int64_t runs) {
  const int64_t usable = device_bytes - device_bytes / 10;
  for (int64_t ranks = 1; ranks <= 64; ++ranks) {
    try {
      check_tensor_parallel(model, ranks);
    } catch (const Error&) {
      continue;  // a split the config does not divide
    }
    if (estimate.cuda_bytes_per_gpu(ranks, tokens, runs, weight_scale) <= usable) return ranks;
  }
  return 0;
}

int64_t MemoryEstimate::cpu_session_bytes(int64_t tokens, int64_t runs, bool policies) const {
  // The caches double from 256 positions: a context of n tokens holds the next power of two.
  int64_t capacity = 256;
  while (capacity < tokens) capacity *= 2;
  const int64_t per_run =
      (kv_cache_per_1k + (policies ? 2 * policy_rows_per_1k : 0)) * capacity / 1024;
  return cpu_weight_bytes + std::max<int64_t>(runs, 1) * per_run;
}

int64_t available_memory_bytes(const std::string& meminfo) {
  std::ifstream in(meminfo);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    int64_t kib = -1;
    if (fields >> kib) return kib * 1024;
  }
  return -1;
}

void require_memory(int64_t needed, int64_t available, const std::string& what) {
  if (available < 0 || needed <= available) return;
  constexpr int64_t kMiB = 1 << 20;
  throw Error(
      "memory", what,
      "at most " + std::to_string(available / kMiB) + " MiB (MemAvailable in /proc/meminfo)",
      std::to_string((needed + kMiB - 1) / kMiB) + " MiB needed");
}

}  // namespace kvlens
