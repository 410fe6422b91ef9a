// Backend selection and model loading of the common options (common_options.h).
#include "app/session/common_options.h"

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/common/error.h"
#include "engine/policy/plugin_policy.h"
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
