// Shared kvlens-cli helpers: backend selection, common flags, token lists, the progress bar.
#include "app/cli/cli_common.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <utility>

#include "engine/common/error.h"
#include "engine/runtime/cpu/cpu_backend.h"
#if KVLENS_HAVE_CUDA
#include "kernels/cuda_backend.h"
#endif

namespace kvlens::cli {
namespace {
double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}
}  // namespace

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

void add_predictor_option(CLI::App& command, CommonOptions& common) {
  command.add_option("--predictor", common.predictor,
                     "TokenButler predictor.safetensors (predictor.json beside it) instead of the "
                     "model folder's own");
}

std::shared_ptr<const Model> load_model(const CommonOptions& common, const std::string& model_dir) {
  return Model::load(model_dir, common.predictor);
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
  command.add_flag("--progress", common.progress, "Show a progress bar on stderr");
}

std::vector<int32_t> parse_token_list(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  for (const std::string& item : split_comma_list(text)) {
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos ||
        item.size() > 10 || std::stoll(item) > INT32_MAX) {
      throw Error(flag, "token list", "comma-separated non-negative token ids like 1,2,3",
                  "'" + item + "'");
    }
    ids.push_back(int32_t(std::stoll(item)));
  }
  return ids;
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

AtomicOutputFile::AtomicOutputFile(std::string path, std::string flag)
    : path_(std::move(path)), flag_(std::move(flag)), partial_(path_ + ".partial") {
  out_.open(partial_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error(path_, flag_, "a writable file");
}

AtomicOutputFile::~AtomicOutputFile() {
  if (committed_) return;
  out_.close();
  std::remove(partial_.c_str());
}

void AtomicOutputFile::commit() {
  out_.close();
  if (!out_) throw Error(path_, flag_, "a file the output could be written to");
  if (std::rename(partial_.c_str(), path_.c_str()) != 0) {
    throw Error(path_, flag_, "a path the output could be moved to");
  }
  committed_ = true;
}

}  // namespace kvlens::cli
