// Shared kvlens-cli helpers: the common flags (CLI11) and the progress bar.
#include "app/cli/cli_common.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <utility>

#include "engine/session/memory_estimate.h"

namespace kvlens::cli {
namespace {
double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}
}  // namespace

void add_predictor_option(CLI::App& command, CommonOptions& common) {
  command.add_option("--predictor", common.predictor,
                     "TokenButler predictor.safetensors (predictor.json beside it) instead of the "
                     "model folder's own");
}

void check_cpu_memory(const CommonOptions& common, const Model& model, int64_t tokens, int64_t runs,
                      bool policies, const std::string& what) {
  if (common.backend != "cpu") return;
  require_memory(estimate_memory(model).cpu_session_bytes(tokens, runs, policies),
                 available_memory_bytes(), what);
}

void add_common_options(CLI::App& command, CommonOptions& common) {
  command.add_option("--backend", common.backend, "Compute backend: cpu or cuda")
      ->capture_default_str();
  command.add_option("--threads", common.threads, "CPU threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  command
      .add_option("--cpu-kernels", common.cpu_kernels,
                  "CPU kernel set: auto (the fastest this CPU has), avx2 (no AVX-512) or generic "
                  "(portable); auto and avx2 give the same bits, generic (attention without "
                  "fused multiply-adds) differs in the last bits")
      ->check(CLI::IsMember({"auto", "avx2", "generic"}))
      ->capture_default_str();
  command
      .add_option("--dtype", common.dtype,
                  "Weights as stored (auto) or converted on load, as torch's .to(dtype): f32 or "
                  "bf16 (rounded to nearest even)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
  command
      .add_option("--kv-dtype", common.kv_dtype,
                  "KV cache dtype: auto (the weights' dtype on cuda, f32 on cpu), f32, bf16 or "
                  "f16 (bf16 and f16 on cuda only)")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16"}))
      ->capture_default_str();
  command.add_flag("--progress", common.progress, "Show a progress bar on stderr");
}

void add_tensor_parallel_options(CLI::App& command, CommonOptions& common) {
  auto* gpus = command.add_option(
      "--gpus", common.gpus,
      "Split the model over GPUs 0..N-1 (tensor parallelism as Megatron-LM splits: heads and MLP "
      "columns; each GPU holds its heads' KV cache; NCCL all-reduces)");
  gpus->check(CLI::PositiveNumber);
  command
      .add_option("--devices", common.devices,
                  "Split the model over these GPUs, e.g. 0,1 or 2,3 (instead of --gpus)")
      ->excludes(gpus);
}

void add_plugin_option(CLI::App& command, CommonOptions& common) {
  command.add_option("--plugin", common.plugins,
                     "A policy plug-in (shared library against include/kvlens/policy_plugin.h) "
                     "to load before the policies are read (repeatable); the folders in "
                     "$KVLENS_PLUGIN_PATH and ~/.local/share/kvlens/plugins are loaded too");
  command.add_option("--policy-file", common.policy_files,
                     "A Python file whose kvlens.Policy classes are registered as policies "
                     "(repeatable; embedded CPython)");
}

void add_policy_options(CLI::App& command, PolicyOptions& options) {
  command.add_option("--policy", options.policy, "Token-selection policy id")
      ->capture_default_str();
  command.add_option("--sparsity", options.sparsity, "Fraction of cached tokens hidden, in [0,1)")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  command.add_option("--policy-arg", options.policy_args,
                     "Policy parameter key=value (repeatable)");
}

ProgressBar::ProgressBar(bool enabled, std::string label, std::string unit)
    : enabled_(enabled),
      label_(std::move(label)),
      unit_(std::move(unit)),
      start_seconds_(now_seconds()) {}

ProgressBar::~ProgressBar() {
  if (enabled_ && drawn_ && ::isatty(STDERR_FILENO)) std::fputc('\n', stderr);
}

void ProgressBar::update(int64_t done, int64_t total) {
  if (!enabled_ || total <= 0) return;
  const double now = now_seconds();
  // Redraw at most ten times a second on a terminal; into a log file (no carriage returns
  // there) one line every two seconds. Always draw the end.
  const bool terminal = ::isatty(STDERR_FILENO) != 0;
  const double interval = terminal ? 0.1 : 2.0;
  if (done < total && last_draw_seconds_ >= 0 && now - last_draw_seconds_ < interval) return;
  last_draw_seconds_ = now;
  constexpr int kWidth = 30;
  const double fraction = double(done) / double(total);
  const int filled = int(fraction * kWidth);
  char bar[kWidth + 1];
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
  bar[kWidth] = '\0';
  const double elapsed = now - start_seconds_;
  const double rate = elapsed > 0 ? double(done) / elapsed : 0.0;
  std::fprintf(stderr, "%s%s [%s] %lld/%lld  %.1f %s/s%s", terminal ? "\r" : "", label_.c_str(),
               bar, (long long)done, (long long)total, rate, unit_.c_str(), terminal ? "" : "\n");
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace kvlens::cli
