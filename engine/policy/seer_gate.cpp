// Loading seerattention's block gate (seer_gate.h): seer_gate.json's shapes, then every layer's
// F32 tensors copied out of the mapped safetensors file (its data need not be aligned).
#include "engine/policy/seer_gate.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/common/json_describe.h"
#include "engine/common/json_fields.h"
#include "engine/common/json_file.h"
#include "engine/model/safetensors.h"

namespace kvlens {
namespace fs = std::filesystem;

namespace {

const char* const kTool = "tools/train_seer_gate.py --model MODEL --data TEXT...";

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

std::vector<float> read_tensor(const SafetensorsFile& file, const std::string& name,
                               const std::vector<int64_t>& shape) {
  const auto it = file.header().tensors.find(name);
  if (it == file.header().tensors.end()) {
    throw Error(file.path(), name, "an F32 tensor " + shape_text(shape), "missing");
  }
  if (it->second.stored_dtype != "F32" || it->second.shape != shape) {
    throw Error(file.path(), name, "an F32 tensor " + shape_text(shape),
                it->second.stored_dtype + " " + shape_text(it->second.shape));
  }
  const TensorView view = file.tensor(name);
  std::vector<float> values(view.bytes / sizeof(float));
  std::memcpy(values.data(), view.data, view.bytes);
  return values;
}

}  // namespace

std::string seer_gate_path(const std::string& model_dir) {
  std::error_code ec;
  const fs::path dir =
      fs::is_regular_file(model_dir, ec) ? fs::path(model_dir).parent_path() : fs::path(model_dir);
  return (dir / "seer_gate.safetensors").string();
}

std::shared_ptr<const SeerGate> load_seer_gate(const std::string& model_dir, int64_t layers,
                                               int64_t heads, int64_t kv_heads, int64_t head_dim) {
  if (model_dir.empty()) {
    throw Error("policy seerattention", "gate",
                "a model folder holding seer_gate.safetensors (made by " + std::string(kTool) + ")",
                "no model folder");
  }
  const std::string path = seer_gate_path(model_dir);
  const std::string json_path = (fs::path(path).parent_path() / "seer_gate.json").string();
  std::error_code ec;
  for (const std::string& needed : {path, json_path}) {
    if (!fs::is_regular_file(needed, ec)) {
      throw Error(
          needed, "seer_gate",
          "the SeerAttention-R gate trained for this model (run " + std::string(kTool) + ")",
          "missing");
    }
  }
  const nlohmann::json root = read_json_file(json_path);
  if (!root.is_object()) throw Error(json_path, "JSON", "an object", describe_json(root));
  const auto format = root.find("format");
  if (format == root.end() || *format != "kvlens-seer-gate") {
    throw Error(json_path, "format", "\"kvlens-seer-gate\"",
                format == root.end() ? "missing" : describe_json(*format));
  }
  const FieldReader fields(root, json_path);
  auto gate = std::make_shared<SeerGate>();
  SeerGateConfig& c = gate->config;
  c.source = path;
  c.layers = fields.integer("layers", 1, 1 << 12);
  c.heads = fields.integer("heads", 1, 1 << 12);
  c.kv_heads = fields.integer("kv_heads", 1, 1 << 12);
  c.head_dim = fields.integer("head_dim", 1, 1 << 12);
  c.gate_dim = fields.integer("gate_dim", 1, 1 << 12);
  c.block_size = fields.integer("block_size", 1, 1 << 20);
  c.norm_eps = float(fields.number_or("norm_eps", 1e-6, 0.0));
  if (c.layers != layers || c.heads != heads || c.kv_heads != kv_heads || c.head_dim != head_dim) {
    throw Error(json_path, "layers, heads, kv_heads, head_dim",
                "the model's " + std::to_string(layers) + ", " + std::to_string(heads) + ", " +
                    std::to_string(kv_heads) + ", " + std::to_string(head_dim),
                std::to_string(c.layers) + ", " + std::to_string(c.heads) + ", " +
                    std::to_string(c.kv_heads) + ", " + std::to_string(c.head_dim));
  }
  const SafetensorsFile file(path);
  const int64_t G = c.kv_heads, d = c.gate_dim, D = c.head_dim, group = c.heads / c.kv_heads;
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".";
    SeerGateLayer layer;
    layer.q_proj = read_tensor(file, prefix + "q_proj.weight", {G, d, group * D});
    layer.k_max_proj = read_tensor(file, prefix + "k_max_proj.weight", {G, d, D});
    layer.k_min_proj = read_tensor(file, prefix + "k_min_proj.weight", {G, d, D});
    layer.q_norm = read_tensor(file, prefix + "q_norm.weight", {G, d});
    layer.k_norm = read_tensor(file, prefix + "k_norm.weight", {G, d});
    gate->layers.push_back(std::move(layer));
  }
  return gate;
}

}  // namespace kvlens
