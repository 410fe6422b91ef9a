// TokenButler predictors for GGUF files: beside the file, or bundled and matched by metadata.
// Index shape: {"predictors": [{"general.name": S, "general.architecture": S, "file": S}, ...]}.
#include "engine/model/gguf_predictor.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/common/bundled_assets.h"
#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/model/gguf.h"

namespace kvlens {
namespace {

using Json = nlohmann::json;

const std::string& text_field(const Json& entry, const std::string& where, const char* key,
                              const std::string& index_path) {
  const auto it = entry.find(key);
  if (it == entry.end() || !it->is_string()) {
    throw Error(index_path, where + "." + key, "a string",
                it == entry.end() ? "none" : it->type_name());
  }
  return it->get_ref<const std::string&>();
}

}  // namespace

std::string match_predictor_index(const std::string& index_json, const std::string& index_path,
                                  const std::string& general_name,
                                  const std::string& architecture) {
  const Json index = Json::parse(index_json, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object()) {
    throw Error(index_path, "(file)", "a JSON object", "text that is not one");
  }
  const auto list = index.find("predictors");
  if (list == index.end() || !list->is_array()) {
    throw Error(index_path, "predictors", "an array of entries",
                list == index.end() ? "none" : list->type_name());
  }
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& entry = (*list)[i];
    const std::string where = "predictors[" + std::to_string(i) + "]";
    if (!entry.is_object()) throw Error(index_path, where, "an object", entry.type_name());
    const std::string& name = text_field(entry, where, "general.name", index_path);
    const std::string& arch = text_field(entry, where, "general.architecture", index_path);
    const std::string& file = text_field(entry, where, "file", index_path);
    if (name == general_name && arch == architecture) {
      return (std::filesystem::path(index_path).parent_path() / file).string();
    }
  }
  return {};
}

std::string bundled_gguf_model_folder(const GgufFile& file) {
  std::string index_path;
  try {
    index_path = bundled_asset_path("predictors/index.json", "bundled predictors");
  } catch (const Error&) {
    return {};  // an install without the bundled assets: nothing shipped to find
  }
  const std::string predictor = match_predictor_index(
      read_text_file(index_path), index_path, file.optional_string("general.name").value_or(""),
      file.optional_string("general.architecture").value_or(""));
  return predictor.empty() ? std::string()
                           : std::filesystem::path(predictor).parent_path().string();
}

GgufPredictorSearch find_gguf_predictor(const std::string& gguf_path, const GgufFile& file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  GgufPredictorSearch search;
  fs::path beside(gguf_path);
  beside.replace_extension(".predictor.safetensors");
  if (fs::is_regular_file(beside, ec)) {
    search.found = beside.string();
    return search;
  }
  search.searched.push_back(beside.string() + " (none)");

  const std::string name = file.optional_string("general.name").value_or("");
  const std::string arch = file.optional_string("general.architecture").value_or("");
  std::string index_path;
  try {
    index_path = bundled_asset_path("predictors/index.json", "bundled predictors");
  } catch (const Error&) {
    search.searched.push_back("assets/predictors/index.json (not found)");
    return search;
  }
  search.found = match_predictor_index(read_text_file(index_path), index_path, name, arch);
  if (search.found.empty()) {
    search.searched.push_back(index_path + " (no entry for general.name \"" + name +
                              "\", architecture " + arch + ")");
  }
  return search;
}

}  // namespace kvlens
