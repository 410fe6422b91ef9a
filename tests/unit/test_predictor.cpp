// The TokenButler predictor in the engine: loading (predictor.json + predictor.safetensors beside a
// model, --predictor, errors naming file and field), its sizes, the CPU ops it adds (layer_norm,
// bias_activation), and the tokenbutler policy's selection (top-B(t) by the predicted logits,
// which it writes as its scores) at both granularities.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/model/model.h"
#include "engine/policy/predictor_runtime.h"
#include "engine/policy/registry.h"
#include "engine/session/decoder_session.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using Json = nlohmann::json;

namespace {

std::string tiny_model(const std::string& tag, bool predictor = true) {
  test::TinyLlamaSpec spec;
  spec.predictor = predictor;
  return test::write_tiny_llama(test::make_temp_dir(tag), spec);
}

// Rewrites predictor.json in `dir` with `change` applied.
void edit_predictor_json(const std::string& dir, const std::function<void(Json&)>& change) {
  Json config = Json::parse(read_text_file(dir + "/predictor.json"));
  change(config);
  test::write_file(dir + "/predictor.json", config.dump());
}

std::string load_error(const std::string& dir, const std::string& predictor_file = {}) {
  try {
    Model::load(dir, predictor_file);
  } catch (const Error& error) {
    return error.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("predictor sizes: the released Llama-3.2-1B predictor's parameter count", "[predictor]") {
  PredictorConfig c;
  c.variant = PredictorConfig::Variant::kV1;
  c.hidden_size = 2048;
  c.attn_reduce_factor = 8;
  c.reduced_size = 256;
  c.heads = 32;
  c.layers = 16;
  c.importance_dim = 16;
  c.intermediate = 512;
  CHECK(c.parameter_count() == 12393472);  // POLICIES.md: the released 1% predictor
  c.variant = PredictorConfig::Variant::kHf;
  CHECK(c.parameter_count() == 12393472 + 2 * 2048);  // + norm_importance
}

TEST_CASE("a predictor beside the model is found, --predictor overrides it", "[predictor]") {
  const std::string dir = tiny_model("predictor_found");
  const auto model = Model::load(dir);
  REQUIRE(model->predictor.predictor);
  CHECK(model->predictor.predictor->path == dir + "/predictor.safetensors");
  CHECK(model->predictor.predictor->config.variant == PredictorConfig::Variant::kHf);
  CHECK(model->predictor.predictor->config.importance_dim == 4);

  const std::string other = test::make_temp_dir("predictor_other");
  test::TinyLlamaSpec spec;
  test::write_tiny_predictor(other, spec, "v1", 2, 6, 12);
  const auto overridden = Model::load(dir, other + "/predictor.safetensors");
  REQUIRE(overridden->predictor.predictor);
  CHECK(overridden->predictor.predictor->config.variant == PredictorConfig::Variant::kV1);
  CHECK(overridden->predictor.predictor->config.importance_dim == 6);

  const auto none = Model::load(tiny_model("predictor_none", false));
  CHECK_FALSE(none->predictor.predictor);
  REQUIRE(none->predictor.searched.size() == 2);
  CHECK(none->predictor.searched[0].find("predictor.safetensors (none)") != std::string::npos);
}

TEST_CASE("predictor errors name the file, the field and the expectation", "[predictor]") {
  SECTION("--predictor that does not exist") {
    const std::string message = load_error(tiny_model("predictor_missing_file", false),
                                           "/nonexistent/predictor.safetensors");
    CHECK(message.find("/nonexistent/predictor.safetensors") != std::string::npos);
    CHECK(message.find("no such file") != std::string::npos);
  }
  SECTION("predictor.json missing") {
    const std::string dir = tiny_model("predictor_no_json");
    std::filesystem::remove(dir + "/predictor.json");
    const std::string message = load_error(dir);
    CHECK(message.find("predictor.json") != std::string::npos);
  }
  SECTION("wrong format, variant or sizes") {
    struct Case {
      std::function<void(Json&)> change;
      std::string field;
    };
    const Case cases[] = {
        {[](Json& c) { c["format"] = "something"; }, "format"},
        {[](Json& c) { c["variant"] = "v2"; }, "variant"},
        {[](Json& c) { c["hidden_size"] = 64; }, "hidden_size"},
        {[](Json& c) { c["heads"] = 8; }, "heads"},
        {[](Json& c) { c["layers"] = 3; }, "layers"},
        {[](Json& c) { c["attn_reduce_factor"] = 3; }, "attn_reduce_factor"},
        {[](Json& c) { c["dDash"] = "four"; }, "dDash"},
        {[](Json& c) { c["dDash"] = 5; }, "dDash"},
        {[](Json& c) { c.erase("intdim"); }, "intdim"},
    };
    for (const Case& c : cases) {
      const std::string dir = tiny_model("predictor_bad_json");
      edit_predictor_json(dir, c.change);
      const std::string message = load_error(dir);
      INFO(message);
      CHECK(message.find(dir + "/predictor.json") != std::string::npos);
      CHECK(message.find(c.field) != std::string::npos);
    }
  }
  SECTION("a tensor missing or of the wrong shape") {
    const std::string dir = tiny_model("predictor_bad_tensor");
    // intdim 9 in the json while the tensors are 8 wide.
    edit_predictor_json(dir, [](Json& c) { c["intdim"] = 9; });
    std::string message = load_error(dir);
    CHECK(message.find("q_proj_importance.0.weight") != std::string::npos);
    CHECK(message.find("[9, 32]") != std::string::npos);
    CHECK(message.find("[8, 32]") != std::string::npos);
    // An hf predictor.json over v1 tensors: norm_importance is missing.
    const std::string v1 = tiny_model("predictor_v1_as_hf", false);
    test::write_tiny_predictor(v1, test::TinyLlamaSpec{}, "v1");
    edit_predictor_json(v1, [](Json& c) { c["variant"] = "hf"; });
    message = load_error(v1);
    CHECK(message.find("norm_importance") != std::string::npos);
    CHECK(message.find("no such tensor") != std::string::npos);
  }
}

TEST_CASE("tokenbutler without a predictor says where it looked", "[predictor][policy]") {
  const std::string dir = tiny_model("tokenbutler_none", false);
  auto backend = make_cpu_backend(1);
  const auto resident = upload_model(Model::load(dir), *backend);
  DecoderSession session(resident);
  PolicyConfig config{"tokenbutler", 0.5, {}};
  const std::string message =
      test::error_message([&] { make_policy(config, session.policy_shape(), *backend); });
  CHECK(message.find("policy tokenbutler") != std::string::npos);
  CHECK(message.find(dir + "/predictor.safetensors (none)") != std::string::npos);
  CHECK(message.find("--predictor") != std::string::npos);
}

TEST_CASE("cpu layer_norm and bias_activation", "[predictor][cpu]") {
  auto backend = make_cpu_backend(1);
  const std::vector<float> x = {1.0f, -2.0f, 3.5f, 0.25f, 10.0f, 10.0f, 10.0f, 10.5f};
  const std::vector<float> w = {1.0f, 2.0f, 0.5f, -1.0f}, b = {0.0f, 1.0f, -1.0f, 0.5f};
  DeviceTensor xt = backend->alloc(DType::F32, {2, 4}), wt = backend->alloc(DType::F32, {4});
  DeviceTensor bt = backend->alloc(DType::F32, {4}), yt = backend->alloc(DType::F32, {2, 4});
  backend->from_host(xt, x.data(), 32);
  backend->from_host(wt, w.data(), 16);
  backend->from_host(bt, b.data(), 16);
  backend->layer_norm(xt, wt, bt, 1e-5f, yt);
  std::vector<float> y(8);
  backend->to_host(yt, y.data(), 32);
  for (int r = 0; r < 2; ++r) {
    double mean = 0, var = 0;
    for (int e = 0; e < 4; ++e) mean += x[size_t(r * 4 + e)] / 4.0;
    for (int e = 0; e < 4; ++e) var += std::pow(x[size_t(r * 4 + e)] - mean, 2) / 4.0;
    for (int e = 0; e < 4; ++e) {
      const double want =
          (x[size_t(r * 4 + e)] - mean) / std::sqrt(var + 1e-5) * w[size_t(e)] + b[size_t(e)];
      CHECK(y[size_t(r * 4 + e)] == Approx(want).epsilon(1e-6));
    }
  }
  backend->bias_activation(xt, &bt, Backend::Activation::Gelu);
  std::vector<float> g(8);
  backend->to_host(xt, g.data(), 32);
  for (size_t i = 0; i < 8; ++i) {
    const double v = double(x[i] + b[i % 4]);
    CHECK(g[i] == Approx(0.5 * v * (1 + std::erf(v / std::sqrt(2.0)))).epsilon(1e-6));
  }
  backend->bias_activation(xt, nullptr, Backend::Activation::Silu);
  std::vector<float> s(8);
  backend->to_host(xt, s.data(), 32);
  for (size_t i = 0; i < 8; ++i)
    CHECK(s[i] == Approx(g[i] / (1 + std::exp(-double(g[i])))).epsilon(1e-6));
}

TEST_CASE("tokenbutler keeps the top B(t) tokens by its predicted logits, at both granularities",
          "[predictor][policy]") {
  const std::string dir = tiny_model("tokenbutler_select");
  auto backend = make_cpu_backend(1);
  const auto model = Model::load(dir);
  const auto resident = upload_model(model, *backend);
  const std::string granularity = GENERATE(std::string("query_head"), std::string("kv_head"));
  INFO(granularity);
  DecoderSession session(resident);
  PolicyConfig config{"tokenbutler", 0.5, {"sinks=1", "granularity=" + granularity}};
  session.set_policy(make_policy(config, session.policy_shape(), *backend));
  // The same predictor stepped on its own: its rows must be the policy's scores.
  PredictorState reference(resident->predictor);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 33, 7, 7, 12, 40, 3, 8, 61, 17, 4};
  const int64_t H = 4, G = 2, E = 32;
  for (size_t t = 0; t < tokens.size(); ++t) {
    // The layer-0 input of this token, as the session computes it: embedding row -> RMSNorm.
    DeviceTensor hidden = backend->alloc(DType::F32, {1, E}),
                 normed = backend->alloc(DType::F32, {1, E});
    backend->embed(resident->embed, std::span(tokens).subspan(t, 1), hidden);
    backend->rmsnorm(hidden, resident->layers[0].attn_norm, 1e-5f, normed);
    reference.append(normed);
    session.forward(std::span(tokens).subspan(t, 1));
    const int64_t cols = int64_t(t) + 1;
    const int64_t budget = std::max<int64_t>(1, int64_t(std::ceil(0.5 * double(cols))));
    CHECK(session.decisions()[0] == LayerDecision::Dense);
    REQUIRE(session.decisions()[1] == LayerDecision::Masked);
    DeviceTensor expected_scores = backend->alloc(DType::F32, {H, cols});
    reference.predicted_logits(1, expected_scores);
    std::vector<float> want(size_t(H * cols));
    backend->to_host(expected_scores, want.data(), want.size() * sizeof(float));
    const DeviceTensor& scores = session.policy_scores()[1];
    const DeviceTensor& visible = session.visible()[1];
    const int64_t stride = scores.dim(1);
    std::vector<float> got(size_t(H * stride));
    std::vector<uint8_t> seen(size_t(H * stride));
    backend->to_host(scores, got.data(), got.size() * sizeof(float));
    backend->to_host(visible, seen.data(), seen.size());
    for (int64_t h = 0; h < H; ++h) {
      int64_t count = 0;
      for (int64_t j = 0; j < cols; ++j) {
        CHECK(got[size_t(h * stride + j)] == want[size_t(h * cols + j)]);
        count += seen[size_t(h * stride + j)];
      }
      CHECK(count == budget);
      CHECK(seen[size_t(h * stride + t)] == 1);  // the current token
      // The sink, unless B(t) has room for the current token alone (POLICIES.md's priority).
      if (budget >= 2) CHECK(seen[size_t(h * stride)] == 1);
      // Every hidden non-forced token ranks below every chosen one (ties to the more recent).
      const int64_t group = granularity == "kv_head" ? H / G : 1;
      auto rank_score = [&](int64_t j) {
        double sum = 0;
        const int64_t first = (h / group) * group;
        for (int64_t r = first; r < first + group; ++r) sum += want[size_t(r * cols + j)];
        return sum;
      };
      double lowest_chosen = INFINITY, highest_hidden = -INFINITY;
      for (int64_t j = 1; j < cols - 1; ++j) {
        if (seen[size_t(h * stride + j)])
          lowest_chosen = std::min(lowest_chosen, rank_score(j));
        else
          highest_hidden = std::max(highest_hidden, rank_score(j));
      }
      if (lowest_chosen < INFINITY && highest_hidden > -INFINITY)
        CHECK(highest_hidden <= lowest_chosen + 1e-5);
    }
  }
}

TEST_CASE("tokenbutler chooses every layer at once as it chooses each alone",
          "[predictor][policy]") {
  // A session hands the policy every layer's rows (LayerStep::every_layer_scores), and the
  // first selected layer of a step fills them all in one call; the same policy driven layer by
  // layer without them must write the same scores and sets, whatever the granularity and the
  // dense layers.
  test::TinyLlamaSpec spec;
  spec.layers = 5;
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("tokenbutler_layers"), spec);
  auto backend = make_cpu_backend(1);
  const auto resident = upload_model(Model::load(dir), *backend);
  const std::string granularity = GENERATE(std::string("query_head"), std::string("kv_head"));
  const std::string dense_layers = GENERATE(std::string("1"), std::string("3"));
  INFO(granularity << ", dense_layers " << dense_layers);
  const PolicyConfig config{
      "tokenbutler",
      0.5,
      {"sinks=1", "granularity=" + granularity, "dense_layers=" + dense_layers}};
  DecoderSession session(resident);
  session.set_policy(make_policy(config, session.policy_shape(), *backend));
  PolicyShape shape = session.policy_shape();
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 33, 7, 7, 12, 40, 3, 8, 61, 17, 4, 22, 19};
  shape.stride = int64_t(tokens.size());
  const auto alone = make_policy(config, shape, *backend);
  const int64_t L = spec.layers, H = spec.heads, E = spec.hidden, stride = shape.stride;
  std::vector<DeviceTensor> scores, visible;
  for (int64_t l = 0; l < L; ++l) {
    scores.push_back(backend->alloc(DType::F32, {H, stride}));
    visible.push_back(backend->alloc(DType::U8, {H, stride}));
  }
  int64_t batched_layers = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    session.forward(std::span(tokens).subspan(t, 1));
    DeviceTensor hidden = backend->alloc(DType::F32, {1, E}),
                 normed = backend->alloc(DType::F32, {1, E});
    backend->embed(resident->embed, std::span(tokens).subspan(t, 1), hidden);
    backend->rmsnorm(hidden, resident->layers[0].attn_norm, 1e-5f, normed);
    const int64_t cols = int64_t(t) + 1;
    for (int64_t l = 0; l < L; ++l) {
      LayerStep step;
      step.step = int64_t(t);
      step.layer = l;
      step.layer_input = &normed;  // read at layer 0 only
      const LayerDecision decision = alone->select(step, visible[size_t(l)], scores[size_t(l)]);
      REQUIRE(decision == session.decisions()[size_t(l)]);
      if (decision != LayerDecision::Masked) continue;
      ++batched_layers;
      const DeviceTensor& session_scores = session.policy_scores()[size_t(l)];
      const DeviceTensor& session_visible = session.visible()[size_t(l)];
      const int64_t session_stride = session_scores.dim(1);
      std::vector<float> want(size_t(H * stride)), got(size_t(H * session_stride));
      std::vector<uint8_t> want_seen(size_t(H * stride)), seen(size_t(H * session_stride));
      backend->to_host(scores[size_t(l)], want.data(), want.size() * sizeof(float));
      backend->to_host(visible[size_t(l)], want_seen.data(), want_seen.size());
      backend->to_host(session_scores, got.data(), got.size() * sizeof(float));
      backend->to_host(session_visible, seen.data(), seen.size());
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t j = 0; j < cols; ++j) {
          INFO("step " << t << " layer " << l << " head " << h << " key " << j);
          REQUIRE(got[size_t(h * session_stride + j)] == want[size_t(h * stride + j)]);
          REQUIRE(seen[size_t(h * session_stride + j)] == want_seen[size_t(h * stride + j)]);
        }
      }
    }
  }
  CHECK(batched_layers == int64_t(tokens.size()) * (L - std::stoll(dense_layers)));
}

