// viz without Qt: the colormaps' perceptual properties, heatmap level of detail and dimming, the
// views built from a hand-made trace (items, hover text, data) and their option errors, and the
// data tables' CSV / JSON.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "tests/support/small_trace.h"
#include "viz/colormap.h"
#include "viz/layout.h"
#include "viz/views.h"

using namespace kvlens;
using namespace kvlens::viz;

namespace {

template <class T>
int64_t count_items(const Figure& figure) {
  int64_t n = 0;
  for (const Item& item : figure.items) n += std::holds_alternative<T>(item);
  return n;
}

bool has_text(const Figure& figure, const std::string& part) {
  for (const Item& item : figure.items) {
    if (const auto* text = std::get_if<TextItem>(&item))
      if (text->text.find(part) != std::string::npos) return true;
  }
  return false;
}

// The token chips of a retention figure (13-unit text that is not a section title), in order.
std::vector<const TextItem*> token_chips(const Figure& figure) {
  std::vector<const TextItem*> chips;
  for (const Item& item : figure.items) {
    const auto* text = std::get_if<TextItem>(&item);
    if (text && text->size == 13 && !text->bold) chips.push_back(text);
  }
  return chips;
}

}  // namespace

TEST_CASE("the sequential map is perceptually uniform with monotone lightness", "[viz]") {
  const Colormap& map = sequential_colormap();
  // 8-bit rounding can give neighbouring entries the same colour, so lightness is checked to
  // never fall, and the steps are compared over strides of 8 entries (about 0.02 in OKLab, the
  // rounding's 0.003 a small part of it).
  std::vector<double> steps;
  for (size_t i = 1; i < 256; ++i) {
    CHECK(to_oklab(map.table()[i]).L >= to_oklab(map.table()[i - 1]).L);
    if (i % 8 == 7) steps.push_back(oklab_distance(map.table()[i - 7], map.table()[i]));
  }
  const auto [lo, hi] = std::minmax_element(steps.begin(), steps.end());
  CHECK(*lo > 0.015);
  CHECK(*hi / *lo < 1.25);
  CHECK(to_oklab(map.table()[255]).L - to_oklab(map.table()[0]).L > 0.6);
}

TEST_CASE("the maps stay ordered and distinct for red-green dichromats", "[viz]") {
  for (const Colormap* map : {&sequential_colormap(), &diverging_colormap()}) {
    for (const Dichromacy kind : {Dichromacy::Protanopia, Dichromacy::Deuteranopia}) {
      // Every 16th entry stays distinguishable from the next under the simulation.
      for (size_t i = 16; i < 256; i += 16) {
        const Color a = simulate_dichromacy(map->table()[i - 16], kind);
        const Color b = simulate_dichromacy(map->table()[i], kind);
        CHECK(oklab_distance(a, b) > 0.03);
      }
    }
  }
  // The diverging map is symmetric in lightness about its light middle.
  const Colormap& div = diverging_colormap();
  for (size_t i = 0; i < 128; i += 8) {
    CHECK(to_oklab(div.table()[i]).L == Approx(to_oklab(div.table()[255 - i]).L).margin(0.01));
  }
  CHECK(to_oklab(div.table()[128]).L > 0.9);
  // Okabe-Ito run colours stay pairwise distinct for dichromats.
  for (int64_t a = 0; a < 4; ++a)
    for (int64_t b = a + 1; b < 4; ++b)
      CHECK(oklab_distance(simulate_dichromacy(run_color(a), Dichromacy::Deuteranopia),
                           simulate_dichromacy(run_color(b), Dichromacy::Deuteranopia)) > 0.05);
  // Each theme's accent (the selected head, the current step, the true token) is none of the
  // run colours it marks things beside (the dark theme's used to be run 0's orange).
  for (const Theme* theme : {&light_theme(), &dark_theme()}) {
    for (int64_t run = 0; run < 4; ++run) {
      INFO("dark " << theme->dark << ", run " << run);
      CHECK(oklab_distance(theme->accent, run_color(run)) > 0.1);
      for (const Dichromacy kind : {Dichromacy::Protanopia, Dichromacy::Deuteranopia})
        CHECK(oklab_distance(simulate_dichromacy(theme->accent, kind),
                             simulate_dichromacy(run_color(run), kind)) > 0.04);
    }
  }
}

