// The retention view: the text with each token shaded by the fraction of the heads in scope (the
// chosen layer / head, or all of them) that see it at the current step, on the sequential map
// from 0 to 1; tokens no head sees are struck through. A fraction, not "seen by any head": with
// every head in scope at 50% nearly every token is seen by some head under every policy, so a
// seen / not seen reading tells runs apart only at one head. With two runs the text first shows
// their difference (fraction under A minus fraction under B on the diverging map: A's end orange
// blue, equal fractions neutral) for any two runs, then each run's own text; with one, three or
// four runs each run's own text. Hover gives every run's count and fraction. Each token chip's
// hover grid has the id "token R:T" (R: the run's index in the trace, A's in the difference; T:
// the token's position), for a click to open that token's history; searched tokens
// (ViewOptions::highlight_tokens) are outlined and marked above.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>

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

// "+0.25", "-1", "0": a difference of fractions with its sign.
std::string signed_value(double value) {
  if (std::isnan(value)) return "-";
  if (value == 0.0) return "0";
  char text[32];
  std::snprintf(text, sizeof text, "%+.3g", value);
  return text;
}

struct Chip {
  Color background{0, 0, 0, 0};
  Color color;
  bool strike = false;
};

// The text from y on, one chip per token styled by style(j), wrapped at the figure's width, the
// answer tokens boxed, the step's token underlined and the highlighted ones outlined and marked;
// chip j's hover id is "token <run>:<j>". Returns the y below the last line.
float token_flow(Figure& f, const Trace& trace, int64_t step, float y, const Theme& theme,
                 const std::function<Chip(size_t)>& style, const std::vector<std::string>& hovers,
                 int64_t run, const std::vector<int64_t>& highlight) {
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
    if (std::find(highlight.begin(), highlight.end(), int64_t(j)) != highlight.end()) {
      // (a search hit: a heavier frame than the answer's and a bar above, seen in a long text)
      f.rect({x - 1, y - size - 4, w + 2, size + 10}, {0, 0, 0, 0}, theme.foreground, 2.0f);
      f.rect({x - 1, y - size - 8, w + 2, 3}, theme.accent);
    }
    f.hover.push_back({{x, y - size - 2, w, line_h},
                       1,
                       1,
                       "token " + std::to_string(run) + ":" + std::to_string(j),
                       [hover = hovers[j]](int64_t, int64_t) { return hover; },
                       "token " + std::to_string(j)});
    x += w + 2;
    if (trace.tokens[j].text.find('\n') != std::string::npos) x = left, y += line_h;
  }
  return y + line_h;
}

// A legend line's piece of text from x on (baseline y); returns the x after it.
float legend_text(Figure& f, float x, float y, const std::string& text, Color color,
                  bool bold = false) {
  f.text({x, y}, text, 11, color, HAlign::Left, VAlign::Baseline, bold);
  return x + text_width(text, 11) + 8;
}

// inline_colorbar's "lo [bar] hi" from x on (baseline y); returns the x after it.
float legend_bar(Figure& f, float x, float y, double lo, double hi, const Colormap& map,
                 const Theme& theme) {
  const float right =
      x + text_width(format_value(lo), 10) + 4 + 56 + 4 + text_width(format_value(hi), 10);
  inline_colorbar(f, {right, y}, lo, hi, map, theme);
  return right + 10;
}

}  // namespace

