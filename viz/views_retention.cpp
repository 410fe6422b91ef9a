// The retention view: the text with each token coloured by how many heads (in the chosen layer /
// head scope) see it at the current step, tokens no head sees struck through; with two runs the
// three-colour diff (seen by both, only by A, only by B), with three or four each run's text.
#include <algorithm>
#include <cmath>
#include <functional>

#include "viz/layout.h"
#include "viz/views.h"

namespace kvlens::viz {
namespace {

// Readable text on a chip: dark on light backgrounds, light on dark ones.
Color text_on(Color background, const Theme& theme) {
  if (background.a == 0) return theme.foreground;
  return to_oklab(background).L > 0.62 ? Color{20, 20, 24, 255} : Color{250, 250, 252, 255};
}

std::string scope_text(const ViewOptions& o) {
  if (o.retention_layer < 0 && o.retention_head < 0) return "all heads";
  if (o.retention_head < 0) return "the heads of layer " + std::to_string(o.retention_layer);
  if (o.retention_layer < 0) return "head " + std::to_string(o.retention_head) + " of each layer";
  return "layer " + std::to_string(o.retention_layer) + ", head " +
         std::to_string(o.retention_head);
}

struct Chip {
  Color background{0, 0, 0, 0};
  Color color;
  bool strike = false;
};

// The text from y on, one chip per token styled by style(j), wrapped at the figure's width, the
// answer tokens boxed and the step's token underlined; returns the y below the last line.
float token_flow(Figure& f, const Trace& trace, int64_t step, float y, const Theme& theme,
                 const std::function<Chip(size_t)>& style, const std::vector<std::string>& hovers) {
  const float size = 13, line_h = 24, left = 16, right = f.width - 16;
  const int64_t answer_begin = trace.coref.present ? trace.coref.answer_token_begin : -1;
  const int64_t answer_end = trace.coref.present ? trace.coref.answer_token_end : -1;
  float x = left;
  for (size_t j = 0; j < trace.tokens.size(); ++j) {
    std::string label = token_label(trace.tokens[j].text, 40);
    if (label.empty()) label = "\u2205";
    const float w = text_width(label, size) + 6;
    if (x + w > right && x > left) x = left, y += line_h;
    const Chip chip = style(j);
    TextItem text;
    text.anchor = {x + 3, y};
    text.text = label;
    text.size = size;
    text.color = chip.color;
    text.background = chip.background;
    text.strike = chip.strike;
    f.add(std::move(text));
    if (int64_t(j) >= answer_begin && int64_t(j) < answer_end)
      f.rect({x, y - size - 3, w, size + 8}, {0, 0, 0, 0}, theme.accent, 1.5f);
    if (int64_t(j) == step) f.line({x, y + 5}, {x + w, y + 5}, theme.accent, 2.0f);
    f.hover.push_back({{x, y - size - 2, w, line_h},
                       1,
                       1,
                       "token " + std::to_string(j),
                       [hover = hovers[j]](int64_t, int64_t) { return hover; },
                       "token " + std::to_string(j)});
    x += w + 2;
    if (trace.tokens[j].text.find('\n') != std::string::npos) x = left, y += line_h;
  }
  return y + line_h;
}

}  // namespace

View retention_view(const Trace& trace, const ViewOptions& options, int64_t step) {
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  // Two runs: the diff. One, three or four: each run's text coloured by its head counts.
  const bool diff = options.runs.size() == 2;
  std::vector<RetentionCounts> counts;
  for (const int64_t run : options.runs) {
    counts.push_back(
        retention_counts(trace, run, step, options.retention_layer, options.retention_head));
  }
  const float top = title_block(
      f, "Retention at step " + std::to_string(step),
      diff ? "which tokens " + scope_text(options) + " see: " + run_title(trace, options.runs[0]) +
                 " (A) against " + run_title(trace, options.runs[1]) + " (B)"
           : "tokens coloured by how many of " + scope_text(options) + " (" +
                 std::to_string(counts[0].heads_in_scope) + ") see them" +
                 (options.runs.size() == 1 ? " under " + run_title(trace, options.runs[0]) : "") +
                 "; struck through: seen by none",
      theme);
  const Color both{120, 132, 150, 255};
  float y = top + 8;
  // Legend.
  if (diff) {
    float x = 16;
    for (const auto& [label, color] : std::vector<std::pair<std::string, Color>>{
             {"seen by both", both}, {"only A", run_color(0)}, {"only B", run_color(1)}}) {
      f.rect({x, y, 14, 14}, color);
      f.text({x + 20, y + 7}, label, 11, theme.foreground, HAlign::Left, VAlign::Middle);
      x += 40 + text_width(label, 11);
    }
    f.text({x, y + 7}, "struck through: seen by neither", 11, theme.muted, HAlign::Left,
           VAlign::Middle);
  } else {
    const std::string label = "heads that see the token:";
    const double most = counts[0].heads_in_scope;
    f.text({16, y + 11}, label, 11, theme.foreground);
    inline_colorbar(f,
                    {16 + text_width(label, 11) + 8 + text_width(format_value(0), 10) + 64 +
                         text_width(format_value(most), 10),
                     y + 11},
                    0, most, sequential_colormap(), theme);
  }
  y += 44;
  bool known = true;
  for (const RetentionCounts& c : counts) known = known && c.known;
  if (!known) {
    f.text({16, y},
           "Some heads in scope have no rows at this step (memory budget): counts are lower "
           "bounds.",
           11, theme.accent);
    y += 20;
  }

  // The data and the hover text: every run's count per token.
  view.data.columns = {"token", "text"};
  for (const int64_t run : options.runs) view.data.columns.push_back(run_title(trace, run));
  std::vector<std::string> hovers;
  for (size_t j = 0; j < trace.tokens.size(); ++j) {
    std::vector<std::variant<double, std::string>> row{double(j), trace.tokens[j].text};
    std::string hover =
        "token " + std::to_string(j) + " '" + token_label(trace.tokens[j].text, 30) + "'";
    for (size_t r = 0; r < counts.size(); ++r) {
      const int32_t seen = counts[r].seen_by[j];
      row.push_back(seen < 0 ? std::numeric_limits<double>::quiet_NaN() : double(seen));
      hover += "\n" + run_title(trace, options.runs[r]) + ": " +
               (seen < 0 ? std::string("not read yet")
                         : "seen by " + std::to_string(seen) + " of " +
                               std::to_string(counts[r].heads_in_scope));
    }
    view.data.rows.push_back(std::move(row));
    hovers.push_back(std::move(hover));
  }

  if (diff) {
    y = token_flow(
        f, trace, step, y, theme,
        [&](size_t j) {
          Chip chip;
          const int32_t a = counts[0].seen_by[j], b = counts[1].seen_by[j];
          if (a < 0) return Chip{{0, 0, 0, 0}, theme.muted, false};  // not yet read at this step
          const bool sa = a > 0, sb = b > 0;
          chip.background = sa && sb ? both
                            : sa     ? run_color(0)
                            : sb     ? run_color(1)
                                     : Color{0, 0, 0, 0};
          chip.strike = !sa && !sb;
          chip.color = text_on(chip.background, theme);
          return chip;
        },
        hovers);
  } else {
    for (size_t r = 0; r < counts.size(); ++r) {
      if (counts.size() > 1) {
        f.text({16, y}, run_title(trace, options.runs[r]), 13, run_color(int64_t(r)), HAlign::Left,
               VAlign::Baseline, true);
        y += 24;
      }
      const RetentionCounts& c = counts[r];
      y = token_flow(
          f, trace, step, y, theme,
          [&](size_t j) {
            const int32_t a = c.seen_by[j];
            if (a < 0) return Chip{{0, 0, 0, 0}, theme.muted, false};
            const double fraction =
                c.heads_in_scope > 0 ? double(a) / double(c.heads_in_scope) : 0.0;
            Chip chip;
            chip.background = a > 0 ? sequential_colormap().at(fraction) : Color{0, 0, 0, 0};
            chip.strike = a == 0;
            chip.color = a == 0 ? theme.muted : text_on(chip.background, theme);
            return chip;
          },
          hovers);
      y += 8;
    }
  }
  if (trace.coref.present) {
    y += 4;
    f.text({16, y}, "boxed: the final mention's answer tokens ('" + trace.coref.answer + "')", 11,
           theme.muted);
  }
  f.height = y + 20;
  return view;
}

}  // namespace kvlens::viz
