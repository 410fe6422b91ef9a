// ModelConfig: real-looking config.json files (Llama 2, Llama 3.1, Mistral, SmolLM, a
// transformers-5 style one) and every validation error, plus rope_inv_freq against hand values.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "engine/common/error.h"
#include "engine/model/config.h"
#include "tests/support/error_message.h"

using Catch::Matchers::Contains;
using kvlens::ModelConfig;
using kvlens::RopeScaling;

namespace {

// Abridged from meta-llama/Llama-2-7b-hf.
const char* const kLlama2 = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})";

// Abridged from meta-llama/Llama-3.1-8B.
const char* const kLlama31 = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 128256})";

// Abridged from mistralai/Mistral-7B-v0.1.
const char* const kMistral = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "use_cache": true, "vocab_size": 32000})";

// Abridged from HuggingFaceTB/SmolLM-135M: 9 heads of 64, 3 KV heads, tied embeddings.
const char* const kSmolLM = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 0,
  "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576, "intermediate_size": 1536,
  "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 9,
  "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "tie_word_embeddings": true, "torch_dtype": "float32", "vocab_size": 49152})";

// A small valid config whose fields the error tests replace one at a time.
std::string small_config(const std::string& extra_fields) {
  return R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4)" +
         (extra_fields.empty() ? std::string() : ", " + extra_fields) + "}";
}

using kvlens::test::error_message;

std::string parse_error(const std::string& text) {
  return error_message([&] { ModelConfig::parse(text, "cfg/config.json"); });
}

}  // namespace

TEST_CASE("config: Llama 2 7B", "[model]") {
  const ModelConfig c = ModelConfig::parse(kLlama2, "llama2/config.json");
  CHECK(c.model_type == "llama");
  CHECK(c.vocab_size == 32000);
  CHECK(c.hidden_size == 4096);
  CHECK(c.intermediate_size == 11008);
  CHECK(c.num_layers == 32);
  CHECK(c.num_heads == 32);
  CHECK(c.num_kv_heads == 32);
  CHECK(c.head_dim == 128);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.rope_theta == 10000.0);  // absent: LlamaConfig's default
  CHECK(c.rope_scaling.type == RopeScaling::Type::kNone);
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.max_position_embeddings == 4096);
  CHECK_FALSE(c.sliding_window.has_value());
  CHECK(c.bos_token_id == 1);
  CHECK(c.eos_token_ids == std::vector<int64_t>{2});
  CHECK(c.torch_dtype == kvlens::DType::F16);
  CHECK(c.source == "llama2/config.json");

  // Unscaled: inv_freq[i] = 10000^(-2i/128); i = 32 gives 10000^(-1/2) = 0.01.
  const std::vector<float> inv_freq = c.rope_inv_freq();
  REQUIRE(inv_freq.size() == 64);
  CHECK(inv_freq[0] == 1.0f);
  CHECK(inv_freq[32] == Approx(0.01).epsilon(1e-6));
  CHECK(inv_freq[63] == Approx(std::pow(10000.0, -126.0 / 128.0)).epsilon(1e-6));
}