View retention_view(const Trace& trace, const ViewOptions& options, int64_t step) {
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  const size_t n = options.runs.size();
  const bool diff = n == 2;
  std::vector<RetentionCounts> counts;
  for (const int64_t run : options.runs) {
    counts.push_back(
        retention_counts(trace, run, step, options.retention_layer, options.retention_head));
  }
  // (the scope is the same for every run: so is its head count)
  const int32_t heads = counts[0].heads_in_scope;
  const std::string heads_text = std::to_string(heads) + (heads == 1 ? " head" : " heads");
  // The heads in scope that can see token j (it is in their sliding window, or they have none).
  auto can_see = [&](size_t r, size_t j) { return heads - counts[r].outside_window_of[j]; };
  // A token before the window of every head in scope: no candidate anywhere in it.
  auto outside = [&](size_t r, size_t j) {
    return counts[r].seen_by[j] >= 0 && heads > 0 && can_see(r, j) == 0;
  };
  // Run r's fraction of the heads in scope that see token j, over those that can (a sliding
  // window's keys before it are nobody's choice); NaN before the step reads it or where none can.
  auto fraction = [&](size_t r, size_t j) {
    const int32_t seen = counts[r].seen_by[j];
    if (seen < 0 || outside(r, j)) return std::numeric_limits<double>::quiet_NaN();
    return heads > 0 ? double(seen) / double(can_see(r, j)) : 0.0;
  };
  bool windowed = false, any_window = false;  // a token outside every window; outside some
  for (const RetentionCounts& c : counts)
    for (const int32_t n_outside : c.outside_window_of) any_window = any_window || n_outside > 0;
  for (size_t r = 0; r < counts.size(); ++r)
    for (size_t j = 0; j < trace.tokens.size() && !windowed; ++j) windowed = outside(r, j);
  const OutsideStyle outside_style = outside_window_style(theme);
  const Chip outside_chip{outside_style.fill, theme.muted, false};
  std::vector<std::string> titles;
  for (const int64_t run : options.runs) titles.push_back(run_title(trace, run));

  const std::string scope = scope_text(options) + " (" + heads_text + ")";
  const float top = title_block(
      f, "Retention at step " + std::to_string(step),
      diff ? "how many more of " + scope + " see each token under " + titles[0] +
                 " (A) than under " + titles[1] + " (B), then each run's own text"
      : n == 1 ? "tokens shaded by the fraction of " + scope + " that see them under " + titles[0]
               : "each run's text shaded by the fraction of " + scope + " that see a token",
      theme);

  // Legend: the difference's map (two runs) and the fraction's, their bars in one column.
  float y = top + 14;
  const std::string diff_label = "A \u2212 B, the difference of the fractions:";
  const std::string fraction_label =
      std::string(diff ? "each run's text: " : "") +
      "the fraction of the heads in scope that see the token" +
      (any_window ? " (of those whose sliding window holds it):" : ":");
  const float bars =
      16 + std::max(diff ? text_width(diff_label, 11) : 0.0f, text_width(fraction_label, 11)) + 8;
  if (diff) {
    legend_text(f, 16, y, diff_label, theme.foreground);
    // (the bar's ends say which run sees more; the labels stay the text colour whichever
    // policies A and B are)
    float x = legend_text(f, bars, y, "B sees more", theme.foreground, true);
    x = legend_bar(f, x, y, -1.0, 1.0, diverging_colormap(), theme);
    x = legend_text(f, x, y, "A sees more", theme.foreground, true);
    // (at narrow widths the gloss goes to a line of its own rather than off the canvas)
    const std::string neutral = "neutral: the same share of heads in both";
    if (x + 8 + text_width(neutral, 11) > options.width - 16) x = bars - 8, y += 18;
    legend_text(f, x + 8, y, neutral, theme.muted);
    y += 22;
  }
  {
    legend_text(f, 16, y, fraction_label, theme.foreground);
    // (under the difference's bar when there is one)
    float x = diff ? bars + text_width("B sees more", 11) + 8 : bars;
    x = legend_bar(f, x, y, 0.0, 1.0, sequential_colormap(), theme);
    legend_text(f, x + 8, y,
                std::string("struck through: seen by no head") + (diff ? " (in either run)" : ""),
                theme.muted);
  }
  if (windowed) {
    y += 22;
    f.rect({16, y - 10, 24, 14}, outside_style.fill, theme.grid);
    legend_text(f, 46, y,
                "outside the sliding window of every head in scope (no candidate: not the "
                "policy's choice)",
                theme.muted);
  }
  bool any_weighted = false;
  for (size_t r = 0; r < n; ++r) any_weighted = any_weighted || !counts[r].sampled_by.empty();
  if (any_weighted) {
    y += 22;
    legend_text(f, 16, y,
                "sampled: seen through an LSH sample with importance weight 1/p > 1 (magicpig); "
                "the hover gives how many heads sampled a token and their mean weight",
                theme.muted);
  }
  y += 34;
  bool known = true;
  for (const RetentionCounts& c : counts) known = known && c.known;
  if (!known) {
    f.text({16, y},
           "Some heads in scope have no rows at this step (memory budget): the fractions are "
           "lower bounds.",
           11, theme.accent);
    y += 20;
  }

  // The data and the hover text: every run's count and fraction per token (and A - B).
  view.data.columns = {"token", "text"};
  // A run that weighted its sample (magicpig) also has, per token, the heads that sampled it and
  // their mean importance weight 1 / p (the engine's retention_counts).
  auto weighted = [&](size_t r) { return !counts[r].sampled_by.empty(); };
  for (size_t r = 0; r < n; ++r) {
    view.data.columns.push_back(titles[r] + " heads");
    view.data.columns.push_back(titles[r] + " fraction");
    if (weighted(r)) {
      view.data.columns.push_back(titles[r] + " sampled heads");
      view.data.columns.push_back(titles[r] + " mean weight");
    }
  }
  if (diff) view.data.columns.push_back("fraction A - B");
  view.data.columns.push_back("heads in scope");
  std::vector<std::string> hovers;
  for (size_t j = 0; j < trace.tokens.size(); ++j) {
    std::vector<std::variant<double, std::string>> row{double(j), trace.tokens[j].text};
    std::string hover =
        "token " + std::to_string(j) + " '" + token_label(trace.tokens[j].text, 30) + "'";
    for (size_t r = 0; r < n; ++r) {
      const int32_t seen = counts[r].seen_by[j];
      row.push_back(seen < 0 ? std::numeric_limits<double>::quiet_NaN() : double(seen));
      row.push_back(fraction(r, j));
      const int32_t away = seen < 0 ? 0 : counts[r].outside_window_of[j];
      hover +=
          "\n" + std::string(diff ? (r == 0 ? "A " : "B ") : "") + titles[r] + ": " +
          (seen < 0        ? std::string("not read yet")
           : outside(r, j) ? std::string("outside the sliding window of every head")
                           : "seen by " + std::to_string(seen) + " of " + heads_text +
                                 (away > 0 ? " (" + std::to_string(away) + " outside their window)"
                                           : std::string()) +
                                 " (" + format_value(fraction(r, j)) + ")");
      if (weighted(r)) {
        const int32_t sampled = seen < 0 ? 0 : counts[r].sampled_by[j];
        row.push_back(seen < 0 ? std::numeric_limits<double>::quiet_NaN() : double(sampled));
        row.push_back(counts[r].mean_weight[j]);
        if (sampled > 0)
          hover += "; sampled by " + std::to_string(sampled) + ", mean weight 1/p " +
                   format_value(counts[r].mean_weight[j]);
      }
    }
    if (diff) {
      const double d = fraction(0, j) - fraction(1, j);
      row.push_back(d);
      if (!std::isnan(d)) hover += "\nA \u2212 B: " + signed_value(d);
    }
    row.push_back(double(heads));
    view.data.rows.push_back(std::move(row));
    hovers.push_back(std::move(hover));
  }

  auto section = [&](const std::string& title, Color color) {
    f.text({16, y}, title, 13, color, HAlign::Left, VAlign::Baseline, true);
    y += 24;
  };
  if (diff) {
    section("A \u2212 B: " + titles[0] + " against " + titles[1], theme.foreground);
    y = token_flow(
        f, trace, step, y, theme,
        [&](size_t j) {
          const double a = fraction(0, j), b = fraction(1, j);
          if (outside(0, j) && outside(1, j)) return outside_chip;
          if (std::isnan(a) || std::isnan(b)) return Chip{{0, 0, 0, 0}, theme.muted, false};
          Chip chip;
          chip.strike = a == 0.0 && b == 0.0;
          // (A's end of the diverging map is its orange, B's its blue)
          if (!chip.strike) chip.background = diverging_colormap().at(0.5 + 0.5 * (a - b));
          chip.color = chip.strike ? theme.muted : text_on(chip.background, theme);
          return chip;
        },
        hovers, options.runs[0], options.highlight_tokens);
    y += 8;
  }
  for (size_t r = 0; r < n; ++r) {
    if (n > 1) {
      section((diff ? (r == 0 ? "A: " : "B: ") : "") + titles[r],
              run_color(trace, options.runs[r], theme));
    }
    y = token_flow(
        f, trace, step, y, theme,
        [&](size_t j) {
          const double a = fraction(r, j);
          if (outside(r, j)) return outside_chip;
          if (std::isnan(a)) return Chip{{0, 0, 0, 0}, theme.muted, false};
          Chip chip;
          chip.strike = counts[r].seen_by[j] == 0;
          if (!chip.strike) chip.background = sequential_colormap().at(a);
          chip.color = chip.strike ? theme.muted : text_on(chip.background, theme);
          return chip;
        },
        hovers, options.runs[r], options.highlight_tokens);
    y += 8;
  }
  if (trace.coref.present) {
    y += 4;
    f.text({16, y}, "boxed: the final mention's answer tokens ('" + trace.coref.answer + "')", 11,
           theme.muted);
  }
  if (!options.highlight_tokens.empty()) {
    y += 16;
    f.text({16, y}, "framed with a bar above: the searched tokens", 11, theme.muted);
  }
  f.height = y + 20;
  return view;
}

}  // namespace kvlens::viz
