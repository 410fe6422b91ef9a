// The token-history query (engine/trace/token_history) on a hand-made trace whose visible sets
// are spelled out step by step, the history view built from it (states, hover, story, data,
// hatched steps without rows), and issue 40's changes to the retention, predicted and logits
// views: click ids, searched tokens, dense runs left out, the per-layer summary, integer step
// ticks and labels that never collide at 950 or 1600 units.
#include <catch2/catch.hpp>
#include <cmath>

#include "engine/common/error.h"
#include "engine/trace/token_history.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/small_trace.h"
#include "viz/layout.h"
#include "viz/views.h"

using namespace kvlens;
using namespace kvlens::viz;

namespace {

// 1 layer x 2 heads, 6 tokens, 6 steps of one run "h2o". Head 0 sees, per step (columns 0..t):
//   t0 [1]  t1 [1 0]  t2 [0 0 1]  t3 [0 1 1 1]  t4 (no rows kept)  t5 [1 0 0 1 1 1]
// so token 0 is visible, visible, evicted, hidden, unknown, back; token 1 hidden, hidden,
// visible, unknown, evicted. Head 1 sees everything.
Trace make_history_trace() {
  Trace trace;
  trace.model = {"hand", 1, 2, 1, 4, 50};
  for (int32_t i = 0; i < 6; ++i) trace.tokens.push_back({i + 1, " t" + std::to_string(i)});
  trace.runs = {{"h2o", 0.5, {}, 0}};
  trace.top_k = 0;
  const std::vector<std::vector<uint8_t>> head0 = {{1},          {1, 0}, {0, 0, 1},
                                                   {0, 1, 1, 1}, {},     {1, 0, 0, 1, 1, 1}};
  for (int64_t t = 0; t < 6; ++t) {
    StepRecord r;
    r.columns = t + 1;
    r.decisions = {LayerDecision::Masked};
    r.visible_counts = {0, int32_t(t + 1)};
    const bool kept = t != 4;
    if (kept) {
      r.kept_heads = {0, 1};
      for (int h = 0; h < 2; ++h) {
        for (int64_t c = 0; c <= t; ++c) {
          const uint8_t seen = h == 1 ? 1 : head0[size_t(t)][size_t(c)];
          r.visible.push_back(seen);
          r.logits.push_back(float(c));
          r.scores.push_back(float(c));
          if (h == 0) r.visible_counts[0] += seen;
        }
      }
    }
    std::vector<StepRecord> records;
    records.push_back(std::move(r));
    trace.add_step(std::move(records));
  }
  return trace;
}

const HoverGrid* grid_with_id(const Figure& figure, const std::string& id) {
  for (const HoverGrid& grid : figure.hover)
    if (grid.id == id) return &grid;
  return nullptr;
}

bool has_text(const Figure& figure, const std::string& part) {
  for (const Item& item : figure.items) {
    if (const auto* text = std::get_if<TextItem>(&item))
      if (text->text.find(part) != std::string::npos) return true;
  }
  return false;
}

template <class T>
std::vector<const T*> items_of(const Figure& figure) {
  std::vector<const T*> found;
  for (const Item& item : figure.items)
    if (const auto* it = std::get_if<T>(&item)) found.push_back(it);
  return found;
}

// A text's box as the layout estimates it (the renderers' font may differ a little: the boxes
// are shrunk by 1 unit a side so that touching is not colliding).
Box text_box(const TextItem& t) {
  const float w = text_width(t.text, t.size), h = t.size;
  float x = t.anchor.x, y = t.anchor.y - h * 0.8f;
  if (t.h == HAlign::Center) x -= w / 2;
  if (t.h == HAlign::Right) x -= w;
  if (t.v == VAlign::Top) y = t.anchor.y;
  if (t.v == VAlign::Middle) y = t.anchor.y - h / 2;
  if (t.v == VAlign::Bottom) y = t.anchor.y - h;
  return {x + 1, y + 1, w - 2, h - 2};
}

// The first pair of horizontal texts whose boxes overlap, as "'a' and 'b'", or "".
std::string colliding_texts(const Figure& figure) {
  const std::vector<const TextItem*> texts = items_of<TextItem>(figure);
  for (size_t a = 0; a < texts.size(); ++a) {
    if (texts[a]->rotation != 0 || texts[a]->text.empty()) continue;
    const Box ba = text_box(*texts[a]);
    for (size_t b = a + 1; b < texts.size(); ++b) {
      if (texts[b]->rotation != 0 || texts[b]->text.empty()) continue;
      const Box bb = text_box(*texts[b]);
      if (ba.x < bb.right() && bb.x < ba.right() && ba.y < bb.bottom() && bb.y < ba.bottom())
        return "'" + texts[a]->text + "' and '" + texts[b]->text + "'";
    }
  }
  return "";
}

}  // namespace

