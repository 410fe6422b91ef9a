// The heads view as a legible instrument (issue 40, item 2): the grid filling the view area in
// both directions, readable and thinned labels, the legend, hidden cells hatched in a hue the map
// never takes, the per-head summary strip and its queries, the detail view's token labels and
// searched tokens; and run colours keyed to policies, legible on both themes.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <map>

#include "engine/common/error.h"
#include "engine/policy/registry.h"
#include "tests/support/small_trace.h"
#include "viz/colormap.h"
#include "viz/layout.h"
#include "viz/views.h"

using namespace kvlens;
using namespace kvlens::viz;

namespace {

// `layers` x `heads` heads over `steps` steps of the given policies: logit = column, every head
// hiding the odd columns before the step (the dense run sees everything).
Trace grid_trace(int64_t layers, int64_t heads, int64_t steps,
                 const std::vector<std::string>& policies) {
  Trace trace;
  trace.model = {"grid", layers, heads, 1, 4, 0};
  for (const std::string& p : policies) trace.runs.push_back({p, p == "dense" ? 0.0 : 0.5, {}, 0});
  for (int64_t t = 0; t < steps; ++t)
    trace.tokens.push_back({int32_t(t), "tok" + std::to_string(t)});
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<StepRecord> records;
    for (const std::string& p : policies) {
      StepRecord r;
      r.columns = t + 1;
      r.decisions.assign(size_t(layers),
                         p == "dense" ? LayerDecision::Dense : LayerDecision::Masked);
      for (int32_t i = 0; i < layers * heads; ++i) {
        r.kept_heads.push_back(i);
        int32_t count = 0;
        for (int64_t c = 0; c <= t; ++c) {
          r.logits.push_back(float(c));
          r.scores.push_back(float(c));
          const uint8_t seen = p == "dense" || c % 2 == 0 || c == t;
          r.visible.push_back(seen);
          count += seen;
        }
        r.visible_counts.push_back(count);
      }
      records.push_back(std::move(r));
    }
    trace.add_step(std::move(records));
  }
  return trace;
}

std::vector<const TextItem*> texts(const Figure& figure) {
  std::vector<const TextItem*> out;
  for (const Item& item : figure.items)
    if (const auto* t = std::get_if<TextItem>(&item)) out.push_back(t);
  return out;
}

bool has_text(const Figure& figure, const std::string& part) {
  for (const TextItem* t : texts(figure))
    if (t->text.find(part) != std::string::npos) return true;
  return false;
}

// The attention maps of a grid (hover regions of more than one cell named "head R:L:H").
std::vector<const HoverGrid*> maps_of(const Figure& figure) {
  std::vector<const HoverGrid*> maps;
  for (const HoverGrid& g : figure.hover)
    if (g.id.rfind("head ", 0) == 0 && g.rows > 1) maps.push_back(&g);
  return maps;
}

// The right and bottom edges of everything drawn (items' boxes and text anchors).
Point extent(const Figure& figure) {
  Point p;
  for (const Item& item : figure.items) {
    if (const auto* i = std::get_if<ImageItem>(&item)) {
      p.x = std::max(p.x, i->box.right()), p.y = std::max(p.y, i->box.bottom());
    } else if (const auto* r = std::get_if<RectItem>(&item)) {
      p.x = std::max(p.x, r->box.right()), p.y = std::max(p.y, r->box.bottom());
    } else if (const auto* t = std::get_if<TextItem>(&item)) {
      const float right =
          t->h == HAlign::Left ? t->anchor.x + text_width(t->text, t->size) : t->anchor.x;
      p.x = std::max(p.x, right), p.y = std::max(p.y, t->anchor.y);
    }
  }
  return p;
}

bool is_hidden_colour(Color c, const Theme& theme) {
  const HiddenStyle hidden = hidden_style(theme);
  return c == hidden.fill || c == hidden.stripe;
}

}  // namespace

