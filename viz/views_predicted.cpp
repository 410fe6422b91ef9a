// The predicted-vs-true view, for the shown runs whose policy ranks tokens (a dense run has no
// scores: it is left out, named in one line): a per-layer summary (each run's mean top-50% hit
// rate and Spearman over the heads of each layer at this step), then per run, for the selected
// head, the policy's importance scores (a learned predictor's predicted logits, for tokenbutler;
// hidden tokens not hatched, the predictions being what one inspects) and the true logits over
// steps x tokens, a scatter of the two at the current step, and every head's top-50% hit rate on
// layer and head axes. Searched tokens (ViewOptions::highlight_tokens) are framed in the maps and
// ringed in the scatter.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <span>

#include "engine/policy/registry.h"
#include "engine/trace/step_metrics.h"
#include "viz/layout.h"
#include "viz/views.h"

namespace kvlens::viz {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The top-50% hit rate (POLICIES.md, the TokenButler paper's published predictor figure): of the
// true top 50% of the candidates by logit, the share the scores also rank in their top 50%.
double hit_rate(std::span<const float> scores, std::span<const float> logits) {
  if (scores.empty() || scores.size() != logits.size()) return kNaN;
  return recall(top_half(scores), top_half(logits));
}

// Every (layer, head)'s hit rate at a step, [layers][heads]: NaN where the row was not kept or
// the policy chose no set at the layer (a dense layer has no scores), as head_accuracy_grid.
std::vector<double> head_hit_rate_grid(const Trace& trace, int64_t run, int64_t step) {
  const StepRecord& record = trace.steps()[size_t(step)][size_t(run)];
  const int64_t L = trace.model.layers, H = trace.model.heads;
  const size_t cols = size_t(record.columns);
  std::vector<double> grid(size_t(L * H), kNaN);
  for (int64_t l = 0; l < L; ++l) {
    if (record.decisions[size_t(l)] != LayerDecision::Masked) continue;
    for (int64_t h = 0; h < H; ++h) {
      const float* logits = record.logits_row(l, h, H);
      const float* scores = record.scores_row(l, h, H);
      if (logits && scores) grid[size_t(l * H + h)] = hit_rate({scores, cols}, {logits, cols});
    }
  }
  return grid;
}

// True when the run's policy ranked tokens at some layer at this step: it has scores to compare.
bool has_scores(const Trace& trace, int64_t run, int64_t step) {
  const StepRecord& record = trace.steps()[size_t(step)][size_t(run)];
  return std::find(record.decisions.begin(), record.decisions.end(), LayerDecision::Masked) !=
         record.decisions.end();
}

// "2-7", "0, 3-5": the layers where the run's policy ranked tokens at this step.
std::string masked_layers(const Trace& trace, int64_t run, int64_t step) {
  const StepRecord& record = trace.steps()[size_t(step)][size_t(run)];
  std::string text;
  for (size_t l = 0; l < record.decisions.size();) {
    if (record.decisions[l] != LayerDecision::Masked) {
      ++l;
      continue;
    }
    size_t end = l;
    while (end + 1 < record.decisions.size() && record.decisions[end + 1] == LayerDecision::Masked)
      ++end;
    text += (text.empty() ? "" : ", ") + std::to_string(l) +
            (end > l ? "-" + std::to_string(end) : std::string());
    l = end + 1;
  }
  return text;
}

// Integer ticks over [0, last] (layers, steps), about `count` of them.
std::vector<double> integer_ticks(int64_t last, int count) {
  std::vector<double> ticks;
  for (const double v : nice_ticks(0.0, double(std::max<int64_t>(last, 1)), count)) {
    // (nice_ticks sums its step: 5 x 0.2 comes out a hair above 1)
    if (std::abs(v - std::round(v)) < 1e-6 && std::round(v) <= double(last) &&
        (ticks.empty() || std::round(v) > ticks.back()))
      ticks.push_back(std::round(v));
  }
  return ticks;
}

void map_panel(Figure& f, const Trace& trace, Box box, const HeadMatrix& m, bool dim_hidden,
               const std::string& what, const Theme& theme, const std::string& where,
               const std::vector<int64_t>& highlight) {
  // Keys outside a sliding window are drawn as such on both maps (a policy may keep scores for
  // them, but they are no candidates); hidden ones are hatched only where dim_hidden asks.
  std::vector<uint8_t> outside_only;
  if (!dim_hidden) {
    outside_only.resize(m.visible.size());
    for (size_t i = 0; i < m.visible.size(); ++i)
      outside_only[i] = m.visible[i] == kOutsideWindow ? kOutsideWindow : 1;
  }
  std::vector<float> shown_values = m.values;  // the scale over the candidates' values only
  for (size_t i = 0; i < shown_values.size(); ++i)
    if (m.visible[i] == kOutsideWindow) shown_values[i] = std::numeric_limits<float>::quiet_NaN();
  const ValueScale scale = ValueScale::fitted(shown_values);
  f.add(heatmap(box, m.values, dim_hidden ? &m.visible : &outside_only, m.rows, m.cols, scale,
                sequential_colormap(), theme, 512));
  f.rect(box, {0, 0, 0, 0}, theme.grid);
  f.text({box.x, box.y - 6}, what, 11, theme.foreground);
  f.text({box.x, box.bottom() + 14}, "tokens \u2192", 10, theme.muted);
  TextItem steps;
  steps.anchor = {box.x - 5, box.y};
  steps.text = "\u2190 steps";
  steps.size = 10;
  steps.color = theme.muted;
  steps.h = HAlign::Right;
  steps.rotation = 90.0f;
  f.add(std::move(steps));
  const bool any =
      std::any_of(m.values.begin(), m.values.end(), [](float v) { return std::isfinite(v); });
  if (!any) {
    f.text({box.x + box.w / 2, box.y + box.h / 2}, "no values at this layer", 11, theme.muted,
           HAlign::Center, VAlign::Middle);
    return;
  }
  const float column = box.w / float(std::max<int64_t>(m.cols, 1));
  for (const int64_t j : highlight) {
    if (j < 0 || j >= m.cols) continue;
    f.rect({box.x + float(j) * column, box.y, column, box.h}, {0, 0, 0, 0}, theme.accent, 1.5f);
  }
  // Each map has its own range: a small colour bar from its low to its high end.
  inline_colorbar(f, {box.right(), box.bottom() + 14}, scale.lo, scale.hi, sequential_colormap(),
                  theme);
  auto shared = std::make_shared<HeadMatrix>(m);
  const std::string label = where + ", " + what;
  f.hover.push_back({box, m.rows, m.cols, "predicted view: " + what,
                     [&trace, shared, label](int64_t r, int64_t c) {
                       std::string text =
                           label + "\nstep " + std::to_string(r) + ", token " + std::to_string(c);
                       if (c < int64_t(trace.tokens.size()))
                         text += " '" + token_label(trace.tokens[size_t(c)].text, 24) + "'";
                       if (c > r) return text;
                       const size_t at = size_t(r * shared->cols + c);
                       if (shared->visible[at] == kOutsideWindow)
                         return text + "\n(outside the sliding window: no candidate of this layer)";
                       return text + "\n" + format_value(shared->values[at]);
                     },
                     "predicted map"});
}

// One per-layer line chart of the summary: each run's value per layer, dots joined where known.
void layer_chart(Figure& f, const Trace& trace, Box plot, const std::vector<int64_t>& runs,
                 const std::vector<std::vector<double>>& values, double lo, double hi,
                 const std::string& title, int64_t selected_layer, const Theme& theme) {
  const int64_t L = trace.model.layers;
  axes(f, plot, integer_ticks(L - 1, std::max(2, int(plot.w / 40))), -0.5, double(L) - 0.5,
       nice_ticks(lo, hi, 2), lo, hi, "layer", "", theme);
  f.text({plot.x, plot.y - 6}, title, 11, theme.foreground);
  auto x_at = [&](int64_t l) { return plot.x + (float(l) + 0.5f) / float(L) * plot.w; };
  auto y_at = [&](double v) { return plot.bottom() - float((v - lo) / (hi - lo)) * plot.h; };
  f.line({x_at(selected_layer), plot.y}, {x_at(selected_layer), plot.bottom()}, theme.accent, 1.0f,
         true);
  for (size_t i = 0; i < runs.size(); ++i) {
    const Color color = run_color(trace, runs[i], theme);
    LineItem series;
    series.color = color;
    series.width = 1.5f;
    for (int64_t l = 0; l < L; ++l) {
      const double v = values[i][size_t(l)];
      if (std::isnan(v)) {
        if (series.points.size() >= 2) f.add(series);
        series.points.clear();
        continue;
      }
      const Point at{x_at(l), y_at(std::clamp(v, lo, hi))};
      series.points.push_back(at);
      f.add(CircleItem{at, 2.5f, color, {0, 0, 0, 0}});
    }
    if (series.points.size() >= 2) f.add(series);
  }
}

}  // namespace

View predicted_view(const Trace& trace, const ViewOptions& options, int64_t step) {
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  const int64_t L = trace.model.layers, H = trace.model.heads;
  // Only runs with scores: a dense run has none, and a row of empty maps says nothing.
  std::vector<int64_t> shown, left_out;
  for (const int64_t run : options.runs)
    (has_scores(trace, run, step) ? shown : left_out).push_back(run);
  // A learned predictor's scores are its predicted logits: named so wherever they are shown.
  size_t predictors = 0;
  for (const int64_t run : shown) predictors += run_predicts_logits(trace, run);
  const std::string compared = predictors == shown.size() ? "the predictor's logits"
                               : predictors > 0           ? "policy scores and a predictor's logits"
                                                          : "the policy's importance scores";
  const float top =
      title_block(f,
                  "Predicted vs true: layer " + std::to_string(options.layer) + ", head " +
                      std::to_string(options.head) + " at step " + std::to_string(step),
                  shown.empty() ? "policy scores against the true attention logits"
                                : compared + " against the true attention logits",
                  theme);
  view.data.columns = {"policy", "run",   "layer", "head",   "step",
                       "token",  "score", "logit", "visible"};
  float y = top + 16;
  std::string omitted;
  for (const int64_t run : left_out)
    omitted += (omitted.empty() ? "" : ", ") + run_title(trace, run);
  if (shown.empty()) {
    // One line saying which runs of the trace would have something to show.
    std::string would;
    for (int64_t run = 0; run < int64_t(trace.runs.size()); ++run) {
      if (has_scores(trace, run, step))
        would += (would.empty() ? "" : ", ") + run_title(trace, run) + " (run " +
                 std::to_string(run) + ")";
    }
    f.text({16, y + 10},
           "No shown run ranks tokens (" + omitted + "): " +
               (would.empty() ? std::string("no run of this trace has policy scores")
                              : "compare one with scores: " + would),
           12, theme.foreground);
    f.height = y + 40;
    return view;
  }
  if (!omitted.empty()) {
    f.text({16, y}, "not shown (no policy scores): " + omitted, 11, theme.muted);
    y += 16;
  }

  // The per-layer summary: each shown run's mean hit rate and Spearman over each layer's heads.
  std::vector<std::vector<double>> layer_hits, layer_spearman;
  for (const int64_t run : shown) {
    const std::vector<double> grid = head_hit_rate_grid(trace, run, step);
    std::vector<double> hits(size_t(L), kNaN), ranks(size_t(L), kNaN);
    for (int64_t l = 0; l < L; ++l) {
      double hit_sum = 0, rank_sum = 0;
      int64_t hit_n = 0, rank_n = 0;
      for (int64_t h = 0; h < H; ++h) {
        const double hit = grid[size_t(l * H + h)];
        if (std::isnan(hit)) continue;
        hit_sum += hit, ++hit_n;
        const double rho = predicted_vs_true(trace, run, step, l, h).spearman;
        if (!std::isnan(rho)) rank_sum += rho, ++rank_n;
      }
      if (hit_n) hits[size_t(l)] = hit_sum / double(hit_n);
      if (rank_n) ranks[size_t(l)] = rank_sum / double(rank_n);
    }
    layer_hits.push_back(std::move(hits));
    layer_spearman.push_back(std::move(ranks));
  }
  {
    y += 24;
    const float chart_gap = 90, chart_h = 90;
    const float chart_w = std::min(520.0f, (options.width - 60 - 16 - chart_gap) / 2);
    layer_chart(f, trace, {60, y, chart_w, chart_h}, shown, layer_hits, 0.0, 1.0,
                "mean top-50% hit rate per layer", options.layer, theme);
    layer_chart(f, trace, {60 + chart_w + chart_gap, y, chart_w, chart_h}, shown, layer_spearman,
                -1.0, 1.0, "mean Spearman per layer", options.layer, theme);
    y += chart_h + 52;
    // The charts' legend: the runs' colours, and what the dashed line and the rate are.
    float x = 60;
    for (const int64_t run : shown) {
      const std::string title = run_title(trace, run);
      f.line({x, y - 4}, {x + 16, y - 4}, run_color(trace, run, theme), 2.0f);
      f.text({x + 20, y}, title, 11, run_color(trace, run, theme), HAlign::Left, VAlign::Baseline,
             true);
      x += 20 + text_width(title, 11) + 16;
    }
    f.text({x, y}, "dashed: the selected layer", 10, theme.muted);
    y += 16;
    f.text({60, y},
           "top-50% hit rate: the share of the true top half of the tokens (by logit) also in "
           "the predicted top half; 0.5 is chance",
           10, theme.muted);
    y += 20;
  }

  const float margin = 40, gap = 36;
  const float panel = std::min(300.0f, (options.width - 2 * margin - 3 * gap) / 4.0f);
  for (const int64_t run : shown) {
    y += 16;
    const std::string where = run_title(trace, run) + ", L" + std::to_string(options.layer) + " H" +
                              std::to_string(options.head);
    const bool predicted = run_predicts_logits(trace, run);
    const std::string scores_name = predicted ? "predicted logits" : "policy scores";
    const Color color = run_color(trace, run, theme);
    f.text({margin, y}, run_title(trace, run), 13, color, HAlign::Left, VAlign::Baseline, true);
    const StepRecord& record = trace.steps()[size_t(step)][size_t(run)];
    // Where the policy did not rank tokens at the selected layer there is nothing to compare:
    // a line says so and the grid (a click there picks a head) stands alone.
    const bool ranked = record.decisions[size_t(options.layer)] == LayerDecision::Masked;
    y += 34;
    if (!ranked) {
      f.text({margin, y + 20},
             "No scores at layer " + std::to_string(options.layer) + ": the policy does not rank",
             12, theme.foreground);
      f.text({margin, y + 38},
             "tokens there. Layers with scores: " + masked_layers(trace, run, step) + ".", 12,
             theme.foreground);
      f.text({margin, y + 56}, "Pick one of their heads in the grid.", 12, theme.muted);
      // (the data still has the head's row: its logits and visible set, scores empty)
      const PredictedVsTrue p = predicted_vs_true(trace, run, step, options.layer, options.head);
      const uint8_t* shown_row = record.visible_row(options.layer, options.head, H);
      for (size_t j = 0; j < p.scores.size(); ++j) {
        view.data.rows.push_back({trace.runs[size_t(run)].policy, double(run),
                                  double(options.layer), double(options.head), double(step),
                                  double(j), double(p.scores[j]), double(p.logits[j]),
                                  double(shown_row && shown_row[j])});
      }
    }
    if (ranked) {
      const HeadMatrix scores =
          head_matrix(trace, run, options.layer, options.head, HeadQuantity::Scores, step);
      const HeadMatrix logits =
          head_matrix(trace, run, options.layer, options.head, HeadQuantity::Logits, step);
      map_panel(f, trace, {margin, y, panel, panel}, scores, false, scores_name, theme, where,
                options.highlight_tokens);
      map_panel(f, trace, {margin + panel + gap, y, panel, panel}, logits, true,
                "true logits (hidden hatched)", theme, where, options.highlight_tokens);
      if (has_keys_outside_window(trace, step)) {
        // The maps' third kind of cell, named once beside the run's title.
        const float after_title = margin + text_width(run_title(trace, run), 13) + 24;
        outside_window_swatch(f, {after_title, y - 48, 20, 10},
                              "outside the sliding window (no candidates of this layer)", theme);
      }

      // The scatter at this step.
      const PredictedVsTrue p = predicted_vs_true(trace, run, step, options.layer, options.head);
      const Box plot{margin + 2 * (panel + gap) + 20, y, panel - 20, panel};
      // The ranges padded by 5% so that the extreme points are drawn whole.
      ValueScale xs = ValueScale::fitted(p.logits), ys = ValueScale::fitted(p.scores);
      for (ValueScale* s : {&xs, &ys}) {
        const double pad = 0.05 * (s->hi - s->lo);
        s->lo -= pad, s->hi += pad;
      }
      axes(f, plot, nice_ticks(xs.lo, xs.hi, 4), xs.lo, xs.hi, nice_ticks(ys.lo, ys.hi, 4), ys.lo,
           ys.hi, "true logit", predicted ? "predicted logit" : "score", theme);
      const uint8_t* shown_row = record.visible_row(options.layer, options.head, H);
      int64_t points = 0;
      for (size_t j = 0; j < p.scores.size(); ++j) {
        const bool seen = shown_row && shown_row[j];
        view.data.rows.push_back({trace.runs[size_t(run)].policy, double(run),
                                  double(options.layer), double(options.head), double(step),
                                  double(j), double(p.scores[j]), double(p.logits[j]),
                                  double(seen)});
        if (!std::isfinite(p.scores[j]) || !std::isfinite(p.logits[j])) continue;
        CircleItem dot;
        dot.center = {plot.x + float(xs.normalise(p.logits[j])) * plot.w,
                      plot.bottom() - float(ys.normalise(p.scores[j])) * plot.h};
        dot.radius = 2.6f;
        dot.fill = seen ? color : Color{0, 0, 0, 0};
        dot.stroke = seen ? Color{0, 0, 0, 0} : theme.muted;
        f.add(dot);
        if (std::find(options.highlight_tokens.begin(), options.highlight_tokens.end(),
                      int64_t(j)) != options.highlight_tokens.end())
          f.add(CircleItem{dot.center, 5.5f, {0, 0, 0, 0}, theme.accent});
        ++points;
      }
      // (as p.accuracy: only where the policy chose a set at the layer); two lines, so that a
      // narrow panel holds them
      const double hits = std::isnan(p.accuracy) ? kNaN : hit_rate(p.scores, p.logits);
      f.text({plot.x, plot.y - 18},
             "Pearson " + format_value(p.pearson) + "  Spearman " + format_value(p.spearman), 10,
             theme.foreground);
      f.text({plot.x, plot.y - 6}, "top-50% hit rate " + format_value(hits), 10, theme.foreground);
      if (points == 0) {
        f.text({plot.x + plot.w / 2, plot.y + plot.h / 2}, "no scores at this layer", 11,
               theme.muted, HAlign::Center, VAlign::Middle);
      } else {  // the legend of the two kinds of points
        const float ly = plot.bottom() + 46;
        CircleItem seen_dot{{plot.x + 4, ly - 3}, 2.6f, color, {0, 0, 0, 0}};
        CircleItem hidden_dot{{plot.x + 44, ly - 3}, 2.6f, {0, 0, 0, 0}, theme.muted};
        f.add(seen_dot);
        f.text({plot.x + 10, ly}, "seen", 10, theme.muted);
        f.add(hidden_dot);
        f.text({plot.x + 50, ly}, "hidden", 10, theme.muted);
      }
    }

    // Every head's hit rate at this step, on layer (rows) and head (columns) axes.
    const std::vector<double> grid = head_hit_rate_grid(trace, run, step);
    // (beside the note where the maps are left out)
    const float gx = ranked ? margin + 3 * (panel + gap) + 22
                            : std::min(margin + 3 * (panel + gap) + 22, margin + 380.0f);
    const float cell = std::min((panel - 22) / float(H), (panel - 10) / float(L));
    f.text({gx - 22, y - 6}, "top-50% hit rate per head", 11, theme.foreground);
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t h = 0; h < H; ++h) {
        const double a = grid[size_t(l * H + h)];
        const Box box{gx + float(h) * cell, y + float(l) * cell, cell - 1, cell - 1};
        f.rect(box, std::isnan(a) ? theme.grid : sequential_colormap().at(a));
        if (l == options.layer && h == options.head) f.rect(box, {0, 0, 0, 0}, theme.accent, 2);
      }
    }
    // Axis labels every k cells so that 9-unit numbers never touch.
    const int64_t every = std::max<int64_t>(1, int64_t(std::ceil(12.0f / cell)));
    for (int64_t l = 0; l < L; l += every) {
      f.text({gx - 4, y + (float(l) + 0.5f) * cell}, std::to_string(l), 9, theme.muted,
             HAlign::Right, VAlign::Middle);
    }
    for (int64_t h = 0; h < H; h += every) {
      f.text({gx + (float(h) + 0.5f) * cell, y + float(L) * cell + 2}, std::to_string(h), 9,
             theme.muted, HAlign::Center, VAlign::Top);
    }
    TextItem layer_title;
    layer_title.anchor = {gx - 16, y + float(L) * cell / 2};
    layer_title.text = "layer";
    layer_title.size = 10;
    layer_title.color = theme.muted;
    layer_title.h = HAlign::Center;
    layer_title.rotation = 90.0f;
    f.add(std::move(layer_title));
    const float below = y + float(L) * cell + 24;
    f.text({gx, below}, "head \u2192", 10, theme.muted);
    f.text({gx, below + 14}, "grey: no scores", 9, theme.muted);
    inline_colorbar(f, {gx + float(H) * cell, below + 28}, 0.0, 1.0, sequential_colormap(), theme);
    auto shared_grid = std::make_shared<std::vector<double>>(grid);
    f.hover.push_back({{gx, y, cell * float(H), cell * float(L)},
                       L,
                       H,
                       "hit rate grid",
                       [shared_grid, H](int64_t r, int64_t c) {
                         return "L" + std::to_string(r) + " H" + std::to_string(c) +
                                "\ntop-50% hit rate " +
                                format_value((*shared_grid)[size_t(r * H + c)]);
                       },
                       "hit rate grid"});
    y += std::max(ranked ? panel + 54 : 0.0f, float(L) * cell + 60);
  }
  f.height = y + 8;
  return view;
}

}  // namespace kvlens::viz
