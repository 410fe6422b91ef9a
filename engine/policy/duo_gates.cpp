// Reading DuoAttention's gate file and the budget rule's head count (duo_gates.h).
#include "engine/policy/duo_gates.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/model/safetensors.h"
#include "engine/policy/model_files.h"

namespace kvlens {

namespace {

const std::string kMakeIt =
    "make it with `python3 tools/train_duo_gates.py --model MODEL_DIR` "
    "(docs/policies/duoattention.md)";

}  // namespace

std::vector<float> load_duo_gates(const PolicyShape& shape) {
  const std::string path =
      require_model_file(shape, "policy duoattention", kDuoGatesFile, "the head gates", kMakeIt);
  const SafetensorsFile file(path);
  // Every KV head of the whole model (a tensor-parallel shard ranks them all too).
  const int64_t kv_heads = shape.whole_kv_heads();
  const std::string expected = "an F32 [" + std::to_string(shape.layers) + ", " +
                               std::to_string(kv_heads) +
                               "] tensor (layers x KV heads) of values in [0, 1]";
  if (!file.contains("gates")) throw Error(path, "gates", expected, "none");
  const TensorView view = file.tensor("gates");
  const std::vector<int64_t> want = {shape.layers, kv_heads};
  if (view.dtype != DType::F32 || view.shape != want) {
    std::string found = std::string(dtype_name(view.dtype)) + " [";
    for (size_t i = 0; i < view.shape.size(); ++i)
      found += (i ? ", " : "") + std::to_string(view.shape[i]);
    throw Error(path, "gates", expected, found + "]");
  }
  std::vector<float> gates(size_t(view.numel()));
  std::memcpy(gates.data(), view.data, gates.size() * sizeof(float));
  for (size_t i = 0; i < gates.size(); ++i) {
    if (!(gates[i] >= 0.0f && gates[i] <= 1.0f))
      throw Error(path, "gates", expected,
                  std::to_string(gates[i]) + " at layer " + std::to_string(int64_t(i) / kv_heads) +
                      ", KV head " + std::to_string(int64_t(i) % kv_heads));
  }
  return gates;
}

int64_t duo_retrieval_count(int64_t heads, int64_t candidates, int64_t streaming_keep,
                            int64_t budget) {
  streaming_keep = std::min(streaming_keep, candidates);
  if (streaming_keep >= candidates) return heads;  // a streaming head already keeps everything
  if (streaming_keep >= budget) return 0;
  // R * (candidates - streaming_keep) <= heads * (budget - streaming_keep), in integers.
  const int64_t r = heads * (budget - streaming_keep) / (candidates - streaming_keep);
  return std::clamp<int64_t>(r, 0, heads);
}

}  // namespace kvlens