TEST_CASE("OKLab round-trips sRGB and NaN maps to the transparent missing colour", "[viz]") {
  for (const Color c : {Color{0, 0, 0}, Color{255, 255, 255}, Color{12, 200, 99}}) {
    bool clipped = true;
    CHECK(from_oklab(to_oklab(c), &clipped) == c);
    CHECK_FALSE(clipped);
  }
  CHECK(to_oklab({255, 255, 255}).L == Approx(1.0).margin(1e-4));
  CHECK(sequential_colormap().at(std::nan("")).a == 0);
  CHECK(sequential_colormap().at(-3) == sequential_colormap().table()[0]);
  CHECK(hex({255, 16, 0}) == "#ff1000");
}

TEST_CASE("heatmaps pool blocks by their largest value and hatch hidden cells", "[viz]") {
  // 4 x 4 cells into 2 x 2 pixels: each pixel takes its block's maximum.
  std::vector<float> values(16, 0.0f);
  values[0 * 4 + 1] = 1.0f;  // block (0, 0)
  values[3 * 4 + 3] = 0.5f;  // block (1, 1)
  values[2 * 4 + 0] = std::nanf("");
  std::vector<uint8_t> visible(16, 1);
  for (int c = 0; c < 2; ++c)
    for (int r = 0; r < 2; ++r) visible[size_t(r * 4 + 2 + c)] = 0;  // block (0, 1) all hidden
  const Theme& theme = light_theme();
  const ImageItem image = heatmap({0, 0, 40, 40}, values, &visible, 4, 4, {0.0, 1.0, false},
                                  sequential_colormap(), theme, 2);
  REQUIRE(image.width == 2);
  REQUIRE(image.height == 2);
  CHECK(image.pixels[0] == sequential_colormap().at(1.0));
  CHECK(image.pixels[3] == sequential_colormap().at(0.5));
  // (hidden: the hatch's colours instead of the value's, see test_viz_heads.cpp)
  CHECK(image.pixels[1] == hidden_style(theme).stripe);  // pixel (1, 0): a stripe
  // Full resolution where it fits.
  CHECK(heatmap({}, values, nullptr, 4, 4, {0, 1, false}, sequential_colormap(), theme, 64).width ==
        4);
  // On a log scale each pixel gets the entry normalise() would give (found by binary search).
  std::vector<float> probabilities = {1e-6f, 1e-4f, 3e-3f, 0.01f, 0.2f, 1.0f};
  const ValueScale log{1e-4, 1.0, true};
  const ImageItem logs =
      heatmap({}, probabilities, nullptr, 1, 6, log, sequential_colormap(), theme, 64);
  for (size_t i = 0; i < probabilities.size(); ++i)
    CHECK(logs.pixels[i] == sequential_colormap().at(log.normalise(probabilities[i])));
  CHECK(log.normalise(1e-2) == Approx(0.5));
  CHECK(log.normalise(0.0) == Approx(0.0));
}

TEST_CASE("every view builds from a trace, alone and in compare mode", "[viz]") {
  const Trace trace = test::make_small_trace(5);
  for (const ViewKind kind : {ViewKind::Heads, ViewKind::Predicted, ViewKind::Retention,
                              ViewKind::Consensus, ViewKind::Logits, ViewKind::History}) {
    for (const std::vector<int64_t>& runs : {std::vector<int64_t>{1}, {0, 1}}) {
      ViewOptions options;
      options.runs = runs;
      options.layer = 1;
      options.dark = runs.size() == 2;
      const View view = build_view(trace, kind, options);
      INFO(view_name(kind) << " with " << runs.size() << " runs");
      CHECK(view.figure.width == options.width);
      CHECK(view.figure.height > 100);
      CHECK(view.figure.items.size() > 10);
      CHECK_FALSE(view.figure.hover.empty());
      CHECK_FALSE(view.data.rows.empty());
      CHECK(view.figure.background == (options.dark ? dark_theme() : light_theme()).background);
      // (hovered cells are outlined in the accent, which no run colour shares)
      CHECK(view.figure.highlight == (options.dark ? dark_theme() : light_theme()).accent);
      CHECK(has_text(view.figure, runs.size() == 2 ? "dense" : "h2o"));
      for (const HoverGrid& grid : view.figure.hover) CHECK_FALSE(grid.describe(0, 0).empty());
    }
  }
}