TEST_CASE("token_history tells visible, hidden, evicted, back and unknown apart", "[trace]") {
  const Trace trace = make_history_trace();
  const TokenHistory h = token_history(trace, 0, 5, 0, 0);
  REQUIRE(h.tokens == 6);
  REQUIRE(h.steps == 6);
  CHECK(h.heads_in_scope == 1);
  using S = TokenState;
  const std::vector<S> token0 = {S::Visible, S::Visible, S::Evicted,
                                 S::Hidden,  S::Unknown, S::Returned};
  for (int64_t t = 0; t < 6; ++t) CHECK(h.state(0, t) == token0[size_t(t)]);
  // Seen for the first time after being hidden is visible, not back; an eviction is against the
  // last step with rows (step 3), across the step without them.
  CHECK(h.state(1, 0) == S::Pending);
  CHECK(h.state(1, 1) == S::Hidden);
  CHECK(h.state(1, 2) == S::Hidden);
  CHECK(h.state(1, 3) == S::Visible);
  CHECK(h.state(1, 4) == S::Unknown);
  CHECK(h.state(1, 5) == S::Evicted);
  CHECK(h.state(3, 5) == S::Visible);  // seen at step 3, no rows at 4, seen again: not back
  CHECK(h.at(0, 4).unknown == 1);
  CHECK(token_story(h, 0) ==
        "visible 0-1, evicted at 2, hidden 2-3, no rows 4, back at 5, visible 5");
  CHECK(token_story(h, 1) == "hidden 1-2, visible 3, no rows 4, evicted at 5, hidden 5");
  CHECK(token_story(token_history(trace, 0, 2, 0, 0), 4) == "not read yet");

  // Both heads: counts per state, and the story in shares of heads.
  const TokenHistory both = token_history(trace, 0, 5, -1, -1);
  CHECK(both.heads_in_scope == 2);
  CHECK(both.at(0, 2).seen() == 1);
  CHECK(both.at(0, 2).evicted == 1);
  CHECK(both.at(0, 5).returned == 1);
  CHECK(both.at(0, 4).unknown == 2);
  CHECK(token_story(both, 0) ==
        "seen by all 2 heads 0-1, by some (1 of 2) 2-3, no rows 4, by all 2 heads 5");
  CHECK(token_state_name(S::Returned) == std::string("back"));

  // Out of range: the field is named.
  CHECK_THROWS_WITH(token_history(trace, 1, 5, 0, 0), Catch::Contains("run"));
  CHECK_THROWS_WITH(token_history(trace, 0, 6, 0, 0), Catch::Contains("step"));
  CHECK_THROWS_WITH(token_history(trace, 0, 5, 0, 2), Catch::Contains("head"));
  CHECK_THROWS_WITH(token_story(h, 6), Catch::Contains("token"));
}

TEST_CASE("token_history agrees with the retention counts at every step", "[trace]") {
  const Trace trace = test::make_small_trace(5);
  for (const int64_t layer : {-1, 1}) {
    const TokenHistory h = token_history(trace, 1, 4, layer, -1);
    for (int64_t t = 0; t < 5; ++t) {
      const RetentionCounts counts = retention_counts(trace, 1, t, layer, -1);
      for (int64_t j = 0; j <= t; ++j) CHECK(h.at(j, t).seen() == counts.seen_by[size_t(j)]);
    }
  }
}

