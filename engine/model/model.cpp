// Model::load: a checkpoint folder (config.json, safetensors weights, optional tokenizer.json),
// fully validated before any compute.
#include "engine/model/model.h"

#include <filesystem>

#include "engine/common/error.h"

namespace kvlens {

std::shared_ptr<const Model> Model::load(const std::string& model_dir,
                                         const std::string& predictor_file) {
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
  if (!tokenizer) {
    throw Error(dir, "tokenizer.json", "a tokenizer.json in the model folder", "none");
  }
  return *tokenizer;
}

}  // namespace kvlens