TEST_CASE("config: Llama 3.1 8B with llama3 rope scaling", "[model]") {
  const ModelConfig c = ModelConfig::parse(kLlama31, "llama31/config.json");
  CHECK(c.num_kv_heads == 8);
  CHECK(c.head_dim == 128);
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rope_scaling.type == RopeScaling::Type::kLlama3);
  CHECK(c.rope_scaling.factor == 8.0);
  CHECK(c.rope_scaling.low_freq_factor == 1.0);
  CHECK(c.rope_scaling.high_freq_factor == 4.0);
  CHECK(c.rope_scaling.original_max_position_embeddings == 8192);
  CHECK(c.eos_token_ids == std::vector<int64_t>{128001, 128008, 128009});
  CHECK(c.bos_token_id == 128000);
  CHECK(c.torch_dtype == kvlens::DType::BF16);

  // Hand computation. Base inv_freq[i] = 500000^(-i/64), wavelength 2*pi / inv_freq.
  // The bands: low_freq_wavelen = 8192 / 1 = 8192, high_freq_wavelen = 8192 / 4 = 2048.
  //  - i = 0: wavelength 2*pi < 2048, kept: 1.
  //  - i = 28: 500000^(-28/64) = 0.0032114460, wavelength 1956.5 < 2048, kept.
  //  - i = 32: 500000^(-1/2) = 1/sqrt(500000) = 0.0014142136, wavelength 4442.88 lies between
  //    2048 and 8192, so smooth = (8192 / 4442.88 - 1) / (4 - 1) = 0.2812847 and the result is
  //    inv * ((1 - smooth) / 8 + smooth) = 0.0014142136 * 0.3711241 = 0.00052484616.
  //  - i = 35: wavelength 8218.7 > 8192: 500000^(-35/64) / 8 = 0.00076449699 / 8 = 9.5562124e-5.
  //  - i = 63: 500000^(-63/64) / 8 = 2.4551408e-6 / 8 = 3.0689260e-7.
  const std::vector<float> inv_freq = c.rope_inv_freq();
  REQUIRE(inv_freq.size() == 64);
  CHECK(inv_freq[0] == 1.0f);
  CHECK(inv_freq[28] == Approx(0.0032114460).epsilon(1e-6));
  CHECK(inv_freq[32] == Approx(0.00052484616).epsilon(1e-6));
  CHECK(inv_freq[35] == Approx(9.5562124e-5).epsilon(1e-6));
  CHECK(inv_freq[63] == Approx(3.0689260e-7).epsilon(1e-6));
  // Monotone decreasing across all three bands.
  for (size_t i = 1; i < inv_freq.size(); ++i) CHECK(inv_freq[i] < inv_freq[i - 1]);
}

TEST_CASE("config: Mistral 7B keeps its sliding window", "[model]") {
  const ModelConfig c = ModelConfig::parse(kMistral, "mistral/config.json");
  CHECK(c.model_type == "mistral");
  CHECK(c.num_kv_heads == 8);
  CHECK(c.max_position_embeddings == 32768);
  REQUIRE(c.sliding_window.has_value());
  CHECK(*c.sliding_window == 4096);

  // An explicit null disables the window (Mistral v0.2+); an absent key means MistralConfig's
  // default of 4096, as transformers applies it.
  std::string text = kMistral;
  const std::string window = "\"sliding_window\": 4096";
  const size_t at = text.find(window);
  REQUIRE(at != std::string::npos);
  CHECK_FALSE(ModelConfig::parse(
                  std::string(text).replace(at, window.size(), "\"sliding_window\": null"), "m")
                  .sliding_window.has_value());
  CHECK(ModelConfig::parse(std::string(text).replace(at, window.size(), "\"unused\": 0"), "m")
            .sliding_window == 4096);
  // Llama has no sliding window: the key is ignored there, as LlamaAttention does.
  CHECK_FALSE(
      ModelConfig::parse(small_config("\"sliding_window\": 16"), "l").sliding_window.has_value());
}

TEST_CASE("config: SmolLM-style tied config with 9 heads", "[model]") {
  const ModelConfig c = ModelConfig::parse(kSmolLM, "smollm/config.json");
  CHECK(c.num_heads == 9);
  CHECK(c.num_kv_heads == 3);
  CHECK(c.head_dim == 64);
  CHECK(c.tie_word_embeddings);
  CHECK(c.bos_token_id == 0);
  CHECK(c.eos_token_ids == std::vector<int64_t>{0});
  CHECK(c.torch_dtype == kvlens::DType::F32);
  CHECK(c.rope_inv_freq().size() == 32);
}

