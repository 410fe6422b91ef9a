// Backend selection and model loading of the common options (common_options.h).
#include "app/session/common_options.h"

#include "engine/common/error.h"
#include "engine/runtime/cpu/cpu_backend.h"
#if KVLENS_HAVE_CUDA
#include "kernels/cuda_backend.h"
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
    return make_cuda_backend(0);
#else
    throw Error("--backend", "cuda", "a build with the CUDA backend (this one has cpu only)");
#endif
  }
  throw Error("--backend", "backend", "cpu or cuda", common.backend);
}

std::shared_ptr<const Model> load_model(const CommonOptions& common, const std::string& model_dir) {
  return Model::load(model_dir, common.predictor);
}

}  // namespace kvlens::session