TEST_CASE("the heads view shows every head's map and describes cells on hover", "[viz]") {
  const Trace trace = test::make_small_trace(5);
  ViewOptions options;
  options.runs = {1};
  options.quantity = HeadQuantity::Logits;
  const View grid = build_view(trace, ViewKind::Heads, options);
  // 4 heads, the legend's colour bars (maps, summaries) and hidden swatch, the 3 summaries
  CHECK(count_items<ImageItem>(grid.figure) == 4 + 3 + 3);
  CHECK(grid.data.rows.size() == 4 * 5);  // each head's row at step 4
  const HoverGrid* head3 = nullptr;
  for (const HoverGrid& g : grid.figure.hover)
    if (g.id == "head 1:1:1" && !head3) head3 = &g;  // (the map; then its summary cells)
  REQUIRE(head3 != nullptr);
  // Step 4, token 2 of head 3 (run 1): logit 3.5, hidden ((2 + 3) % 2 != 0).
  const std::string text = head3->describe(4, 2);
  CHECK(text.find("logit 3.5") != std::string::npos);
  CHECK(text.find("hidden") != std::string::npos);
  CHECK(text.find("' key'") == std::string::npos);  // token labels show spaces as a dot
  CHECK(text.find("\u00b7key") != std::string::npos);
  CHECK(head3->describe(1, 3).find("not yet a candidate") != std::string::npos);
  // A learned predictor's scores are named as what they are: predicted logits.
  {
    Trace butler = trace;
    butler.runs[1].policy = "tokenbutler";
    ViewOptions scores = options;
    scores.quantity = HeadQuantity::Scores;
    const Trace* const traces[] = {&trace, &butler};
    for (const Trace* t : traces) {
      const View view = build_view(*t, ViewKind::Heads, scores);
      std::string described;
      for (const HoverGrid& g : view.figure.hover)
        if (g.id == "head 1:1:1" && described.empty()) described = g.describe(4, 2);
      CHECK(described.find(t == &butler ? "predicted logit" : "policy score") != std::string::npos);
    }
  }
  int64_t row = -1, col = -1;
  CHECK(head3->cell_at({head3->box.x + 1, head3->box.bottom() - 1}, row, col));
  CHECK(row == 4);
  CHECK(col == 0);

  options.head_detail = true;
  options.layer = 1;
  options.head = 1;
  const View detail = build_view(trace, ViewKind::Heads, options);
  CHECK(has_text(detail.figure, "Layer 1, head 1 at step 4"));
  // The outlined visible set at step 4: tokens 1 and 3, 4 (consecutive) -> two outlines.
  int64_t outlines = 0;
  for (const Item& item : detail.figure.items) {
    const auto* rect = std::get_if<RectItem>(&item);
    if (rect && rect->stroke == light_theme().accent && rect->stroke_width == 1.5f) ++outlines;
  }
  CHECK(outlines == 2);
}

