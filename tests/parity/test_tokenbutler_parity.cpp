// The TokenButler predictor against PyTorch (tests/fixtures/tokenbutler, made by
// tools/make_predictor_fixtures.py): random-weight predictors of both variants (v1, hf) for the
// llama-gqa-f32 model, and a synthetic Hugging Face llama_butler folder (BF16 model, F32
// predictor shard). The references are ONE full-sequence forward of the predictor in float64;
// kvlens computes each row incrementally in F32, step by step (decode simulation) or after a
// dense prompt chunk (prefill + decode), and must give the same rows.
//
// Tolerance: F32 through a dozen small products (widths 4..64), three LayerNorms and two
// softmax-free dot products of width d' against a float64 reference: relative errors of a few
// 1e-6 of the row's largest magnitude. 1e-4 of max(1, that magnitude) keeps 20x headroom, while
// a wrong slot mapping, RoPE width or scaling, a missed norm or a re-rotated key moves values by
// 1e-1 or more.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/model/model.h"
#include "engine/session/decoder_session.h"
#include "tests/support/predictor_steps.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

namespace {

constexpr double kRelativeTolerance = 1e-4;

nlohmann::json reference(const std::string& folder) {
  return nlohmann::json::parse(read_text_file(
      test::source_path("tests/fixtures/tokenbutler/" + folder + "/reference.json")));
}

// Compares every computed row (steps from `first_step` on) with the reference's lower triangle.
void check_rows(const test::PredictedRows& rows, const nlohmann::json& ref, int64_t first_step) {
  const auto layers = ref["layers"].get<std::vector<int64_t>>();
  const int64_t heads = ref["heads"];
  const int64_t steps = int64_t(ref["tokens"].size());
  double worst = 0.0;
  for (size_t i = 0; i < layers.size(); ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t t = first_step; t < steps; ++t) {
        const auto expected = ref["predicted"][i][size_t(h)][size_t(t)].get<std::vector<double>>();
        REQUIRE(int64_t(expected.size()) == t + 1);
        const std::vector<float>& row = rows[size_t(t)][size_t(layers[i])];
        double scale = 1.0;
        for (double v : expected) scale = std::max(scale, std::abs(v));
        for (int64_t j = 0; j <= t; ++j) {
          const double got = row[size_t(h * (t + 1) + j)];
          const double gap = std::abs(got - expected[size_t(j)]) / scale;
          worst = std::max(worst, gap);
          if (gap > kRelativeTolerance) {
            INFO("layer " << layers[i] << " head " << h << " step " << t << " key " << j);
            CHECK(got == Approx(expected[size_t(j)]).margin(kRelativeTolerance * scale));
          }
        }
      }
    }
  }
  INFO("largest gap relative to the row's scale: " << worst);
  CHECK(worst <= kRelativeTolerance);
}

}  // namespace

TEST_CASE("tokenbutler predictor rows equal PyTorch's full-sequence forward, both variants",
          "[parity][tokenbutler]") {
  for (const char* variant : {"v1", "hf"}) {
    INFO("variant " << variant);
    const std::string folder = std::string("predictor-") + variant;
    const auto ref = reference(folder);
    REQUIRE(ref["variant"] == variant);
    const auto model = Model::load(
        test::source_path("tests/fixtures/llama-gqa-f32"),
        test::source_path("tests/fixtures/tokenbutler/" + folder + "/predictor.safetensors"));
    REQUIRE(model->predictor.predictor);
    CHECK(PredictorConfig::variant_name(model->predictor.predictor->config.variant) ==
          std::string(variant));
    const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
    auto backend = make_cpu_backend();
    SECTION("decode simulation: every token a step") {
      check_rows(test::tokenbutler_predicted_rows(*backend, model, tokens), ref, 0);
    }
    SECTION("prefill + decode: the prompt's inputs reach the predictor as one chunk") {
      check_rows(test::tokenbutler_predicted_rows(*backend, model, tokens, 11), ref, 11);
    }
  }
}

TEST_CASE("a llama_butler folder opens as model + predictor and matches PyTorch",
          "[parity][tokenbutler]") {
  const auto ref = reference("butler-bf16");
  const std::string dir = test::source_path("tests/fixtures/tokenbutler/butler-bf16");
  const auto model = Model::load(dir);
  REQUIRE(model->config.model_type == "llama_butler");
  REQUIRE(model->predictor.predictor);
  CHECK(model->predictor.predictor->path == dir);
  CHECK(model->predictor.predictor->config.variant == PredictorConfig::Variant::kHf);
  CHECK(model->predictor.predictor->config.importance_dim == 4);
  CHECK(model->predictor.predictor->config.intermediate == 16);
  const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
  auto backend = make_cpu_backend();
  check_rows(test::tokenbutler_predicted_rows(*backend, model, tokens), ref, 0);

  // The model part: the next-token logits at the last position (BF16 weights widened to F32 on
  // both sides; same tolerance argument as the other parity fixtures).
  const auto resident = upload_model(model, *backend);
  DecoderSession session(resident);
  const DeviceTensor& logits = session.forward(tokens);
  std::vector<float> all(size_t(logits.numel()));
  backend->to_host(logits, all.data(), all.size() * sizeof(float));
  const auto expected = ref["last_logits"].get<std::vector<double>>();
  const int64_t vocab = int64_t(expected.size());
  const float* last = all.data() + (int64_t(tokens.size()) - 1) * vocab;
  for (int64_t i = 0; i < vocab; ++i)
    CHECK(last[i] ==
          Approx(expected[size_t(i)]).margin(1e-4 * std::max(1.0, std::abs(expected[size_t(i)]))));
}