TEST_CASE("head_summary gives each head's recall of dense mass, hit rate and sparsity", "[viz]") {
  const Trace trace = test::make_small_trace(5);
  // Run 1 (h2o) at step 4. Layer 1 head 0 (h = 2): logit 1.25 c, seen c = 0, 2, 4 of 0-4.
  const HeadSummary s = head_summary(trace, 1, 4);
  REQUIRE(s.recall.size() == 4);
  double total = 0;
  for (int c = 0; c <= 4; ++c) total += std::exp(1.25 * c);
  CHECK(s.recall[2] == Approx((1 + std::exp(2.5) + std::exp(5.0)) / total));
  CHECK(s.sparsity[2] == Approx(1.0 - 3.0 / 5.0));
  // Scores are logit / 2 + 1: the same order, so the top halves agree everywhere.
  CHECK(s.hit_rate[2] == Approx(1.0));
  // Head 3: logit 1.75 c, column 0 -inf (no mass), seen c = 1, 3, 4.
  double total3 = 0;
  for (int c = 1; c <= 4; ++c) total3 += std::exp(1.75 * c);
  CHECK(s.recall[3] == Approx((std::exp(1.75) + std::exp(5.25) + std::exp(7.0)) / total3));
  // Column 0's -inf logit (a sliding window's) makes it no candidate: 3 seen of 4.
  CHECK(s.sparsity[3] == Approx(1.0 - 3.0 / 4.0));
  // Layer 0 is dense under h2o: everything seen, no scores.
  CHECK(s.recall[0] == Approx(1.0));
  CHECK(s.sparsity[0] == Approx(0.0));
  CHECK(std::isnan(s.hit_rate[0]));
  // A row the trace did not keep has no recall (its sparsity comes from the kept counts).
  Trace degraded = test::make_small_trace(4);
  std::vector<StepRecord> last = trace.steps()[4];
  last[1].kept_heads.clear(), last[1].logits.clear(), last[1].scores.clear();
  last[1].visible.clear();
  degraded.add_step(std::move(last));
  const HeadSummary d = head_summary(degraded, 1, 4);
  CHECK(std::isnan(d.recall[2]));
  CHECK(d.sparsity[2] == Approx(0.4));
  CHECK_THROWS_AS(head_summary(trace, 2, 4), Error);
  CHECK_THROWS_AS(head_summary(trace, 1, 5), Error);
}

TEST_CASE("the heads grid fills the view area in both directions", "[viz]") {
  const Trace trace = grid_trace(8, 8, 40, {"dense", "tokenbutler", "h2o", "quest"});
  for (const float width : {1480.0f, 970.0f}) {
    for (const std::vector<int64_t>& runs : {std::vector<int64_t>{1}, std::vector<int64_t>{0, 1, 2},
                                             std::vector<int64_t>{0, 1, 2, 3}}) {
      ViewOptions options;
      options.runs = runs;
      options.width = width;
      options.height = width > 1000 ? 920 : 610;
      INFO("width " << width << ", runs " << runs.size());
      const View view = build_view(trace, ViewKind::Heads, options);
      const std::vector<const HoverGrid*> maps = maps_of(view.figure);
      REQUIRE(maps.size() == runs.size() * 64);
      const float side = maps[0]->box.w;
      CHECK(maps[0]->box.h == side);
      // Everything fits the area, and one direction is used up: the maps are as large as fit.
      const Point used = extent(view.figure);
      CHECK(used.x <= options.width);
      CHECK(view.figure.height <= options.height);
      CHECK(std::max(used.x / options.width, view.figure.height / options.height) > 0.9f);
      // Larger than the 35 units (25 with four runs) the width-only fit gave at 1480 x 920.
      if (width > 1000) CHECK(side > (runs.size() == 4 ? 25.0f : 35.0f));
    }
  }
  // Without a height (exports, kvlens-cli figure) the width decides, as before.
  ViewOptions options;
  options.runs = {1};
  options.width = 1480;
  const View free = build_view(trace, ViewKind::Heads, options);
  CHECK(maps_of(free.figure)[0]->box.w == 120.0f);
}

