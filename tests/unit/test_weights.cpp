// ModelWeights and Model::load on tiny random checkpoints: every dtype, tied/untied, sharded,
// explicit head_dim, and the errors for missing tensors, wrong shapes and wrong dtypes.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/model/weights.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using Catch::Matchers::Contains;
using kvlens::ModelConfig;
using kvlens::ModelWeights;
using kvlens::test::TestTensor;
using kvlens::test::TinyLlamaSpec;

namespace {

using kvlens::test::error_message;

ModelWeights load_dir(const std::string& dir) {
  return ModelWeights::load(dir, ModelConfig::load(dir + "/config.json"));
}

// Writes spec's checkpoint after `edit` has changed its tensor list.
template <class Edit>
std::string write_edited(const std::string& tag, const TinyLlamaSpec& spec, Edit&& edit) {
  std::vector<TestTensor> tensors = kvlens::test::tiny_llama_tensors(spec);
  edit(tensors);
  const std::string dir = kvlens::test::make_temp_dir(tag);
  kvlens::test::write_checkpoint(dir, kvlens::test::tiny_llama_config(spec), tensors, false);
  return dir;
}

TestTensor& find(std::vector<TestTensor>& tensors, const std::string& name) {
  for (TestTensor& tensor : tensors) {
    if (tensor.name == name) return tensor;
  }
  FAIL("no tensor " << name);
  return tensors.front();
}

}  // namespace

TEST_CASE("weights: tiny checkpoints load with the documented shapes", "[model]") {
  TinyLlamaSpec spec;
  const std::string dtype = GENERATE(as<std::string>{}, "F32", "BF16", "F16");
  const bool tied = GENERATE(false, true);
  const bool sharded = GENERATE(false, true);
  spec.dtype = dtype;
  spec.tied = tied;
  spec.sharded = sharded;
  spec.seed = 7;
  const std::string dir = kvlens::test::write_tiny_llama(kvlens::test::make_temp_dir("w"), spec);
  const ModelWeights w = load_dir(dir);

  const kvlens::DType expected_dtype = dtype == "F32"    ? kvlens::DType::F32
                                       : dtype == "BF16" ? kvlens::DType::BF16
                                                         : kvlens::DType::F16;
  using Shape = std::vector<int64_t>;
  CHECK(w.embed.shape == Shape{64, 32});
  CHECK(w.embed.dtype == expected_dtype);
  CHECK(w.final_norm.shape == Shape{32});
  CHECK(w.lm_head.shape == Shape{64, 32});
  if (tied) {
    CHECK(w.lm_head.data == w.embed.data);
  } else {
    CHECK(w.lm_head.name == "lm_head.weight");
    CHECK(w.lm_head.data != w.embed.data);
  }
  REQUIRE(w.layers.size() == 2);
  for (const kvlens::LayerWeights& layer : w.layers) {
    CHECK(layer.attn_norm.shape == Shape{32});
    CHECK(layer.wq.shape == Shape{32, 32});  // 4 heads of 8
    CHECK(layer.wk.shape == Shape{16, 32});  // 2 KV heads of 8
    CHECK(layer.wv.shape == Shape{16, 32});
    CHECK(layer.wo.shape == Shape{32, 32});
    CHECK(layer.mlp_norm.shape == Shape{32});
    CHECK(layer.w_gate.shape == Shape{48, 32});
    CHECK(layer.w_up.shape == Shape{48, 32});
    CHECK(layer.w_down.shape == Shape{32, 48});
    CHECK(layer.w_down.dtype == expected_dtype);
  }
  CHECK(w.layers[1].wq.name == "model.layers.1.self_attn.q_proj.weight");

  // The bytes are the generator's: weights ~ N(0, 0.05), norms ~ 1.
  const std::vector<TestTensor> tensors = kvlens::test::tiny_llama_tensors(spec);
  const TestTensor& norm = tensors[1];
  REQUIRE(norm.name == "model.layers.0.input_layernorm.weight");
  REQUIRE(w.layers[0].attn_norm.bytes == norm.bytes.size());
  CHECK(std::memcmp(w.layers[0].attn_norm.data, norm.bytes.data(), norm.bytes.size()) == 0);
  double norm_mean = 0, weight_sq = 0;
  for (const float v : kvlens::test::tensor_values(norm)) norm_mean += v / 32.0;
  const std::vector<float> embed = kvlens::test::tensor_values(tensors[0]);
  for (const float v : embed) weight_sq += double(v) * v / double(embed.size());
  CHECK(norm_mean == Approx(1.0).margin(0.05));
  CHECK(std::sqrt(weight_sq) == Approx(0.05).margin(0.01));
}

