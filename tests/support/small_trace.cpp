// make_small_trace (small_trace.h).
#include "tests/support/small_trace.h"

#include <cmath>
#include <limits>

namespace kvlens::test {

Trace make_small_trace(int64_t steps) {
  Trace trace;
  trace.model = {"small", kSmallLayers, kSmallHeads, 1, 4, 50};
  trace.coref = {true, 0, 0, "Ann", 4, 6};
  trace.tokens = {{1, "<s>"}, {11, " The"}, {12, " key"}, {13, " is"}, {14, " A"}, {15, "nn"}};
  // (h2o's default knobs: the run is titled "h2o s=0.5", as views name a run by its non-default
  // knobs)
  trace.runs = {{"dense", 0.0, {}, 0}, {"h2o", 0.5, {"sinks=4"}, 0}};
  trace.top_k = 2;
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<StepRecord> records;
    for (int run = 0; run < 2; ++run) {
      StepRecord r;
      r.columns = t + 1;
      r.decisions = {LayerDecision::Dense, run == 0 ? LayerDecision::Dense : LayerDecision::Masked};
      for (int32_t h = 0; h < kSmallLayers * kSmallHeads; ++h) {
        r.kept_heads.push_back(h);
        int32_t count = 0;
        for (int64_t c = 0; c <= t; ++c) {
          const float logit = 0.5f * float(c) * float(h + 1) - float(run) * float(c) * 0.25f;
          r.logits.push_back(h == 3 && c == 0 ? -inf : logit);
          const bool masked = run == 1 && h >= kSmallHeads;
          r.scores.push_back(masked ? logit / 2 + float(run)
                                    : std::numeric_limits<float>::quiet_NaN());
          const uint8_t seen = !masked || (c + h) % 2 == 0 || c == t;
          r.visible.push_back(seen);
          count += seen;
        }
        r.visible_counts.push_back(count);
      }
      r.top.ids = {int32_t(11 + (t + 1) % 5), 1};
      r.top.log_probs = {-0.1f, -2.5f - float(run)};
      r.argmax = r.top.ids[0];
      r.metrics.nll = 0.5 + 0.1 * double(t) + 0.2 * run;
      r.metrics.true_rank = run;
      r.metrics.dense_true_rank = 0;
      r.metrics.kl_vs_dense = run == 0 ? 0.0 : 0.05 * double(t);
      r.columns = t + 1;
      records.push_back(std::move(r));
    }
    trace.add_step(std::move(records));
  }
  return trace;
}

}  // namespace kvlens::test