TEST_CASE("four runs in a tall view area go on two rows when that makes the maps larger", "[viz]") {
  // The app's view area at 1920 x 1080: four runs side by side leave maps of about 27 units and
  // most of the height empty; two rows of two fill it with larger maps.
  const Trace trace = grid_trace(8, 8, 40, {"dense", "tokenbutler", "h2o", "quest"});
  ViewOptions options;
  options.runs = {0, 1, 2, 3};
  options.width = 1112;
  options.height = 824;
  const View view = build_view(trace, ViewKind::Heads, options);
  const std::vector<const HoverGrid*> maps = maps_of(view.figure);
  REQUIRE(maps.size() == 4 * 64);
  const float side = maps[0]->box.w;
  const float one_row = std::floor((1112.0f - 44 - 16 - 3 * 28) / 4 / 8) - 3;
  CHECK(side > one_row + 4);
  // Runs 0 and 1 side by side, 2 and 3 under them, in the same columns.
  const HoverGrid& first = *maps[0];
  const HoverGrid& second = *maps[64];
  const HoverGrid& third = *maps[128];
  CHECK(second.box.y == first.box.y);
  CHECK(second.box.x > first.box.x);
  CHECK(third.box.x == first.box.x);
  CHECK(third.box.y > first.box.y + 8 * side);
  CHECK(view.figure.height <= options.height);
  CHECK(extent(view.figure).x <= options.width);
  // In a wide, low area one row stays (the maps would be smaller on two).
  options.width = 1800;
  options.height = 500;
  const View wide = build_view(trace, ViewKind::Heads, options);
  const std::vector<const HoverGrid*> wide_maps = maps_of(wide.figure);
  CHECK(wide_maps[192]->box.y == wide_maps[0]->box.y);
}

TEST_CASE("layer and head labels are readable and never overlap", "[viz]") {
  const Trace trace = grid_trace(16, 16, 20, {"dense", "tokenbutler", "h2o", "quest"});
  for (const float width : {1480.0f, 970.0f}) {
    for (const bool dark : {false, true}) {
      ViewOptions options;
      options.runs = {0, 1, 2, 3};
      options.width = width;
      options.height = 600;
      options.dark = dark;
      const View view = build_view(trace, ViewKind::Heads, options);
      const Theme& theme = dark ? dark_theme() : light_theme();
      std::map<float, std::vector<const TextItem*>> head_rows;  // head labels by baseline
      std::vector<const TextItem*> layer_labels;
      for (const TextItem* t : texts(view.figure)) {
        const bool head = t->text.size() > 1 && t->text[0] == 'H' && std::isdigit(t->text[1]);
        const bool layer = t->text.size() > 1 && t->text[0] == 'L' && std::isdigit(t->text[1]);
        if (!head && !layer) continue;
        CHECK(t->size >= 11.0f);
        CHECK(t->color == theme.foreground);
        (head ? head_rows[t->anchor.y] : layer_labels).push_back(t);
      }
      REQUIRE_FALSE(layer_labels.empty());
      // Thinned where maps are small (four panels of 16 x 16 in 970 units); never touching.
      if (width < 1000) CHECK(layer_labels.size() < 16 * 4);
      std::sort(layer_labels.begin(), layer_labels.end(), [](auto* a, auto* b) {
        return a->anchor.x != b->anchor.x ? a->anchor.x < b->anchor.x : a->anchor.y < b->anchor.y;
      });
      for (size_t i = 1; i < layer_labels.size(); ++i) {
        if (layer_labels[i]->anchor.x != layer_labels[i - 1]->anchor.x) continue;
        CHECK(layer_labels[i]->anchor.y - layer_labels[i - 1]->anchor.y >= 11.0f);
      }
      for (auto& [y, row] : head_rows) {
        std::sort(row.begin(), row.end(),
                  [](auto* a, auto* b) { return a->anchor.x < b->anchor.x; });
        for (size_t i = 1; i < row.size(); ++i) {
          const float gap = (row[i]->anchor.x - text_width(row[i]->text, row[i]->size) / 2) -
                            (row[i - 1]->anchor.x + text_width(row[i - 1]->text, row[i]->size) / 2);
          CHECK(gap > 0.0f);
        }
      }
    }
  }
}

