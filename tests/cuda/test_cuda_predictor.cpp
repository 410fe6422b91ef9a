// The CUDA backend's ops for the TokenButler predictor (layer_norm, bias_activation, a keys-only
// kv_append) against the CPU reference backend, and the predictor's incremental rows on the GPU
// against the CPU's and against PyTorch (tests/fixtures/tokenbutler), and its fused decode step
// (kernels/policy/predictor_step_kernels.cu) against its reference ops.
#include <catch2/catch.hpp>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/common/mapped_file.h"
#include "engine/model/model.h"
#include "engine/policy/predictor_runtime.h"
#include "kernels/cuda_backend.h"
#include "tests/support/backend_checks.h"
#include "tests/support/predictor_steps.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using kvlens::test::check_within;
using kvlens::test::make_f32;
using kvlens::test::read_f32;

namespace {

std::vector<float> normal_values(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

// Relative tolerance of `ulps` F32 units of roundoff per element, with a floor for values near 0.
std::vector<double> ulp_tolerance(const std::vector<float>& want, double ulps) {
  std::vector<double> tolerance(want.size());
  for (size_t i = 0; i < want.size(); ++i)
    tolerance[i] = ulps * std::ldexp(1.0, -24) * std::max(1.0, double(std::fabs(want[i])));
  return tolerance;
}

}  // namespace

TEST_CASE("cuda backend: layer_norm and bias_activation", "[cuda]") {
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0);
  const int64_t rows = 5, width = 96;
  const auto x = normal_values(size_t(rows * width), 1, 3.0f);
  const auto weight = normal_values(size_t(width), 2);
  const auto bias = normal_values(size_t(width), 3);
  SECTION("layer_norm, out of place and in place") {
    for (bool in_place : {false, true}) {
      std::vector<float> results[2];
      Backend* backends[2] = {cpu.get(), gpu.get()};
      for (int b = 0; b < 2; ++b) {
        DeviceTensor in = make_f32(*backends[b], x, {rows, width});
        DeviceTensor w = make_f32(*backends[b], weight, {width});
        DeviceTensor shift = make_f32(*backends[b], bias, {width});
        DeviceTensor out = in_place ? in : backends[b]->alloc(DType::F32, {rows, width});
        backends[b]->layer_norm(in, w, shift, 1e-5f, out);
        results[b] = read_f32(*backends[b], out);
      }
      // Both keep the statistics in double and round the inverse deviation once; the products
      // then round alike: a few F32 roundings of the (unit-scale) outputs.
      check_within(results[0], results[1], ulp_tolerance(results[0], 8), "layer_norm");
      // And it is a layer norm: mean 0, variance 1 before the affine part (spot check row 0).
      double mean = 0;
      for (int64_t e = 0; e < width; ++e)
        mean += (results[0][size_t(e)] - bias[size_t(e)]) / weight[size_t(e)];
      CHECK(std::fabs(mean / double(width)) < 1e-5);
    }
  }
  SECTION("bias_activation: none, GELU, SiLU, with and without a bias") {
    for (auto act :
         {Backend::Activation::None, Backend::Activation::Gelu, Backend::Activation::Silu}) {
      for (bool with_bias : {false, true}) {
        std::vector<float> results[2];
        Backend* backends[2] = {cpu.get(), gpu.get()};
        for (int b = 0; b < 2; ++b) {
          DeviceTensor t = make_f32(*backends[b], x, {rows, width});
          DeviceTensor shift = make_f32(*backends[b], bias, {width});
          backends[b]->bias_activation(t, with_bias ? &shift : nullptr, act);
          results[b] = read_f32(*backends[b], t);
        }
        // The same F32 sum, then the activation in double rounded once on both sides.
        check_within(results[0], results[1], ulp_tolerance(results[0], 2), "bias_activation");
        const float v = x[7] + (with_bias ? bias[7] : 0.0f);
        const double expected = act == Backend::Activation::Gelu
                                    ? 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)))
                                : act == Backend::Activation::Silu ? v / (1.0 + std::exp(-v))
                                                                   : v;
        CHECK(results[1][7] == Approx(expected).epsilon(1e-6).margin(1e-7));
      }
    }
  }
  SECTION("kv_append with an empty value cache writes the keys alone") {
    const int64_t groups = 3, capacity = 8, dim = 4;
    const auto keys = normal_values(size_t(2 * groups * dim), 4);
    DeviceTensor k = make_f32(*gpu, keys, {2, groups, dim});
    DeviceTensor cache = gpu->alloc(DType::F32, {groups, capacity, dim});
    DeviceTensor none;
    gpu->kv_append(k, none, cache, none, 5);
    const auto got = read_f32(*gpu, cache);
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t d = 0; d < dim; ++d)
          CHECK(got[size_t((g * capacity + 5 + i) * dim + d)] ==
                keys[size_t((i * groups + g) * dim + d)]);
    CHECK(got[0] == 0.0f);
  }
}