TEST_CASE("config: defaults, explicit head_dim, linear scaling, transformers 5 keys", "[model]") {
  const ModelConfig defaults = ModelConfig::parse(small_config(""), "d");
  CHECK(defaults.num_kv_heads == 4);  // num_key_value_heads defaults to the head count
  CHECK(defaults.head_dim == 16);
  CHECK(defaults.rms_norm_eps == 1e-6);
  CHECK(defaults.rope_theta == 10000.0);
  CHECK(defaults.max_position_embeddings == 2048);
  CHECK_FALSE(defaults.bos_token_id.has_value());
  CHECK(defaults.eos_token_ids.empty());
  CHECK(defaults.torch_dtype == kvlens::DType::F32);

  // Mistral-Nemo style: head_dim (128) differs from hidden / heads (160).
  const ModelConfig nemo = ModelConfig::parse(
      R"({"model_type": "mistral", "vocab_size": 131072, "hidden_size": 5120,
          "intermediate_size": 14336, "num_hidden_layers": 40, "num_attention_heads": 32,
          "num_key_value_heads": 8, "head_dim": 128, "rope_theta": 1000000.0,
          "sliding_window": null, "torch_dtype": "bfloat16"})",
      "nemo");
  CHECK(nemo.head_dim == 128);
  CHECK(nemo.rope_inv_freq().size() == 64);

  // linear ("type" spelling of older configs): every frequency divided by the factor.
  // head_dim 16: inv_freq[1] = 10000^(-2/16) / 4 = 0.31622777 / 4 = 0.079056942.
  const ModelConfig linear = ModelConfig::parse(
      small_config(R"("rope_scaling": {"type": "linear", "factor": 4.0})"), "lin");
  CHECK(linear.rope_scaling.type == RopeScaling::Type::kLinear);
  const std::vector<float> inv_freq = linear.rope_inv_freq();
  REQUIRE(inv_freq.size() == 8);
  CHECK(inv_freq[0] == 0.25f);
  CHECK(inv_freq[1] == Approx(0.079056942).epsilon(1e-6));

  // transformers 5: "dtype" and rope_parameters carrying rope_theta and the scaling.
  const ModelConfig v5 = ModelConfig::parse(small_config(R"("dtype": "bfloat16",
      "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})"),
                                            "v5");
  CHECK(v5.torch_dtype == kvlens::DType::BF16);
  CHECK(v5.rope_theta == 500000.0);
  CHECK(v5.rope_scaling.type == RopeScaling::Type::kLlama3);
  CHECK(v5.rope_scaling.factor == 32.0);
  const ModelConfig v5_default = ModelConfig::parse(
      small_config(R"("rope_parameters": {"rope_theta": 123.0, "rope_type": "default"})"), "v5");
  CHECK(v5_default.rope_theta == 123.0);
  CHECK(v5_default.rope_scaling.type == RopeScaling::Type::kNone);
}

TEST_CASE("config: Qwen2.5 0.5B (q/k/v biases) and Qwen3 0.6B (q/k norms)", "[model]") {
  // Their published config.json files (the Qwen2.5 one names a sliding window it does not use).
  const ModelConfig qwen2 = ModelConfig::parse(R"({"architectures": ["Qwen2ForCausalLM"],
      "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
      "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
      "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 24,
      "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
      "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
      "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
      "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
      "vocab_size": 151936})",
                                               "qwen2.json");
  CHECK(qwen2.model_type == "qwen2");
  CHECK(qwen2.qkv_bias);
  CHECK_FALSE(qwen2.qk_norm);
  CHECK_FALSE(qwen2.sliding_window.has_value());
  CHECK(qwen2.head_dim == 64);
  CHECK(qwen2.rope_theta == 1000000.0);
  CHECK(qwen2.tie_word_embeddings);

  const ModelConfig qwen3 = ModelConfig::parse(R"({"architectures": ["Qwen3ForCausalLM"],
      "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
      "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024,
      "initializer_range": 0.02, "intermediate_size": 3072, "max_position_embeddings": 40960,
      "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16,
      "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
      "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
      "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
      "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})",
                                               "qwen3.json");
  CHECK(qwen3.model_type == "qwen3");
  CHECK(qwen3.qk_norm);
  CHECK_FALSE(qwen3.qkv_bias);
  CHECK(qwen3.head_dim == 128);
  CHECK(qwen3.num_kv_heads == 8);
}

