// End to end on the GPU: every Hugging Face parity fixture decoded by DecoderSession on the CUDA
// backend gives the CPU backend's logits, scores and greedy continuation.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/common/mapped_file.h"
#include "engine/runtime/scoring.h"
#include "kernels/cuda_backend.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

TEST_CASE("cuda session matches the cpu session on every parity fixture", "[cuda]") {
  for (const char* name : {"llama-gqa-f32", "llama-mha-headdim-tied-llama3-f32",
                           "mistral-window-bf16", "llama-linear-f16"}) {
    INFO("fixture " << name);
    const std::string dir = test::source_path(std::string("tests/fixtures/") + name);
    const auto reference = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
    const std::vector<int32_t> tokens = reference["tokens"].get<std::vector<int32_t>>();
    const auto model = Model::load(dir);
    auto cpu = make_cpu_backend(2);
    auto gpu = make_cuda_backend(0);
    const auto on_cpu = BackendModel::upload(model, *cpu);
    const auto on_gpu = BackendModel::upload(model, *gpu);

    DecoderSession cpu_session(on_cpu), gpu_session(on_gpu);
    std::vector<float> cpu_logits, gpu_logits;
    for (const int32_t t : tokens) {
      cpu_logits = cpu_session.step(t);
      gpu_logits = gpu_session.step(t);
    }
    // Both compute in F32 from the same widened weights; only summation order differs
    // (cuBLAS vs the CPU's blocked dot products), so 1e-4 of the logit scale is generous.
    double scale = 1.0, worst = 0.0;
    for (size_t i = 0; i < cpu_logits.size(); ++i) {
      scale = std::max(scale, double(std::fabs(cpu_logits[i])));
      worst = std::max(worst, double(std::fabs(cpu_logits[i] - gpu_logits[i])));
    }
    CHECK(worst <= 1e-4 * scale);

    const ScoreResult cpu_score = score_tokens(on_cpu, tokens);
    const ScoreResult gpu_score = score_tokens(on_gpu, tokens);
    CHECK(gpu_score.argmax == cpu_score.argmax);
    CHECK(gpu_score.ppl == Approx(cpu_score.ppl).epsilon(1e-4));

    GenerateOptions options;
    options.max_new = 16;
    options.stop_at_eos = false;
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 12);
    CHECK(generate_greedy(on_gpu, prompt, options) == generate_greedy(on_cpu, prompt, options));
  }
}
