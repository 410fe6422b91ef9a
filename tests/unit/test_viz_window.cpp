// Sliding windows in the trace queries and the views: keys before a local layer's window (true
// logit -inf) are kOutsideWindow in head rows and maps, drawn in their own style (not the policy's
// hatch, not blank) with a legend entry in the heads, predicted and retention views, and left out
// of the retention fractions' denominators. Trace: 2 layers x 2 heads, layer 0 with a window of
// 4, layer 1 global; the policy hides the odd columns before the step.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "viz/layout.h"
#include "viz/views.h"

using namespace kvlens;
using namespace kvlens::viz;

namespace {

constexpr int64_t kWindow = 4, kLayers = 2, kHeads = 2;

Trace windowed_trace(int64_t steps) {
  Trace trace;
  trace.model = {"windowed", kLayers, kHeads, 1, 4, 0};
  trace.runs.push_back({"h2o", 0.5, {}, 0});
  for (int64_t t = 0; t < steps; ++t)
    trace.tokens.push_back({int32_t(t), "tok" + std::to_string(t)});
  for (int64_t t = 0; t < steps; ++t) {
    StepRecord r;
    r.columns = t + 1;
    r.decisions.assign(size_t(kLayers), LayerDecision::Masked);
    for (int32_t i = 0; i < kLayers * kHeads; ++i) {
      const bool local = i / kHeads == 0;
      r.kept_heads.push_back(i);
      int32_t count = 0;
      for (int64_t c = 0; c <= t; ++c) {
        const bool outside = local && c <= t - kWindow;
        r.logits.push_back(outside ? -std::numeric_limits<float>::infinity() : float(c));
        r.scores.push_back(float(c));  // a policy may keep scores for keys it cannot choose
        const uint8_t seen = !outside && (c % 2 == 0 || c == t);
        r.visible.push_back(seen);
        count += seen;
      }
      r.visible_counts.push_back(count);
    }
    std::vector<StepRecord> records;
    records.push_back(std::move(r));
    trace.add_step(std::move(records));
  }
  return trace;
}

bool has_text(const Figure& figure, const std::string& part) {
  for (const Item& item : figure.items) {
    if (const auto* t = std::get_if<TextItem>(&item); t && t->text.find(part) != std::string::npos)
      return true;
  }
  return false;
}

bool same(Color a, Color b) {
  return a.r == b.r && a.g == b.g && a.b == b.b && a.a == b.a;
}

}  // namespace

TEST_CASE("head rows and maps mark the keys before a sliding window", "[viz][window]") {
  const Trace trace = windowed_trace(10);
  const HeadRow local = head_row_at(trace, 0, 9, 0, 1, HeadQuantity::Probabilities);
  REQUIRE(local.kept);
  for (int64_t j = 0; j <= 9; ++j) {
    INFO("token " << j);
    if (j <= 9 - kWindow) {
      CHECK(local.visible[size_t(j)] == kOutsideWindow);
      CHECK(std::isnan(local.values[size_t(j)]));
    } else {
      CHECK(local.visible[size_t(j)] == uint8_t(j % 2 == 0 || j == 9));
    }
  }
  const HeadRow global = head_row_at(trace, 0, 9, 1, 0, HeadQuantity::Probabilities);
  CHECK(std::count(global.visible.begin(), global.visible.end(), kOutsideWindow) == 0);

  // Unpooled: step 9's row as head_row_at gives it. Pooled 2 x 2: a block is outside the window
  // only where every known cell is, hidden where a hidden cell shares it with outside ones and
  // none was seen, seen where any was.
  const HeadMatrix m = head_matrix(trace, 0, 0, 1, HeadQuantity::Probabilities, 9);
  for (int64_t j = 0; j <= 9; ++j)
    CHECK(m.visible[size_t(9 * m.cols + j)] == local.visible[size_t(j)]);
  const HeadMatrix pooled = head_matrix(trace, 0, 0, 1, HeadQuantity::Probabilities, 9, 5);
  REQUIRE(pooled.block == 2);
  const auto cell = [&](int64_t steps_cell, int64_t tokens_cell) {
    return pooled.visible[size_t(steps_cell * pooled.cols + tokens_cell)];
  };
  CHECK(cell(4, 0) == kOutsideWindow);  // steps 8-9 x tokens 0-1: all outside
  CHECK(cell(4, 2) == 0);               // tokens 4-5: 5 hidden at step 8, the rest outside
  CHECK(cell(4, 3) == 1);               // tokens 6-7: 6 seen
  CHECK(has_keys_outside_window(trace, 9));
  CHECK_FALSE(has_keys_outside_window(trace, kWindow - 1));  // nothing has slid out yet
}

