// Test checkpoints: a safetensors writer (well-formed or hand-built corrupt files) and a random,
// seeded tiny Llama/Mistral folder (config.json + model.safetensors, or 2 shards + index json).
// Weight shapes follow engine/model/weights.h: q [H*D, E], k/v [G*D, E], o [E, H*D], ...
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kvlens::test {

struct TestTensor {
  std::string name;
  std::string dtype;  // safetensors spelling: "F32", "BF16", "F16", "I32", ... (any string)
  std::vector<int64_t> shape;
  std::string bytes;  // raw little-endian data, written as given (not checked against shape)
};

// F32 values stored as `dtype` ("F32", "BF16" or "F16"; round-to-nearest-even).
TestTensor make_tensor(const std::string& name, const std::string& dtype,
                       const std::vector<int64_t>& shape, const std::vector<float>& values);
// The values of a tensor written by make_tensor, widened back to F32 (F32/BF16/F16 only).
std::vector<float> tensor_values(const TestTensor& tensor);
uint16_t f32_to_f16_bits(float value);  // round-to-nearest-even, subnormals and inf kept

// Whole-file bytes of a valid safetensors file: header padded with spaces to a multiple of 8
// (as the reference writer does), tensors laid out back to back in the given order.
std::string safetensors_bytes(const std::vector<TestTensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {});
void write_safetensors(const std::string& path, const std::vector<TestTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// For corrupt-file tests: the 8-byte little-endian length of `header_json`, the header, `data`.
std::string safetensors_raw(const std::string& header_json, const std::string& data);
void write_file(const std::string& path, const std::string& bytes);

struct TinyLlamaSpec {
  int64_t vocab = 64;
  int64_t hidden = 32;
  int64_t intermediate = 48;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 0;  // 0: hidden / heads (and head_dim is left out of config.json)
  bool tied = false;
  std::string dtype = "F32";  // "F32", "BF16" or "F16", for every tensor
  int64_t max_positions = 256;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  uint64_t seed = 1;
  std::string model_type = "llama";  // "llama" or "mistral"
  bool sharded = false;  // two shards + model.safetensors.index.json instead of one file
  // Extra top-level config.json entries as a JSON object text (e.g. "{\"rope_scaling\": ...}");
  // they override the generated ones.
  std::string extra_config = "{}";
  // Also write a random TokenButler predictor (predictor.safetensors + predictor.json, variant
  // hf, r = 2, d' = 4, m = 8) beside the model, so the tokenbutler policy runs on it.
  bool predictor = true;
  // Also write the approximate-logit policies' calibration files (write_tiny_calibration), so
  // loki and doublesparsity run on it.
  bool calibration = true;
  // Also write a random seerattention gate (seer_gate.safetensors + seer_gate.json, blocks of 4,
  // gate width 4) beside the model, so the seerattention policy runs on it.
  bool seer_gate = true;
};

// loki_pca.safetensors and doublesparsity_channels.safetensors for `spec`'s model in `dir`
// (engine/policy/channel_calibration.h): every KV head's basis the channels in reverse order with
// alternating signs (orthonormal, exact), every query head's channels in reverse order.
void write_tiny_calibration(const std::string& dir, const TinyLlamaSpec& spec);
// A copy of the model folder `dir` (a committed fixture) in a new temporary folder, with
// write_tiny_calibration's files for its shape: loki and doublesparsity run on it.
std::string copy_with_calibration(const std::string& dir);

// A random predictor for `spec`'s model (F32, weights ~ N(0, 0.2), LayerNorms ~ 1 / 0 + noise),
// written into `dir` as predictor.safetensors + predictor.json (engine/model/predictor.h).
void write_tiny_predictor(const std::string& dir, const TinyLlamaSpec& spec,
                          const std::string& variant = "hf", int64_t reduce = 2, int64_t d = 4,
                          int64_t m = 8);

// A random seerattention gate for `spec`'s model (F32, projections ~ N(0, 0.3), norms ~ 1 + noise,
// blocks of `block_size`, gate width `gate_dim`), written into `dir` as seer_gate.safetensors +
// seer_gate.json (engine/policy/seer_gate.h).
void write_tiny_seer_gate(const std::string& dir, const TinyLlamaSpec& spec, int64_t block_size = 4,
                          int64_t gate_dim = 4);

// config.json text for `spec` (bos 1, eos 2, torch_dtype from spec.dtype).
std::string tiny_llama_config(const TinyLlamaSpec& spec);
// The tensors of a random tiny model: weights ~ N(0, 0.05), norm weights ~ 1 + N(0, 0.05),
// from a portable generator (same values for a given seed on every platform).
std::vector<TestTensor> tiny_llama_tensors(const TinyLlamaSpec& spec);
// Writes config.json and the tensors into `dir` (created when missing): model.safetensors, or
// with `sharded` model-0000{1,2}-of-00002.safetensors (first half / second half of the tensors)
// plus model.safetensors.index.json.
void write_checkpoint(const std::string& dir, const std::string& config_json,
                      const std::vector<TestTensor>& tensors, bool sharded);
// write_checkpoint(dir, tiny_llama_config(spec), tiny_llama_tensors(spec), spec.sharded), plus
// write_tiny_predictor where spec.predictor and write_tiny_seer_gate where spec.seer_gate; returns
// dir.
std::string write_tiny_llama(const std::string& dir, const TinyLlamaSpec& spec);
// duo_gates.safetensors for `spec`'s model in `dir` (engine/policy/duo_gates.h): gate i of the
// [layers, kv_heads] row-major order is ((3 i) mod 10) / 10, so duoattention runs on it.
void write_tiny_duo_gates(const std::string& dir, const TinyLlamaSpec& spec);

}  // namespace kvlens::test
