// upload_model with UploadOptions (kvlens-cli --dtype / --kv-dtype) on the CPU: weights
// converted on load as torch's .to(dtype) converts them, and the KV cache dtypes the CPU keeps.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/session/decoder_session.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;

TEST_CASE("upload --dtype bf16 rounds F32 weights to nearest even, --dtype f32 widens F16",
          "[upload]") {
  auto backend = make_cpu_backend(1);
  test::TinyLlamaSpec spec;
  spec.predictor = false;
  const auto model = Model::load(test::write_tiny_llama(test::make_temp_dir("upload-f32"), spec));
  UploadOptions bf16;
  bf16.weight_dtype = DType::BF16;
  const auto narrow = upload_model(model, *backend, bf16);
  REQUIRE(narrow->weight_dtype() == DType::BF16);
  REQUIRE(narrow->layers[0].attn_norm.dtype == DType::BF16);
  REQUIRE(narrow->kv_cache_dtype == DType::F32);  // the CPU keeps F32 caches
  const TensorView& wq = model->weights.layers[0].wq;
  std::vector<float> original(size_t(wq.numel()));
  std::memcpy(original.data(), wq.data, original.size() * sizeof(float));
  const auto* stored = narrow->layers[0].wq.as<const uint16_t>();
  int64_t rounded_away = 0;  // values BF16 cannot hold: the test data must exercise rounding
  for (size_t i = 0; i < original.size(); ++i) {
    REQUIRE(stored[i] == f32_to_bf16(original[i]));
    rounded_away += bf16_to_f32(stored[i]) != original[i];
  }
  CHECK(rounded_away > 0);
  // The session runs on the converted weights (a forward of a few tokens).
  DecoderSession session(narrow);
  CHECK(session.step(3).size() == size_t(spec.vocab));

  spec.dtype = "F16";
  const auto half = Model::load(test::write_tiny_llama(test::make_temp_dir("upload-f16"), spec));
  UploadOptions f32;
  f32.weight_dtype = DType::F32;
  const auto wide = upload_model(half, *backend, f32);
  REQUIRE(wide->weight_dtype() == DType::F32);
  const TensorView& half_wq = half->weights.layers[0].wq;
  const auto* widened = wide->layers[0].wq.as<const float>();
  for (int64_t i = 0; i < half_wq.numel(); ++i) {
    uint16_t bits;
    std::memcpy(&bits, half_wq.data + 2 * i, sizeof bits);
    REQUIRE(widened[i] == f16_to_f32(bits));
  }
}

TEST_CASE("upload refuses dtypes it cannot give", "[upload]") {
  auto backend = make_cpu_backend(1);
  test::TinyLlamaSpec spec;
  spec.predictor = false;
  const auto model = Model::load(test::write_tiny_llama(test::make_temp_dir("upload-bad"), spec));
  UploadOptions f16_weights;
  f16_weights.weight_dtype = DType::F16;
  CHECK_THROWS_AS(upload_model(model, *backend, f16_weights), Error);
  UploadOptions bf16_cache;
  bf16_cache.kv_cache_dtype = DType::BF16;
  CHECK_THROWS_AS(upload_model(model, *backend, bf16_cache), Error);
  SessionOptions options;
  options.kv_cache_dtype = DType::F16;
  CHECK_THROWS_AS(DecoderSession(upload_model(model, *backend), options), Error);
}
