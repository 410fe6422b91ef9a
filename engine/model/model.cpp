// Model::load: a checkpoint folder (config.json, safetensors weights, optional tokenizer.json),
// fully validated before any compute.
#include "engine/model/model.h"

#include <filesystem>
#include <fstream>

#include "engine/common/error.h"
#include "engine/model/gguf_config.h"
#include "engine/model/gguf_predictor.h"
#include "engine/model/gguf_tokenizer_data.h"
#include "engine/model/gguf_weights.h"

namespace kvlens {
namespace {

bool starts_with_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

// A regular file named .gguf or starting with the GGUF magic (Ollama's blobs have no extension).
bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) &&
         (std::filesystem::path(path).extension() == ".gguf" || starts_with_gguf_magic(path));
}

std::shared_ptr<const Model> load_gguf(const std::string& path, const std::string& predictor_file) {
  auto model = std::make_shared<Model>();
  model->dir = path;
  model->gguf = GgufFile::open(path);
  model->config = gguf_model_config(*model->gguf);
  model->weights = ModelWeights::from_files(
      load_gguf_tensors(model->gguf, model->config, gguf_dequantized_dtype(*model->gguf)),
      model->config);
  // The tokenizer llama.cpp would use for the file, from its metadata.
  if (has_gguf_tokenizer(*model->gguf)) {
    model->tokenizer = std::shared_ptr<const Tokenizer>(
        tokenizer_from_gguf(gguf_tokenizer_data(*model->gguf), path));
  }
  model->file_dirs.push_back(std::filesystem::path(path).parent_path().string());
  const std::string shipped = bundled_gguf_model_folder(*model->gguf);
  if (!shipped.empty()) model->file_dirs.push_back(shipped);
  if (!predictor_file.empty()) {
    model->predictor.predictor = Predictor::load_file(predictor_file, model->config);
  } else {
    GgufPredictorSearch search = find_gguf_predictor(path, *model->gguf);
    if (!search.found.empty()) {
      model->predictor.predictor = Predictor::load_file(search.found, model->config);
    } else {
      model->predictor.searched = std::move(search.searched);
    }
  }
  return model;
}

}  // namespace

void Model::check(const std::string& model_dir) {
  if (is_gguf_file(model_dir)) {
    const std::shared_ptr<const GgufFile> file = GgufFile::open(model_dir);
    gguf_model_config(*file);
    return;
  }
  load(model_dir);
}

std::shared_ptr<const Model> Model::load(const std::string& model_dir,
                                         const std::string& predictor_file) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (is_gguf_file(model_dir)) return load_gguf(model_dir, predictor_file);
  if (!fs::is_directory(model_dir, ec)) {
    throw Error(model_dir, "model folder",
                "a directory with config.json and safetensors weights, or a .gguf file",
                fs::exists(model_dir, ec) ? "a file that is neither" : "no such file or directory");
  }
  const fs::path dir(model_dir);
  const fs::path config_path = dir / "config.json";
  if (!fs::is_regular_file(config_path, ec)) {
    throw Error(model_dir, "config.json", "a config.json in the model folder", "none");
  }
  auto model = std::make_shared<Model>();
  model->dir = model_dir;
  model->file_dirs = {model_dir};
  model->config = ModelConfig::load(config_path.string());
  model->weights = ModelWeights::load(model_dir, model->config);
  const fs::path beside = dir / "predictor.safetensors";
  if (!predictor_file.empty()) {
    model->predictor.predictor = Predictor::load_file(predictor_file, model->config);
  } else if (model->config.model_type == "llama_butler") {
    model->predictor.predictor =
        Predictor::from_butler(model_dir, model->weights.files, model->config);
  } else if (fs::is_regular_file(beside, ec)) {
    model->predictor.predictor = Predictor::load_file(beside.string(), model->config);
  } else {
    model->predictor.searched = {beside.string() + " (none)",
                                 (dir / "config.json").string() + " (model_type " +
                                     model->config.model_type + ", not llama_butler)"};
  }
  const fs::path tokenizer_path = dir / "tokenizer.json";
  if (fs::is_regular_file(tokenizer_path, ec)) {
    model->tokenizer = std::make_shared<const Tokenizer>(Tokenizer::load(tokenizer_path.string()));
  }
  return model;
}

const Tokenizer& Model::require_tokenizer() const {
  if (!tokenizer && gguf) {
    throw Error(dir, "tokenizer", "a tokenizer from the GGUF file's metadata",
                "none (the file has no tokenizer.ggml.model)");
  }
  if (!tokenizer) {
    throw Error(dir, "tokenizer.json", "a tokenizer.json in the model folder", "none");
  }
  return *tokenizer;
}

}  // namespace kvlens
