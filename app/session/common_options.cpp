// Backend selection and model loading of the common options (common_options.h).
#include "app/session/common_options.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <optional>
#include <thread>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/common/comma_list.h"
#include "engine/common/error.h"
#include "engine/policy/plugin_policy.h"
#include "engine/session/memory_estimate.h"
#if KVLENS_HAVE_CUDA
#include "kernels/cuda_backend.h"
#include "kernels/policy/cuda_policy_ops.h"
#endif

namespace kvlens::session {

std::unique_ptr<Backend> make_backend(const CommonOptions& common) {
  if (common.backend == "cpu") {
    CpuBackendOptions options;
    options.threads = common.threads;
    options.allow_simd = common.cpu_kernels != "generic";
    options.allow_avx512 = common.cpu_kernels == "auto";
    return make_cpu_backend(options);
  }
  if (common.backend == "cuda") {
#if KVLENS_HAVE_CUDA
    if (!cuda_device_available()) {
      throw Error("--backend", "cuda", "a CUDA device (none was found; use --backend cpu)");
    }
    register_cuda_policy_ops();  // the policies' own ops on the GPU (keydiff, quest, ...)
    return make_cuda_backend(0);
#else
    throw Error("--backend", "cuda", "a build with the CUDA backend (this one has cpu only)");
#endif
  }
  throw Error("--backend", "backend", "cpu or cuda", common.backend);
}

std::vector<int> chosen_devices(const std::string& command, int64_t gpus,
                                const std::string& devices) {
  std::vector<int> chosen;
  if (!devices.empty()) {
    for (const std::string& item : split_comma_list(devices)) {
      int device = -1;
      const char* end = item.data() + item.size();
      const auto [ptr, ec] = std::from_chars(item.data(), end, device);
      if (item.empty() || ec != std::errc() || ptr != end || device < 0) {
        throw Error(command, "--devices", "comma-separated GPU indices such as 0,1,2,3",
                    "'" + devices + "'");
      }
      if (std::find(chosen.begin(), chosen.end(), device) != chosen.end())
        throw Error(command, "--devices", "each GPU once", "'" + devices + "'");
      chosen.push_back(device);
    }
    return chosen;
  }
  if (gpus < 0) throw Error(command, "--gpus", "at least 1", std::to_string(gpus));
  for (int d = 0; d < std::max<int>(1, int(gpus)); ++d) chosen.push_back(d);
  return chosen;
}

std::vector<std::unique_ptr<Backend>> make_backend_group(const CommonOptions& common,
                                                         std::span<const int> devices) {
  std::vector<std::unique_ptr<Backend>> group;
  if (devices.size() <= 1 && (devices.empty() || devices[0] == 0)) {
    group.push_back(make_backend(common));
    return group;
  }
  if (common.backend == "cpu") {
    CpuBackendOptions options;
    const int cores =
        common.threads > 0 ? common.threads : int(std::thread::hardware_concurrency());
    options.threads = std::max(1, cores / int(devices.size()));
    options.allow_simd = common.cpu_kernels != "generic";
    options.allow_avx512 = common.cpu_kernels == "auto";
    return make_cpu_backend_group(int(devices.size()), options);
  }
#if KVLENS_HAVE_CUDA
  if (common.backend != "cuda") {
    group.push_back(make_backend(common));  // its error names the backend
    return group;
  }
  // make_backend's checks and registration, without making a backend that would go unused.
  if (!cuda_device_available()) {
    throw Error("--backend", "cuda", "a CUDA device (none was found; use --backend cpu)");
  }
  register_cuda_policy_ops();
  const int available = cuda_device_count();
  for (const int device : devices) {
    if (device >= available) {
      throw Error("--devices", "GPU " + std::to_string(device),
                  "a GPU of this host (" + std::to_string(available) + " found)");
    }
  }
  return make_cuda_backend_group(devices);
#else
  group.push_back(make_backend(common));  // the error of a build without CUDA
  return group;
#endif
}

double weight_scale(const CommonOptions& common, const Model& model) {
  const std::optional<DType> dtype = upload_options(common).weight_dtype;
  const TensorView& matrix =
      model.weights.layers.empty() ? model.weights.embed : model.weights.layers.front().wq;
  if (!dtype || matrix.data == nullptr) return 1.0;
  return double(dtype_size(*dtype)) / double(dtype_size(matrix.dtype));
}

void require_gpus_hold([[maybe_unused]] const CommonOptions& common,
                       [[maybe_unused]] const Model& model,
                       [[maybe_unused]] std::span<const int> devices,
                       [[maybe_unused]] int64_t tokens, [[maybe_unused]] int64_t runs) {
#if KVLENS_HAVE_CUDA
  if (common.backend != "cuda" || !cuda_device_available()) return;
  const MemoryEstimate estimate = estimate_memory(model);
  const double scale = weight_scale(common, model);
  const int64_t ranks = int64_t(std::max<size_t>(devices.size(), 1));
  const int64_t need = estimate.cuda_bytes_per_gpu(ranks, tokens, runs, scale);
  auto gib = [](int64_t bytes) {
    char text[32];
    std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(int64_t(1) << 30));
    return std::string(text);
  };
  for (const int device : devices) {
    const int64_t bytes = cuda_device_memory_bytes(device);
    if (need <= bytes - bytes / 10) continue;
    const int64_t fewest = gpus_needed_split(model, estimate, tokens, bytes, scale, runs);
    throw Error(model.dir, ranks == 1 ? "--gpus" : "--gpus " + std::to_string(ranks),
                (fewest > 0 ? "at least " + std::to_string(fewest) + " GPUs of " + gib(bytes)
                            : "more than 64 GPUs of " + gib(bytes)) +
                    " (kvlens-cli info says so: gpus.gpus_needed)",
                std::to_string(ranks) + " GPU" + (ranks > 1 ? "s" : "") + ", each to hold " +
                    gib(need) + " of weights and caches, " + gib(bytes - bytes / 10) +
                    " usable on GPU " + std::to_string(device));
  }
#endif
}

void load_plugins(const CommonOptions& common, std::vector<std::string>& warnings) {
  for (const std::string& folder : default_plugin_folders()) {
    std::vector<std::string> errors;
    load_policy_plugin_folder(folder, errors);
    for (const std::string& error : errors) warnings.push_back(error + " (skipped)");
  }
  for (const std::string& file : common.plugins) load_policy_plugin(file);
}

UploadOptions upload_options(const CommonOptions& common) {
  auto parse = [](const std::string& flag, const std::string& value,
                  bool f16) -> std::optional<DType> {
    if (value == "auto") return std::nullopt;
    if (value == "f32") return DType::F32;
    if (value == "bf16") return DType::BF16;
    if (value == "f16" && f16) return DType::F16;
    throw Error(flag, "dtype", f16 ? "auto, f32, bf16 or f16" : "auto, f32 or bf16", value);
  };
  UploadOptions options;
  options.weight_dtype = parse("--dtype", common.dtype, false);
  options.kv_cache_dtype = parse("--kv-dtype", common.kv_dtype, true);
  return options;
}

std::shared_ptr<const Model> load_model(const CommonOptions& common, const std::string& model_dir) {
  return Model::load(model_dir, common.predictor);
}

}  // namespace kvlens::session
