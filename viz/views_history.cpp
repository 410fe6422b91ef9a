// The history view: for each shown run, a raster of the text's tokens (rows, labelled with their
// text) by steps 0..the shown step (columns) telling when each token was visible, hidden, evicted
// or brought back, for the selected head (categorical colours) or the retention scope (the
// fraction of its heads that see the token). Steps without the head's rows (the memory budget)
// are hatched; a focused token's row is outlined and its story told; searched tokens are marked.
#include <algorithm>
#include <array>
#include <cmath>
#include <memory>

#include "engine/common/error.h"
#include "engine/trace/token_history.h"
#include "viz/layout.h"
#include "viz/views.h"

namespace kvlens::viz {
namespace {

// The states' colours: four hues apart in hue and lightness on either theme (blue, grey,
// vermillion, green of Okabe and Ito's set, lightened on the dark theme).
Color state_color(TokenState state, const Theme& theme) {
  switch (state) {
    case TokenState::Visible:
      return theme.dark ? Color{86, 180, 233, 255} : Color{0, 114, 178, 255};
    case TokenState::Hidden:
      return theme.dark ? Color{84, 87, 98, 255} : Color{200, 201, 208, 255};
    case TokenState::Evicted:
      return theme.dark ? Color{245, 130, 50, 255} : Color{213, 94, 0, 255};
    case TokenState::Returned:
      return theme.dark ? Color{60, 205, 150, 255} : Color{0, 158, 115, 255};
    case TokenState::Pending:
    case TokenState::Unknown:
      break;
  }
  return {0, 0, 0, 0};
}

// Integer ticks in [lo, hi], about `count` of them (steps have no fractions).
std::vector<int64_t> integer_ticks(int64_t lo, int64_t hi, int count) {
  std::vector<int64_t> ticks;
  for (const double v : nice_ticks(double(lo), double(hi), std::max(count, 2))) {
    // (nice_ticks sums its step: 5 x 0.2 comes out a hair above 1)
    const int64_t t = int64_t(std::llround(v));
    if (std::abs(v - double(t)) < 1e-6 && t >= lo && t <= hi && (ticks.empty() || t > ticks.back()))
      ticks.push_back(t);
  }
  if (ticks.empty()) ticks.push_back(lo);
  return ticks;
}

// Diagonal hatching over `box` (what no data looks like here, whatever the theme).
void hatch(Figure& f, Box box, const Theme& theme) {
  f.rect(box, theme.background);
  const float spacing = 5;
  // Lines y - box.y = (x - box.x) - c for c over the box's span, clipped to it.
  for (float c = -box.h; c < box.w; c += spacing) {
    const float x0 = std::max(box.x, box.x + c), x1 = std::min(box.right(), box.x + c + box.h);
    if (x1 <= x0) continue;
    f.line({x0, box.y + (x0 - box.x - c)}, {x1, box.y + (x1 - box.x - c)}, theme.muted, 0.7f);
  }
  f.rect(box, {0, 0, 0, 0}, theme.grid);
}

// Splits a story at its ", " into lines of at most `width` units at `size`; past `max_lines`
// the last line ends with "…".
std::vector<std::string> wrap_story(const std::string& story, float width, float size,
                                    size_t max_lines) {
  std::vector<std::string> lines{""};
  size_t at = 0;
  while (at < story.size()) {
    size_t end = story.find(", ", at);
    std::string part = story.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at = end == std::string::npos ? story.size() : end + 2;
    const std::string joined = lines.back().empty() ? part : lines.back() + ", " + part;
    if (text_width(joined, size) <= width || lines.back().empty()) {
      lines.back() = joined;
    } else if (lines.size() == max_lines) {
      lines.back() += ", \u2026";
      break;
    } else {
      lines.back() += ",";
      lines.push_back(part);
    }
  }
  return lines;
}

std::string scope_text(int64_t layer, int64_t head) {
  if (layer < 0 && head < 0) return "all heads";
  if (head < 0) return "the heads of layer " + std::to_string(layer);
  if (layer < 0) return "head " + std::to_string(head) + " of each layer";
  return "layer " + std::to_string(layer) + ", head " + std::to_string(head);
}

// A cell's hover text.
std::string describe_cell(const Trace& trace, const TokenHistory& h, const std::string& title,
                          int64_t token, int64_t step) {
  std::string text = "token " + std::to_string(token) + " '" +
                     token_label(trace.tokens[size_t(token)].text, 24) + "', step " +
                     std::to_string(step) + "\n" + title + ": ";
  if (h.pending(token, step)) return text + "not read yet";
  const TokenStepCounts& c = h.at(token, step);
  if (c.known() == 0) return text + "no rows kept at this step (memory budget)";
  if (h.heads_in_scope == 1) return text + token_state_name(h.state(token, step));
  text += "seen by " + std::to_string(c.seen()) + " of " + std::to_string(c.known()) +
          (c.unknown ? " heads with rows (" + std::to_string(c.unknown) + " without)"
                     : std::string(" heads")) +
          " (" + format_value(double(c.seen()) / double(c.known())) + ")";
  if (c.evicted) text += "\nevicted by " + std::to_string(c.evicted);
  if (c.returned) text += "\nback in " + std::to_string(c.returned);
  return text;
}

// At most this many pixels a side: a long text's raster pools cells rather than growing to
// tokens x steps pixels (the app uploads it as a texture).
constexpr int64_t kMaxHistoryPixels = 1024;

// The raster of a history: a pixel per (token, step), or per block of them past
// kMaxHistoryPixels, where a block shows its most telling state (evicted, back, visible, hidden,
// in that order: an event in one cell stays visible) or its cells' mean share of heads. Cells
// without rows are transparent (hatched over), tokens not read yet the canvas colour.
ImageItem history_image(const TokenHistory& h, Box box, bool one_head, Color pending_color,
                        const Theme& theme) {
  const int64_t block_t = (h.steps + kMaxHistoryPixels - 1) / kMaxHistoryPixels;
  const int64_t block_j = (h.tokens + kMaxHistoryPixels - 1) / kMaxHistoryPixels;
  ImageItem image;
  image.box = box;
  image.width = int32_t((h.steps + block_t - 1) / block_t);
  image.height = int32_t((h.tokens + block_j - 1) / block_j);
  image.pixels.assign(size_t(image.width) * size_t(image.height), Color{0, 0, 0, 0});
  constexpr TokenState kPriority[] = {TokenState::Evicted, TokenState::Returned,
                                      TokenState::Visible, TokenState::Hidden};
  for (int64_t py = 0; py < image.height; ++py) {
    for (int64_t px = 0; px < image.width; ++px) {
      bool read = false;
      int best = 4;  // index into kPriority; 4: none
      double share = 0;
      int64_t known = 0;
      for (int64_t j = py * block_j; j < std::min(h.tokens, (py + 1) * block_j); ++j) {
        for (int64_t t = px * block_t; t < std::min(h.steps, (px + 1) * block_t); ++t) {
          if (h.pending(j, t)) continue;
          read = true;
          const TokenStepCounts& c = h.at(j, t);
          if (c.known() == 0) continue;
          ++known;
          share += double(c.seen()) / double(c.known());
          const TokenState state = h.state(j, t);
          for (int k = 0; k < best; ++k)
            if (kPriority[k] == state) best = k;
        }
      }
      Color& pixel = image.pixels[size_t(py * image.width + px)];
      if (!read) {
        pixel = pending_color;
      } else if (known > 0) {
        pixel = one_head ? state_color(kPriority[best], theme)
                         : sequential_colormap().at(share / double(known));
      }
    }
  }
  return image;
}

}  // namespace

View history_view(const Trace& trace, const ViewOptions& options, int64_t step) {
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  const int64_t tokens = int64_t(trace.tokens.size());
  if (options.focus_token < -1 || options.focus_token >= tokens) {
    throw Error("view", "focus_token", "a token in [0, " + std::to_string(tokens) + ") or -1",
                std::to_string(options.focus_token));
  }
  const int64_t layer = options.history_per_head ? options.layer : options.retention_layer;
  const int64_t head = options.history_per_head ? options.head : options.retention_head;
  const size_t n = options.runs.size();
  std::vector<std::shared_ptr<const TokenHistory>> histories;
  std::vector<std::string> titles;
  for (const int64_t run : options.runs) {
    histories.push_back(
        std::make_shared<const TokenHistory>(token_history(trace, run, step, layer, head)));
    titles.push_back(run_title(trace, run));
  }
  const int32_t heads = histories[0]->heads_in_scope;
  const bool one_head = heads == 1;
  const std::string scope = scope_text(layer, head);
  const int64_t steps = step + 1;
  float y = title_block(f, "Token history to step " + std::to_string(step),
                        one_head ? scope + ": each token (row) at each step (column)"
                                 : "the share of " + scope + " (" + std::to_string(heads) +
                                       ") that see each token (row) at each step (column)",
                        theme);

  // Legend: the states (one head) or the fraction's bar, then blank and hatched cells.
  y += 16;
  float x = 16;
  auto swatch = [&](Color color, const std::string& label) {
    f.rect({x, y - 9, 10, 10}, color, theme.grid);
    f.text({x + 14, y}, label, 11, theme.foreground);
    x += 14 + text_width(label, 11) + 14;
  };
  if (one_head) {
    swatch(state_color(TokenState::Visible, theme), "visible");
    swatch(state_color(TokenState::Hidden, theme), "hidden");
    swatch(state_color(TokenState::Evicted, theme), "evicted (seen the step before)");
    swatch(state_color(TokenState::Returned, theme), "back (seen again)");
  } else {
    const std::string label = "share of heads that see it";
    f.text({x, y}, label, 11, theme.foreground);
    x += text_width(label, 11) + 8;
    const float right = x + 2 * text_width("0", 10) + 64;
    inline_colorbar(f, {right, y}, 0.0, 1.0, sequential_colormap(), theme);
    x = right + 16;
  }
  // (the canvas itself: the staircase of tokens not read yet stands apart from grey "hidden")
  const Color pending_color = theme.background;
  // (the legend wraps at narrow widths rather than running off the canvas)
  if (x + 220 > options.width) x = 16, y += 18;
  swatch(pending_color, "not read yet");
  hatch(f, {x, y - 9, 10, 10}, theme);
  f.text({x + 14, y}, "no rows (memory budget)", 11, theme.foreground);
  y += 12;

  const int64_t degraded = trace.degraded_from_step();
  if (!one_head && degraded >= 0 && degraded <= step) {
    y += 16;
    f.text({16, y},
           "From step " + std::to_string(degraded) +
               " the trace kept only the selected heads' rows (memory budget): shares there are "
               "of those heads",
           11, theme.accent);
  }

  // The focused token's story, a line or three per run.
  const float story_w = options.width - 32;
  if (options.focus_token >= 0) {
    const int64_t j = options.focus_token;
    y += 16;
    f.text({16, y},
           "token " + std::to_string(j) + " '" + token_label(trace.tokens[size_t(j)].text, 30) +
               "' (outlined):",
           12, theme.foreground, HAlign::Left, VAlign::Baseline, true);
    for (size_t i = 0; i < n; ++i) {
      const std::string story = titles[i] + ": " + token_story(*histories[i], j);
      for (const std::string& line : wrap_story(story, story_w, 11, 3)) {
        y += 16;
        f.text({16, y}, line, 11, run_color(trace, options.runs[i], theme));
      }
    }
  }

  // Rows fill the view's height when it is given, else about 720 units; labels thin out to one
  // every few rows when rows are shorter than the text.
  const float title_y = y + 30, grid_y = title_y + 10;
  const float space = options.height > 0 ? options.height - grid_y - 48 : 720.0f;
  const float row_h = std::clamp(space / float(std::max<int64_t>(tokens, 1)), 1.5f, 14.0f);
  const float label_size = std::clamp(row_h - 1.0f, 10.0f, 11.0f);
  const int64_t label_every = std::max<int64_t>(1, int64_t(std::ceil((label_size + 1) / row_h)));
  float label_w = 0;
  for (const TraceToken& t : trace.tokens)
    label_w = std::max(label_w, text_width(token_label(t.text, 14), label_size));
  label_w = std::min(label_w, 110.0f) + 12;
  const float left = 16 + label_w, gap = 14;
  const float panel_w =
      std::max(40.0f, (options.width - left - 16 - gap * float(n - 1)) / float(n));
  const float grid_h = row_h * float(tokens);
  auto is_highlighted = [&](int64_t j) {
    return std::find(options.highlight_tokens.begin(), options.highlight_tokens.end(), j) !=
           options.highlight_tokens.end();
  };
  const int64_t answer_begin = trace.coref.present ? trace.coref.answer_token_begin : -1;
  const int64_t answer_end = trace.coref.present ? trace.coref.answer_token_end : -1;

  // Token labels, right-aligned against the first panel.
  f.text({left - 6, title_y}, "token", 10, theme.muted, HAlign::Right);
  // Marked labels on rows closer than a line go side by side, each left of the one above.
  float marked_y = -1e9f, marked_shift = 0, marked_w = 0;
  for (int64_t j = 0; j < tokens; ++j) {
    const bool marked = is_highlighted(j) || j == options.focus_token;
    if (j % label_every != 0 && !marked) continue;
    // (a marked token's label is always drawn: the regular labels too close to it give way)
    auto near_marked = [&](int64_t m) {
      return m != j && m >= 0 && std::abs(float(m - j)) * row_h < label_size + 1;
    };
    if (!marked && (near_marked(options.focus_token) ||
                    std::any_of(options.highlight_tokens.begin(), options.highlight_tokens.end(),
                                near_marked)))
      continue;
    TextItem label;
    label.anchor = {left - 6, grid_y + (float(j) + 0.5f) * row_h};
    label.text = token_label(trace.tokens[size_t(j)].text, 14);
    if (label.text.empty()) label.text = "\u2205";
    label.size = label_size;
    label.color = marked                                ? theme.foreground
                  : j >= answer_begin && j < answer_end ? theme.accent
                                                        : theme.muted;
    label.h = HAlign::Right;
    label.v = VAlign::Middle;
    label.bold = marked;
    if (is_highlighted(j)) label.background = mix(theme.background, theme.accent, 0.3);
    if (marked) {
      marked_shift = label.anchor.y - marked_y < label_size + 1 ? marked_shift + marked_w + 4 : 0;
      marked_y = label.anchor.y;
      marked_w = text_width(label.text, label_size) + 4;
      label.anchor.x -= marked_shift;
    }
    f.add(std::move(label));
  }

  if (options.with_data) {
    view.data.columns = {"run",     "policy",    "token",      "text",    "step",    "state",
                         "seen_by", "hidden_by", "evicted_by", "back_in", "no_rows", "heads"};
  }
  for (size_t i = 0; i < n; ++i) {
    const int64_t run = options.runs[i];
    const TokenHistory& h = *histories[i];
    const float px = left + float(i) * (panel_w + gap);
    const Box box{px, grid_y, panel_w, grid_h};
    f.text({px, title_y}, titles[i], 12, run_color(trace, run, theme), HAlign::Left,
           VAlign::Baseline, true);
    f.add(history_image(h, box, one_head, pending_color, theme));
    // Hatch the runs of steps where no head in scope has rows.
    const float col_w = panel_w / float(steps);
    for (int64_t t = 0; t < steps;) {
      auto unknown = [&](int64_t s) { return tokens > 0 && h.at(0, s).known() == 0; };
      if (!unknown(t)) {
        ++t;
        continue;
      }
      int64_t end = t;
      while (end + 1 < steps && unknown(end + 1)) ++end;
      // (down to the last step's own token: the candidates of those steps)
      const float rows = float(std::min(tokens, end + 1));
      hatch(f, {px + float(t) * col_w, grid_y, float(end - t + 1) * col_w, rows * row_h}, theme);
      t = end + 1;
    }
    f.rect(box, {0, 0, 0, 0}, theme.grid);
    for (int64_t j = 0; j < tokens; ++j) {
      if (!is_highlighted(j)) continue;
      f.rect({px - 1, grid_y + float(j) * row_h, panel_w + 2, row_h}, {0, 0, 0, 0}, theme.accent,
             1.5f);
    }
    if (options.focus_token >= 0) {
      f.rect({px - 2, grid_y + float(options.focus_token) * row_h - 1, panel_w + 4, row_h + 2},
             {0, 0, 0, 0}, theme.foreground, 2.0f);
    }
    // The step axis: integer ticks at the columns' centres.
    for (const int64_t t : integer_ticks(0, step, std::max(2, int(panel_w / 55)))) {
      const float tx = px + (float(t) + 0.5f) * col_w;
      f.line({tx, box.bottom()}, {tx, box.bottom() + 4}, theme.foreground);
      f.text({tx, box.bottom() + 6}, std::to_string(t), 10, theme.foreground, HAlign::Center,
             VAlign::Top);
    }
    if (i == 0) f.text({px, box.bottom() + 32}, "step \u2192", 11, theme.muted);
    f.hover.push_back({box, tokens, steps, "history " + std::to_string(run),
                       [&trace, history = histories[i], title = titles[i]](int64_t r, int64_t c) {
                         return describe_cell(trace, *history, title, r, c);
                       },
                       "history"});
    if (!options.with_data) continue;
    for (int64_t j = 0; j < tokens; ++j) {
      for (int64_t t = j; t < steps; ++t) {
        const TokenStepCounts& c = h.at(j, t);
        view.data.rows.push_back({double(run), trace.runs[size_t(run)].policy, double(j),
                                  trace.tokens[size_t(j)].text, double(t),
                                  std::string(token_state_name(h.state(j, t))), double(c.seen()),
                                  double(c.hidden), double(c.evicted), double(c.returned),
                                  double(c.unknown), double(h.heads_in_scope)});
      }
    }
  }
  f.height = grid_y + grid_h + 44;
  return view;
}

}  // namespace kvlens::viz