TEST_CASE("a heatmap draws cells outside the window in their own style", "[viz][window]") {
  const Theme& theme = light_theme();
  // One row: seen 1.0, hidden 2.0, outside (NaN, as its probability is), outside with a value.
  const std::vector<float> values = {1.0f, 2.0f, std::numeric_limits<float>::quiet_NaN(), 3.0f};
  const std::vector<uint8_t> visible = {1, 0, kOutsideWindow, kOutsideWindow};
  const ImageItem image =
      heatmap({0, 0, 4, 1}, values, &visible, 1, 4, ValueScale{0.0, 3.0, false},
              sequential_colormap(), theme, 16, kDotPeriod);  // 3 x 3 pixels a cell
  const int32_t w = image.width;
  REQUIRE(w == 4 * kDotPeriod);
  const OutsideStyle outside = outside_window_style(theme);
  const HiddenStyle hidden = hidden_style(theme);
  auto pixel = [&](int32_t x, int32_t y) { return image.pixels[size_t(y * w + x)]; };
  for (const int32_t cell : {2, 3}) {
    INFO("cell " << cell);
    const int32_t x0 = cell * int32_t(kDotPeriod);
    CHECK(same(pixel(x0, 0), outside.dot));  // the dot grid starts at each period's corner
    CHECK(same(pixel(x0 + 1, 0), outside.fill));
    CHECK(same(pixel(x0 + 1, 1), outside.fill));
  }
  // The hidden cell is hatched, the seen one coloured: neither looks like the window's cells.
  for (int32_t x = int32_t(kDotPeriod); x < 2 * int32_t(kDotPeriod); ++x) {
    CHECK((same(pixel(x, 0), hidden.fill) || same(pixel(x, 0), hidden.stripe)));
    CHECK_FALSE(same(pixel(x, 0), outside.fill));
  }
  CHECK_FALSE(same(pixel(0, 0), outside.fill));
  // The style has no hue (never a value of the map, never the hatch's pink), on both themes.
  for (const Theme* t : {&light_theme(), &dark_theme()}) {
    const OutsideStyle s = outside_window_style(*t);
    CHECK(std::abs(int(s.fill.r) - int(s.fill.b)) <= 1);
    CHECK(std::abs(int(s.fill.r) - int(s.fill.g)) <= 1);
    CHECK_FALSE(same(s.fill, t->background));
  }
}

TEST_CASE("the heads, predicted and retention views explain the sliding window", "[viz][window]") {
  const Trace trace = windowed_trace(10);
  ViewOptions options;
  options.layer = 0;
  for (const bool detail : {false, true}) {
    options.head_detail = detail;
    INFO("detail " << detail);
    CHECK(has_text(heads_view(trace, options, 9).figure, "outside the sliding window"));
    // Before the window slides nothing is outside it: no entry for what is not drawn.
    CHECK_FALSE(has_text(heads_view(trace, options, 3).figure, "outside the sliding window"));
  }
  options.head_detail = false;
  CHECK(has_text(predicted_view(trace, options, 9).figure, "outside the sliding window"));

  // Retention, layer 0 (window 4): tokens 0-5 are outside both heads' windows, so they are drawn
  // as such (not struck through as "seen by no head"), and the fractions count only the heads
  // whose window holds the token.
  const RetentionCounts counts = retention_counts(trace, 0, 9, 0, -1);
  CHECK(counts.outside_window_of[0] == kHeads);
  CHECK(counts.outside_window_of[9 - kWindow + 1] == 0);
  CHECK(counts.seen_by[0] == 0);
  const RetentionCounts all = retention_counts(trace, 0, 9, -1, -1);
  CHECK(all.outside_window_of[0] == kHeads);  // layer 1 (global) can see it
  options.retention_layer = 0;
  const View view = retention_view(trace, options, 9);
  CHECK(has_text(view.figure, "outside the sliding window of every head"));
  const OutsideStyle outside = outside_window_style(light_theme());
  int64_t outside_chips = 0, struck = 0;
  for (const Item& item : view.figure.items) {
    const auto* t = std::get_if<TextItem>(&item);
    if (!t || t->text.rfind("tok", 0) != 0) continue;
    outside_chips += same(t->background, outside.fill);
    struck += t->strike;
  }
  CHECK(outside_chips == 10 - kWindow);
  CHECK(struck == 1);  // token 7, in the window and hidden by both heads: the policy's doing
  // Over every layer, token 0 is a candidate of layer 1's heads only, which both see it (an even
  // column): its fraction is 2 / 2, not 2 / 4.
  options.retention_layer = -1;
  const View all_view = retention_view(trace, options, 9);
  bool found = false;
  for (const auto& row : all_view.data.rows) {
    if (std::get<double>(row[0]) != 0.0) continue;
    CHECK(std::get<double>(row[3]) == Approx(1.0));
    found = true;
  }
  CHECK(found);
}