TEST_CASE("config: errors name the file, the field and the expectation", "[model]") {
  SECTION("unsupported model_type") {
    const std::string message = parse_error(R"({"model_type": "gpt2", "vocab_size": 5})");
    CHECK_THAT(message, Contains("cfg/config.json") && Contains("model_type") &&
                            Contains("llama") && Contains("mistral") && Contains("qwen2") &&
                            Contains("qwen3") && Contains("gpt2"));
  }
  SECTION("qwen sliding windows (per layer) are refused") {
    CHECK_THAT(parse_error(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 64,
        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4,
        "use_sliding_window": true})"),
               Contains("use_sliding_window") && Contains("not supported"));
  }
  SECTION("missing model_type") {
    CHECK_THAT(parse_error(R"({"vocab_size": 5})"),
               Contains("cfg/config.json") && Contains("model_type") && Contains("llama"));
  }
  SECTION("a string where an integer is expected") {
    const std::string message = parse_error(R"({"model_type": "llama", "vocab_size": 100,
        "hidden_size": "4096", "intermediate_size": 8, "num_hidden_layers": 1,
        "num_attention_heads": 4})");
    CHECK_THAT(message, Contains("cfg/config.json") && Contains("hidden_size") &&
                            Contains("integer") && Contains("string"));
  }
  SECTION("a float where an integer is expected") {
    CHECK_THAT(parse_error(small_config("\"num_key_value_heads\": 2.5")),
               Contains("num_key_value_heads") && Contains("integer"));
  }
  SECTION("a missing required size") {
    CHECK_THAT(parse_error(R"({"model_type": "llama", "vocab_size": 100})"),
               Contains("cfg/config.json") && Contains("hidden_size") && Contains("integer"));
  }
  SECTION("negative or zero sizes") {
    CHECK_THAT(parse_error(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 0, "num_attention_heads": 4})"),
               Contains("num_hidden_layers") && Contains("integer in [1,") && Contains("found 0"));
    CHECK_THAT(parse_error(R"({"model_type": "llama", "vocab_size": -3})"),
               Contains("vocab_size") && Contains("integer in [1,"));
  }
  SECTION("a wrong boolean and a wrong number") {
    CHECK_THAT(parse_error(small_config("\"tie_word_embeddings\": \"yes\"")),
               Contains("tie_word_embeddings") && Contains("true or false"));
    CHECK_THAT(parse_error(small_config("\"rms_norm_eps\": \"1e-5\"")),
               Contains("rms_norm_eps") && Contains("a number"));
    CHECK_THAT(parse_error(small_config("\"rope_theta\": -1")),
               Contains("rope_theta") && Contains("greater than"));
  }
  SECTION("KV heads that do not divide the heads") {
    CHECK_THAT(parse_error(small_config("\"num_key_value_heads\": 3")),
               Contains("num_key_value_heads") && Contains("divisor"));
  }
  SECTION("hidden size not a multiple of the heads without head_dim") {
    CHECK_THAT(parse_error(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 30,
        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4})"),
               Contains("hidden_size") && Contains("multiple of num_attention_heads"));
  }
  SECTION("unsupported rope type") {
    const std::string message =
        parse_error(small_config(R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0})"));
    CHECK_THAT(message, Contains("cfg/config.json") && Contains("rope_scaling.rope_type") &&
                            Contains("llama3") && Contains("yarn"));
    CHECK_THAT(parse_error(small_config(R"("rope_parameters": {"rope_type": "dynamic"})")),
               Contains("rope_parameters.rope_type") && Contains("dynamic"));
    CHECK_THAT(parse_error(small_config(R"("rope_scaling": 4)")),
               Contains("rope_scaling") && Contains("object"));
  }
  SECTION("llama3 scaling with equal frequency factors") {
    CHECK_THAT(parse_error(small_config(R"("rope_scaling": {"rope_type": "llama3", "factor": 8,
                   "low_freq_factor": 2, "high_freq_factor": 2})")),
               Contains("high_freq_factor") && Contains("greater than low_freq_factor"));
  }
  SECTION("biases and other activations are unsupported") {
    CHECK_THAT(parse_error(small_config("\"attention_bias\": true")),
               Contains("attention_bias") && Contains("not supported"));
    CHECK_THAT(parse_error(small_config("\"mlp_bias\": true")), Contains("mlp_bias"));
    CHECK_THAT(parse_error(small_config("\"hidden_act\": \"gelu\"")),
               Contains("hidden_act") && Contains("silu"));
  }
  SECTION("unknown torch_dtype") {
    CHECK_THAT(parse_error(small_config("\"torch_dtype\": \"int8\"")),
               Contains("torch_dtype") && Contains("bfloat16") && Contains("int8"));
  }
  SECTION("eos_token_id of the wrong type") {
    CHECK_THAT(parse_error(small_config("\"eos_token_id\": [1, \"x\"]")),
               Contains("eos_token_id[1]") && Contains("integer"));
  }
  SECTION("not JSON, or not an object") {
    CHECK_THAT(parse_error("{\"model_type\": \"llama\","),
               Contains("cfg/config.json") && Contains("valid JSON"));
    CHECK_THAT(parse_error("[1, 2]"), Contains("cfg/config.json") && Contains("object"));
  }
  SECTION("a missing file") {
    const std::string message =
        error_message([] { ModelConfig::load("/nonexistent-kvlens/config.json"); });
    CHECK_THAT(message, Contains("/nonexistent-kvlens/config.json"));
  }
}
