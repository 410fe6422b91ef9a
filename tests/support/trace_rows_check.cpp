// The by-hand reference of trace_rows_check.h: blocking to_host reads after every forward.
#include "tests/support/trace_rows_check.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "engine/policy/registry.h"

namespace kvlens::test {
namespace {

// Bitwise equality (NaN scores of unranked layers compare equal to themselves).
bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0;
}

}  // namespace

int64_t check_trace_rows_match_session(const std::shared_ptr<const BackendModel>& model,
                                       const std::vector<int32_t>& tokens,
                                       const std::vector<PolicyConfig>& policies) {
  REQUIRE(!policies.empty());
  REQUIRE(policies.front().id == "dense");
  TraceRecorder recorder(model, nullptr, tokens, policies);
  SessionOptions options;
  options.record_attention_logits = true;
  DecoderSession session(model, options, int64_t(policies.size()));
  Backend& backend = *model->backend;
  for (size_t r = 0; r < policies.size(); ++r) {
    if (policies[r].id == "dense") continue;
    session.set_policy(int64_t(r), make_policy(policies[r], session.policy_shape(), backend));
  }
  const ModelConfig& c = model->config();
  const int64_t L = c.num_layers, H = c.num_heads;
  int64_t steps = 0;
  while (recorder.step()) {
    const int64_t t = steps++;
    const int64_t cols = t + 1;
    session.forward(std::span<const int32_t>(&tokens[size_t(t)], 1));
    const auto& step = recorder.trace().steps()[size_t(t)];
    for (size_t r = 0; r < policies.size(); ++r) {
      INFO("step " << t << ", run " << r << " (" << policies[r].id << ")");
      const SessionRun& run = session.run(int64_t(r));
      const StepRecord& record = step[r];
      REQUIRE(record.columns == cols);
      REQUIRE(record.logits.size() == size_t(L * H * cols));
      const bool policy_step = run.policy != nullptr;
      std::vector<float> rows, scores(size_t(H * cols));
      std::vector<uint8_t> masks(size_t(H * cols));
      for (int64_t l = 0; l < L; ++l) {
        INFO("layer " << l);
        const DeviceTensor& logits = run.attention_logits[size_t(l)];
        const int64_t stride = logits.dim(2);
        rows.resize(size_t(H * stride));
        backend.to_host(logits, rows.data(), rows.size() * sizeof(float));
        for (int64_t h = 0; h < H; ++h)
          CHECK(
              same_bits(record.logits.data() + (l * H + h) * cols, rows.data() + h * stride, cols));
        const LayerDecision decision =
            policy_step ? run.decisions[size_t(l)] : LayerDecision::Dense;
        CHECK(record.decisions[size_t(l)] == decision);
        if (decision == LayerDecision::Dense) continue;
        const int64_t policy_stride = run.scores[size_t(l)].dim(1);
        std::vector<float> wide_scores(size_t(H * policy_stride));
        backend.to_host(run.scores[size_t(l)], wide_scores.data(),
                        wide_scores.size() * sizeof(float));
        std::vector<uint8_t> wide_masks(size_t(H * policy_stride));
        backend.to_host(run.visible[size_t(l)], wide_masks.data(), wide_masks.size());
        for (int64_t h = 0; h < H; ++h) {
          const size_t at = size_t((l * H + h) * cols);
          CHECK(same_bits(record.scores.data() + at, wide_scores.data() + h * policy_stride, cols));
          if (decision != LayerDecision::Masked) continue;
          for (int64_t j = 0; j < cols; ++j)
            CHECK(record.visible[at + size_t(j)] ==
                  (wide_masks[size_t(h * policy_stride + j)] != 0));
        }
      }
    }
  }
  CHECK(steps == int64_t(tokens.size()));
  return steps;
}

}  // namespace kvlens::test