TEST_CASE("tokenbutler's every-layer choice starts afresh with a new text", "[predictor][policy]") {
  // The policy chooses every layer at the first selected layer of a step and remembers the step;
  // a session reset to a new text numbers its steps from 0 again, so the same step number must
  // not reuse the last text's rows. Prefill 8 tokens, one step at position 8, twice.
  test::TinyLlamaSpec spec;
  spec.layers = 4;
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("tokenbutler_reset"), spec);
  auto backend = make_cpu_backend(1);
  const auto resident = upload_model(Model::load(dir), *backend);
  DecoderSession session(resident);
  session.set_policy(
      make_policy({"tokenbutler", 0.5, {"sinks=1"}}, session.policy_shape(), *backend),
      /*first_step=*/8);
  const int64_t H = spec.heads, E = spec.hidden, cols = 9;
  for (const std::vector<int32_t>& text :
       {std::vector<int32_t>{1, 5, 9, 2, 33, 7, 7, 12, 40}, {3, 8, 61, 17, 4, 22, 19, 50, 11}}) {
    session.reset();
    session.forward(std::span(text).first(8));
    session.forward(std::span(text).subspan(8, 1));
    // The predictor fed the same text on its own: its rows at position 8.
    PredictorState reference(resident->predictor);
    DeviceTensor hidden = backend->alloc(DType::F32, {cols, E}),
                 normed = backend->alloc(DType::F32, {cols, E});
    backend->embed(resident->embed, text, hidden);
    backend->rmsnorm(hidden, resident->layers[0].attn_norm, 1e-5f, normed);
    reference.append(normed);
    for (int64_t l = 1; l < spec.layers; ++l) {
      INFO("text starting " << text[0] << ", layer " << l);
      REQUIRE(session.decisions()[size_t(l)] == LayerDecision::Masked);
      DeviceTensor expected = backend->alloc(DType::F32, {H, cols});
      reference.predicted_logits(l, expected);
      std::vector<float> want(size_t(H * cols));
      backend->to_host(expected, want.data(), want.size() * sizeof(float));
      const DeviceTensor& scores = session.policy_scores()[size_t(l)];
      const int64_t stride = scores.dim(1);
      std::vector<float> got(size_t(H * stride));
      backend->to_host(scores, got.data(), got.size() * sizeof(float));
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = 0; j < cols; ++j)
          CHECK(got[size_t(h * stride + j)] == want[size_t(h * cols + j)]);
    }
  }
}
