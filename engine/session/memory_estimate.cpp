// Memory estimates from a model's config and tensors, and the check against MemAvailable.
#include "engine/session/memory_estimate.h"

#include <algorithm>
#include <fstream>
#include <sstream>

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
  return e;
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