TEST_CASE("the history view shows each run's tokens x steps by state", "[viz]") {
  const Trace trace = make_history_trace();
  CHECK(parse_view("history") == ViewKind::History);
  CHECK(view_name(ViewKind::History) == std::string("history"));
  ViewOptions options;
  options.runs = {0};
  options.history_per_head = true;
  options.layer = 0;
  options.head = 0;
  for (const bool dark : {false, true}) {
    options.dark = dark;
    const View view = build_view(trace, ViewKind::History, options);
    const Theme& theme = dark ? dark_theme() : light_theme();
    // One pixel per (token, step); the four states' colours far apart on either theme.
    const std::vector<const ImageItem*> images = items_of<ImageItem>(view.figure);
    REQUIRE(images.size() == 1);
    const ImageItem& image = *images[0];
    REQUIRE(image.width == 6);
    REQUIRE(image.height == 6);
    auto pixel = [&](int64_t token, int64_t step) {
      return image.pixels[size_t(token * 6 + step)];
    };
    const std::vector<Color> states = {pixel(0, 0), pixel(0, 3), pixel(0, 2), pixel(0, 5)};
    for (size_t a = 0; a < states.size(); ++a) {
      CHECK(oklab_distance(states[a], theme.background) > 0.08);
      for (size_t b = a + 1; b < states.size(); ++b)
        CHECK(oklab_distance(states[a], states[b]) > 0.12);
    }
    CHECK(pixel(0, 4).a == 0);          // no rows: transparent, hatched over
    CHECK(pixel(5, 0) != pixel(0, 0));  // not read yet
    CHECK(has_text(view.figure, "evicted"));
    CHECK(has_text(view.figure, "back"));
    CHECK(has_text(view.figure, "no rows (memory budget)"));
  }
  options.dark = false;
  const View view = build_view(trace, ViewKind::History, options);
  // Hover: "history <run>" grids, a row per token and a column per step.
  const HoverGrid* grid = grid_with_id(view.figure, "history 0");
  REQUIRE(grid != nullptr);
  CHECK(grid->rows == 6);
  CHECK(grid->cols == 6);
  CHECK(grid->describe(0, 2).find("evicted") != std::string::npos);
  CHECK(grid->describe(0, 2).find("step 2") != std::string::npos);
  CHECK(grid->describe(0, 5).find("back") != std::string::npos);
  CHECK(grid->describe(0, 4).find("no rows") != std::string::npos);
  CHECK(grid->describe(2, 1).find("not read yet") != std::string::npos);
  // The step without rows is hatched (lines over its column).
  CHECK(items_of<LineItem>(view.figure).size() > 3);
  // The data: a row per (token, step) read, with the state's name.
  REQUIRE(view.data.rows.size() == 6 + 5 + 4 + 3 + 2 + 1);
  CHECK(view.data.columns[5] == "state");
  CHECK(std::get<std::string>(view.data.rows[2][5]) == "evicted");
  CHECK(std::get<double>(view.data.rows[2][4]) == 2.0);

  // A focused token: its story, and its row outlined in every panel.
  options.focus_token = 0;
  options.runs = {0, 0};
  const View focused = build_view(trace, ViewKind::History, options);
  CHECK(has_text(focused.figure, "visible 0-1, evicted at 2, hidden 2-3"));
  int64_t outlines = 0;
  for (const RectItem* r : items_of<RectItem>(focused.figure))
    outlines += r->stroke_width == 2.0f && r->stroke == light_theme().foreground;
  CHECK(outlines == 2);
  options.focus_token = 6;
  CHECK_THROWS_WITH(build_view(trace, ViewKind::History, options), Catch::Contains("focus_token"));
  options.focus_token = -1;

  // The retention scope: shares of heads, not states.
  options.history_per_head = false;
  options.runs = {0};
  const View shares = build_view(trace, ViewKind::History, options);
  const HoverGrid* shared = grid_with_id(shares.figure, "history 0");
  REQUIRE(shared != nullptr);
  CHECK(shared->describe(0, 2).find("seen by 1 of 2 heads") != std::string::npos);
  CHECK(shared->describe(0, 2).find("evicted by 1") != std::string::npos);
  CHECK(has_text(shares.figure, "share of heads"));
}

