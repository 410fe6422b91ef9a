// find_model_file / require_model_file: one search order for every file made for a model.
#include "engine/policy/model_files.h"

#include <filesystem>

#include "engine/common/error.h"

namespace kvlens {

ModelFileSearch find_model_file(const PolicyShape& shape, const std::string& file) {
  namespace fs = std::filesystem;
  std::error_code ignored;
  ModelFileSearch search;
  search.folders = shape.model_file_dirs;
  if (search.folders.empty() && !shape.model_dir.empty()) {
    fs::path folder(shape.model_dir);
    if (fs::is_regular_file(folder, ignored)) folder = folder.parent_path();
    search.folders.push_back(folder.string());
  }
  for (const std::string& folder : search.folders) {
    const fs::path path = fs::path(folder) / file;
    if (fs::is_regular_file(path, ignored)) {
      search.found = path.string();
      break;
    }
  }
  return search;
}

std::string require_model_file(const PolicyShape& shape, const std::string& owner,
                               const std::string& file, const std::string& purpose,
                               const std::string& make_it) {
  const ModelFileSearch search = find_model_file(shape, file);
  if (!search.found.empty()) return search.found;
  if (search.folders.empty())
    throw Error(owner, file, "the model's folder, which holds it (" + make_it + ")",
                "a model without a folder");
  std::string looked;
  for (const std::string& folder : search.folders) looked += (looked.empty() ? "" : ", ") + folder;
  throw Error(owner, file, purpose + " beside the model: " + make_it, "none in " + looked);
}

}  // namespace kvlens
