// Writers for test safetensors files and tiny random Llama checkpoints (see tiny_checkpoint.h).
// Random values come from splitmix64 + Box-Muller so a seed means the same model everywhere.
#include "tests/support/tiny_checkpoint.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "engine/common/dtype.h"
#include "engine/model/config.h"
#include "tests/support/test_paths.h"

namespace kvlens::test {
namespace {

using Json = nlohmann::json;

class NormalSource {
 public:
  explicit NormalSource(uint64_t seed) : state_(seed) {}
  float next(double mean, double stddev) {
    // Box-Muller; u1 in (0, 1] so log() is finite.
    const double u1 = (double(next_u64() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = double(next_u64() >> 11) * 0x1.0p-53;
    return float(mean +
                 stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
  }

 private:
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

void append_u16(std::string& out, uint16_t bits) {
  out.push_back(char(bits & 0xff));
  out.push_back(char(bits >> 8));
}

int64_t product(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (const int64_t extent : shape) count *= extent;
  return count;
}

}  // namespace

uint16_t f32_to_f16_bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: infinity
  if (abs < 0x38800000u) {
    // Below the smallest F16 normal (2^-14): the result is a subnormal multiple of 2^-24.
    // Adding 0.5 shifts the value so that the float adder's own round-to-nearest-even lands on
    // that grid (the classic trick: |x| + 0.5 has an ulp of 2^-24).
    const float shifted = std::bit_cast<float>(abs) + 0.5f;
    return uint16_t(sign | uint16_t(std::bit_cast<uint32_t>(shifted) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to even.
  uint32_t rebased = abs - ((127u - 15u) << 23);
  rebased += 0xfffu + ((rebased >> 13) & 1u);
  return uint16_t(sign | uint16_t(rebased >> 13));
}

TestTensor make_tensor(const std::string& name, const std::string& dtype,
                       const std::vector<int64_t>& shape, const std::vector<float>& values) {
  TestTensor tensor{name, dtype, shape, {}};
  if (dtype == "F32") {
    tensor.bytes.resize(values.size() * 4);
    if (!values.empty()) std::memcpy(tensor.bytes.data(), values.data(), tensor.bytes.size());
  } else if (dtype == "BF16") {
    for (const float v : values) append_u16(tensor.bytes, f32_to_bf16(v));
  } else if (dtype == "F16") {
    for (const float v : values) append_u16(tensor.bytes, f32_to_f16_bits(v));
  } else {
    throw std::invalid_argument("make_tensor: dtype must be F32, BF16 or F16, not " + dtype);
  }
  return tensor;
}

std::vector<float> tensor_values(const TestTensor& tensor) {
  std::vector<float> values;
  if (tensor.dtype == "F32") {
    values.resize(tensor.bytes.size() / 4);
    if (!values.empty()) std::memcpy(values.data(), tensor.bytes.data(), values.size() * 4);
    return values;
  }
  if (tensor.dtype != "BF16" && tensor.dtype != "F16") {
    throw std::invalid_argument("tensor_values: unsupported dtype " + tensor.dtype);
  }
  for (size_t i = 0; i + 1 < tensor.bytes.size(); i += 2) {
    const uint16_t bits = uint16_t(uint8_t(tensor.bytes[i]) | (uint8_t(tensor.bytes[i + 1]) << 8));
    values.push_back(tensor.dtype == "BF16" ? bf16_to_f32(bits) : f16_to_f32(bits));
  }
  return values;
}

std::string safetensors_raw(const std::string& header_json, const std::string& data) {
  std::string out;
  uint64_t length = header_json.size();
  for (int i = 0; i < 8; ++i) out.push_back(char((length >> (8 * i)) & 0xff));
  return out + header_json + data;
}

std::string safetensors_bytes(const std::vector<TestTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string data;
  for (const TestTensor& tensor : tensors) {
    const uint64_t begin = data.size();
    data += tensor.bytes;
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", Json::array({begin, uint64_t(data.size())})}};
  }
  std::string text = header.dump();
  // Pad so the data section starts 8-byte aligned, as the reference writer does.
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  return safetensors_raw(text, data);
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

void write_safetensors(const std::string& path, const std::vector<TestTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file(path, safetensors_bytes(tensors, metadata));
}

std::string tiny_llama_config(const TinyLlamaSpec& spec) {
  const char* torch_dtype = spec.dtype == "BF16"  ? "bfloat16"
                            : spec.dtype == "F16" ? "float16"
                                                  : "float32";
  Json config = {
      {"architectures",
       Json::array({spec.model_type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM"})},
      {"model_type", spec.model_type},
      {"vocab_size", spec.vocab},
      {"hidden_size", spec.hidden},
      {"intermediate_size", spec.intermediate},
      {"num_hidden_layers", spec.layers},
      {"num_attention_heads", spec.heads},
      {"num_key_value_heads", spec.kv_heads},
      {"hidden_act", "silu"},
      {"max_position_embeddings", spec.max_positions},
      {"rms_norm_eps", spec.rms_norm_eps},
      {"rope_theta", spec.rope_theta},
      {"rope_scaling", nullptr},
      {"tie_word_embeddings", spec.tied},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"attention_bias", false},
      {"torch_dtype", torch_dtype},
  };
  if (spec.head_dim != 0) config["head_dim"] = spec.head_dim;
  if (spec.model_type == "llama") config["mlp_bias"] = false;
  if (spec.model_type == "mistral") config["sliding_window"] = nullptr;
  config.update(Json::parse(spec.extra_config));
  return config.dump(2);
}

std::vector<TestTensor> tiny_llama_tensors(const TinyLlamaSpec& spec) {
  NormalSource random(spec.seed);
  std::vector<TestTensor> tensors;
  const auto add = [&](const std::string& name, const std::vector<int64_t>& shape, double mean) {
    std::vector<float> values(size_t(product(shape)));
    for (float& v : values) v = random.next(mean, 0.05);
    tensors.push_back(make_tensor(name, spec.dtype, shape, values));
  };
  const int64_t head_dim = spec.head_dim != 0 ? spec.head_dim : spec.hidden / spec.heads;
  const int64_t e = spec.hidden, f = spec.intermediate;
  const int64_t q = spec.heads * head_dim, kv = spec.kv_heads * head_dim;
  add("model.embed_tokens.weight", {spec.vocab, e}, 0.0);
  for (int64_t i = 0; i < spec.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {e}, 1.0);
    add(p + "self_attn.q_proj.weight", {q, e}, 0.0);
    add(p + "self_attn.k_proj.weight", {kv, e}, 0.0);
    add(p + "self_attn.v_proj.weight", {kv, e}, 0.0);
    add(p + "self_attn.o_proj.weight", {e, q}, 0.0);
    add(p + "post_attention_layernorm.weight", {e}, 1.0);
    add(p + "mlp.gate_proj.weight", {f, e}, 0.0);
    add(p + "mlp.up_proj.weight", {f, e}, 0.0);
    add(p + "mlp.down_proj.weight", {e, f}, 0.0);
  }
  add("model.norm.weight", {e}, 1.0);
  if (!spec.tied) add("lm_head.weight", {spec.vocab, e}, 0.0);
  return tensors;
}

void write_checkpoint(const std::string& dir, const std::string& config_json,
                      const std::vector<TestTensor>& tensors, bool sharded) {
  std::filesystem::create_directories(dir);
  write_file(dir + "/config.json", config_json);
  if (!sharded) {
    write_safetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}});
    return;
  }
  const size_t split = tensors.size() / 2;
  const std::vector<TestTensor> first(tensors.begin(), tensors.begin() + std::ptrdiff_t(split));
  const std::vector<TestTensor> second(tensors.begin() + std::ptrdiff_t(split), tensors.end());
  const std::string names[2] = {"model-00001-of-00002.safetensors",
                                "model-00002-of-00002.safetensors"};
  write_safetensors(dir + "/" + names[0], first, {{"format", "pt"}});
  write_safetensors(dir + "/" + names[1], second, {{"format", "pt"}});
  Json weight_map = Json::object();
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    weight_map[tensors[i].name] = names[i < split ? 0 : 1];
    total += tensors[i].bytes.size();
  }
  const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file(dir + "/model.safetensors.index.json", index.dump(2));
}

void write_tiny_predictor(const std::string& dir, const TinyLlamaSpec& spec,
                          const std::string& variant, int64_t reduce, int64_t d, int64_t m) {
  NormalSource random(spec.seed + 1000);
  std::vector<TestTensor> tensors;
  const auto add = [&](const std::string& name, const std::vector<int64_t>& shape, double mean,
                       double deviation) {
    std::vector<float> values(size_t(product(shape)));
    for (float& v : values) v = random.next(mean, deviation);
    tensors.push_back(make_tensor(name, "F32", shape, values));
  };
  const int64_t e = spec.hidden, er = spec.hidden / reduce, slots = spec.layers * spec.heads * d;
  add("input_proj.weight", {er, e}, 0.0, 0.2);
  for (const char* name : {"q_proj_attn.weight", "k_proj_attn.weight", "v_proj_attn.weight"})
    add(name, {er, er}, 0.0, 0.2);
  add("norm1.weight", {er}, 1.0, 0.1);
  add("norm1.bias", {er}, 0.0, 0.1);
  add("ffn.0.weight", {2 * er, er}, 0.0, 0.2);
  add("ffn.0.bias", {2 * er}, 0.0, 0.1);
  add("ffn.2.weight", {e, 2 * er}, 0.0, 0.2);
  add("ffn.2.bias", {e}, 0.0, 0.1);
  add("norm2.weight", {e}, 1.0, 0.1);
  add("norm2.bias", {e}, 0.0, 0.1);
  if (variant == "hf") {
    add("norm_importance.weight", {e}, 1.0, 0.1);
    add("norm_importance.bias", {e}, 0.0, 0.1);
  }
  for (const char* side : {"q", "k"}) {
    add(std::string(side) + "_proj_importance.0.weight", {m, e}, 0.0, 0.2);
    add(std::string(side) + "_proj_importance.2.weight", {slots, m}, 0.0, 0.2);
  }
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/predictor.safetensors", tensors);
  const Json config = {{"format", "kvlens-tokenbutler-predictor"},
                       {"version", 1},
                       {"variant", variant},
                       {"hidden_size", e},
                       {"attn_reduce_factor", reduce},
                       {"heads", spec.heads},
                       {"layers", spec.layers},
                       {"dDash", d},
                       {"intdim", m},
                       {"layer_norm_eps", 1e-5},
                       {"rope_theta", spec.rope_theta},
                       {"training", {{"random", true}, {"seed", spec.seed}}}};
  write_file(dir + "/predictor.json", config.dump(2));
}

std::string write_tiny_llama(const std::string& dir, const TinyLlamaSpec& spec) {
  write_checkpoint(dir, tiny_llama_config(spec), tiny_llama_tensors(spec), spec.sharded);
  // Sizes the predictor cannot take (its rotary attention needs hidden / 2 split into heads of
  // an even width, and a layer to predict) get none.
  const bool fits = spec.layers >= 2 && (spec.hidden / 2) % (2 * spec.heads) == 0;
  if (spec.predictor && fits) write_tiny_predictor(dir, spec);
  if (spec.calibration) write_tiny_calibration(dir, spec);
  write_tiny_duo_gates(dir, spec);
  if (spec.seer_gate) write_tiny_seer_gate(dir, spec);
  return dir;
}

std::string copy_with_calibration(const std::string& dir) {
  const std::string copy = make_temp_dir("calibrated");
  std::filesystem::copy(
      dir, copy,
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  const ModelConfig config = ModelConfig::load(dir + "/config.json");
  TinyLlamaSpec spec;
  spec.layers = config.num_layers;
  spec.heads = config.num_heads;
  spec.kv_heads = config.num_kv_heads;
  spec.head_dim = config.head_dim;
  write_tiny_calibration(copy, spec);
  return copy;
}

void write_tiny_calibration(const std::string& dir, const TinyLlamaSpec& spec) {
  const int64_t D = spec.head_dim != 0 ? spec.head_dim : spec.hidden / spec.heads;
  const int64_t L = spec.layers, G = spec.kv_heads, H = spec.heads;
  std::vector<float> basis(size_t(L * G * D * D), 0.0f), channels(size_t(L * H * D));
  for (int64_t lg = 0; lg < L * G; ++lg)
    for (int64_t i = 0; i < D; ++i)  // direction i: channel D - 1 - i
      basis[size_t((lg * D + (D - 1 - i)) * D + i)] = i % 2 == 0 ? 1.0f : -1.0f;
  for (int64_t lh = 0; lh < L * H; ++lh)
    for (int64_t i = 0; i < D; ++i) channels[size_t(lh * D + i)] = float(D - 1 - i);
  write_safetensors(dir + "/loki_pca.safetensors",
                    {make_tensor("basis", "F32", {L, G, D, D}, basis)});
  write_safetensors(dir + "/doublesparsity_channels.safetensors",
                    {make_tensor("channels", "F32", {L, H, D}, channels)});
}

void write_tiny_duo_gates(const std::string& dir, const TinyLlamaSpec& spec) {
  std::vector<float> gates(size_t(spec.layers * spec.kv_heads));
  for (size_t i = 0; i < gates.size(); ++i) gates[i] = float((i * 3) % 10) / 10.0f;
  write_safetensors(dir + "/duo_gates.safetensors",
                    {make_tensor("gates", "F32", {spec.layers, spec.kv_heads}, gates)});
}

void write_tiny_seer_gate(const std::string& dir, const TinyLlamaSpec& spec, int64_t block_size,
                          int64_t gate_dim) {
  NormalSource random(spec.seed + 2000);
  const int64_t head_dim = spec.head_dim > 0 ? spec.head_dim : spec.hidden / spec.heads;
  const int64_t G = spec.kv_heads, group = spec.heads / spec.kv_heads;
  std::vector<TestTensor> tensors;
  const auto add = [&](const std::string& name, const std::vector<int64_t>& shape, double mean,
                       double deviation) {
    std::vector<float> values(size_t(product(shape)));
    for (float& v : values) v = random.next(mean, deviation);
    tensors.push_back(make_tensor(name, "F32", shape, values));
  };
  for (int64_t l = 0; l < spec.layers; ++l) {
    const std::string at = "layers." + std::to_string(l) + ".";
    add(at + "q_proj.weight", {G, gate_dim, group * head_dim}, 0.0, 0.3);
    add(at + "k_max_proj.weight", {G, gate_dim, head_dim}, 0.0, 0.3);
    add(at + "k_min_proj.weight", {G, gate_dim, head_dim}, 0.0, 0.3);
    add(at + "q_norm.weight", {G, gate_dim}, 1.0, 0.1);
    add(at + "k_norm.weight", {G, gate_dim}, 1.0, 0.1);
  }
  std::filesystem::create_directories(dir);
  write_safetensors(dir + "/seer_gate.safetensors", tensors);
  const Json config = {{"format", "kvlens-seer-gate"},
                       {"version", 1},
                       {"layers", spec.layers},
                       {"heads", spec.heads},
                       {"kv_heads", G},
                       {"head_dim", head_dim},
                       {"gate_dim", gate_dim},
                       {"block_size", block_size},
                       {"training", {{"random", true}, {"seed", spec.seed}}}};
  write_file(dir + "/seer_gate.json", config.dump(2));
}

}  // namespace kvlens::test
