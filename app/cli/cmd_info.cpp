// kvlens-cli info: the validated config of a checkpoint folder or GGUF file, its weights and
// tokenizer, and the memory it will need on each backend, as JSON.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "app/cli/cli_common.h"
#include "app/cli/eval_report.h"
#include "engine/model/dequantize.h"
#include "engine/model/gguf_weights.h"
#include "engine/model/model.h"
#include "engine/session/memory_estimate.h"
#if KVLENS_HAVE_CUDA
#include "kernels/cuda_backend.h"
#endif

namespace kvlens::cli {
namespace {

std::string rope_type_name(RopeScaling::Type type) {
  switch (type) {
    case RopeScaling::Type::kNone:
      return "default";
    case RopeScaling::Type::kLinear:
      return "linear";
    case RopeScaling::Type::kLlama3:
      return "llama3";
    case RopeScaling::Type::kYarn:
      return "yarn";
    case RopeScaling::Type::kDynamic:
      return "dynamic";
    case RopeScaling::Type::kLongRope:
      return "longrope";
  }
  return "?";
}

// A GGUF file's own view: tensor types as stored, and what loading made of them (quantized
// tensors dequantized to F32 in memory, plain float ones read in place from the map).
nlohmann::json gguf_info(const Model& model) {
  const GgufFile& file = *model.gguf;
  nlohmann::json types = nlohmann::json::object();
  int64_t stored_bytes = 0;
  for (const GgufTensorInfo& tensor : file.tensors()) {
    const std::string type = ggml_type_name(tensor.type);
    types[type] = types.value(type, 0) + 1;
    stored_bytes += int64_t(tensor.bytes);
  }
  int64_t dequantized_bytes = 0, in_place_bytes = 0;
  for (const std::string& name : model.weights.files->names()) {
    const TensorView view = model.weights.files->tensor(name);
    const auto* base = reinterpret_cast<const std::byte*>(file.bytes().data());
    const bool mapped = view.data >= base && view.data < base + file.bytes().size();
    (mapped ? in_place_bytes : dequantized_bytes) += int64_t(view.bytes);
  }
  return {{"file", file.source()},
          {"version", file.version()},
          {"architecture", file.optional_string("general.architecture").value_or("")},
          {"name", file.optional_string("general.name").value_or("")},
          {"file_bytes", file.file_bytes()},
          {"tensor_count", file.tensors().size()},
          {"tensor_types", types},
          {"stored_tensor_bytes", stored_bytes},
          {"dequantized_to", std::string(dtype_name(gguf_dequantized_dtype(file)))},
          {"dequantized_bytes", dequantized_bytes},
          {"in_place_bytes", in_place_bytes}};
}

nlohmann::json model_info(const Model& model) {
  const ModelConfig& c = model.config;
  nlohmann::json rope = {{"type", rope_type_name(c.rope_scaling.type)}, {"theta", c.rope_theta}};
  if (c.rope_scaling.type != RopeScaling::Type::kNone) rope["factor"] = c.rope_scaling.factor;
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    rope["low_freq_factor"] = c.rope_scaling.low_freq_factor;
    rope["high_freq_factor"] = c.rope_scaling.high_freq_factor;
    rope["original_max_position_embeddings"] = c.rope_scaling.original_max_position_embeddings;
  }
  if (c.rope_local_theta > 0.0) rope["local_theta"] = c.rope_local_theta;
  int64_t parameters = 0, weight_bytes = 0;
  nlohmann::json dtype_counts = nlohmann::json::object();
  for (const std::string& name : model.weights.files->names()) {
    const TensorView tensor = model.weights.files->tensor(name);
    parameters += tensor.numel();
    weight_bytes += int64_t(tensor.bytes);
    const std::string dtype(dtype_name(tensor.dtype));
    dtype_counts[dtype] = dtype_counts.value(dtype, 0) + 1;
  }
  nlohmann::json info = {
      {"model", model.dir},
      {"model_type", c.model_type},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_layers},
      {"num_attention_heads", c.num_heads},
      {"num_key_value_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope", rope},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"max_position_embeddings", c.max_position_embeddings},
      {"sliding_window", c.sliding_window ? nlohmann::json(*c.sliding_window) : nlohmann::json()},
      {"layer_pattern", c.layer_pattern()},
      {"bos_token_id", c.bos_token_id ? nlohmann::json(*c.bos_token_id) : nlohmann::json()},
      {"eos_token_ids", c.eos_token_ids},
      {"torch_dtype", std::string(dtype_name(c.torch_dtype))},
      {"parameters", parameters},
      {"weight_bytes", weight_bytes},
      {"tensor_dtypes", dtype_counts},
  };
  if (c.attention_scalar > 0.0) info["query_pre_attn_scalar"] = c.attention_scalar;
  if (c.final_logit_softcap > 0.0) info["final_logit_softcapping"] = c.final_logit_softcap;
  if (c.hidden_activation == ModelConfig::Activation::kGeluTanh)
    info["hidden_activation"] = "gelu_pytorch_tanh";
  const MemoryEstimate memory = estimate_memory(model);
  info["memory"] = {{"mapped_weight_bytes", memory.mapped_bytes},
                    {"cpu_weight_bytes", memory.cpu_weight_bytes},
                    {"cuda_weight_bytes", memory.cuda_weight_bytes},
                    {"kv_cache_bytes_per_1k_tokens", memory.kv_cache_per_1k},
                    {"cuda_kv_cache_bytes_per_1k_tokens", memory.cuda_kv_cache_per_1k},
                    {"policy_rows_bytes_per_1k_tokens", memory.policy_rows_per_1k},
                    {"trace_step_row_bytes_at_1k_tokens", memory.trace_step_rows_at_1k},
                    {"available_bytes", available_memory_bytes()}};
  if (const auto& predictor = model.predictor.predictor) {
    const PredictorConfig& sizes = predictor->config;
    info["predictor"] = {{"path", predictor->path},
                         {"variant", PredictorConfig::variant_name(sizes.variant)},
                         {"attn_reduce_factor", sizes.attn_reduce_factor},
                         {"dDash", sizes.importance_dim},
                         {"intdim", sizes.intermediate},
                         {"parameters", sizes.parameter_count()}};
  } else {
    info["predictor"] = nullptr;
  }
  if (model.gguf) info["gguf"] = gguf_info(model);
  if (model.tokenizer) {
    info["tokenizer"] = {
        {"vocab_size", model.tokenizer->vocab_size()},
        {"bos_id", model.tokenizer->bos_id() ? nlohmann::json(*model.tokenizer->bos_id())
                                             : nlohmann::json()}};
  } else {
    info["tokenizer"] = nullptr;
  }
  return info;
}