TEST_CASE("hidden cells are hatched in a hue the map never takes, on both themes", "[viz]") {
  for (const Theme* theme : {&light_theme(), &dark_theme()}) {
    const HiddenStyle hidden = hidden_style(*theme);
    // Far from every entry of the sequential map (about five just-noticeable differences) and
    // from the background (blank cells).
    for (const Color entry : sequential_colormap().table()) {
      CHECK(oklab_distance(entry, hidden.fill) > 0.08);
      CHECK(oklab_distance(entry, hidden.stripe) > 0.08);
    }
    CHECK(oklab_distance(theme->background, hidden.fill) > 0.15);
    CHECK(oklab_distance(hidden.fill, hidden.stripe) > 0.1);  // the stripes show
  }
  // A hidden cell gets both stripes (repeated 4 x 4 where a cell covers many screen pixels); a
  // seen one its value's colour.
  const std::vector<float> values = {1.0f, 1.0f};
  const std::vector<uint8_t> visible = {1, 0};
  const ImageItem image = heatmap({0, 0, 40, 20}, values, &visible, 1, 2, {0.0, 1.0, false},
                                  sequential_colormap(), light_theme(), 64, 4);
  REQUIRE(image.width == 8);
  REQUIRE(image.height == 4);
  int64_t fill = 0, stripe = 0;
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 8; ++x) {
      const Color c = image.pixels[size_t(y * 8 + x)];
      if (x < 4) CHECK(c == sequential_colormap().at(1.0));
      if (x >= 4) CHECK(is_hidden_colour(c, light_theme()));
      fill += c == hidden_style(light_theme()).fill;
      stripe += c == hidden_style(light_theme()).stripe;
    }
  }
  CHECK(fill == 8);
  CHECK(stripe == 8);
  CHECK(hatch_scale_for(110, 110) == 1);
  CHECK(hatch_scale_for(110, 720) == 4);
  // The dark theme's background keeps the map's darkest entry (near-zero attention) visible.
  CHECK(oklab_distance(sequential_colormap().table()[0], dark_theme().background) > 0.15);
  CHECK(to_oklab(sequential_colormap().table()[0]).L - to_oklab(dark_theme().background).L > 0.1);
}

TEST_CASE("the heads grid has a legend and a clickable per-head summary strip", "[viz]") {
  const Trace trace = test::make_small_trace(5);
  ViewOptions options;
  options.runs = {1};
  options.width = 1200;
  options.height = 700;
  const View view = build_view(trace, ViewKind::Heads, options);
  CHECK(has_text(view.figure, "probability (log scale)"));
  CHECK(has_text(view.figure, "1e-4"));
  CHECK(has_text(view.figure, "hidden by the policy"));
  // (2 x 2 heads: the summaries are narrow, so their titles are short; the tooltip says all)
  CHECK(has_text(view.figure, "recall"));
  CHECK(has_text(view.figure, "hit rate"));
  CHECK(has_text(view.figure, "sparsity"));
  CHECK(has_text(view.figure, "per-head summaries"));
  // The swatch and the maps' hidden cells look alike.
  bool swatch = false;
  for (const Item& item : view.figure.items) {
    const auto* image = std::get_if<ImageItem>(&item);
    if (image && image->box.w == 24 && is_hidden_colour(image->pixels[0], light_theme()))
      swatch = true;
  }
  CHECK(swatch);
  // Each summary cell: a one-cell region named as a map is (the app selects the head), three
  // per head (one per summary), the exact numbers on hover.
  const HeadSummary s = head_summary(trace, 1, 4);
  int64_t cells = 0;
  std::string described;
  for (const HoverGrid& g : view.figure.hover) {
    if (g.rows != 1 || g.cols != 1) continue;
    int run = -1, l = -1, h = -1;
    REQUIRE(std::sscanf(g.id.c_str(), "head %d:%d:%d", &run, &l, &h) == 3);
    CHECK(run == 1);
    ++cells;
    if (l == 1 && h == 0) described = g.describe(0, 0);
  }
  CHECK(cells == 3 * 4);
  CHECK(described.find("recall vs dense " + format_value(s.recall[2])) != std::string::npos);
  CHECK(described.find("top-50% hit rate 1") != std::string::npos);
  CHECK(described.find("effective sparsity 0.4") != std::string::npos);
}

