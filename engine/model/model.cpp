// Model::load: a checkpoint folder (config.json, safetensors weights, optional tokenizer.json),
// fully validated before any compute.
#include "engine/model/model.h"

#include <filesystem>

#include "engine/common/error.h"

namespace kvlens {

std::shared_ptr<const Model> Model::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) {
    throw Error(model_dir, "model folder", "a directory with config.json and safetensors weights",
                "no such directory");
  }
  const fs::path dir(model_dir);
  const fs::path config_path = dir / "config.json";
  if (!fs::is_regular_file(config_path, ec)) {
    throw Error(model_dir, "config.json", "a config.json in the model folder", "none");
  }
  auto model = std::make_shared<Model>();
  model->dir = model_dir;
  model->config = ModelConfig::load(config_path.string());
  model->weights = ModelWeights::load(model_dir, model->config);
  const fs::path tokenizer_path = dir / "tokenizer.json";
  if (fs::is_regular_file(tokenizer_path, ec)) {
    model->tokenizer = std::make_shared<const Tokenizer>(Tokenizer::load(tokenizer_path.string()));
  }
  return model;
}

const Tokenizer& Model::require_tokenizer() const {
  if (!tokenizer) {
    throw Error(dir, "tokenizer.json", "a tokenizer.json in the model folder", "none");
  }
  return *tokenizer;
}

}  // namespace kvlens
