// The seerattention policy's block gate (SeerAttention-R's decode gate, docs/policies/
// seerattention.md): seer_gate.safetensors + seer_gate.json beside the model, written by
// tools/train_seer_gate.py. Per layer l and KV head g (group = H / G, D = head_dim, d = gate_dim):
// q_proj [G, d, group * D], k_max_proj and k_min_proj [G, d, D], q_norm and k_norm [G, d], F32.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvlens {

struct SeerGateConfig {
  int64_t layers = 0, heads = 0, kv_heads = 0, head_dim = 0;
  int64_t gate_dim = 0;    // d: the gate's query and block-key width
  int64_t block_size = 0;  // tokens per block (whole blocks are kept)
  float norm_eps = 1e-6f;  // the gate's RMSNorms
  std::string source;      // the .safetensors file, for messages
};

struct SeerGateLayer {
  std::vector<float> q_proj, k_max_proj, k_min_proj, q_norm, k_norm;  // shapes as above
};

struct SeerGate {
  SeerGateConfig config;
  std::vector<SeerGateLayer> layers;
};

// The gate file seerattention reads for a model: seer_gate.safetensors in the model folder (or
// beside a .gguf file).
std::string seer_gate_path(const std::string& model_dir);

// Loads and checks the gate of `model_dir` against the model's shape. Throws kvlens::Error naming
// the file and the field: no model folder, a missing file (naming tools/train_seer_gate.py), a
// bad seer_gate.json, a shape other than the model's, a missing tensor or one of another dtype or
// shape.
std::shared_ptr<const SeerGate> load_seer_gate(const std::string& model_dir, int64_t layers,
                                               int64_t heads, int64_t kv_heads, int64_t head_dim);

}  // namespace kvlens