TEST_CASE("the detail view labels rows with query tokens, columns as the zoom allows", "[viz]") {
  const Trace trace = grid_trace(1, 1, 96, {"h2o"});
  ViewOptions options;
  options.head_detail = true;
  options.width = 900;
  options.height = 900;
  options.pixel_scale = 1.0f;
  auto labels = [&](const View& view, bool rotated) {
    std::vector<const TextItem*> out;
    for (const TextItem* t : texts(view.figure))
      if (t->text.rfind("tok", 0) == 0 && (t->rotation != 0.0f) == rotated) out.push_back(t);
    return out;
  };
  const View at_100 = build_view(trace, ViewKind::Heads, options);
  const HoverGrid& map = *maps_of(at_100.figure)[0];
  // Rows: the query token of each step (not step numbers), left of the map; the current one.
  const std::vector<const TextItem*> rows = labels(at_100, false);
  REQUIRE(rows.size() >= 2);
  for (const TextItem* t : rows) CHECK(t->anchor.x < map.box.x);
  CHECK(has_text(at_100.figure, "tok95"));
  // Columns: every k-th where 11-unit labels would collide; every one zoomed in 4x.
  const std::vector<const TextItem*> cols = labels(at_100, true);
  CHECK(cols.size() < 96);
  CHECK(cols.size() >= 96 / 16);
  for (size_t i = 1; i < cols.size(); ++i)
    CHECK((cols[i]->anchor.x - cols[i - 1]->anchor.x) * options.pixel_scale >= 11.0f);
  // A searched token is labelled wherever it is; the regular labels beside it give way.
  options.highlight_tokens = {41, 90};
  const View searched = build_view(trace, ViewKind::Heads, options);
  for (const bool rotated : {true, false}) {
    std::vector<float> at;
    for (const TextItem* t : labels(searched, rotated))
      at.push_back(rotated ? t->anchor.x : t->anchor.y);
    std::sort(at.begin(), at.end());
    for (size_t i = 1; i < at.size(); ++i) CHECK(at[i] - at[i - 1] >= 11.0f);
  }
  CHECK(has_text(searched.figure, "tok41"));
  options.highlight_tokens.clear();
  options.pixel_scale = 4.0f;
  const View at_400 = build_view(trace, ViewKind::Heads, options);
  CHECK(labels(at_400, true).size() == 96);
  // (22 / 4 units: 11 to 22 device pixels at any zoom the app rounds up to 4, in (2, 4])
  CHECK(labels(at_400, true)[0]->size == Approx(5.5f));
  // Not cut off: the figure reaches below the longest rotated label.
  const HoverGrid& map_400 = *maps_of(at_400.figure)[0];
  float longest = 0;
  for (const TextItem* t : labels(at_400, true))
    longest = std::max(longest, text_width(t->text, t->size));
  CHECK(at_400.figure.height >= map_400.box.bottom() + 4 + longest);
  CHECK(at_100.figure.height <= options.height);
}

TEST_CASE("searched tokens are highlighted in the grid and the detail view", "[viz]") {
  const Trace trace = test::make_small_trace(5);
  ViewOptions options;
  options.runs = {0, 1};
  options.highlight_tokens = {2};
  auto tints = [](const View& view) {
    int64_t n = 0;
    for (const Item& item : view.figure.items) {
      const auto* r = std::get_if<RectItem>(&item);
      const Color a = light_theme().accent;
      if (r && r->fill.a == 70 && r->fill.r == a.r && r->fill.g == a.g) ++n;
    }
    return n;
  };
  const View grid = build_view(trace, ViewKind::Heads, options);
  CHECK(tints(grid) == 2 * 4);  // token 2's column in every map of both runs
  CHECK(has_text(grid.figure, "searched token"));
  options.highlight_tokens.clear();
  CHECK(tints(build_view(trace, ViewKind::Heads, options)) == 0);
  options.highlight_tokens = {2};
  options.head_detail = true;
  const View detail = build_view(trace, ViewKind::Heads, options);
  CHECK(tints(detail) == 2);
  bool emphasised = false;
  for (const TextItem* t : texts(detail.figure))
    if (t->text == "\u00b7key" && t->rotation != 0 && t->bold && t->color == light_theme().accent)
      emphasised = true;
  CHECK(emphasised);
}