TEST_CASE("weights: explicit head_dim different from hidden / heads", "[model]") {
  TinyLlamaSpec spec;
  spec.head_dim = 16;  // 4 heads * 16 = 64 != hidden 32
  const std::string dir = kvlens::test::write_tiny_llama(kvlens::test::make_temp_dir("hd"), spec);
  const ModelWeights w = load_dir(dir);
  CHECK(w.layers[0].wq.shape == std::vector<int64_t>{64, 32});
  CHECK(w.layers[0].wk.shape == std::vector<int64_t>{32, 32});
  CHECK(w.layers[0].wo.shape == std::vector<int64_t>{32, 64});
}

TEST_CASE("weights: errors name the folder, the tensor and the expectation", "[model]") {
  TinyLlamaSpec spec;
  SECTION("a missing tensor") {
    const std::string dir = write_edited("w-missing", spec, [](std::vector<TestTensor>& t) {
      std::erase_if(
          t, [](const TestTensor& x) { return x.name == "model.layers.1.mlp.up_proj.weight"; });
    });
    const std::string message = error_message([&] { load_dir(dir); });
    CHECK_THAT(message, Contains(dir) && Contains("model.layers.1.mlp.up_proj.weight") &&
                            Contains("[48, 32]") && Contains("no such tensor"));
  }
  SECTION("a wrong shape") {
    const std::string dir = write_edited("w-shape", spec, [](std::vector<TestTensor>& t) {
      TestTensor& k = find(t, "model.layers.0.self_attn.k_proj.weight");
      k.shape = {32, 16};  // same byte count, transposed
    });
    const std::string message = error_message([&] { load_dir(dir); });
    CHECK_THAT(message, Contains(dir) && Contains("model.layers.0.self_attn.k_proj.weight") &&
                            Contains("shape [16, 32]") && Contains("found [32, 16]"));
  }
  SECTION("a wrong dtype (I32)") {
    const std::string dir = write_edited("w-dtype", spec, [](std::vector<TestTensor>& t) {
      find(t, "model.norm.weight").dtype = "I32";  // 4-byte elements: sizes stay consistent
    });
    const std::string message = error_message([&] { load_dir(dir); });
    CHECK_THAT(message, Contains(dir) && Contains("model.norm.weight") &&
                            Contains("dtype F32, F16 or BF16") && Contains("I32"));
  }
  SECTION("untied without lm_head.weight") {
    const std::string dir = write_edited("w-nohead", spec, [](std::vector<TestTensor>& t) {
      std::erase_if(t, [](const TestTensor& x) { return x.name == "lm_head.weight"; });
    });
    CHECK_THAT(error_message([&] { load_dir(dir); }),
               Contains(dir) && Contains("lm_head.weight") && Contains("[64, 32]"));
  }
  SECTION("a config with more layers than the checkpoint") {
    TinyLlamaSpec more = spec;
    more.extra_config = R"({"num_hidden_layers": 3})";
    const std::string dir =
        kvlens::test::write_tiny_llama(kvlens::test::make_temp_dir("w-layers"), more);
    CHECK_THAT(error_message([&] { load_dir(dir); }),
               Contains("model.layers.2.input_layernorm.weight"));
  }
}

TEST_CASE("model: Model::load reads config, weights and the optional tokenizer", "[model]") {
  TinyLlamaSpec spec;
  spec.model_type = "mistral";
  spec.sharded = true;
  const std::string dir = kvlens::test::write_tiny_llama(kvlens::test::make_temp_dir("m"), spec);
  const std::shared_ptr<const kvlens::Model> model = kvlens::Model::load(dir);
  CHECK(model->dir == dir);
  CHECK(model->config.model_type == "mistral");
  CHECK_FALSE(model->config.sliding_window.has_value());
  CHECK(model->weights.layers.size() == 2);
  CHECK(model->tokenizer == nullptr);
  CHECK_THAT(error_message([&] { model->require_tokenizer(); }),
             Contains(dir) && Contains("tokenizer.json"));

  std::filesystem::remove(dir + "/config.json");
  CHECK_THAT(error_message([&] { kvlens::Model::load(dir); }),
             Contains(dir) && Contains("config.json"));
  CHECK_THAT(error_message([&] { kvlens::Model::load(dir + "/no-such-model"); }),
             Contains("no-such-model"));
}