TEST_CASE("the heads grid pools maps to the pixels they cover on screen", "[viz]") {
  // One head over 64 steps (logit = column, every token seen): 120-unit maps at width 640.
  constexpr int64_t kSteps = 64;
  Trace trace;
  trace.model = {"long", 1, 1, 1, 4, 0};
  trace.runs.push_back({});
  for (int64_t t = 0; t < kSteps; ++t) trace.tokens.push_back({0, "t"});
  for (int64_t t = 0; t < kSteps; ++t) {
    StepRecord record;
    record.decisions = {LayerDecision::Dense};
    record.visible_counts = {int32_t(t + 1)};
    record.columns = t + 1;
    record.kept_heads = {0};
    for (int64_t c = 0; c <= t; ++c) {
      record.logits.push_back(float(c));
      record.scores.push_back(NAN);
      record.visible.push_back(1);
    }
    trace.add_step({std::move(record)});
  }
  ViewOptions options;
  options.width = 640;
  options.quantity = HeadQuantity::Logits;
  auto map_rows = [&](const View& view) {
    for (const Item& item : view.figure.items) {
      const auto* image = std::get_if<ImageItem>(&item);
      // (the map: square and larger than the legend's swatch and the summaries' cells)
      if (image && image->box.w == image->box.h && image->box.w > 30) return image->height;
    }
    return 0;
  };
  // Exports (pixel_scale 0) keep max_map_pixels: every step of 64.
  CHECK(map_rows(build_view(trace, ViewKind::Heads, options)) == kSteps);
  // On a screen: the map covers 120 * 0.0625 = 7.5 device pixels, so it is pooled to at most
  // 2 * 8 rows (blocks of 4 steps), with or without the app's cache.
  options.pixel_scale = 0.0625f;
  CHECK(map_rows(build_view(trace, ViewKind::Heads, options)) == 16);
  HeadMapCache cache;
  options.head_maps = &cache;
  const View cached = build_view(trace, ViewKind::Heads, options);
  CHECK(map_rows(cached) == 16);
  // Zoomed in 4x: 30 pixels, 64 rows; the cache follows the new level of detail.
  options.pixel_scale = 0.25f;
  CHECK(map_rows(build_view(trace, ViewKind::Heads, options)) == kSteps);
}

TEST_CASE("the logits view marks the answer's steps right or wrong per run", "[viz]") {
  // Answer tokens [4, 6) are predicted at steps 3 and 4. The small trace's argmax is wrong at
  // both; run 1 is made right at step 4.
  Trace trace = test::make_small_trace(4);
  std::vector<StepRecord> last = test::make_small_trace(5).steps()[4];
  last[1].argmax = 15;
  trace.add_step(std::move(last));
  ViewOptions options;
  options.runs = {0, 1};
  options.step = 4;
  const View view = build_view(trace, ViewKind::Logits, options);
  CHECK(has_text(view.figure, "predicting answer token 2 of 2 ('Ann')"));
  CHECK(has_text(view.figure, "answer token right"));  // run 1 at step 4 (and the legend)
  CHECK(has_text(view.figure, "answer token wrong"));  // dense at step 4
  int64_t dots = 0, crosses = 0;
  for (const Item& item : view.figure.items) {
    if (const auto* c = std::get_if<CircleItem>(&item); c && c->radius == 3.0f) ++dots;
    if (const auto* l = std::get_if<LineItem>(&item);
        l && l->width == 1.5f && l->points.size() == 2 && l->points[1].x - l->points[0].x == 6)
      ++crosses;
  }
  CHECK(dots == 1 + 1);           // run 1 at step 4, and the legend's
  CHECK(crosses == 2 * (3 + 1));  // two lines each: dense twice, run 1 once, the legend
  options.step = 1;               // not an answer step: no verdict above the strip
  CHECK_FALSE(has_text(build_view(trace, ViewKind::Logits, options).figure, "answer token wrong"));
}

TEST_CASE("retention shades tokens by the fraction of heads that see them", "[viz]") {
  const Trace trace = test::make_small_trace(4);
  ViewOptions options;
  options.runs = {1};
  options.retention_layer = 1;
  options.retention_head = 1;
  const View one = build_view(trace, ViewKind::Retention, options);
  // Step 3, head 3 of run 1 sees {1, 3}: tokens 0 and 2 struck through; 5 is not read yet.
  const std::vector<const TextItem*> chips = token_chips(one.figure);
  REQUIRE(chips.size() == 6);
  std::vector<bool> struck;
  for (const TextItem* chip : chips) struck.push_back(chip->strike);
  CHECK(struck == std::vector<bool>{true, false, true, false, false, false});
  CHECK(chips[1]->background == sequential_colormap().at(1.0));
  CHECK(chips[5]->background.a == 0);
  // Data per token: the run's count, its fraction, the heads in scope.
  REQUIRE(one.data.rows.size() == 6);
  REQUIRE(one.data.columns.size() == 5);
  CHECK(one.data.columns[3] == "h2o s=0.5 fraction");
  CHECK(std::get<double>(one.data.rows[1][2]) == 1.0);
  CHECK(std::get<double>(one.data.rows[1][3]) == 1.0);
  CHECK(std::get<double>(one.data.rows[1][4]) == 1.0);
  CHECK(std::isnan(std::get<double>(one.data.rows[5][3])));  // not read at step 3

  // All heads in scope: run 1 sees tokens 0-2 with 3 of its 4 heads and token 3 with all 4.
  options.retention_layer = options.retention_head = -1;
  // The view outlives the chips: they point into its figure.
  const View all_heads = build_view(trace, ViewKind::Retention, options);
  const std::vector<const TextItem*> all = token_chips(all_heads.figure);
  CHECK(all[0]->background == sequential_colormap().at(0.75));
  CHECK(all[3]->background == sequential_colormap().at(1.0));
}