TEST_CASE("the allocators' colours are their own, legible on both themes", "[viz]") {
  const std::vector<std::string> ids = {
      "dense",   "oracle",      "random",  "streaming",   "h2o",  "snapkv",    "quest",
      "keydiff", "tokenfilter", "lazyllm", "tokenbutler", "tova", "pyramidkv", "adakv"};
  const Trace trace = grid_trace(1, 1, 2, ids);
  for (const Theme* theme : {&light_theme(), &dark_theme()}) {
    INFO("dark " << theme->dark);
    for (const int64_t allocator : {12, 13}) {
      CHECK(contrast_ratio(run_color(trace, allocator, *theme), theme->background) >=
            (theme->dark ? 4.5 : 3.0));
      CHECK(oklab_distance(run_color(trace, allocator, *theme), theme->accent) > 0.1);
      for (int64_t a = 0; a < int64_t(ids.size()); ++a) {
        if (a == allocator) continue;
        INFO(ids[size_t(a)] << " vs " << ids[size_t(allocator)]);
        CHECK(oklab_distance(run_color(trace, a, *theme), run_color(trace, allocator, *theme)) >
              0.1);
      }
    }
  }
}

TEST_CASE("a run's colour is its policy's, legible on both themes", "[viz]") {
  const Trace trace = grid_trace(
      1, 1, 2,
      {"dense", "oracle", "random", "streaming", "h2o", "snapkv", "quest", "keydiff", "tokenfilter",
       "lazyllm", "tokenbutler", "my_plugin", "h2o", "tova", "duoattention"});
  for (const Theme* theme : {&light_theme(), &dark_theme()}) {
    INFO("dark " << theme->dark);
    for (int64_t run = 0; run < int64_t(trace.runs.size()); ++run) {
      INFO(trace.runs[size_t(run)].policy);
      CHECK(contrast_ratio(run_color(trace, run, *theme), theme->background) >=
            (theme->dark ? 4.5 : 3.0));
      CHECK(run_color(trace, run, *theme) == run_color(trace, run, *theme));
    }
    // The same policy keeps its colour at any position.
    CHECK(run_color(trace, 4, *theme) == run_color(trace, 12, *theme));
    // Every built-in has a colour of its own (tova once fell back to the hash, which gave it
    // streaming's blue).
    for (int64_t a = 0; a < 11; ++a) {
      INFO(trace.runs[size_t(a)].policy << " vs tova");
      CHECK(oklab_distance(run_color(trace, a, *theme), run_color(trace, 13, *theme)) > 0.1);
    }
    // The approximate-logit policies too: apart from every other policy, the accent and each
    // other.
    const Trace approx = grid_trace(1, 1, 2,
                                    {"dense", "oracle", "random", "streaming", "h2o", "snapkv",
                                     "quest", "keydiff", "tokenfilter", "lazyllm", "tokenbutler",
                                     "tova", "sparq", "loki", "doublesparsity", "rocketkv"});
    for (int64_t a = 12; a < 16; ++a) {
      CHECK(oklab_distance(run_color(approx, a, *theme), theme->accent) > 0.1);
      for (int64_t b = 0; b < a; ++b) {
        INFO(approx.runs[size_t(a)].policy << " vs " << approx.runs[size_t(b)].policy);
        CHECK(oklab_distance(run_color(approx, a, *theme), run_color(approx, b, *theme)) > 0.1);
      }
    }
    // The usual comparison's four stay apart for dichromats and from the accent.
    const int64_t usual[] = {0, 10, 4, 6};  // dense, tokenbutler, h2o, quest
    for (const Dichromacy kind : {Dichromacy::Protanopia, Dichromacy::Deuteranopia}) {
      for (int a = 0; a < 4; ++a) {
        const Color x = simulate_dichromacy(run_color(trace, usual[a], *theme), kind);
        CHECK(oklab_distance(x, simulate_dichromacy(theme->accent, kind)) > 0.04);
        for (int b = a + 1; b < 4; ++b)
          CHECK(oklab_distance(x, simulate_dichromacy(run_color(trace, usual[b], *theme), kind)) >
                0.05);
      }
    }
  }
  // Okabe-Ito's yellow is darkened on white (keeping its hue), kept as it is on the dark theme.
  const Color yellow{240, 228, 66, 255};
  CHECK(contrast_ratio(yellow, light_theme().background) < 1.5);
  const Color on_white = legible_on(yellow, light_theme().background);
  CHECK(contrast_ratio(on_white, light_theme().background) >= 3.0);
  const OkLab a = to_oklab(yellow), b = to_oklab(on_white);
  CHECK(std::abs(std::atan2(a.b, a.a) - std::atan2(b.b, b.a)) < 0.15);
  CHECK(legible_on(yellow, dark_theme().background) == yellow);
  CHECK(contrast_ratio({0, 0, 0, 255}, {255, 255, 255, 255}) == Approx(21.0));
}

