// The calibration files of the approximate-logit policies, made by tools/calibrate_channels.py
// beside the model and read when a run's policy is made: loki_pca.safetensors (the keys'
// principal directions, "basis" F32 [L, G, D, D], direction i in column i, by explained variance)
// and doublesparsity_channels.safetensors ("channels" F32 [L, H, D]: each query head's channels,
// most important first, as exact whole numbers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens {

inline constexpr const char* kLokiCalibrationFile = "loki_pca.safetensors";
inline constexpr const char* kDoubleSparsityCalibrationFile = "doublesparsity_channels.safetensors";

// The F32 tensor `tensor` of `file` in the folder of shape.model_dir (a .gguf file's folder for a
// .gguf), checked to have `expected` as its shape; row-major host values. Throws kvlens::Error
// naming `owner` ("policy loki") and the file, and saying which tool makes it, when the model
// has no folder or the file is missing; naming the file and the tensor when the tensor is
// missing, not F32 or of another shape.
std::vector<float> read_calibration(const PolicyShape& shape, const std::string& owner,
                                    const std::string& file, const std::string& tensor,
                                    const std::vector<int64_t>& expected);

// Loki's per-layer bases [G, D, dims]: the first `dims` principal directions of each KV head's
// keys, from loki_pca.safetensors ([L, G, D, D] over the whole model's KV heads: a
// tensor-parallel shard's are rows shape.first_kv_head ..) beside the model.
std::vector<std::vector<float>> loki_bases(const PolicyShape& shape, int64_t dims);

// DoubleSparsity's per-layer bases [H, D, channels]: column i of query head h's basis is the unit
// vector of its i-th most important channel (so the keys "projected" on it are exactly those
// channels: its label cache), from doublesparsity_channels.safetensors ([L, H, D] over the whole
// model's query heads: a shard's are rows shape.first_head ..). Each row must list distinct
// channels in [0, D).
std::vector<std::vector<float>> doublesparsity_bases(const PolicyShape& shape, int64_t channels);

}  // namespace kvlens