TEST_CASE("retention with two runs shows the difference of their fractions", "[viz]") {
  // Every head in scope: dense sees every token with its 4 heads, h2o tokens 0-2 with 3 and
  // token 3 with 4. Each token is seen by some head of both runs (the old diff read "seen by
  // both" for all of them alike): the difference tells tokens 0-2 from token 3.
  const Trace trace = test::make_small_trace(4);
  ViewOptions options;
  options.runs = {0, 1};
  const View diff = build_view(trace, ViewKind::Retention, options);
  // The difference's text, then A's and B's own.
  const std::vector<const TextItem*> chips = token_chips(diff.figure);
  REQUIRE(chips.size() == 3 * 6);
  const Colormap& div = diverging_colormap();
  CHECK(chips[0]->background == div.at(0.5 + 0.5 * 0.25));  // dense 1 - h2o 0.75
  CHECK(chips[3]->background == div.at(0.5));               // the same share in both
  CHECK(chips[0]->background != chips[3]->background);
  CHECK_FALSE(chips[0]->strike);
  CHECK(chips[5]->background.a == 0);                                  // not read yet
  CHECK(chips[6 + 0]->background == sequential_colormap().at(1.0));    // A: dense
  CHECK(chips[12 + 0]->background == sequential_colormap().at(0.75));  // B: h2o
  CHECK(chips[12 + 3]->background == sequential_colormap().at(1.0));
  // The map's A end is on A's side of the neutral middle (orange, as A's run colour), B's blue.
  CHECK(to_oklab(div.at(1.0)).b > 0.05);
  CHECK(to_oklab(run_color(0)).b > 0.05);
  CHECK(to_oklab(div.at(0.0)).b < -0.05);
  CHECK(to_oklab(run_color(1)).b < -0.05);
  CHECK(has_text(diff.figure, "B sees more"));
  CHECK(has_text(diff.figure, "A sees more"));
  // Hover gives both runs' counts and fractions and the difference.
  std::string hover;
  for (const HoverGrid& grid : diff.figure.hover)
    if (grid.id == "token 0:0") hover = grid.describe(0, 0);
  CHECK(hover.find("dense: seen by 4 of 4 heads (1)") != std::string::npos);
  CHECK(hover.find("h2o s=0.5: seen by 3 of 4 heads (0.75)") != std::string::npos);
  CHECK(hover.find("A \u2212 B: +0.25") != std::string::npos);
  // Data: each run's count and fraction, their difference, the heads in scope.
  REQUIRE(diff.data.columns.size() == 2 + 2 * 2 + 2);
  CHECK(diff.data.columns[6] == "fraction A - B");
  CHECK(std::get<double>(diff.data.rows[0][5]) == 0.75);
  CHECK(std::get<double>(diff.data.rows[0][6]) == 0.25);
  CHECK(std::get<double>(diff.data.rows[3][6]) == 0.0);
  CHECK(std::get<double>(diff.data.rows[0][7]) == 4.0);

  // One head in scope: token 0 is seen by dense only (the A end), token 1 by both.
  options.retention_layer = options.retention_head = 1;
  const View one_head = build_view(trace, ViewKind::Retention, options);
  const std::vector<const TextItem*> one = token_chips(one_head.figure);
  CHECK(one[0]->background == div.at(1.0));
  CHECK(one[1]->background == div.at(0.5));
  // Three runs: each run's own text, titled, one row of data per token with three of each.
  options.runs = {0, 1, 0};
  const View three = build_view(trace, ViewKind::Retention, options);
  CHECK(token_chips(three.figure).size() == 3 * 6);
  CHECK(has_text(three.figure, "h2o s=0.5"));
  CHECK_FALSE(has_text(three.figure, "A sees more"));
  REQUIRE(three.data.rows.size() == 6);
  CHECK(three.data.rows[0].size() == 2 + 3 * 2 + 1);
}