TEST_CASE("zoomed in, grid maps repeat cells for the hatch only up to twice the level of detail",
          "[viz]") {
  const Trace trace = grid_trace(1, 1, 100, {"h2o"});
  ViewOptions options;
  options.width = 1000;
  auto map_width = [&](const View& view) {
    for (const Item& item : view.figure.items) {
      const auto* image = std::get_if<ImageItem>(&item);
      if (image && image->box.w == image->box.h && image->box.w > 30) return image->width;
    }
    return 0;
  };
  // 120-unit maps at 8 device pixels a unit: 960 pixels for 100 cells would ask for 6 x 6
  // pixels a cell; twice max_map_pixels (128) allows 2.
  options.pixel_scale = 8.0f;
  CHECK(map_width(build_view(trace, ViewKind::Heads, options)) == 200);
  // At 100% each cell is one pixel (120 pixels for 100 cells).
  options.pixel_scale = 1.0f;
  CHECK(map_width(build_view(trace, ViewKind::Heads, options)) == 100);
}

TEST_CASE("every built-in policy has a colour of its own on both themes", "[viz]") {
  // As drawn (after legible_on): the first eleven keep their published palette (least pair
  // 0.06 OKLab); every policy added since (tova on, in registry order) is at least 0.1 from every
  // other and from the accent.
  std::vector<std::string> ids;
  for (const PolicyInfo& info : policy_infos())
    if (policy_source(info.id).empty()) ids.push_back(info.id);
  const size_t first_added = size_t(std::find(ids.begin(), ids.end(), "tova") - ids.begin());
  REQUIRE(first_added == 11);
  REQUIRE(ids.size() >= 17);
  for (const Theme* theme : {&light_theme(), &dark_theme()}) {
    for (size_t a = 0; a < ids.size(); ++a) {
      INFO(ids[a] << " vs the accent");
      CHECK(oklab_distance(policy_color(ids[a], *theme), theme->accent) > 0.06);
      for (size_t b = 0; b < a; ++b) {
        INFO(ids[a] << " vs " << ids[b]);
        const double least = a >= first_added ? 0.1 : 0.05;
        CHECK(oklab_distance(policy_color(ids[a], *theme), policy_color(ids[b], *theme)) > least);
      }
    }
  }
}

TEST_CASE("a composed SCORER+ALLOCATOR run takes its allocator's colour, not its scorer's",
          "[viz]") {
  for (const Theme* theme : {&light_theme(), &dark_theme()}) {
    CHECK(policy_color("h2o+pyramidkv", *theme) == policy_color("pyramidkv", *theme));
    CHECK(policy_color("h2o+pyramid", *theme) == policy_color("pyramidkv", *theme));
    CHECK(policy_color("tova+adakv", *theme) == policy_color("adakv", *theme));
    CHECK(oklab_distance(policy_color("h2o+pyramidkv", *theme), policy_color("h2o", *theme)) > 0.1);
  }
}

