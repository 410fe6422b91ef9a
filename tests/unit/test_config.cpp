// ModelConfig: real-looking config.json files (Llama 2, Llama 3.1, Mistral, SmolLM, Qwen, Phi-3 /
// 3.5 / 4 / 4-mini, a transformers-5 style one) and every validation error, plus rope_inv_freq
// against hand values and transformers' own tables (longrope, yarn, dynamic).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

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

// microsoft/Phi-3-mini-4k-instruct: MHA, default RoPE, sliding_window 2047 (transformers masks
// keys older than 2047 positions), original_max_position_embeddings unused without longrope.
const char* const kPhi3Mini4k =
    R"({"_name_or_path": "Phi-3-mini-4k-instruct", "architectures": ["Phi3ForCausalLM"],
  "attention_dropout": 0.0,
  "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
               "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM"},
  "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
  "hidden_size": 3072, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 4096, "model_type": "phi3", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "original_max_position_embeddings": 4096,
  "pad_token_id": 32000, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 10000.0, "sliding_window": 2047, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.40.2", "use_cache": true,
  "attention_bias": false, "vocab_size": 32064})";

// microsoft/Phi-3.5-mini-instruct: longrope, 48 short and long factors (head_dim 96), no factor
// (max / original = 32 stands for it), sliding_window 262144.
const char* const kPhi35Mini =
    R"({"_name_or_path": "Phi-3.5-mini-instruct", "architectures": ["Phi3ForCausalLM"],
  "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000,
  "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "model_type": "phi3",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "original_max_position_embeddings": 4096, "pad_token_id": 32000, "resid_pdrop": 0.0,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"long_factor": [1.0800000429153442, 1.1100000143051147, 1.1399999856948853,
      1.340000033378601, 1.5899999141693115, 1.600000023841858, 1.6200000047683716,
      2.620000123977661, 3.2300000190734863, 3.2300000190734863, 4.789999961853027,
      7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137,
      17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578,
      30.840002059936523, 32.590003967285156, 32.93000411987305, 42.320003509521484,
      44.96000289916992, 50.340003967285156, 50.45000457763672, 57.55000305175781,
      57.93000411987305, 58.21000289916992, 60.1400032043457, 62.61000442504883,
      62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457,
      63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125,
      64.02999877929688, 64.06999969482422, 64.08000183105469, 64.12000274658203,
      64.41000366210938, 64.4800033569336, 64.51000213623047, 64.52999877929688,
      64.83999633789062],
    "short_factor": [1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705,
      1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842,
      1.0499999523162842, 1.0699999332427979, 1.0999999046325684, 1.1099998950958252,
      1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378,
      1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083,
      1.8499997854232788, 1.8799997568130493, 1.9099997282028198, 1.9399996995925903,
      1.9899996519088745, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
      2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0299997329711914,
      2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
      2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
      2.0799996852874756, 2.0899996757507324, 2.189999580383301, 2.2199995517730713,
      2.5899994373321533, 2.729999542236328, 2.749999523162842, 2.8399994373321533],
    "type": "longrope"},
  "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": true,
  "attention_bias": false, "vocab_size": 32064})";

// microsoft/Phi-4: GQA 40 / 10, default RoPE with theta 250000, sliding_window null.
const char* const kPhi4 =
    R"({"architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 100257, "embd_pdrop": 0.0, "eos_token_id": 100265, "hidden_act": "silu",
  "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17920,
  "max_position_embeddings": 16384, "model_type": "phi3", "num_attention_heads": 40,
  "num_hidden_layers": 40, "num_key_value_heads": 10, "original_max_position_embeddings": 16384,
  "pad_token_id": 100349, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "rope_theta": 250000, "sliding_window": null, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.47.0", "use_cache": true,
  "vocab_size": 100352})";

// microsoft/Phi-4-mini-instruct: longrope over partial_rotary_factor 0.75 of head_dim 128 (96
// channels, 48 factors), GQA 24 / 8, tied embeddings.
const char* const kPhi4Mini =
    R"({"architectures": ["Phi3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "auto_map": {"AutoConfig": "configuration_phi3.Phi3Config",
               "AutoModelForCausalLM": "modeling_phi3.Phi3ForCausalLM",
               "AutoTokenizer": "Xenova/gpt-4o"},
  "bos_token_id": 199999, "embd_pdrop": 0.0, "eos_token_id": 199999, "full_attn_mod": 1,
  "hidden_act": "silu", "hidden_size": 3072, "initializer_range": 0.02,
  "intermediate_size": 8192, "interpolate_factor": 1, "lm_head_bias": false,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "phi3",
  "num_attention_heads": 24, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "original_max_position_embeddings": 4096, "pad_token_id": 199999,
  "partial_rotary_factor": 0.75, "resid_pdrop": 0.0, "rms_norm_eps": 1e-05,
  "rope_scaling": {"long_factor": [1, 1.118320672, 1.250641126, 1.398617824, 1.564103225,
      1.74916897, 1.956131817, 2.187582649, 2.446418898, 2.735880826, 3.059592084,
      3.421605075, 3.826451687, 4.279200023, 4.785517845, 5.351743533, 5.984965424,
      6.693110555, 7.485043894, 8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651,
      14.64173252, 16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418,
      28.64115884, 32.03, 32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93,
      32.97, 33.28, 33.49, 33.5, 44.16, 47.77],
    "short_factor": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,
      1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0,
      1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    "type": "longrope"},
  "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "transformers_version": "4.45.0", "use_cache": true,
  "vocab_size": 200064})";