TEST_CASE("a long history pools its raster and keeps a one-step eviction visible", "[viz]") {
  // 1 layer x 1 head, 1100 tokens and steps; the head sees everything but token 5 at step 600.
  Trace trace;
  trace.model = {"long", 1, 1, 1, 4, 50};
  const int64_t n = 1100;
  for (int64_t i = 0; i < n; ++i) trace.tokens.push_back({1, "x"});
  trace.runs = {{"h2o", 0.5, {}, 0}};
  trace.top_k = 0;
  for (int64_t t = 0; t < n; ++t) {
    StepRecord r;
    r.columns = t + 1;
    r.decisions = {LayerDecision::Masked};
    r.kept_heads = {0};
    r.visible.assign(size_t(t + 1), 1);
    if (t == 600) r.visible[5] = 0;
    r.logits.assign(size_t(t + 1), 0.0f);
    r.scores.assign(size_t(t + 1), 0.0f);
    r.visible_counts = {int32_t(t + 1 - (t == 600))};
    std::vector<StepRecord> records;
    records.push_back(std::move(r));
    trace.add_step(std::move(records));
  }
  ViewOptions options;
  options.history_per_head = true;
  options.with_data = false;
  const View view = build_view(trace, ViewKind::History, options);
  const std::vector<const ImageItem*> images = items_of<ImageItem>(view.figure);
  REQUIRE(images.size() == 1);
  const ImageItem& image = *images[0];
  CHECK(image.width == 550);  // 2 x 2 cells a pixel
  CHECK(image.height == 550);
  auto pixel = [&](int64_t y, int64_t x) { return image.pixels[size_t(y * image.width + x)]; };
  CHECK(pixel(2, 300) != pixel(2, 200));  // steps 600-601 of tokens 4-5: the eviction shows
  CHECK(pixel(2, 301) == pixel(2, 200));  // then visible again
  CHECK(pixel(0, 549) == pixel(2, 200));
  // Hover stays per cell.
  const HoverGrid* grid = grid_with_id(view.figure, "history 0");
  REQUIRE(grid != nullptr);
  CHECK(grid->describe(5, 600).find("evicted") != std::string::npos);
  CHECK(grid->describe(5, 601).find("back") != std::string::npos);
}

TEST_CASE("searched tokens are marked in the history, retention and predicted views", "[viz]") {
  const Trace trace = test::make_small_trace(5);
  ViewOptions options;
  options.runs = {1};
  options.layer = 1;
  auto accent_frames = [](const View& view, float width) {
    int64_t n = 0;
    for (const RectItem* r : items_of<RectItem>(view.figure))
      n += r->stroke == light_theme().accent && r->stroke_width == width && r->fill.a == 0;
    return n;
  };
  auto foreground_frames = [](const View& view) {
    int64_t n = 0;
    for (const RectItem* r : items_of<RectItem>(view.figure))
      n += r->stroke == light_theme().foreground && r->stroke_width == 2.0f;
    return n;
  };
  const View plain_history = build_view(trace, ViewKind::History, options);
  const View plain_retention = build_view(trace, ViewKind::Retention, options);
  const View plain_predicted = build_view(trace, ViewKind::Predicted, options);
  options.highlight_tokens = {2, 3};
  CHECK(accent_frames(build_view(trace, ViewKind::History, options), 1.5f) ==
        accent_frames(plain_history, 1.5f) + 2);
  const View retention = build_view(trace, ViewKind::Retention, options);
  CHECK(foreground_frames(retention) == foreground_frames(plain_retention) + 2);
  CHECK(has_text(retention.figure, "the searched tokens"));
  CHECK_FALSE(has_text(plain_retention.figure, "the searched tokens"));
  // Two maps per run frame each searched column.
  CHECK(accent_frames(build_view(trace, ViewKind::Predicted, options), 1.5f) ==
        accent_frames(plain_predicted, 1.5f) + 4);
}

TEST_CASE("the retention view's token cells name their run and token for a click", "[viz]") {
  const Trace trace = test::make_small_trace(5);
  ViewOptions options;
  options.runs = {1, 0};  // A - B with A the sparse run, B dense: any two runs compare
  const View view = build_view(trace, ViewKind::Retention, options);
  CHECK(grid_with_id(view.figure, "token 1:3") != nullptr);
  CHECK(grid_with_id(view.figure, "token 0:3") != nullptr);
  CHECK(grid_with_id(view.figure, "token 3") == nullptr);
  CHECK(has_text(view.figure, "A \u2212 B"));
  // Token 1 at step 4: h2o's layer 1 hides it from head 2 ((1 + h) % 2 != 0) and shows it to
  // head 3: A sees it with 3 of 4 heads, dense with 4: A - B = -0.25.
  const auto& row = view.data.rows[1];
  CHECK(std::get<double>(row[row.size() - 2]) == Approx(-0.25));
}