TEST_CASE("the grid shows each head's own budget: beside the run's title and on hover", "[viz]") {
  // 2 layers x 2 heads, 6 steps: "h2o" sees every other column in every head (a uniform budget);
  // "adakv" sees every column in head 0 and only the current one in head 1 (layer 0 dense).
  Trace trace;
  trace.model = {"grid", 2, 2, 1, 4, 0};
  trace.runs = {{"h2o", 0.5, {}, 0}, {"adakv", 0.5, {}, 0}};
  const int64_t steps = 6;
  for (int64_t t = 0; t < steps; ++t) trace.tokens.push_back({int32_t(t), "tok"});
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<StepRecord> records;
    for (int run = 0; run < 2; ++run) {
      StepRecord r;
      r.columns = t + 1;
      r.decisions = {run == 0 ? LayerDecision::Masked : LayerDecision::Dense,
                     LayerDecision::Masked};
      for (int32_t i = 0; i < 4; ++i) {
        r.kept_heads.push_back(i);
        int32_t count = 0;
        for (int64_t c = 0; c <= t; ++c) {
          r.logits.push_back(float(c));
          r.scores.push_back(float(c));
          const bool seen = run == 0 ? (c % 2 == 0 || c == t) : (i % 2 == 0 || c == t);
          r.visible.push_back(seen);
          count += seen;
        }
        r.visible_counts.push_back(count);
      }
      records.push_back(std::move(r));
    }
    trace.add_step(std::move(records));
  }
  ViewOptions options;
  options.runs = {0, 1};
  options.width = 1280;
  options.height = 720;
  const View view = heads_view(trace, options, 5);
  // Step 5: h2o keeps 0, 2, 4, 5 in every head; adakv 6 in head 0 and 1 in head 1 of layer 1.
  CHECK(has_text(view.figure, "kept per head: 4 of 6"));
  CHECK(has_text(view.figure, "kept per head: 1-6 of 6 (mean 3.5)"));
  std::string adakv_l1_h1, adakv_l0_h0, summary_l1_h0;
  for (const HoverGrid& g : view.figure.hover) {
    if (g.id == "head 1:1:1" && g.rows > 1) adakv_l1_h1 = g.describe(5, 5);
    if (g.id == "head 1:0:0" && g.rows > 1) adakv_l0_h0 = g.describe(5, 5);
    if (g.id == "head 1:1:0" && g.rows == 1) summary_l1_h0 = g.describe(0, 0);
  }
  CHECK(adakv_l1_h1.find("kept 1 of 6 tokens (layer 7 over 2 heads)") != std::string::npos);
  CHECK(adakv_l0_h0.find("no budget (dense or skipped layer)") != std::string::npos);
  CHECK(summary_l1_h0.find("kept 6 of 6 tokens") != std::string::npos);
}

TEST_CASE("magicpig's colour is its own among every built-in, legible on both themes", "[viz]") {
  std::vector<std::string> ids;
  for (const PolicyInfo& info : policy_infos()) ids.push_back(info.id);
  const auto found = std::find(ids.begin(), ids.end(), "magicpig");
  REQUIRE(found != ids.end());
  const int64_t pig = found - ids.begin();
  const Trace trace = grid_trace(1, 1, 2, ids);
  for (const Theme* theme : {&light_theme(), &dark_theme()}) {
    INFO("dark " << theme->dark);
    CHECK(contrast_ratio(run_color(trace, pig, *theme), theme->background) >=
          (theme->dark ? 4.5 : 3.0));
    CHECK(oklab_distance(run_color(trace, pig, *theme), theme->accent) > 0.1);
    for (int64_t a = 0; a < int64_t(ids.size()); ++a) {
      if (a == pig) continue;
      INFO(ids[size_t(a)]);
      CHECK(oklab_distance(run_color(trace, a, *theme), run_color(trace, pig, *theme)) > 0.1);
    }
  }
}
