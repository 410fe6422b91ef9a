// Where a GGUF model's TokenButler predictor comes from when --predictor names none: a file the
// user put beside the .gguf (<file without .gguf>.predictor.safetensors), else a predictor kvlens
// ships for that model, listed in assets/predictors/index.json by the file's general.name and
// general.architecture (a quantization of the same checkpoint keeps both, so it matches too).
#pragma once

#include <string>
#include <vector>

namespace kvlens {

class GgufFile;

struct GgufPredictorSearch {
  std::string found;                  // the predictor .safetensors, empty when none
  std::vector<std::string> searched;  // each place looked at, for the "no predictor" message
};

GgufPredictorSearch find_gguf_predictor(const std::string& gguf_path, const GgufFile& file);

// The folder kvlens ships for the model of `file` (the folder of its index entry's predictor,
// which also holds the policies' calibration and gate files made for that model), or empty when
// the index lists none or cannot be found. A malformed index throws as match_predictor_index.
std::string bundled_gguf_model_folder(const GgufFile& file);

// The predictor file an index lists for (name, architecture), resolved against the index's
// folder; empty when no entry matches. `index_path` names the file in errors: a malformed index
// throws kvlens::Error naming the entry and field.
std::string match_predictor_index(const std::string& index_json, const std::string& index_path,
                                  const std::string& general_name, const std::string& architecture);

}  // namespace kvlens
