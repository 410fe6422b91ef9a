// The logits view: the dense reference's and each run's next-token top-k at the current step
// (probabilities as bars, the true next token marked), KL against dense and the true token's rank
// under both, and a strip of the per-step KL and NLL over every step (a click picks a step); on a
// co-reference sample the steps predicting the answer are shaded and each run's predictions there
// marked right or wrong.
#include <algorithm>
#include <cmath>
#include <memory>

#include "viz/layout.h"
#include "viz/views.h"

#include "engine/policy/registry.h"

namespace kvlens::viz {
namespace {

int64_t dense_run(const Trace& trace) {
  for (size_t r = 0; r < trace.runs.size(); ++r)
    if (is_reference_policy(trace.runs[r].policy)) return int64_t(r);
  return -1;
}

// The k-th top token's text: from the record (recorded with a tokenizer), else from the text's
// own tokens, else its id.
std::string top_text(const Trace& trace, const StepRecord& record, size_t k) {
  if (k < record.top.texts.size()) return token_label(record.top.texts[k], 14);
  const int32_t id = record.top.ids[k];
  for (const TraceToken& t : trace.tokens)
    if (t.id == id) return token_label(t.text, 14);
  return "#" + std::to_string(id);
}

// One column of top-k bars; returns its height.
float top_k_bars(Figure& f, const Trace& trace, Box area, const StepRecord& record,
                 const std::string& title, Color color, int32_t true_token, const Theme& theme) {
  f.text({area.x, area.y}, title, 12, color, HAlign::Left, VAlign::Baseline, true);
  const float row_h = 18, label_w = 110;
  const float bar_w = area.w - label_w - 60;
  float y = area.y + 12;
  for (size_t k = 0; k < record.top.ids.size(); ++k) {
    const double p = std::exp(double(record.top.log_probs[k]));
    const bool truth = record.top.ids[k] == true_token;
    f.text({area.x + label_w - 6, y + row_h / 2}, top_text(trace, record, k), 11,
           truth ? theme.accent : theme.foreground, HAlign::Right, VAlign::Middle, truth);
    f.rect({area.x + label_w, y + 3, std::max(1.0f, float(p) * bar_w), row_h - 6}, color);
    f.text({area.x + label_w + float(p) * bar_w + 4, y + row_h / 2}, format_value(p), 10,
           theme.muted, HAlign::Left, VAlign::Middle);
    y += row_h;
  }
  return y - area.y;
}

}  // namespace

View logits_view(const Trace& trace, const ViewOptions& options, int64_t step) {
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  const int32_t true_token =
      step + 1 < int64_t(trace.tokens.size()) ? trace.tokens[size_t(step + 1)].id : -1;
  // On a co-reference sample, the steps that predict the final mention's answer tokens.
  const int64_t answer_first = trace.coref.present ? trace.coref.answer_token_begin - 1 : -1;
  const int64_t answer_last = trace.coref.present ? trace.coref.answer_token_end - 2 : -2;
  const bool answer_step = step >= answer_first && step <= answer_last;
  std::string subtitle =
      true_token >= 0 ? "true next token '" + token_label(trace.tokens[size_t(step + 1)].text, 14) +
                            "' (highlighted); bars: probability"
                      : "the text ends here: no true next token";
  if (answer_step) {
    subtitle += "; predicting answer token " + std::to_string(step - answer_first + 1) + " of " +
                std::to_string(answer_last - answer_first + 1) + " ('" + trace.coref.answer + "')";
  }
  const float top = title_block(f, "Next token at step " + std::to_string(step), subtitle, theme);
  const int64_t dense = dense_run(trace);
  std::vector<int64_t> columns;
  if (dense >= 0) columns.push_back(dense);
  for (const int64_t run : options.runs)
    if (run != dense) columns.push_back(run);
  const float margin = 20;
  const float col_w = (options.width - 2 * margin) / float(std::max<size_t>(columns.size(), 2));
  float tallest = 0;
  view.data.columns = {"policy", "run", "step", "rank", "token", "text", "probability"};
  for (size_t c = 0; c < columns.size(); ++c) {
    const int64_t run = columns[c];
    const StepRecord& record = trace.steps()[size_t(step)][size_t(run)];
    const auto found = std::find(options.runs.begin(), options.runs.end(), run);
    const Color color = found == options.runs.end() ? theme.muted : run_color(trace, run, theme);
    const Box area{margin + float(c) * col_w, top + 18, col_w - 16, 0};
    float h = top_k_bars(f, trace, area, record, run_title(trace, run), color, true_token, theme);
    const StepMetrics& m = record.metrics;
    std::string line =
        "true rank " + (m.true_rank < 0 ? std::string("-") : std::to_string(m.true_rank));
    if (run != dense) {
      line += "  (dense " +
              (m.dense_true_rank < 0 ? std::string("-") : std::to_string(m.dense_true_rank)) +
              ")  KL " + format_value(m.kl_vs_dense);
    }
    f.text({area.x, area.y + h + 14}, line, 11, theme.foreground);
    if (answer_step && true_token >= 0) {
      const bool right = record.argmax == true_token;
      f.text({area.x + text_width(line, 11) + 12, area.y + h + 14},
             right ? "answer token right" : "answer token wrong", 11,
             right ? theme.foreground : theme.accent, HAlign::Left, VAlign::Baseline, true);
    }
    tallest = std::max(tallest, h + 24);
    for (size_t k = 0; k < record.top.ids.size(); ++k) {
      view.data.rows.push_back({trace.runs[size_t(run)].policy, double(run), double(step),
                                double(k), double(record.top.ids[k]), top_text(trace, record, k),
                                std::exp(double(record.top.log_probs[k]))});
    }
  }

  // The step strip: KL against dense (or NLL where there is no dense run) of every step.
  const float strip_y = top + 18 + tallest + 40, strip_h = 120;
  const Box plot{margin + 50, strip_y, options.width - 2 * margin - 70, strip_h};
  const int64_t steps = trace.step_count();
  const bool use_kl = dense >= 0 && std::any_of(options.runs.begin(), options.runs.end(),
                                                [&](int64_t r) { return r != dense; });
  double hi = 0;
  for (const int64_t run : options.runs) {
    for (int64_t t = 0; t < steps; ++t) {
      const StepMetrics& m = trace.steps()[size_t(t)][size_t(run)].metrics;
      const double v = use_kl ? m.kl_vs_dense : m.nll;
      if (std::isfinite(v)) hi = std::max(hi, v);
    }
  }
  if (hi <= 0) hi = 1;
  axes(f, plot, nice_ticks(0, double(std::max<int64_t>(steps - 1, 1)), 8), 0,
       double(std::max<int64_t>(steps - 1, 1)), nice_ticks(0, hi, 3), 0, hi, "step",
       use_kl ? "KL vs dense" : "NLL", theme);
  auto x_at = [&](int64_t t) {
    return plot.x + float(t) / float(std::max<int64_t>(steps - 1, 1)) * plot.w;
  };
  if (answer_first >= 0 && answer_first < steps) {
    // The answer's steps shaded; each run's prediction there marked (dot: right, cross: wrong).
    const float x0 = x_at(answer_first) - 2, x1 = x_at(std::min(answer_last, steps - 1)) + 2;
    f.rect({x0, plot.y, x1 - x0, plot.h}, mix(theme.grid, theme.background, 0.5));
    f.text({x1, plot.y - 6}, "answer", 10, theme.muted, HAlign::Right);
    for (size_t i = 0; i < options.runs.size(); ++i) {
      const Color color = run_color(trace, options.runs[i], theme);
      for (const AnswerPrediction& a : answer_predictions(trace, options.runs[i])) {
        const Point at{x_at(a.position), plot.y + 8 + float(i) * 9};
        if (a.correct) {
          f.add(CircleItem{at, 3.0f, color, {0, 0, 0, 0}});
        } else {
          f.line({at.x - 3, at.y - 3}, {at.x + 3, at.y + 3}, color, 1.5f);
          f.line({at.x - 3, at.y + 3}, {at.x + 3, at.y - 3}, color, 1.5f);
        }
      }
    }
    const float lx = plot.right() - 160, ly = plot.bottom() + 30;
    f.add(CircleItem{{lx, ly - 3}, 3.0f, theme.foreground, {0, 0, 0, 0}});
    f.text({lx + 7, ly}, "answer token right", 10, theme.muted);
    f.line({lx + 110, ly - 6}, {lx + 116, ly}, theme.foreground, 1.5f);
    f.line({lx + 110, ly}, {lx + 116, ly - 6}, theme.foreground, 1.5f);
    f.text({lx + 121, ly}, "wrong", 10, theme.muted);
  }
  for (size_t i = 0; i < options.runs.size(); ++i) {
    const int64_t run = options.runs[i];
    if (use_kl && run == dense) continue;
    LineItem series;
    series.color = run_color(trace, run, theme);
    series.width = 1.5f;
    for (int64_t t = 0; t < steps; ++t) {
      const StepMetrics& m = trace.steps()[size_t(t)][size_t(run)].metrics;
      const double v = use_kl ? m.kl_vs_dense : m.nll;
      if (!std::isfinite(v)) {
        if (series.points.size() >= 2) f.add(series);
        series.points.clear();
        continue;
      }
      series.points.push_back({x_at(t), plot.bottom() - float(std::min(v, hi) / hi) * plot.h});
    }
    if (series.points.size() >= 2) f.add(series);
  }
  f.line({x_at(step), plot.y}, {x_at(step), plot.bottom()}, theme.accent, 1.5f, true);
  f.text({plot.x, plot.y - 6}, "per step (click to go to a step)", 10, theme.muted);
  f.hover.push_back({plot, 1, std::max<int64_t>(steps, 1), "steps",
                     [&trace, runs = options.runs, use_kl](int64_t, int64_t t) {
                       std::string text = "step " + std::to_string(t);
                       for (const int64_t run : runs) {
                         const StepMetrics& m = trace.steps()[size_t(t)][size_t(run)].metrics;
                         text += "\n" + run_title(trace, run) + ": " +
                                 (use_kl ? "KL " + format_value(m.kl_vs_dense) : "") + " NLL " +
                                 format_value(m.nll);
                       }
                       return text;
                     }});
  f.height = strip_y + strip_h + 44;
  return view;
}

}  // namespace kvlens::viz
