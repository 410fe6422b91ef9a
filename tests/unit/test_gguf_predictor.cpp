// A GGUF model's TokenButler predictor without --predictor: the file beside the .gguf first,
// then the bundled index (assets/predictors/index.json) by general.name and architecture; each
// malformed index entry is an error naming the entry and field.
#include <catch2/catch.hpp>

#include <filesystem>

#include "engine/common/error.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_predictor.h"
#include "tests/support/error_message.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/test_paths.h"

using Catch::Matchers::Contains;
using kvlens::find_gguf_predictor;
using kvlens::match_predictor_index;
using kvlens::test::error_message;

namespace {

std::string gguf_named(const std::string& name, const std::string& arch) {
  kvlens::test::GgufWriter writer;
  writer.string("general.architecture", arch);
  writer.string("general.name", name);
  return writer.bytes();
}

const char* kIndex = R"({"predictors": [
  {"general.name": "Tiny", "general.architecture": "llama", "file": "tiny/predictor.safetensors"},
  {"general.name": "Tiny", "general.architecture": "qwen2", "file": "q/predictor.safetensors"}]})";

}  // namespace

TEST_CASE("predictor index: matched by name and architecture, resolved beside the index",
          "[gguf][predictor]") {
  CHECK(match_predictor_index(kIndex, "/a/b/index.json", "Tiny", "llama") ==
        "/a/b/tiny/predictor.safetensors");
  CHECK(match_predictor_index(kIndex, "/a/b/index.json", "Tiny", "qwen2") ==
        "/a/b/q/predictor.safetensors");
  CHECK(match_predictor_index(kIndex, "/a/b/index.json", "Tiny", "phi3").empty());
  CHECK(match_predictor_index(kIndex, "/a/b/index.json", "tiny", "llama").empty());
}

TEST_CASE("predictor index: each malformed part is an error naming it", "[gguf][predictor]") {
  CHECK_THAT(error_message([] { match_predictor_index("{", "i.json", "n", "a"); }),
             Contains("i.json") && Contains("a JSON object"));
  CHECK_THAT(error_message([] { match_predictor_index("{}", "i.json", "n", "a"); }),
             Contains("predictors") && Contains("an array"));
  CHECK_THAT(
      error_message([] { match_predictor_index(R"({"predictors": [3]})", "i.json", "n", "a"); }),
      Contains("predictors[0]") && Contains("an object"));
  CHECK_THAT(error_message([] {
               match_predictor_index(
                   R"({"predictors": [{"general.name": "n", "general.architecture": "a"}]})",
                   "i.json", "n", "a");
             }),
             Contains("predictors[0].file") && Contains("a string") && Contains("none"));
  CHECK_THAT(
      error_message([] {
        match_predictor_index(
            R"({"predictors": [{"general.name": 1, "general.architecture": "a", "file": "f"}]})",
            "i.json", "n", "a");
      }),
      Contains("predictors[0].general.name") && Contains("number"));
}

TEST_CASE("GGUF predictor search: beside the file first, then the bundled index",
          "[gguf][predictor]") {
  const std::string dir = kvlens::test::make_temp_dir("gguf_predictor");
  const std::string smol = "Smollm2 135M 8k Lc100K Mix1 Ep2";

  const std::string path = dir + "/model.Q4_1.gguf";
  kvlens::test::write_file(path, gguf_named(smol, "llama"));
  const auto file = kvlens::GgufFile::open(path);
  // No file beside it: the bundled SmolLM2 predictor (the shipped index names this model).
  kvlens::GgufPredictorSearch search = find_gguf_predictor(path, *file);
  CHECK_THAT(search.found, Contains("smollm2-135m-instruct/predictor.safetensors"));
  CHECK(std::filesystem::is_regular_file(search.found));

  // A user's own predictor beside the file wins.
  kvlens::test::write_file(dir + "/model.Q4_1.predictor.safetensors", "x");
  search = find_gguf_predictor(path, *file);
  CHECK(search.found == dir + "/model.Q4_1.predictor.safetensors");

  // Another model: nothing found, and the message lists both places.
  const std::string other = dir + "/other.gguf";
  kvlens::test::write_file(other, gguf_named("Someone Else 1B", "llama"));
  search = find_gguf_predictor(other, *kvlens::GgufFile::open(other));
  CHECK(search.found.empty());
  REQUIRE(search.searched.size() == 2);
  CHECK_THAT(search.searched[0], Contains("other.predictor.safetensors (none)"));
  CHECK_THAT(search.searched[1], Contains("index.json") && Contains("Someone Else 1B"));
}

TEST_CASE("GGUF model files: the folder kvlens ships for a known model, none for another",
          "[gguf][predictor]") {
  const std::string dir = kvlens::test::make_temp_dir("gguf_model_folder");
  const std::string path = dir + "/smol.gguf";
  kvlens::test::write_file(path, gguf_named("Smollm2 135M 8k Lc100K Mix1 Ep2", "llama"));
  const std::string folder = kvlens::bundled_gguf_model_folder(*kvlens::GgufFile::open(path));
  CHECK_THAT(folder, Contains("predictors") && Contains("smollm2-135m-instruct"));
  // The shipped folder holds every policy's file made for SmolLM2 (item 2 of the real-model
  // issue: every policy runs on it).
  for (const char* name :
       {"predictor.safetensors", "loki_pca.safetensors", "doublesparsity_channels.safetensors",
        "duo_gates.safetensors", "seer_gate.safetensors", "seer_gate.json"}) {
    INFO(name);
    CHECK(std::filesystem::is_regular_file(std::filesystem::path(folder) / name));
  }
  const std::string other = dir + "/other.gguf";
  kvlens::test::write_file(other, gguf_named("Someone Else 1B", "llama"));
  CHECK(kvlens::bundled_gguf_model_folder(*kvlens::GgufFile::open(other)).empty());
}
