// find_model_file / require_model_file: the search order of files made for a model (beside it
// first, then the folder kvlens ships for a known GGUF model) and the error when none holds one.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "engine/common/error.h"
#include "engine/policy/model_files.h"
#include "tests/support/test_paths.h"

using namespace kvlens;
namespace fs = std::filesystem;

namespace {

void touch(const fs::path& path) {
  std::ofstream(path) << "x";
}

}  // namespace

TEST_CASE("a file made for the model is found beside it first, then in the shipped folder",
          "[unit]") {
  const fs::path beside = test::make_temp_dir("model_files_beside");
  const fs::path shipped = test::make_temp_dir("model_files_shipped");
  PolicyShape shape;
  shape.model_dir = (beside / "model.gguf").string();
  shape.model_file_dirs = {beside.string(), shipped.string()};

  touch(shipped / "loki_pca.safetensors");
  CHECK(find_model_file(shape, "loki_pca.safetensors").found ==
        (shipped / "loki_pca.safetensors").string());
  touch(beside / "loki_pca.safetensors");  // the user's own file wins
  CHECK(find_model_file(shape, "loki_pca.safetensors").found ==
        (beside / "loki_pca.safetensors").string());
  CHECK(require_model_file(shape, "policy loki", "loki_pca.safetensors", "the calibration file",
                           "make it") == (beside / "loki_pca.safetensors").string());
}

TEST_CASE("without model_file_dirs the folder of model_dir (a .gguf file's folder) is searched",
          "[unit]") {
  const fs::path folder = test::make_temp_dir("model_files_gguf");
  touch(folder / "model.gguf");
  touch(folder / "duo_gates.safetensors");
  PolicyShape shape;
  shape.model_dir = (folder / "model.gguf").string();
  const ModelFileSearch search = find_model_file(shape, "duo_gates.safetensors");
  CHECK(search.found == (folder / "duo_gates.safetensors").string());
  REQUIRE(search.folders.size() == 1);
  CHECK(search.folders[0] == folder.string());
}

TEST_CASE("a missing model file names the owner, the file, the tool and every folder looked in",
          "[unit]") {
  const fs::path beside = test::make_temp_dir("model_files_none_a");
  const fs::path shipped = test::make_temp_dir("model_files_none_b");
  PolicyShape shape;
  shape.model_file_dirs = {beside.string(), shipped.string()};
  try {
    require_model_file(shape, "policy doublesparsity", "doublesparsity_channels.safetensors",
                       "the calibration file", "run tools/calibrate_channels.py");
    FAIL("no error");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK(message.find("policy doublesparsity") != std::string::npos);
    CHECK(message.find("doublesparsity_channels.safetensors") != std::string::npos);
    CHECK(message.find("tools/calibrate_channels.py") != std::string::npos);
    CHECK(message.find(beside.string() + ", " + shipped.string()) != std::string::npos);
  }
  PolicyShape no_folder;
  try {
    require_model_file(no_folder, "policy loki", "loki_pca.safetensors", "the calibration file",
                       "make it");
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("a model without a folder") != std::string::npos);
  }
}
