// Gemma 3: its config.json files (gemma3_text, and gemma3 with the language model under
// text_config, transformers 4 and 5 spellings) and their errors, and every registered policy
// decoding the tiny random gemma3 fixture (tests/fixtures/gemma3-window-softcap-f32: local,
// local, global layers, window 16), where the local layers never show a key outside the window.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/common/mapped_file.h"
#include "engine/model/config.h"
#include "engine/model/model.h"
#include "engine/model/safetensors.h"
#include "engine/policy/registry.h"
#include "engine/session/decoder_session.h"
#include "engine/session/scoring.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using Catch::Matchers::Contains;
using namespace kvlens;

namespace {

// google/gemma-3-1b-it's config.json (transformers 4.50), abridged.
const char* const kGemma3_1B = R"({
  "architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "attn_logit_softcapping": null, "bos_token_id": 2, "cache_implementation": "hybrid",
  "eos_token_id": [1, 106], "final_logit_softcapping": null, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "initializer_range": 0.02,
  "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text",
  "num_attention_heads": 4, "num_hidden_layers": 26, "num_key_value_heads": 1,
  "pad_token_id": 0, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
  "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": 512, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
  "transformers_version": "4.50.0.dev0", "use_cache": true, "vocab_size": 262144})";

// google/gemma-3-4b-it's config.json (a Gemma3ForConditionalGeneration), abridged: the text part
// leaves the vocabulary, the head counts and the RoPE bases to Gemma3TextConfig's defaults.
const char* const kGemma3_4B = R"({
  "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
  "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
  "mm_tokens_per_image": 256, "model_type": "gemma3",
  "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                  "num_hidden_layers": 34,
                  "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                  "sliding_window": 1024},
  "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
  "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}})";

// A small gemma3_text config with `extra` fields appended.
std::string small_gemma(const std::string& extra) {
  std::string text = R"({"model_type": "gemma3_text", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 16)";
  if (!extra.empty()) text += ", " + extra;
  return text + "}";
}

}  // namespace

TEST_CASE("config: Gemma 3 1B, every sixth layer global", "[model][gemma3]") {
  const ModelConfig c = ModelConfig::parse(kGemma3_1B, "gemma-3-1b");
  CHECK(c.model_type == "gemma3_text");
  CHECK_FALSE(c.multimodal_prefix);
  REQUIRE(c.sliding_layers.size() == 26);
  for (int64_t layer = 0; layer < 26; ++layer) {
    INFO("layer " << layer);
    const bool global = (layer + 1) % 6 == 0;
    CHECK(c.layer_is_local(layer) == !global);
    CHECK(c.layer_window(layer) == (global ? 0 : 512));
  }
  CHECK(c.layer_pattern() ==
        "local x5, global, local x5, global, local x5, global, local x5, global, local x2");
  CHECK(c.rope_theta == 1000000.0);
  CHECK(c.rope_local_theta == 10000.0);
  CHECK(c.rope_scaling.type == RopeScaling::Type::kNone);
  CHECK(c.attention_scalar == 256.0);
  CHECK(c.final_logit_softcap == 0.0);
  CHECK(c.hidden_activation == ModelConfig::Activation::kGeluTanh);
  CHECK(c.embedding_scale == Approx(std::sqrt(1152.0)));
  CHECK(c.norm_weight_offset);
  CHECK(c.sandwich_norms);
  CHECK(c.qk_norm);
  CHECK(c.tie_word_embeddings);  // Gemma3TextConfig's default
  CHECK(c.eos_token_ids == std::vector<int64_t>{1, 106});
  CHECK(c.torch_dtype == DType::BF16);
  // The local layers' table: base 1e4 over head_dim 256, channel pair 1 = 1e4^(-2/256).
  const std::vector<float> local = c.rope_inv_freq_local();
  REQUIRE(local.size() == 128);
  CHECK(local[0] == 1.0f);
  CHECK(local[1] == Approx(std::pow(10000.0, -2.0 / 256.0)).epsilon(1e-6));
  CHECK(c.rope_inv_freq()[1] == Approx(std::pow(1000000.0, -2.0 / 256.0)).epsilon(1e-6));
}