// A small valid config whose fields the error tests replace one at a time.
std::string small_config(const std::string& extra_fields) {
  return R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4)" +
         (extra_fields.empty() ? std::string() : ", " + extra_fields) + "}";
}

using kvlens::test::error_message;

// A small phi3 config (head_dim 16) with extra fields.
std::string small_phi3(const std::string& extra_fields) {
  return R"({"model_type": "phi3", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4)" +
         (extra_fields.empty() ? std::string() : ", " + extra_fields) + "}";
}

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

// Expected tables below: transformers 5.17's rope init functions on the same config (F32).
TEST_CASE("config: Phi-3-mini-4k and Phi-4 (fused projections, default RoPE)", "[model]") {
  const ModelConfig mini = ModelConfig::parse(kPhi3Mini4k, "phi3/config.json");
  CHECK(mini.model_type == "phi3");
  CHECK(mini.fused_projections);
  CHECK(mini.head_dim == 96);
  CHECK(mini.rotary_dim == 96);
  CHECK(mini.num_kv_heads == 32);
  REQUIRE(mini.sliding_window.has_value());
  CHECK(*mini.sliding_window == 2047);
  CHECK(mini.rope_scaling.type == RopeScaling::Type::kNone);
  CHECK(mini.rope_attention_scale() == 1.0);
  CHECK(mini.max_position_embeddings == 4096);
  const std::vector<float> inv_freq = mini.rope_inv_freq();
  REQUIRE(inv_freq.size() == 48);
  CHECK(inv_freq[1] == Approx(0.825404167175293).epsilon(1e-6));
  CHECK(inv_freq[47] == Approx(0.00012115274876123294).epsilon(1e-6));

  const ModelConfig phi4 = ModelConfig::parse(kPhi4, "phi4/config.json");
  CHECK(phi4.fused_projections);
  CHECK(phi4.head_dim == 128);
  CHECK(phi4.num_kv_heads == 10);
  CHECK_FALSE(phi4.sliding_window.has_value());  // null: no window
  CHECK(phi4.rope_theta == 250000.0);
  const std::vector<float> phi4_freq = phi4.rope_inv_freq();
  REQUIRE(phi4_freq.size() == 64);
  CHECK(phi4_freq[1] == Approx(0.8234878182411194).epsilon(1e-6));
  CHECK(phi4_freq[63] == Approx(4.857388375967275e-06).epsilon(1e-6));
}

