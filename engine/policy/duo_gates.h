// DuoAttention's head gates (docs/policies/duoattention.md): one value in [0, 1] per (layer, KV
// head), optimised by tools/train_duo_gates.py and saved beside the model as
// duo_gates.safetensors (tensor "gates", F32 [layers, kv_heads]); high = a retrieval head.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens {

inline constexpr const char* kDuoGatesFile = "duo_gates.safetensors";

// The gates of the model in shape.model_dir, row-major [layers, kv_heads] over the whole model's
// KV heads (shape.whole_kv_heads(): a tensor-parallel shard gets every head's too). Errors name
// the file and the tool that makes it when it is missing, and the expected shape when it is
// wrong.
std::vector<float> load_duo_gates(const PolicyShape& shape);

// The number of retrieval heads R at a step under the budget rule: the largest R in [0, heads]
// with R * candidates + (heads - R) * streaming_keep <= heads * budget, i.e. the total kept over
// all `heads` (KV heads of the selecting layers) within what `budget` per head would keep.
// streaming_keep is what a streaming head keeps (sinks + recent, at most candidates). When the
// streaming heads alone exceed the budget, 0; when streaming heads keep every candidate, heads.
int64_t duo_retrieval_count(int64_t heads, int64_t candidates, int64_t streaming_keep,
                            int64_t budget);

}  // namespace kvlens