TEST_CASE("config: Gemma 3 4B, the language model of a gemma3 config", "[model][gemma3]") {
  const ModelConfig c = ModelConfig::parse(kGemma3_4B, "gemma-3-4b");
  CHECK(c.model_type == "gemma3_text");
  CHECK(c.multimodal_prefix);
  CHECK(c.hidden_size == 2560);
  CHECK(c.num_layers == 34);
  // Gemma3TextConfig's defaults.
  CHECK(c.vocab_size == 262208);
  CHECK(c.num_heads == 8);
  CHECK(c.num_kv_heads == 4);
  CHECK(c.head_dim == 256);
  CHECK(c.attention_scalar == 256.0);
  CHECK(c.rope_theta == 1000000.0);
  CHECK(c.rope_local_theta == 10000.0);
  CHECK(c.tie_word_embeddings);
  // The global layers' linear scaling leaves the local table alone.
  CHECK(c.rope_scaling.type == RopeScaling::Type::kLinear);
  CHECK(c.rope_scaling.factor == 8.0);
  CHECK(c.rope_inv_freq()[0] == 0.125f);
  CHECK(c.rope_inv_freq_local()[0] == 1.0f);
  CHECK(c.layer_window(0) == 1024);
  CHECK(c.layer_window(5) == 0);
  // Given at the top level only.
  CHECK(c.eos_token_ids == std::vector<int64_t>{1, 106});
  CHECK(c.torch_dtype == DType::BF16);
}

TEST_CASE("config: Gemma 3 in transformers 5 spelling, layer_types and per-kind RoPE",
          "[model][gemma3]") {
  const ModelConfig c = ModelConfig::parse(
      small_gemma(R"("layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                                     "full_attention"], "sliding_window": 8,
          "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 24,
          "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                 "rope_theta": 500000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 20.0}})"),
      "v5");
  CHECK(c.sliding_layers == std::vector<bool>{true, false, true, false});
  CHECK(c.layer_pattern() == "local, global, local, global");
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rope_scaling.type == RopeScaling::Type::kLinear);
  CHECK(c.rope_local_theta == 20.0);
  CHECK(c.final_logit_softcap == 30.0);
  CHECK(c.attention_scalar == 24.0);

  // An explicit null window: no layer masks (the layers keep their kinds for RoPE).
  const ModelConfig unwindowed = ModelConfig::parse(small_gemma(R"("sliding_window": null)"), "n");
  CHECK_FALSE(unwindowed.sliding_window.has_value());
  CHECK(unwindowed.layer_window(0) == 0);
  CHECK(unwindowed.sliding_layers == std::vector<bool>{true, true, true, true});
  // Absent: Gemma3TextConfig's 4096.
  CHECK(ModelConfig::parse(small_gemma(""), "d").layer_window(0) == 4096);
  // Other families keep one window for every layer.
  const ModelConfig mistral = ModelConfig::parse(
      R"({"model_type": "mistral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
          "num_hidden_layers": 2, "num_attention_heads": 2, "sliding_window": 24})",
      "m");
  CHECK(mistral.layer_window(0) == 24);
  CHECK(mistral.layer_window(1) == 24);
  CHECK(mistral.layer_pattern() == "all 2");
}

