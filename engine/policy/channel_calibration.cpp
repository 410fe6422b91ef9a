// Reading the approximate-logit policies' calibration files (channel_calibration.h).
#include "engine/policy/channel_calibration.h"

#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/model/safetensors.h"
#include "engine/policy/model_files.h"

namespace kvlens {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

const std::string kMakeIt =
    "make it with `python3 tools/calibrate_channels.py --model MODEL_DIR` (docs/policies/)";

}  // namespace

std::vector<float> read_calibration(const PolicyShape& shape, const std::string& owner,
                                    const std::string& file, const std::string& tensor,
                                    const std::vector<int64_t>& expected) {
  const std::string path = require_model_file(shape, owner, file, "the calibration file", kMakeIt);
  const SafetensorsFile calibration(path);
  if (!calibration.contains(tensor))
    throw Error(path, tensor, "an F32 " + shape_text(expected) + " tensor", "none");
  const TensorView view = calibration.tensor(tensor);
  if (view.dtype != DType::F32 || view.shape != expected)
    throw Error(path, tensor, "an F32 " + shape_text(expected) + " tensor",
                std::string(dtype_name(view.dtype)) + " " + shape_text(view.shape));
  std::vector<float> values(size_t(view.numel()));
  std::memcpy(values.data(), view.data, values.size() * sizeof(float));
  return values;
}

std::vector<std::vector<float>> loki_bases(const PolicyShape& shape, int64_t dims) {
  // The file holds every KV head of the whole model; a tensor-parallel shard takes its own.
  const int64_t L = shape.layers, G = shape.kv_heads, D = shape.head_dim;
  const int64_t model_G = shape.whole_kv_heads(), first = shape.first_kv_head;
  const std::vector<float> all =
      read_calibration(shape, "policy loki", kLokiCalibrationFile, "basis", {L, model_G, D, D});
  std::vector<std::vector<float>> bases(size_t(L), std::vector<float>(size_t(G * D * dims)));
  for (int64_t l = 0; l < L; ++l)
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < D; ++c)
        for (int64_t i = 0; i < dims; ++i)
          bases[size_t(l)][size_t((g * D + c) * dims + i)] =
              all[size_t(((l * model_G + first + g) * D + c) * D + i)];
  return bases;
}

std::vector<std::vector<float>> doublesparsity_bases(const PolicyShape& shape, int64_t channels) {
  // The file holds every query head of the whole model; a tensor-parallel shard takes its own.
  const int64_t L = shape.layers, H = shape.heads, D = shape.head_dim;
  const int64_t model_H = shape.whole_heads(), first = shape.first_head;
  const std::vector<float> order = read_calibration(
      shape, "policy doublesparsity", kDoubleSparsityCalibrationFile, "channels", {L, model_H, D});
  std::vector<std::vector<float>> bases(size_t(L), std::vector<float>(size_t(H * D * channels)));
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<bool> seen(size_t(D), false);
      for (int64_t i = 0; i < channels; ++i) {
        const float c = order[size_t((l * model_H + first + h) * D + i)];
        if (!(c >= 0.0f && c < float(D) && c == std::floor(c)) || seen[size_t(c)])
          throw Error(
              std::string(kDoubleSparsityCalibrationFile), "channels",
              "distinct whole channel numbers in [0, " + std::to_string(D) + ") in each row",
              std::to_string(c) + " at layer " + std::to_string(l) + ", head " +
                  std::to_string(first + h) + ", rank " + std::to_string(i));
        seen[size_t(c)] = true;
        bases[size_t(l)][size_t((h * D + int64_t(c)) * channels + i)] = 1.0f;
      }
    }
  }
  return bases;
}

}  // namespace kvlens