// Where a CUDA device is present: how many GPUs of its memory the model's weights at --dtype
// need (with 4k tokens of one run's cache), before any work; eval refuses fewer, and since it
// puts a whole copy on each GPU, more than one.
void add_gpu_need([[maybe_unused]] nlohmann::json& info,
                  [[maybe_unused]] const CommonOptions& common,
                  [[maybe_unused]] const Model& model) {
#if KVLENS_HAVE_CUDA
  if (!cuda_device_available()) return;
  const MemoryEstimate estimate = estimate_memory(model);
  const int64_t kv_bytes = estimate.cuda_kv_cache_per_1k * 4;
  const GpuNeed need = gpu_need(common, model, kv_bytes, cuda_device_memory_bytes(0));
  // The fewest GPUs that hold it split by tensor parallelism (--gpus N of generate, bench, trace
  // and the app), and what each then holds; eval, a whole copy per GPU, needs it on one.
  const double scale = session::weight_scale(common, model);
  const int64_t split = gpus_needed_split(model, estimate, 4096, need.device_bytes, scale);
  info["gpus"] = {{"device", 0},
                  {"device_bytes", need.device_bytes},
                  {"dtype", need.dtype},
                  {"weight_bytes", need.weight_bytes},
                  {"kv_cache_bytes_4k_tokens", need.kv_bytes},
                  {"gpus_needed", split},
                  {"bytes_per_gpu_4k_tokens",
                   split > 0 ? nlohmann::json(estimate.cuda_bytes_per_gpu(split, 4096, 1, scale))
                             : nlohmann::json()},
                  {"eval_fits_one_gpu", need.gpus == 1}};
#endif
}

}  // namespace

void add_info_command(CLI::App& app, CommonOptions& common, CommandFn& run) {
  auto* command =
      app.add_subcommand("info", "Print a checkpoint's validated configuration as JSON");
  static std::string model_dir;
  command->add_option("--model", model_dir, "Hugging Face checkpoint folder or .gguf file")
      ->required();
  add_common_options(*command, common);
  add_predictor_option(*command, common);
  command->callback([&run, &common] {
    run = [&common] {
      const auto model = load_model(common, model_dir);
      nlohmann::json info = model_info(*model);
      add_gpu_need(info, common, *model);
      std::printf("%s\n", info.dump(2).c_str());
      return 0;
    };
  });
}

}  // namespace kvlens::cli