TEST_CASE("config: Gemma 3 errors name the field", "[model][gemma3]") {
  auto message = [](const std::string& text) {
    return test::error_message([&] { ModelConfig::parse(text, "bad.json"); });
  };
  CHECK_THAT(message(small_gemma(R"("attn_logit_softcapping": -50.0)")),
             Contains("attn_logit_softcapping"));
  CHECK_THAT(message(small_gemma(R"("layer_types": ["sliding_attention"])")),
             Contains("layer_types") && Contains("a list of 4"));
  CHECK_THAT(message(small_gemma(
                 R"("layer_types": ["sliding_attention", "full_attention", "chunked", "x"])")),
             Contains("layer_types[2]"));
  CHECK_THAT(message(small_gemma(R"("hidden_activation": "gelu")")),
             Contains("hidden_activation") && Contains("gelu_pytorch_tanh"));
  CHECK_THAT(message(small_gemma(R"("rope_parameters": {"full_attention": {"rope_type": "default"},
                 "sliding_attention": {"rope_type": "linear", "factor": 2.0}})")),
             Contains("rope_parameters.sliding_attention.rope_type"));
  CHECK_THAT(message(R"({"model_type": "gemma3", "vision_config": {}})"), Contains("text_config"));
  CHECK_THAT(message(R"({"model_type": "gemma3", "text_config": {"model_type": "gemma3_text",
                 "hidden_size": 0, "intermediate_size": 8, "num_hidden_layers": 1}})"),
             Contains("text_config.hidden_size"));
  CHECK_THAT(message(R"({"model_type": "gemma2", "vocab_size": 4})"), Contains("gemma3_text"));
}

TEST_CASE("every policy decodes Gemma 3, and its local layers show only the window",
          "[gemma3][policy]") {
  auto backend = make_cpu_backend(2);
  // With calibration files for loki and doublesparsity beside it.
  const auto model = upload_model(Model::load(test::copy_with_calibration(test::source_path(
                                      "tests/fixtures/gemma3-window-softcap-f32"))),
                                  *backend);
  const int64_t window = 16, heads = model->config().num_heads;
  REQUIRE(model->config().layer_window(0) == window);
  REQUIRE(model->config().layer_window(2) == 0);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 40; ++i) tokens.push_back((i * 37 + 11) % 320);

  for (const PolicyInfo& info : policy_infos()) {
    if (info.needs_predictor) continue;  // the fixture has no TokenButler predictor
    INFO(info.id);
    PolicyConfig policy{info.id, info.id == "dense" ? 0.0 : 0.5, {}};
    for (const ParamSpec& spec : info.params) {
      if (spec.name == "sinks") policy.args.push_back("sinks=1");
      if (spec.name == "obs_window") policy.args.push_back("obs_window=4");
      if (spec.name == "page_size") policy.args.push_back("page_size=4");
    }
    ScoreOptions options;
    options.policy = policy;
    const ScoreResult scored = score_tokens(model, tokens, options);
    REQUIRE(scored.nll.size() == tokens.size() - 1);
    for (const double nll : scored.nll) REQUIRE(std::isfinite(nll));
    // Sparsity is over the keys a layer attends to (a local layer's window): never above 1.
    const std::vector<double> per_layer = scored.sparsity.per_layer();
    for (const double layer_sparsity : per_layer) {
      CHECK(layer_sparsity >= 0.0);
      CHECK(layer_sparsity <= 1.0);
    }
    // The token-budget policies spend B on the window's tokens in a local layer (layer 1; layer
    // 0 is dense by default): its sparsity over the window is the global layer's, about 0.5
    // (budgets over every key would leave most of the window visible instead).
    const std::vector<std::string> token_budgeted = {"h2o",     "oracle",    "random", "snapkv",
                                                     "keydiff", "streaming", "tova",   "sparq"};
    if (std::find(token_budgeted.begin(), token_budgeted.end(), info.id) != token_budgeted.end()) {
      REQUIRE(per_layer.size() == 3);
      CHECK(per_layer[1] == Approx(per_layer[2]).margin(0.03));
      CHECK(per_layer[1] > 0.4);
    }

    TraceRecorder recorder(model, nullptr, tokens, {policy});
    while (recorder.step()) {
    }
    const Trace& trace = recorder.trace();
    const int64_t run = 0;
    REQUIRE(trace.runs[size_t(run)].policy == info.id);
    if (info.reference) {
      // The views' per-head sparsity is over the keys a head attends to: none hidden by dense.
      for (const double sparsity : head_summary(trace, run, 39).sparsity) CHECK(sparsity == 0.0);
    }
    for (const int64_t step : {int64_t(20), int64_t(39)}) {
      for (int64_t layer = 0; layer < 3; ++layer) {
        for (int64_t head = 0; head < heads; ++head) {
          INFO("step " << step << " layer " << layer << " head " << head);
          const HeadRow row =
              head_row_at(trace, run, step, layer, head, HeadQuantity::Probabilities);
          if (!row.kept) continue;
          int64_t outside = 0, inside = 0;
          for (int64_t j = 0; j <= step; ++j) {
            if (row.visible[size_t(j)] != 1) continue;
            (j <= step - window ? outside : inside) += 1;
          }
          if (layer < 2) {
            CHECK(outside == 0);  // a local layer: hidden by the window, whatever the policy
            // tokenfilter skips whole layers for some tokens (nothing visible); others see keys.
            CHECK((inside >= 1 || info.id == "tokenfilter"));
          } else if (info.id == "dense") {
            CHECK(outside + inside == step + 1);  // the global layer sees every key
          }
        }
      }
    }
  }
}