TEST_CASE("config: Phi-3.5-mini and Phi-4-mini longrope, partial rotary 0.75", "[model]") {
  const ModelConfig phi35 = ModelConfig::parse(kPhi35Mini, "phi35/config.json");
  CHECK(phi35.rope_scaling.type == RopeScaling::Type::kLongRope);
  CHECK(phi35.rope_scaling.original_max_position_embeddings == 4096);
  CHECK(phi35.rope_scaling.factor == 32.0);  // 131072 / 4096
  CHECK(phi35.rope_attention_scale() == Approx(1.1902380714238083).epsilon(1e-12));
  CHECK(*phi35.sliding_window == 262144);
  CHECK(phi35.rope_table(4096) == ModelConfig::RopeTable::kShort);
  CHECK(phi35.rope_table(4097) == ModelConfig::RopeTable::kLong);
  const std::vector<float> short_freq = phi35.rope_inv_freq(4096);
  const std::vector<float> long_freq = phi35.rope_inv_freq(4097);
  REQUIRE(short_freq.size() == 48);
  REQUIRE(long_freq.size() == 48);
  CHECK(short_freq[1] == Approx(0.8092197775840759).epsilon(1e-6));
  CHECK(short_freq[24] == Approx(0.005025126505643129).epsilon(1e-6));
  CHECK(short_freq[47] == Approx(4.2659426981117576e-05).epsilon(1e-6));
  CHECK(long_freq[0] == Approx(0.9259259104728699).epsilon(1e-6));
  CHECK(long_freq[24] == Approx(0.0001986491697607562).epsilon(1e-6));
  CHECK(long_freq[47] == Approx(1.868487856881984e-06).epsilon(1e-6));

  const ModelConfig mini = ModelConfig::parse(kPhi4Mini, "phi4mini/config.json");
  CHECK(mini.head_dim == 128);
  CHECK(mini.rotary_dim == 96);
  CHECK(mini.num_kv_heads == 8);
  CHECK(mini.tie_word_embeddings);
  CHECK(mini.rope_attention_scale() == Approx(1.1902380714238083).epsilon(1e-12));
  const std::vector<float> mini_short = mini.rope_inv_freq();
  const std::vector<float> mini_long = mini.rope_inv_freq(5000);
  REQUIRE(mini_short.size() == 48);
  CHECK(mini_short[1] == Approx(0.825404167175293).epsilon(1e-6));
  CHECK(mini_short[47] == Approx(0.00012115274876123294).epsilon(1e-6));
  CHECK(mini_long[1] == Approx(0.7380746603012085).epsilon(1e-6));
  CHECK(mini_long[24] == Approx(0.0006829792982898653).epsilon(1e-6));
  CHECK(mini_long[47] == Approx(2.5361680400237674e-06).epsilon(1e-6));
  // transformers 5 writes partial_rotary_factor into rope_parameters, and "su" is longrope.
  const ModelConfig v5 = ModelConfig::parse(small_phi3(R"("rope_parameters": {"rope_type": "su",
      "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "short_factor": [1, 1, 1, 1],
      "long_factor": [2, 2, 2, 2]}, "original_max_position_embeddings": 8)"),
                                            "v5");
  CHECK(v5.rotary_dim == 8);
  CHECK(v5.rope_scaling.type == RopeScaling::Type::kLongRope);
  CHECK(v5.rope_scaling.original_max_position_embeddings == 8);
  CHECK(v5.max_position_embeddings == 4096);      // Phi3Config's default
  CHECK(v5.rope_scaling.factor == 4096.0 / 8.0);  // max / original when no factor is given
  CHECK(v5.rms_norm_eps == 1e-5);                 // Phi3Config's default
}

TEST_CASE("config: yarn and dynamic rope tables match transformers", "[model]") {
  const auto llama = [](const std::string& rope) {
    return ModelConfig::parse(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 256,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "head_dim": 64, "max_position_embeddings": )" +
                                  rope + "}",
                              "cfg.json");
  };
  const ModelConfig yarn = llama(R"(8192, "rope_parameters": {"rope_type": "yarn",
      "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 2048,
      "beta_fast": 16, "beta_slow": 2, "truncate": false, "mscale": 0.707,
      "mscale_all_dim": 1.0})");
  CHECK(yarn.rope_scaling.type == RopeScaling::Type::kYarn);
  CHECK_FALSE(yarn.rope_scaling.truncate);
  CHECK(yarn.rope_attention_scale() == Approx(0.964326914892074).epsilon(1e-12));
  const std::vector<float> y = yarn.rope_inv_freq();
  REQUIRE(y.size() == 32);
  CHECK(y[1] == Approx(0.7498942017555237).epsilon(1e-6));
  CHECK(y[16] == Approx(0.004261618945747614).epsilon(1e-6));
  CHECK(y[31] == Approx(3.333803761051968e-05).epsilon(1e-6));
  const ModelConfig yarn_default = llama(R"(8192, "rope_scaling": {"type": "yarn",
      "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 2048})");
  CHECK(yarn_default.rope_attention_scale() == Approx(1.138629436111989).epsilon(1e-12));
  const std::vector<float> yd = yarn_default.rope_inv_freq();
  CHECK(yd[1] == Approx(0.6493816375732422).epsilon(1e-6));
  CHECK(yd[16] == Approx(0.0002500000118743628).epsilon(1e-6));
  CHECK(yd[31] == Approx(3.8498163235090033e-07).epsilon(1e-6));

  // dynamic: the table of a call up to 2048 positions is the plain one; past it the base is
  // rescaled for the call's length, and kvlens allows 2048 x factor positions.
  const ModelConfig dynamic = ModelConfig::parse(
      R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 256, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 2048,
          "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})",
      "dyn.json");
  CHECK(dynamic.rope_scaling.type == RopeScaling::Type::kDynamic);
  CHECK(dynamic.rope_scaling.original_max_position_embeddings == 2048);
  CHECK(dynamic.max_position_embeddings == 4096);
  CHECK(dynamic.rope_table(2048) == ModelConfig::RopeTable::kShort);
  CHECK(dynamic.rope_table(2049) == ModelConfig::RopeTable::kPerLength);
  CHECK(dynamic.rope_inv_freq(2048)[1] == Approx(0.7498942017555237).epsilon(1e-6));
  const std::vector<std::pair<int64_t, std::vector<double>>> expected = {
      {2049, {0.7498705983161926, 0.009994964115321636, 0.0001332220563199371}},
      {3000, {0.7341600060462952, 0.007122818846255541, 6.91055684001185e-05}},
      {4096, {0.7237839698791504, 0.0056721000000834465, 4.445071317604743e-05}}};
  for (const auto& [length, values] : expected) {
    INFO("seq_len " << length);
    const std::vector<float> t = dynamic.rope_inv_freq(length);
    REQUIRE(t.size() == 32);
    CHECK(t[1] == Approx(values[0]).epsilon(1e-6));
    CHECK(t[16] == Approx(values[1]).epsilon(1e-6));
    CHECK(t[31] == Approx(values[2]).epsilon(1e-6));
  }
}

