// kvlens-cli bench --attention-cost (see bench_attention_cost.h). Shapes: q [1, H, D] F32;
// logits [H, stride] F32; a run's visible masks U8 [H, stride]; caches [G, capacity, D].
#include "app/cli/bench_attention_cost.h"

#include "engine/backend/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <random>
#include <span>

#include "engine/model/config.h"

namespace kvlens::cli {
namespace {

// The median over `repeats` of one call of `step`, each after an untimed one and timed between
// two synchronizations.
double timed(Backend& backend, int repeats, const std::function<void()>& step) {
  step();
  std::vector<double> seconds;
  for (int i = 0; i < repeats; ++i) {
    backend.synchronize();
    const auto start = std::chrono::steady_clock::now();
    step();
    backend.synchronize();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median_of(seconds);
}

}  // namespace

std::vector<AttentionCost> measure_attention_cost(const DecoderSession& session, Backend& backend,
                                                  int repeats) {
  std::vector<AttentionCost> costs;
  const ModelConfig& config = session.model().config();
  const int64_t H = config.num_heads, G = config.num_kv_heads, D = config.head_dim,
                L = config.num_layers;
  const int64_t cols = session.position(), position = cols - 1;
  if (cols < 1 || repeats < 1) return costs;
  // The query's values do not change the work; a fixed draw keeps the softmax ordinary.
  std::vector<float> q_values(size_t(H * D));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> draw(-1.0f, 1.0f);
  for (float& v : q_values) v = draw(rng);
  DeviceTensor q = backend.alloc(DType::F32, {1, H, D});
  backend.from_host(q, q_values.data(), q_values.size() * sizeof(float));
  DeviceTensor out = backend.alloc(DType::F32, {1, H, D});
  const int64_t stride = session.policy_shape().stride;
  DeviceTensor logits = backend.alloc(DType::F32, {H, stride});

  for (int64_t r = 0; r < session.runs(); ++r) {
    const SessionRun& run = session.run(r);
    if (!run.policy || run.decisions.size() != size_t(L)) continue;
    AttentionCost cost;
    cost.run = r;
    int64_t visible = 0, attended = 0, read = 0, keys = 0;
    std::vector<uint8_t> mask_host;
    for (int64_t l = 0; l < L; ++l) {
      if (run.decisions[size_t(l)] != LayerDecision::Masked) continue;
      ++cost.masked_layers;
      const DeviceTensor& mask = run.visible[size_t(l)];
      mask_host.resize(size_t(mask.numel()));
      backend.to_host(mask, mask_host.data(), mask_host.size());
      const int64_t window = config.layer_window(l);
      const int64_t first = window > 0 ? std::max<int64_t>(0, cols - window) : 0;
      const int64_t group = H / G;
      for (int64_t g = 0; g < G; ++g) {
        for (int64_t j = first; j < cols; ++j) {
          int64_t seeing = 0;  // the group's heads that see key j
          for (int64_t h = g * group; h < (g + 1) * group; ++h)
            seeing += mask_host[size_t(h * mask.dim(1) + j)] != 0;
          visible += seeing;
          read += seeing > 0;
        }
      }
      attended += H * (cols - first);
      keys += G * (cols - first);
    }
    cost.kept_share = attended > 0 ? double(visible) / double(attended) : 1.0;
    cost.read_share = keys > 0 ? double(read) / double(keys) : 1.0;
    for (int64_t l = 0; l < L && size_t(l) < run.fused_attention.size(); ++l)
      cost.fused_layers += run.fused_attention[size_t(l)];
    cost.masked_seconds = timed(backend, repeats, [&] {
      for (int64_t l = 0; l < L; ++l) {
        const LayerDecision decision = run.decisions[size_t(l)];
        if (decision == LayerDecision::Skipped) continue;
        const int64_t window = config.layer_window(l);
        const DeviceTensor* mask =
            decision == LayerDecision::Masked ? &run.visible[size_t(l)] : nullptr;
        // The session's call for this layer: one fused call, or logits then softmax.
        if (size_t(l) < run.fused_attention.size() && run.fused_attention[size_t(l)]) {
          const Backend::RunAttention call{.q = &q,
                                           .k_cache = &run.k_cache[size_t(l)],
                                           .v_cache = &run.v_cache[size_t(l)],
                                           .logits = &logits,
                                           .visible = mask,
                                           .out = &out};
          backend.attention_masked_runs(std::span(&call, 1), 0, position, window);
        } else {
          backend.attention_logits(q, run.k_cache[size_t(l)], position, window, logits);
          backend.attention_visible(logits, cols, mask, run.v_cache[size_t(l)], out, nullptr);
        }
      }
    });
    cost.dense_seconds = timed(backend, repeats, [&] {
      for (int64_t l = 0; l < L; ++l)
        backend.attention(q, run.k_cache[size_t(l)], run.v_cache[size_t(l)], position,
                          config.layer_window(l), Visibility{}, out, nullptr);
    });
    costs.push_back(cost);
  }
  return costs;
}

}  // namespace kvlens::cli