TEST_CASE("a gemma3 multimodal checkpoint runs its language model", "[gemma3][model]") {
  // The fixture's tensors under Gemma3ForConditionalGeneration's names (transformers 4:
  // language_model.model.*, 5: model.language_model.*), a vision tensor beside them, and its
  // config.json under text_config: the same logits as the text-only checkpoint.
  const std::string fixture = test::source_path("tests/fixtures/gemma3-window-softcap-f32");
  std::ifstream config_file(fixture + "/config.json");
  std::stringstream config_text;
  config_text << config_file.rdbuf();
  const SafetensorsSet source = SafetensorsSet::open_folder(fixture);
  auto backend = make_cpu_backend(1);
  auto last_logits = [&](const std::string& dir) {
    const auto model = upload_model(Model::load(dir), *backend);
    DecoderSession session(model);
    const std::vector<int32_t> tokens = {1, 17, 200, 5, 9, 77, 31, 2, 150, 12};
    const DeviceTensor& logits = session.forward(tokens);
    std::vector<float> host(size_t(logits.numel()));
    backend->to_host(logits, host.data(), host.size() * sizeof(float));
    return host;
  };
  const std::vector<float> expected = last_logits(fixture);
  for (const std::string prefix : {"language_model.model.", "model.language_model."}) {
    INFO(prefix);
    std::vector<test::TestTensor> tensors;
    for (const std::string& name : source.names()) {
      const TensorView view = source.tensor(name);
      const std::string renamed = prefix + name.substr(std::string("model.").size());
      tensors.push_back({renamed, "F32", view.shape,
                         std::string(reinterpret_cast<const char*>(view.data), view.bytes)});
    }
    tensors.push_back(test::make_tensor("vision_tower.patch.weight", "F32", {2, 2}, {1, 2, 3, 4}));
    const std::string dir = test::make_temp_dir("gemma3-multimodal");
    test::write_safetensors(dir + "/model.safetensors", tensors);
    test::write_file(
        dir + "/config.json",
        R"({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
                         "vision_config": {"model_type": "siglip_vision_model"},
                         "text_config": )" +
            config_text.str() + "}");
    CHECK(last_logits(dir) == expected);
  }
  // Without the language model's tensors: the error says what was looked for.
  const std::string empty = test::make_temp_dir("gemma3-no-text");
  test::write_safetensors(empty + "/model.safetensors",
                          {test::make_tensor("vision_tower.patch.weight", "F32", {1}, {1})});
  test::write_file(empty + "/config.json",
                   R"({"model_type": "gemma3", "text_config": )" + config_text.str() + "}");
  CHECK_THAT(test::error_message([&] { Model::load(empty); }),
             Contains("language_model.model.embed_tokens.weight"));
}

