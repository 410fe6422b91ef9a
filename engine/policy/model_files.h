// Where a policy finds a file made for its model (loki's and doublesparsity's calibrations,
// duoattention's gates, seerattention's gate): the folders of PolicyShape::model_file_dirs in
// order, so a user's file beside the model wins over the one kvlens ships for a known GGUF model.
#pragma once

#include <string>
#include <vector>

#include "engine/policy/policy.h"

namespace kvlens {

struct ModelFileSearch {
  std::string found;                 // the file's path, empty when no folder holds it
  std::vector<std::string> folders;  // the folders looked in, in order (for the error)
};

// `file` in the first of the shape's folders that holds it: model_file_dirs, or model_dir's
// folder (a .gguf file's folder) when those are not given.
ModelFileSearch find_model_file(const PolicyShape& shape, const std::string& file);

// The path of `file` for `owner` ("policy loki"); throws kvlens::Error naming the owner, the file,
// what `purpose` it serves and how to make it (`make_it`), and every folder looked in, when none
// holds it (or the model has no folder).
std::string require_model_file(const PolicyShape& shape, const std::string& owner,
                               const std::string& file, const std::string& purpose,
                               const std::string& make_it);

}  // namespace kvlens
