// The options both front ends open a model and a backend with (app/session/: the session set-up
// kvlens-cli and the desktop app share; kvlens-cli's flags fill them in app/cli/cli_common.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/model.h"
#include "engine/session/decoder_session.h"

namespace kvlens::session {

struct CommonOptions {
  std::string backend = "cpu";  // cpu | cuda
  int threads = 0;              // 0 = all cores
  // CPU kernel set: auto (the fastest the CPU has), avx2 (no AVX-512) or generic (portable
  // loops); auto and avx2 give the same bits, generic differs in the attention's last bits.
  std::string cpu_kernels = "auto";
  bool progress = false;  // progress bar on stderr (kvlens-cli's --progress)
  // --predictor: a predictor.safetensors (predictor.json beside it) overriding the model
  // folder's own TokenButler predictor (commands that open a model).
  std::string predictor;
  // Weights as stored (auto) or converted on load (f32, bf16: torch's .to(dtype)), and the KV
  // cache's dtype: auto (the weights' dtype on the GPU, F32 on the CPU), f32, bf16 or f16.
  std::string dtype = "auto";
  std::string kv_dtype = "auto";
  // --plugin: policy plug-ins (shared libraries, include/kvlens/policy_plugin.h) to register
  // before the command runs, besides those of the plug-in folders (load_plugins).
  std::vector<std::string> plugins;
  // --policy-file: Python files whose kvlens.Policy subclasses are registered before the command
  // runs (app/session/python_policies.h).
  std::vector<std::string> policy_files;
  // --gpus N / --devices LIST: one model split over several GPUs (tensor parallelism,
  // engine/arch/tensor_parallel.h; on the CPU backend as many CPU ranks, a check of the split).
  int64_t gpus = 0;
  std::string devices;
  bool tensor_parallel() const { return gpus > 1 || !devices.empty(); }
};

// Backend by name; throws kvlens::Error when it is not available in this build or machine.
std::unique_ptr<Backend> make_backend(const CommonOptions& common);

// The GPUs a command runs on: `devices` (--devices: comma-separated indices, each once) as given,
// else 0 .. gpus - 1 (--gpus), else GPU 0. Throws kvlens::Error naming `command` and the flag.
std::vector<int> chosen_devices(const std::string& command, int64_t gpus,
                                const std::string& devices);

// One backend per entry of `devices`: a plain backend (on that GPU) for one entry, else a
// tensor-parallel group, rank r on devices[r] (cuda: its all-reduces through NCCL; cpu: as many
// CPU ranks, each with --threads / ranks threads, a check of the split where there is no GPU).
std::vector<std::unique_ptr<Backend>> make_backend_group(const CommonOptions& common,
                                                         std::span<const int> devices);

// Before any upload: on the CUDA backend, the model at --dtype with `runs` runs' caches of
// `tokens` positions, split over `devices` (one: whole), must fit each of those GPUs (a tenth kept
// for the runtime); otherwise a kvlens::Error naming the model, the GPUs' memory and the fewest
// GPUs that would hold it (MemoryEstimate::cuda_bytes_per_gpu, gpus_needed_split). Other
// backends pass.
void require_gpus_hold(const CommonOptions& common, const Model& model,
                       std::span<const int> devices, int64_t tokens, int64_t runs);
// The factor --dtype scales the checkpoint's weights by on the GPU (1 as stored).
double weight_scale(const CommonOptions& common, const Model& model);

// --dtype and --kv-dtype as upload_model takes them.
UploadOptions upload_options(const CommonOptions& common);

// Registers the plug-ins of the folders searched at start (default_plugin_folders: a bad file
// there is a line in `warnings`, and is skipped), then `common.plugins` (a bad one throws
// kvlens::Error naming the file). Idempotent: a plug-in loaded twice is registered once.
void load_plugins(const CommonOptions& common, std::vector<std::string>& warnings);

// Model::load with the --predictor override.
std::shared_ptr<const Model> load_model(const CommonOptions& common, const std::string& model_dir);

}  // namespace kvlens::session