namespace {

// The gemma3 fixture with `extra` merged into its config.json (weights shared by copy).
std::string gemma3_variant(const std::string& tag, const nlohmann::json& extra) {
  const std::string source = test::source_path("tests/fixtures/gemma3-window-softcap-f32");
  const std::string dir = test::make_temp_dir(tag);
  nlohmann::json config = nlohmann::json::parse(read_text_file(source + "/config.json"));
  config.update(extra);
  test::write_file(dir + "/config.json", config.dump());
  std::filesystem::copy_file(source + "/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  return dir;
}

// Layer `layer`'s recorded true logits of head `head` at step t, from a trace's dense run.
std::vector<float> recorded_logits(const Trace& trace, int64_t run, int64_t t, int64_t layer,
                                   int64_t head) {
  return head_row_at(trace, run, t, layer, head, HeadQuantity::Logits).values;
}

}  // namespace

TEST_CASE("attn_logit_softcapping caps the attention logits before the mask and the softmax",
          "[gemma3][softcap]") {
  // transformers 5.17's Gemma 3 stores attn_logit_softcapping but never applies it (its Gemma 2
  // does): the reference is computed here. Layer 0's inputs do not depend on the cap, so its
  // capped logits must be cap * tanh(z / cap) of the uncapped z, in double, at every step and
  // head, -inf (outside the window) staying -inf; later layers then differ.
  const double cap = 0.6;
  const ModelConfig parsed = ModelConfig::load(
      gemma3_variant("softcap-config", {{"attn_logit_softcapping", cap}}) + "/config.json");
  CHECK(parsed.attn_logit_softcap == cap);
  auto backend = make_cpu_backend(2);
  const auto plain = upload_model(
      Model::load(test::source_path("tests/fixtures/gemma3-window-softcap-f32")), *backend);
  const auto capped = upload_model(
      Model::load(gemma3_variant("softcap", {{"attn_logit_softcapping", cap}})), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 24; ++i) tokens.push_back((i * 53 + 7) % 320);
  // dense (the fused path, unfused when capped) and oracle over every layer (the policy path:
  // logits of every run, then the selection) in one recording.
  const std::vector<PolicyConfig> runs = {{"dense", 0.0, {}},
                                          {"oracle", 0.5, {"dense_layers=0", "sinks=1"}}};
  TraceRecorder plain_recorder(plain, nullptr, tokens, runs);
  TraceRecorder capped_recorder(capped, nullptr, tokens, runs);
  while (plain_recorder.step() && capped_recorder.step()) {
  }
  const Trace& a = plain_recorder.trace();
  const Trace& b = capped_recorder.trace();
  int64_t masked = 0;
  for (int64_t t = 0; t < b.step_count(); ++t) {
    for (int64_t head = 0; head < plain->config().num_heads; ++head) {
      INFO("step " << t << " head " << head);
      const std::vector<float> z = recorded_logits(a, 0, t, 0, head);
      for (const int64_t run : {0, 1}) {
        const std::vector<float> got = recorded_logits(b, run, t, 0, head);
        REQUIRE(got.size() == z.size());
        for (size_t j = 0; j < z.size(); ++j) {
          if (std::isnan(z[j])) {  // -inf before the window: no value, capped or not
            CHECK(std::isnan(got[j]));
            ++masked;
            continue;
          }
          const double expected = std::tanh(double(float(z[j] / float(cap)))) * cap;
          CHECK(double(got[j]) == Approx(expected).margin(1e-6));
          CHECK(std::fabs(got[j]) <= float(cap));
        }
      }
    }
  }
  CHECK(masked > 0);  // the window slid: masked keys were checked too
  // The cap changes what follows: the last step's next-token distributions differ.
  const ScoreResult plain_score = score_tokens(plain, tokens);
  const ScoreResult capped_score = score_tokens(capped, tokens);
  CHECK(std::fabs(plain_score.ppl - capped_score.ppl) > 1e-3);
  // A cap far above every logit leaves the model as it was (tanh(x) = x to float precision).
  const auto loose = upload_model(
      Model::load(gemma3_variant("softcap-loose", {{"attn_logit_softcapping", 1e6}})), *backend);
  CHECK(score_tokens(loose, tokens).ppl == Approx(plain_score.ppl).epsilon(1e-6));
}

TEST_CASE("a soft-capped model gives the same logits by chunks and step by step",
          "[gemma3][softcap]") {
  auto backend = make_cpu_backend(2);
  const auto capped = upload_model(
      Model::load(gemma3_variant("softcap-chunks", {{"attn_logit_softcapping", 0.6}})), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 30; ++i) tokens.push_back((i * 41 + 3) % 320);
  DecoderSession stepped(capped), chunked(capped);
  std::vector<float> by_step;
  for (const int32_t token : tokens) by_step = stepped.step(token);
  // Two chunks: 20 tokens (the window of 16 slides inside the chunk), then 10.
  chunked.forward(std::span<const int32_t>(tokens.data(), 20));
  const DeviceTensor& last = chunked.forward(std::span<const int32_t>(tokens.data() + 20, 10));
  const int64_t vocab = capped->config().vocab_size;
  std::vector<float> rows(size_t(last.numel()));
  backend->to_host(last, rows.data(), rows.size() * sizeof(float));
  const float* by_chunk = rows.data() + (last.numel() / vocab - 1) * vocab;
  double worst = 0.0;
  for (int64_t v = 0; v < vocab; ++v)
    worst = std::max(worst, double(std::fabs(by_chunk[v] - by_step[size_t(v)])));
  CHECK(worst <= 1e-4);  // batched projections against single-row ones: rounding only
}

TEST_CASE("a soft-capped prefill records the capped logits a decode records", "[gemma3][softcap]") {
  // The dense chunk's rows (recorded from the chunk's logits, -inf after each row's position and
  // before its window) against the same steps decoded one by one.
  auto backend = make_cpu_backend(2);
  const auto capped = upload_model(
      Model::load(gemma3_variant("softcap-prefill", {{"attn_logit_softcapping", 0.6}})), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 26; ++i) tokens.push_back((i * 29 + 5) % 320);
  TraceOptions prefill;
  prefill.prefill = 20;
  TraceRecorder chunked(capped, nullptr, tokens, {{"dense", 0.0, {}}}, prefill);
  TraceRecorder stepped(capped, nullptr, tokens, {{"dense", 0.0, {}}});
  while (chunked.step()) {
  }
  while (stepped.step()) {
  }
  int64_t compared = 0;
  for (const int64_t t : {int64_t(3), int64_t(19), int64_t(25)}) {
    for (int64_t layer = 0; layer < 3; ++layer) {
      for (int64_t head = 0; head < capped->config().num_heads; ++head) {
        INFO("step " << t << " layer " << layer << " head " << head);
        const std::vector<float> a = recorded_logits(chunked.trace(), 0, t, layer, head);
        const std::vector<float> b = recorded_logits(stepped.trace(), 0, t, layer, head);
        REQUIRE(a.size() == b.size());
        for (size_t j = 0; j < a.size(); ++j) {
          CHECK(std::isnan(a[j]) == std::isnan(b[j]));
          if (!std::isnan(b[j])) CHECK(a[j] == Approx(b[j]).margin(1e-4));
          if (!std::isnan(b[j])) CHECK(std::fabs(a[j]) <= 0.6f);
        }
        ++compared;
      }
    }
  }
  CHECK(compared == 3 * 3 * capped->config().num_heads);
}