TEST_CASE("cuda backend: the tokenbutler predictor's rows equal the CPU's and PyTorch's",
          "[cuda]") {
  struct Case {
    std::string model, predictor, reference;
  };
  const std::string fixtures = test::source_path("tests/fixtures/");
  const Case cases[] = {
      {fixtures + "llama-gqa-f32", fixtures + "tokenbutler/predictor-v1/predictor.safetensors",
       fixtures + "tokenbutler/predictor-v1/reference.json"},
      {fixtures + "llama-gqa-f32", fixtures + "tokenbutler/predictor-hf/predictor.safetensors",
       fixtures + "tokenbutler/predictor-hf/reference.json"},
      {fixtures + "tokenbutler/butler-bf16", "",
       fixtures + "tokenbutler/butler-bf16/reference.json"},
  };
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0);
  for (const Case& c : cases) {
    INFO(c.reference);
    const auto ref = nlohmann::json::parse(read_text_file(c.reference));
    const auto model = Model::load(c.model, c.predictor);
    const auto tokens = ref["tokens"].get<std::vector<int32_t>>();
    for (int64_t prefill : {0, 9}) {
      const auto on_cpu = test::tokenbutler_predicted_rows(*cpu, model, tokens, prefill);
      const auto on_gpu = test::tokenbutler_predicted_rows(*gpu, model, tokens, prefill);
      const auto layers = ref["layers"].get<std::vector<int64_t>>();
      for (int64_t t = prefill; t < int64_t(tokens.size()); ++t) {
        for (size_t i = 0; i < layers.size(); ++i) {
          const auto& want = on_cpu[size_t(t)][size_t(layers[i])];
          const auto& got = on_gpu[size_t(t)][size_t(layers[i])];
          // F32 on both, summed in other orders (cuBLAS, block reductions): the PyTorch bound of
          // the parity test, 1e-4 of the row's scale.
          double scale = 1.0;
          for (float v : want) scale = std::max(scale, double(std::fabs(v)));
          check_within(want, got, std::vector<double>(want.size(), 1e-4 * scale),
                       "step " + std::to_string(t) + " layer " + std::to_string(layers[i]));
          // PyTorch's value for head 0, key 0.
          const double expected = ref["predicted"][i][0][size_t(t)][0];
          CHECK(got[0] == Approx(expected).margin(1e-4 * scale));
        }
      }
    }
  }
}

TEST_CASE("cuda backend: the predictor's fused decode step equals its reference ops", "[cuda]") {
  // A predictor of the 1B butler's proportions at a smaller width (r = 8, heads of 8 channels,
  // d' = 16), hf and v1, fed a 5-token chunk and then 300 decode tokens: long enough that the
  // fused step splits each head's keys over several blocks.
  auto gpu = make_cuda_backend(0);
  const std::string variant = GENERATE(std::string("hf"), std::string("v1"));
  INFO(variant);
  test::TinyLlamaSpec spec;
  spec.hidden = 512;
  spec.heads = 8;
  spec.kv_heads = 2;
  spec.layers = 4;
  spec.intermediate = 64;
  spec.predictor = false;
  spec.calibration = false;
  spec.seer_gate = false;
  spec.max_positions = 512;
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("fused_predictor"), spec);
  test::write_tiny_predictor(dir, spec, variant, 8, 16, 128);
  const auto model = Model::load(dir);
  REQUIRE(model->predictor.predictor);
  const auto uploaded = BackendPredictor::upload(model->predictor.predictor, *gpu);
  PredictorState fused(uploaded), reference(uploaded, /*fused_decode=*/false);
  const int64_t E = spec.hidden, prefill = 5, steps = 300, H = spec.heads;
  const int64_t predicted = spec.layers - 1;
  const auto rows = normal_values(size_t((prefill + steps) * E), 11);
  DeviceTensor chunk =
      make_f32(*gpu, std::vector<float>(rows.begin(), rows.begin() + prefill * E), {prefill, E});
  fused.append(chunk);
  reference.append(chunk);
  for (int64_t t = prefill; t < prefill + steps; ++t) {
    DeviceTensor row = make_f32(
        *gpu, std::vector<float>(rows.begin() + t * E, rows.begin() + (t + 1) * E), {1, E});
    fused.append(row);
    reference.append(row);
    if ((t - prefill) % 37 != 0 && t != prefill + steps - 1) continue;
    std::vector<float> got[2];
    PredictorState* states[2] = {&fused, &reference};
    for (int i = 0; i < 2; ++i) {
      DeviceTensor scores = gpu->alloc(DType::F32, {predicted * H, t + 1});
      states[i]->predicted_logits(1, predicted, scores);
      got[i] = read_f32(*gpu, scores);
    }
    // Both F32 throughout; the fused step sums its products and its softmax in other orders (an
    // online softmax over key splits): the bound of the CPU comparison above, 1e-4 of the
    // largest logit.
    double scale = 1.0;
    for (float v : got[1]) scale = std::max(scale, double(std::fabs(v)));
    check_within(got[1], got[0], std::vector<double>(got[1].size(), 1e-4 * scale),
                 "step " + std::to_string(t));
  }
  CHECK(fused.fused_steps() == steps);
  CHECK(reference.fused_steps() == 0);
}