TEST_CASE("the predicted view names a predictor's scores and shows each head's hit rate", "[viz]") {
  // Step 4 of run 1 with L1 H0's scores reversed: of the true top 3 of 5 tokens {2, 3, 4} the
  // scores rank only token 2 in their top 3 {0, 1, 2}, a hit rate of 1/3 (the top-50%
  // agreement would be 1/5). Elsewhere the scores order tokens as the logits do: 1.
  Trace trace = test::make_small_trace(4);
  std::vector<StepRecord> last = test::make_small_trace(5).steps()[4];
  for (int64_t c = 0; c < 5; ++c) last[1].scores[size_t(2 * 5 + c)] = -float(c);
  trace.add_step(std::move(last));
  ViewOptions options;
  options.runs = {1};
  options.layer = 1;
  const auto grid_text = [](const View& view, int64_t row, int64_t col) {
    for (const HoverGrid& grid : view.figure.hover)
      if (grid.id == "hit rate grid") return grid.describe(row, col);
    return std::string();
  };
  const View h2o = build_view(trace, ViewKind::Predicted, options);
  CHECK(has_text(h2o.figure, "top-50% hit rate per head"));
  CHECK(has_text(h2o.figure, "policy scores"));
  CHECK_FALSE(has_text(h2o.figure, "predicted logits"));
  CHECK(grid_text(h2o, 1, 0).find("top-50% hit rate 0.333") != std::string::npos);
  CHECK(grid_text(h2o, 1, 1).find("top-50% hit rate 1") != std::string::npos);
  CHECK(grid_text(h2o, 0, 0).find("top-50% hit rate -") != std::string::npos);  // dense layer
  CHECK(has_text(h2o.figure, "top-50% hit rate 0.333"));  // the scatter's, L1 H0

  // A learned predictor's run: its scores are called predicted logits.
  trace.runs[1].policy = "tokenbutler";
  CHECK(run_predicts_logits(trace, 1));
  CHECK_FALSE(run_predicts_logits(trace, 0));
  const View butler = build_view(trace, ViewKind::Predicted, options);
  CHECK(has_text(butler.figure, "predicted logits"));
  CHECK(has_text(butler.figure, "predicted logit"));  // the scatter's axis
  CHECK(has_text(butler.figure, "the predictor's logits against the true attention logits"));
  CHECK_FALSE(has_text(butler.figure, "policy scores"));
  // (a dense run has no scores: the view leaves it out; an h2o run beside the predictor stays)
  options.runs = {0, 1};
  Trace mixed = trace;
  mixed.truncate_steps(0);
  mixed.runs[0] = {"h2o", 0.5, {}, 0};
  for (const std::vector<StepRecord>& step : trace.steps()) mixed.add_step({step[1], step[1]});
  const View both = build_view(mixed, ViewKind::Predicted, options);
  CHECK(has_text(both.figure, "policy scores"));
  CHECK(has_text(both.figure, "predicted logits"));
  // The approximate-logit methods' scores are predicted logits too, with the same hit rates.
  options.runs = {1};
  for (const char* id : {"sparq", "loki", "doublesparsity", "rocketkv"}) {
    INFO(id);
    trace.runs[1].policy = id;
    CHECK(run_predicts_logits(trace, 1));
    const View approx = build_view(trace, ViewKind::Predicted, options);
    CHECK(has_text(approx.figure, "predicted logits"));
    CHECK_FALSE(has_text(approx.figure, "policy scores"));
    CHECK(grid_text(approx, 1, 0).find("top-50% hit rate 0.333") != std::string::npos);
  }
}

