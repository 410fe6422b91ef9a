// Model: a Hugging Face checkpoint folder on disk (config.json, the safetensors weights and,
// when present, tokenizer.json) or a llama.cpp GGUF file (gguf.h). Loading validates everything
// before any compute.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/gguf.h"
#include "engine/model/predictor.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"

namespace kvlens {

// Where a tensor-parallel shard's heads sit in the whole model (shard_model,
// engine/arch/tensor_parallel.h, sets it): the whole model's first query head and first KV head
// that the shard holds, and the whole model's counts. Files made for the whole model (a policy's
// per-head calibration or gates) are indexed by those heads. A model that is not a shard keeps
// the defaults: first heads 0, counts 0 (read as its own config's).
struct ShardPlace {
  int64_t first_head = 0, first_kv_head = 0;
  int64_t model_heads = 0, model_kv_heads = 0;
};

struct Model {
  std::string dir;
  ModelConfig config;
  ModelWeights weights;
  std::shared_ptr<const Tokenizer> tokenizer;  // null when the folder has no tokenizer.json
  // The mapped GGUF file (metadata for the tokenizer, tensor types for info); null for folders.
  std::shared_ptr<const GgufFile> gguf;
  // The TokenButler predictor, when one was found (predictor.predictor non-null), and where the
  // lookup looked (PredictorLookup).
  PredictorLookup predictor;
  // Folders where files made for this model are looked for, in order (policies' calibrations and
  // gates: engine/policy/model_files.h): the model's folder (a .gguf file's folder), then, for a
  // GGUF file kvlens knows by its general.name, the folder it ships for that model.
  std::vector<std::string> file_dirs;
  // A shard's place in the whole model (defaults: not a shard).
  ShardPlace shard;

  // `predictor_file` (a predictor.safetensors, with its predictor.json beside it) overrides the
  // lookup; empty: a llama_butler checkpoint's own predictor, else predictor.safetensors in the
  // folder, else none. `model_dir` may also be a .gguf file (recognised by its "GGUF" magic):
  // its metadata gives the config, its quantized tensors are dequantized to F32 (BF16 past about 1B
  // parameters: gguf_dequantized_dtype), the
  // predictor comes only from `predictor_file`, and the tokenizer is read from its metadata.
  static std::shared_ptr<const Model> load(const std::string& model_dir,
                                           const std::string& predictor_file = {});
  // The checks of load that cost little, for a front end to refuse a bad path at once: a folder
  // is loaded as load does (its weights are only mapped); a .gguf file is opened and its
  // configuration read, without dequantizing its weights (gigabytes for a large model). Throws
  // what load throws for those parts.
  static void check(const std::string& model_dir);
  // The tokenizer, or an Error naming the folder when there is none.
  const Tokenizer& require_tokenizer() const;
};

}  // namespace kvlens
