// The predicted-vs-true view: for the selected head, the policy's importance scores (a learned
// predictor's predicted logits, for tokenbutler) and the true logits over steps x tokens side by
// side, a scatter of the two at the current step (Pearson, Spearman, top-50% hit rate), and every
// head's top-50% hit rate at this step.
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

void map_panel(Figure& f, const Trace& trace, Box box, const HeadMatrix& m, const std::string& what,
               const Theme& theme, const std::string& where) {
  const ValueScale scale = ValueScale::fitted(m.values);
  f.add(
      heatmap(box, m.values, &m.visible, m.rows, m.cols, scale, sequential_colormap(), theme, 512));
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
    f.text({box.x + box.w / 2, box.y + box.h / 2}, "no values (dense layer)", 11, theme.muted,
           HAlign::Center, VAlign::Middle);
    return;
  }
  // Each map has its own range: a small colour bar from its low to its high end.
  inline_colorbar(f, {box.right(), box.bottom() + 14}, scale.lo, scale.hi, sequential_colormap(),
                  theme);
  auto shared = std::make_shared<HeadMatrix>(m);
  const std::string label = where + ", " + what;
  f.hover.push_back(
      {box, m.rows, m.cols, "predicted view: " + what,
       [&trace, shared, label](int64_t r, int64_t c) {
         std::string text = label + "\nstep " + std::to_string(r) + ", token " + std::to_string(c);
         if (c < int64_t(trace.tokens.size()))
           text += " '" + token_label(trace.tokens[size_t(c)].text, 24) + "'";
         if (c > r) return text;
         return text + "\n" + format_value(shared->values[size_t(r * shared->cols + c)]);
       },
       "predicted map"});
}

}  // namespace

View predicted_view(const Trace& trace, const ViewOptions& options, int64_t step) {
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  const int64_t L = trace.model.layers, H = trace.model.heads;
  // A learned predictor's scores are its predicted logits: named so wherever they are shown.
  size_t predictors = 0;
  for (const int64_t run : options.runs) predictors += run_predicts_logits(trace, run);
  const std::string compared = predictors == options.runs.size() ? "the predictor's logits"
                               : predictors > 0 ? "policy scores and a predictor's logits"
                                                : "the policy's importance scores";
  const float top = title_block(
      f,
      "Predicted vs true: layer " + std::to_string(options.layer) + ", head " +
          std::to_string(options.head) + " at step " + std::to_string(step),
      compared +
          " against the true attention logits; top-50% hit rate: the share of the true top 50% "
          "of tokens also in the predicted top 50%",
      theme);
  const float margin = 40, gap = 36;
  const float panel = std::min(300.0f, (options.width - 2 * margin - 3 * gap) / 4.0f);
  view.data.columns = {"policy", "run",   "layer", "head",   "step",
                       "token",  "score", "logit", "visible"};
  float y = top + 26;
  for (size_t i = 0; i < options.runs.size(); ++i) {
    const int64_t run = options.runs[i];
    const std::string where = run_title(trace, run) + ", L" + std::to_string(options.layer) + " H" +
                              std::to_string(options.head);
    const bool predicted = run_predicts_logits(trace, run);
    const std::string scores_name = predicted ? "predicted logits" : "policy scores";
    f.text({margin, y}, run_title(trace, run), 13, run_color(trace, run, theme), HAlign::Left,
           VAlign::Baseline, true);
    y += 22;
    const HeadMatrix scores =
        head_matrix(trace, run, options.layer, options.head, HeadQuantity::Scores, step);
    const HeadMatrix logits =
        head_matrix(trace, run, options.layer, options.head, HeadQuantity::Logits, step);
    map_panel(f, trace, {margin, y, panel, panel}, scores, scores_name, theme, where);
    map_panel(f, trace, {margin + panel + gap, y, panel, panel}, logits, "true logits", theme,
              where);

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
    const StepRecord& record = trace.steps()[size_t(step)][size_t(run)];
    const uint8_t* shown = record.visible_row(options.layer, options.head, H);
    int64_t points = 0;
    for (size_t j = 0; j < p.scores.size(); ++j) {
      const bool seen = shown && shown[j];
      view.data.rows.push_back({trace.runs[size_t(run)].policy, double(run), double(options.layer),
                                double(options.head), double(step), double(j), double(p.scores[j]),
                                double(p.logits[j]), double(seen)});
      if (!std::isfinite(p.scores[j]) || !std::isfinite(p.logits[j])) continue;
      CircleItem dot;
      dot.center = {plot.x + float(xs.normalise(p.logits[j])) * plot.w,
                    plot.bottom() - float(ys.normalise(p.scores[j])) * plot.h};
      dot.radius = 2.6f;
      dot.fill = seen ? run_color(trace, run, theme) : Color{0, 0, 0, 0};
      dot.stroke = seen ? Color{0, 0, 0, 0} : theme.muted;
      f.add(dot);
      ++points;
    }
    // (as p.accuracy: only where the policy chose a set at the layer)
    const double hits = std::isnan(p.accuracy) ? kNaN : hit_rate(p.scores, p.logits);
    f.text({plot.x, plot.y - 6},
           "Pearson " + format_value(p.pearson) + "  Spearman " + format_value(p.spearman) +
               "  top-50% hit rate " + format_value(hits),
           10, theme.foreground);
    if (points == 0) {
      f.text({plot.x + plot.w / 2, plot.y + plot.h / 2}, "no scores at this layer (dense)", 11,
             theme.muted, HAlign::Center, VAlign::Middle);
    } else {  // the legend of the two kinds of points
      const float ly = plot.bottom() + 46;
      CircleItem seen_dot{{plot.x + 4, ly - 3}, 2.6f, run_color(trace, run, theme), {0, 0, 0, 0}};
      CircleItem hidden_dot{{plot.x + 64, ly - 3}, 2.6f, {0, 0, 0, 0}, theme.muted};
      f.add(seen_dot);
      f.text({plot.x + 10, ly}, "seen", 10, theme.muted);
      f.add(hidden_dot);
      f.text({plot.x + 70, ly}, "hidden (this step)", 10, theme.muted);
    }

    // Every head's hit rate at this step.
    const std::vector<double> grid = head_hit_rate_grid(trace, run, step);
    const float gx = margin + 3 * (panel + gap) + 10;
    const float cell = std::min((panel - 10) / float(H), (panel - 10) / float(L));
    f.text({gx, y - 6}, "top-50% hit rate per head", 11, theme.foreground);
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t h = 0; h < H; ++h) {
        const double a = grid[size_t(l * H + h)];
        const Box box{gx + float(h) * cell, y + float(l) * cell, cell - 1, cell - 1};
        f.rect(box, std::isnan(a) ? theme.grid : sequential_colormap().at(a));
        if (l == options.layer && h == options.head) f.rect(box, {0, 0, 0, 0}, theme.accent, 2);
      }
    }
    f.text({gx, y + float(L) * cell + 14}, "layers x heads; grey: no scores", 9, theme.muted);
    inline_colorbar(f, {gx + float(H) * cell, y + float(L) * cell + 14}, 0.0, 1.0,
                    sequential_colormap(), theme);
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
    y += panel + 62;
  }
  f.height = y;
  return view;
}

}  // namespace kvlens::viz