TEST_CASE("views built without data draw the same figure", "[viz]") {
  // The app redraws figures without their tables (heads x tokens rows) and builds them to export.
  const Trace trace = test::make_small_trace(5);
  for (const ViewKind kind :
       {ViewKind::Heads, ViewKind::Consensus, ViewKind::Retention, ViewKind::History}) {
    ViewOptions options;
    options.runs = {0, 1};
    const View full = build_view(trace, kind, options);
    options.with_data = false;
    const View bare = build_view(trace, kind, options);
    INFO(view_name(kind));
    CHECK_FALSE(full.data.rows.empty());
    CHECK(bare.data.rows.empty());
    CHECK(bare.data.columns.empty());
    CHECK(bare.figure.items.size() == full.figure.items.size());
    CHECK(bare.figure.hover.size() == full.figure.hover.size());
  }
  CHECK(parse_runs(trace, "h2o, 0", "--runs") == std::vector<int64_t>{1, 0});
  CHECK_THROWS_AS(parse_runs(trace, "0,,1", "--runs"), Error);
  CHECK(default_runs(trace) == std::vector<int64_t>{0, 1});
  Trace more = trace;
  more.runs.resize(5);
  CHECK(default_runs(more) == std::vector<int64_t>{0, 1, 2});
  CHECK(parse_consensus("jaccard", "--consensus") == ConsensusMetric::Jaccard);
  CHECK_THROWS_AS(parse_consensus("spearman", "--consensus"), Error);
}

TEST_CASE("views reject options the trace cannot satisfy", "[viz]") {
  const Trace trace = test::make_small_trace(3);
  ViewOptions options;
  options.step = 3;
  CHECK_THROWS_AS(build_view(trace, ViewKind::Heads, options), Error);
  options.step = -1;
  options.runs = {0, 1, 0, 1, 0};
  CHECK_THROWS_AS(build_view(trace, ViewKind::Heads, options), Error);
  options.runs = {2};
  CHECK_THROWS_AS(build_view(trace, ViewKind::Logits, options), Error);
  options.runs = {0};
  options.head = 2;
  CHECK_THROWS_AS(build_view(trace, ViewKind::Predicted, options), Error);
  CHECK_THROWS_AS(parse_view("attention"), Error);
  CHECK(parse_view("consensus") == ViewKind::Consensus);
  Trace empty = test::make_small_trace(1);
  empty.truncate_steps(0);
  CHECK_THROWS_AS(build_view(empty, ViewKind::Heads, ViewOptions{}), Error);
}

TEST_CASE("data tables write CSV with quoting and JSON with nulls", "[viz]") {
  DataTable table;
  table.columns = {"token", "text", "value"};
  table.rows.push_back({1.0, std::string("a, \"b\""), std::nan("")});
  table.rows.push_back({2.0, std::string("plain"), 0.125});
  CHECK(table.to_csv() == "token,text,value\n1,\"a, \"\"b\"\"\",\n2,plain,0.125\n");
  const nlohmann::json json = nlohmann::json::parse(table.to_json());
  CHECK(json["columns"].size() == 3);
  CHECK(json["rows"][0]["value"].is_null());
  CHECK(json["rows"][1]["value"] == 0.125);
  CHECK(json["rows"][0]["text"] == "a, \"b\"");
}

TEST_CASE("labels format values and tokens readably", "[viz]") {
  CHECK(format_value(std::nan("")) == "-");
  CHECK(format_value(0.123456) == "0.123");
  CHECK(token_label(" key") == "\u00b7key");
  CHECK(token_label("a\nb") == "a\u21b5b");
  CHECK(token_label("abcdefghijklmnop", 4) == "abcd\u2026");
  CHECK(token_label("\xc3\xa9\xc3\xa9\xc3\xa9", 2) == "\xc3\xa9\xc3\xa9\u2026");
  const std::vector<double> ticks = nice_ticks(0, 9, 4);
  CHECK(ticks.front() == 0);
  CHECK(ticks.back() <= 9);
  CHECK(ticks.size() >= 3);
}