TEST_CASE("config: errors name the file, the field and the expectation", "[model]") {
  SECTION("unsupported model_type") {
    const std::string message = parse_error(R"({"model_type": "gpt2", "vocab_size": 5})");
    CHECK_THAT(message, Contains("cfg/config.json") && Contains("model_type") &&
                            Contains("llama") && Contains("mistral") && Contains("qwen2") &&
                            Contains("qwen3") && Contains("phi3") && Contains("gpt2"));
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
    const std::string message = parse_error(
        small_config(R"("rope_scaling": {"rope_type": "proportional", "factor": 4.0})"));
    CHECK_THAT(message, Contains("cfg/config.json") && Contains("rope_scaling.rope_type") &&
                            Contains("llama3") && Contains("longrope") && Contains("proportional"));
    CHECK_THAT(parse_error(small_config(R"("rope_parameters": {"rope_type": "mrope"})")),
               Contains("rope_parameters.rope_type") && Contains("mrope"));
    CHECK_THAT(parse_error(small_config(R"("rope_scaling": 4)")),
               Contains("rope_scaling") && Contains("object"));
  }
  SECTION("yarn, dynamic and longrope without their required fields") {
    CHECK_THAT(parse_error(small_config(R"("rope_scaling": {"rope_type": "yarn"})")),
               Contains("rope_scaling.factor") && Contains("yarn") && Contains("missing"));
    CHECK_THAT(parse_error(small_config(R"("rope_parameters": {"rope_type": "dynamic"})")),
               Contains("rope_parameters.factor") && Contains("dynamic") && Contains("missing"));
    CHECK_THAT(
        parse_error(small_phi3(R"("rope_scaling": {"type": "longrope",
                   "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})")),
        Contains("rope_scaling.short_factor") && Contains("8 numbers") && Contains("missing"));
    CHECK_THAT(
        parse_error(small_phi3(R"("rope_scaling": {"type": "longrope",
                   "short_factor": [1, 1, 1, 1, 1, 1, 1, 1], "long_factor": [1, 2, 3]})")),
        Contains("rope_scaling.long_factor") && Contains("8 numbers") && Contains("3 entries"));
    CHECK_THAT(parse_error(small_phi3(R"("rope_scaling": {"type": "longrope",
                   "short_factor": [1, 0, 1, 1, 1, 1, 1, 1], "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]})")),
               Contains("rope_scaling.short_factor[1]") && Contains("greater than 0"));
  }
  SECTION("phi3 takes default or longrope RoPE only") {
    CHECK_THAT(parse_error(small_phi3(R"("rope_scaling": {"type": "linear", "factor": 2})")),
               Contains("rope_scaling.type") && Contains("longrope") && Contains("phi3") &&
                   Contains("linear"));
  }
  SECTION("partial rotary: phi3 only, and an even rotary dimension") {
    CHECK_THAT(parse_error(small_config(R"("partial_rotary_factor": 0.5)")),
               Contains("partial_rotary_factor") && Contains("phi3 only") && Contains("0.5"));
    CHECK_THAT(parse_error(small_config(
                   R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})")),
               Contains("rope_parameters.partial_rotary_factor"));
    // head_dim 16 x 0.35 = 5.6: int() gives 5 channels, which rotate-half cannot split.
    CHECK_THAT(parse_error(small_phi3(R"("partial_rotary_factor": 0.35)")),
               Contains("partial_rotary_factor") && Contains("even rotary dimension"));
    CHECK_THAT(parse_error(small_phi3(R"("partial_rotary_factor": 1.5)")),
               Contains("partial_rotary_factor") && Contains("(0, 1]"));
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
