// Policy plug-ins on the GPU: the example C plug-ins (host memory: kvlens copies their inputs
// and answers across) and the CUDA h2o plug-in (device memory, its own kernels on the session's
// stream) give the built-ins' visible sets, scores and logits bit for bit, in lockstep with them,
// over co-reference samples on the demo model; a device-only plug-in on the CPU is an error.
#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/common/error.h"
#include "engine/eval/coref_benchmark.h"
#include "engine/eval/coref_pools.h"
#include "engine/policy/plugin_policy.h"
#include "engine/policy/registry.h"
#include "engine/session/decoder_session.h"
#include "engine/session/scoring.h"
#include "kernels/cuda_backend.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

namespace {

std::string plugin_file(const std::string& name) {
  return std::string(KVLENS_EXAMPLE_PLUGIN_DIR) + "/libkvlens_" + name + ".so";
}

template <typename T>
std::vector<T> host_copy(Backend& backend, const DeviceTensor& tensor) {
  std::vector<T> host(size_t(tensor.numel()));
  backend.to_host(tensor, host.data(), host.size() * sizeof(T));
  return host;
}

}  // namespace

TEST_CASE("cuda plug-ins give the built-ins' visible sets, scores and logits", "[cuda]") {
  for (const char* name : {"h2o_c", "quest_c", "tokenbutler_c", "h2o_cuda"})
    load_policy_plugin(plugin_file(name));
  auto gpu = make_cuda_backend(0);
  const auto model = Model::load(test::source_path("assets/models/demo"));
  const auto resident = upload_model(model, *gpu);
  REQUIRE(resident->predictor);
  const CorefPools pools = load_bundled_coref_pools();
  const ModelConfig& c = resident->config();
  const std::vector<std::pair<std::string, std::string>> pairs = {{"h2o", "h2o_c"},
                                                                  {"quest", "quest_c"},
                                                                  {"tokenbutler", "tokenbutler_c"},
                                                                  {"h2o", "h2o_cuda"}};
  for (const std::vector<std::string>& knobs :
       {std::vector<std::string>{}, std::vector<std::string>{"granularity=kv_head"}}) {
    std::vector<PolicyConfig> policies;
    for (const auto& [builtin, plugin] : pairs) {
      policies.push_back({builtin, 0.6, knobs});
      policies.push_back({plugin, 0.6, knobs});
    }
    for (int64_t index = 0; index < 2; ++index) {
      const CorefSample sample = generate_coref_sample(pools, 11, index, false);
      const CorefTokens marked = mark_answer_tokens(sample, *model->tokenizer);
      DecoderSession session(resident, {}, int64_t(policies.size()));
      for (size_t r = 0; r < policies.size(); ++r)
        session.set_policy(int64_t(r), make_run_policy(policies[r], session.policy_shape(), *gpu));
      int64_t masked = 0;
      for (const int32_t token : marked.tokens) {
        const std::vector<float> logits =
            host_copy<float>(*gpu, session.forward(std::span<const int32_t>(&token, 1)));
        const int64_t cols = session.position(), vocab = c.vocab_size;
        for (size_t r = 0; r < policies.size(); r += 2) {
          INFO(policies[r].id << " / " << policies[r + 1].id << " sample " << index << " step "
                              << cols - 1 << (knobs.empty() ? "" : " kv_head"));
          const SessionRun& a = session.run(int64_t(r));
          const SessionRun& b = session.run(int64_t(r + 1));
          REQUIRE(a.decisions == b.decisions);
          for (int64_t l = 0; l < c.num_layers; ++l) {
            if (a.decisions[size_t(l)] != LayerDecision::Masked) continue;
            ++masked;
            const int64_t stride = a.visible[size_t(l)].dim(1);
            const auto va = host_copy<uint8_t>(*gpu, a.visible[size_t(l)]);
            const auto vb = host_copy<uint8_t>(*gpu, b.visible[size_t(l)]);
            const auto sa = host_copy<float>(*gpu, a.scores[size_t(l)]);
            const auto sb = host_copy<float>(*gpu, b.scores[size_t(l)]);
            for (int64_t h = 0; h < c.num_heads; ++h) {
              INFO("layer " << l << " head " << h);
              REQUIRE(std::memcmp(va.data() + h * stride, vb.data() + h * stride, size_t(cols)) ==
                      0);
              REQUIRE(std::memcmp(sa.data() + h * stride, sb.data() + h * stride,
                                  size_t(cols) * sizeof(float)) == 0);
            }
          }
          REQUIRE(std::memcmp(logits.data() + int64_t(r) * vocab,
                              logits.data() + int64_t(r + 1) * vocab,
                              size_t(vocab) * sizeof(float)) == 0);
        }
      }
      CHECK(masked > 0);
    }
  }
}

TEST_CASE("a device-only plug-in on a cpu session is an error naming it", "[cuda]") {
  load_policy_plugin(plugin_file("h2o_cuda"));
  auto cpu = make_cpu_backend(1);
  const auto resident = upload_model(Model::load(test::source_path("assets/models/demo")), *cpu);
  DecoderSession session(resident);
  CHECK_THROWS_WITH(make_run_policy({"h2o_cuda", 0.5, {}}, session.policy_shape(), *cpu),
                    Catch::Contains("h2o_cuda") && Catch::Contains("device memory only"));
}
