// The heads grid's retrieval marks (DuoAttention): full_heads_at on a hand-made trace (a masked
// layer with one head seeing everything, a dense layer, a masked layer where every head saw
// everything), and the grid's "R" chips, legend and hover text with the recorded gate.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "engine/trace/trace_queries.h"
#include "viz/views.h"

using namespace kvlens;
using namespace kvlens::viz;

namespace {

// 3 layers x 2 heads, one duoattention run over 6 steps. At every step: layer 0 masked, head 0
// sees every token with scores all 0.93 (a retrieval head and its gate), head 1 the first and
// the last token with scores 0.2; layer 1 dense; layer 2 masked with both heads seeing all (a
// layer of retrieval heads only: DuoAttention picks its retrieval heads over the whole model).
Trace duo_trace() {
  const int64_t layers = 3, heads = 2;
  Trace trace;
  trace.model = {"duo", layers, heads, 1, 4, 0};
  trace.runs.push_back({"duoattention", 0.5, {}, 0});
  for (int64_t t = 0; t < 6; ++t)
    trace.tokens.push_back({int32_t(t), std::string("w").append(std::to_string(t))});
  for (int64_t t = 0; t < 6; ++t) {
    StepRecord r;
    r.columns = t + 1;
    r.decisions = {LayerDecision::Masked, LayerDecision::Dense, LayerDecision::Masked};
    for (int32_t i = 0; i < layers * heads; ++i) {
      r.kept_heads.push_back(i);
      const bool streaming = i == 1;
      int32_t count = 0;
      for (int64_t c = 0; c <= t; ++c) {
        r.logits.push_back(float(c));
        r.scores.push_back(i == 0 ? 0.93f : 0.2f);
        const uint8_t seen = !streaming || c == 0 || c == t;
        r.visible.push_back(seen);
        count += seen;
      }
      r.visible_counts.push_back(count);
    }
    trace.add_step({r});
  }
  return trace;
}

}  // namespace

TEST_CASE("full_heads_at marks the heads of masked layers that saw everything while others did not",
          "[viz][duo]") {
  const Trace trace = duo_trace();
  const FullHeads marks = full_heads_at(trace, 0, 5);
  // Layer 2's heads count too although no head of that layer was limited (the round-7 demo
  // model has such a layer at 50%; a per-layer rule left its retrieval heads unmarked).
  CHECK(marks.full == std::vector<uint8_t>{1, 0, 0, 0, 1, 1});
  CHECK(marks.score[0] == Approx(0.93f));
  for (size_t i = 1; i < 4; ++i) CHECK(std::isnan(marks.score[i]));
  CHECK(marks.score[4] == Approx(0.2f));  // one score over every candidate: recorded as its gate
  // At step 1 head 1 still sees both tokens: nobody is limited, nothing is marked.
  CHECK(full_heads_at(trace, 0, 1).full == std::vector<uint8_t>(6, 0));
}

TEST_CASE("the heads grid marks retrieval heads with an R, a legend and the gate on hover",
          "[viz][duo]") {
  const Trace trace = duo_trace();
  for (const bool dark : {false, true}) {
    ViewOptions options;
    options.runs = {0};
    options.width = 1280;
    options.height = 720;
    options.dark = dark;
    const View view = build_view(trace, ViewKind::Heads, options);
    int64_t chips = 0;
    bool legend = false;
    for (const Item& item : view.figure.items) {
      const auto* text = std::get_if<TextItem>(&item);
      if (!text) continue;
      if (text->text == "R") {
        ++chips;
        CHECK(text->background.a == 255);  // a chip, legible over any map colour
      }
      legend = legend || text->text.find("R: a retrieval head") != std::string::npos;
    }
    CHECK(chips == 3);
    CHECK(legend);
    std::string retrieval, streaming;
    for (const HoverGrid& g : view.figure.hover) {
      if (g.id == "head 0:0:0" && g.rows > 1) retrieval = g.describe(5, 2);
      if (g.id == "head 0:0:1" && g.rows > 1) streaming = g.describe(5, 2);
    }
    CHECK(retrieval.find("retrieval head: saw every cached token (gate 0.93)") !=
          std::string::npos);
    CHECK(streaming.find("retrieval head") == std::string::npos);
  }
}