TEST_CASE("the predicted view leaves out runs without scores and sums up each layer", "[viz]") {
  const Trace trace = test::make_small_trace(5);
  ViewOptions options;
  options.layer = 1;
  options.runs = {0};
  const View none = build_view(trace, ViewKind::Predicted, options);
  CHECK(has_text(none.figure, "No shown run ranks tokens"));
  CHECK(has_text(none.figure, "h2o s=0.5 (run 1)"));
  CHECK(none.figure.hover.empty());

  options.runs = {0, 1};
  const View view = build_view(trace, ViewKind::Predicted, options);
  CHECK(has_text(view.figure, "not shown (no policy scores): dense"));
  CHECK_FALSE(has_text(view.figure, "dense layer"));
  CHECK(has_text(view.figure, "mean top-50% hit rate per layer"));
  CHECK(has_text(view.figure, "mean Spearman per layer"));
  // The hit-rate grid's axes.
  CHECK(has_text(view.figure, "head \u2192"));
  bool layer_axis = false;
  for (const TextItem* t : items_of<TextItem>(view.figure))
    layer_axis = layer_axis || (t->text == "layer" && t->rotation == 90.0f);
  CHECK(layer_axis);
  // The predicted map is not hatched where the head hid tokens; the true logits' map is.
  const std::vector<const ImageItem*> images = items_of<ImageItem>(view.figure);
  REQUIRE(images.size() >= 2);
  const HeadMatrix scores = head_matrix(trace, 1, 1, 0, HeadQuantity::Scores, 4);
  const ImageItem undimmed =
      heatmap(images[0]->box, scores.values, nullptr, scores.rows, scores.cols,
              ValueScale::fitted(scores.values), sequential_colormap(), light_theme(), 512);
  CHECK(images[0]->pixels == undimmed.pixels);
  const HeadMatrix logits = head_matrix(trace, 1, 1, 0, HeadQuantity::Logits, 4);
  const ImageItem logits_undimmed =
      heatmap(images[1]->box, logits.values, nullptr, logits.rows, logits.cols,
              ValueScale::fitted(logits.values), sequential_colormap(), light_theme(), 512);
  CHECK(images[1]->pixels != logits_undimmed.pixels);

  // At a layer the policy leaves dense: no empty maps, a line naming the layers with scores,
  // and the grid to pick one of their heads.
  options.layer = 0;
  options.runs = {1};
  const View dense_layer = build_view(trace, ViewKind::Predicted, options);
  CHECK(items_of<ImageItem>(dense_layer.figure).size() == 1);  // the grid's colour bar only
  CHECK(has_text(dense_layer.figure, "No scores at layer 0"));
  CHECK(has_text(dense_layer.figure, "Layers with scores: 1."));
  CHECK(grid_with_id(dense_layer.figure, "hit rate grid") != nullptr);
  REQUIRE(dense_layer.data.rows.size() == 5);  // the head's row at step 4: logits, no scores
  CHECK(std::isnan(std::get<double>(dense_layer.data.rows[2][6])));
  CHECK(std::get<double>(dense_layer.data.rows[2][7]) == Approx(2 * 0.5 - 2 * 0.25));
}

TEST_CASE("step axes have integer ticks only", "[viz]") {
  const Trace trace = test::make_small_trace(5);  // steps 0-4: round ticks would be 0.5 apart
  ViewOptions options;
  options.runs = {0, 1};
  for (const ViewKind kind : {ViewKind::Logits, ViewKind::History}) {
    const View view = build_view(trace, kind, options);
    INFO(view_name(kind));
    for (const std::string fraction : {"0.5", "1.5", "2.5", "3.5"}) {
      for (const TextItem* t : items_of<TextItem>(view.figure)) CHECK(t->text != fraction);
    }
    CHECK(has_text(view.figure, "step"));
  }
}

TEST_CASE("no labels collide in the views at 950 and 1600 units", "[viz]") {
  const Trace trace = test::make_small_trace(5);
  Trace butler = trace;
  butler.runs[1].policy = "tokenbutler";
  for (const float width : {950.0f, 1600.0f}) {
    for (const ViewKind kind :
         {ViewKind::Predicted, ViewKind::Consensus, ViewKind::Logits, ViewKind::History}) {
      for (const std::vector<int64_t>& runs : {std::vector<int64_t>{1}, {0, 1}, {0, 1, 1, 0}}) {
        ViewOptions options;
        options.runs = runs;
        options.layer = 1;
        options.width = width;
        options.focus_token = kind == ViewKind::History ? 2 : -1;
        const View view = build_view(butler, kind, options);
        INFO(view_name(kind) << " at " << width << " with " << runs.size() << " runs");
        CHECK(colliding_texts(view.figure) == "");
        for (const TextItem* t : items_of<TextItem>(view.figure)) {
          if (t->rotation != 0) continue;
          const Box b = text_box(*t);
          INFO("'" << t->text << "'");
          CHECK(b.right() <= width);
        }
      }
    }
  }
}
