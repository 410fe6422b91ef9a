// Lookup of the fetched real model for the `real` tests (see real_model_paths.h).
#include "tests/real/real_model_paths.h"

#include <cstdlib>
#include <filesystem>

namespace kvlens::test::real {
namespace {

namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

// get_model.sh's default: $KVLENS_MODEL_CACHE, else ~/.cache/kvlens/models.
std::string cache_dir() {
  if (std::string cache = env("KVLENS_MODEL_CACHE"); !cache.empty()) return cache;
  return env("HOME") + "/.cache/kvlens/models";
}

std::string expected_gguf() {
  if (std::string set = env("KVLENS_REAL_MODEL"); !set.empty()) return set;
  return cache_dir() + "/smollm2/" + kGgufName;
}

std::string expected_f32_folder() {
  if (std::string set = env("KVLENS_REAL_HF_DIR"); !set.empty()) return set;
  const fs::path gguf(expected_gguf());
  return (gguf.parent_path() / (gguf.stem().string() + "-f32-hf")).string();
}

}  // namespace

std::string gguf_path() {
  const std::string path = expected_gguf();
  std::error_code ec;
  return fs::is_regular_file(path, ec) ? path : std::string();
}

std::string f32_folder_path() {
  const std::string dir = expected_f32_folder();
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / "config.json", ec) ? dir : std::string();
}

std::string gguf_hint() {
  return "looked for " + expected_gguf() +
         "; fetch it with tools/get_model.sh smollm2, or set KVLENS_REAL_MODEL to the .gguf";
}

std::string f32_folder_hint() {
  return "looked for " + expected_f32_folder() +
         "/config.json; make it with tools/make_real_fixtures.py --hf-only --gguf FILE, or set "
         "KVLENS_REAL_HF_DIR";
}

}  // namespace kvlens::test::real
