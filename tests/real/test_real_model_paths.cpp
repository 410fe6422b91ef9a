// The `real` suite's model lookup (real_model_paths.h): environment variables first, then the
// cache folder tools/get_model.sh fills. Runs everywhere, the model fetched or not.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "tests/real/real_model_paths.h"
#include "tests/support/test_paths.h"

namespace real = kvlens::test::real;

namespace {

// Sets an environment variable for one scope, restoring the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { had_ ? ::setenv(name_, old_.c_str(), 1) : ::unsetenv(name_); }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("the model is found in KVLENS_REAL_MODEL, then in get_model.sh's cache", "[real]") {
  const std::string dir = kvlens::test::make_temp_dir("real-paths");
  ScopedEnv no_override("KVLENS_REAL_MODEL", "");
  ScopedEnv no_folder("KVLENS_REAL_HF_DIR", "");
  ScopedEnv cache("KVLENS_MODEL_CACHE", dir);
  CHECK(real::gguf_path().empty());
  CHECK_THAT(real::gguf_hint(), Catch::Contains(dir + "/smollm2/" + real::kGgufName) &&
                                    Catch::Contains("tools/get_model.sh smollm2"));

  std::filesystem::create_directories(dir + "/smollm2");
  std::ofstream(dir + "/smollm2/" + real::kGgufName) << "GGUF";
  CHECK(real::gguf_path() == dir + "/smollm2/" + real::kGgufName);
  CHECK(real::f32_folder_path().empty());
  const std::string folder = dir + "/smollm2/SmolLM2-135M-Instruct.Q4_1-f32-hf";
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/config.json") << "{}";
  CHECK(real::f32_folder_path() == folder);

  ScopedEnv override_file("KVLENS_REAL_MODEL", dir + "/elsewhere.gguf");
  CHECK(real::gguf_path().empty());  // set, but no such file
  std::ofstream(dir + "/elsewhere.gguf") << "GGUF";
  CHECK(real::gguf_path() == dir + "/elsewhere.gguf");
}
