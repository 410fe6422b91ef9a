// The heads view: a grid of per-(layer, head) attention maps (rows: steps, columns: tokens) per
// run, sized to fill the view area, hidden tokens hatched, with a legend and a per-head summary
// strip (recall against dense, top-50% hit rate, effective sparsity: [layers][heads] heatmaps);
// or one head in detail with query and key token labels whose density follows the zoom. Data:
// every shown head's row at the current step.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/policy/registry.h"
#include "viz/layout.h"
#include "viz/views.h"

namespace kvlens::viz {
namespace {

// `predicted`: the run's scores are a learned predictor's logits (run_predicts_logits).
const char* quantity_name(HeadQuantity q, bool predicted = false) {
  switch (q) {
    case HeadQuantity::Logits:
      return "logit";
    case HeadQuantity::Probabilities:
      return "probability";
    case HeadQuantity::Scores:
      return predicted ? "predicted logit" : "policy score";
  }
  return "value";
}

using MapPointer = std::shared_ptr<const HeadMatrix>;

ValueScale scale_for(const ViewOptions& options, const std::vector<MapPointer>& maps) {
  if (options.quantity == HeadQuantity::Probabilities && options.log_scale)
    return {1e-4, 1.0, true};
  if (options.quantity == HeadQuantity::Probabilities) return {0.0, 1.0, false};
  // The finite range over every map (as fitted over all values, without gathering them).
  float lo = INFINITY, hi = -INFINITY;
  for (const MapPointer& m : maps) {
    for (const float v : m->values) {
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    }
  }
  return ValueScale::fitted(lo <= hi ? std::vector<float>{lo, hi} : std::vector<float>{});
}

// The side a grid map is pooled to: max_map_pixels, or on a screen twice the power of two at or
// above the device pixels the map covers (map_block pools to more than half the side, so a map
// keeps at least a data row per screen pixel): a 16 x 32 grid at 1024 tokens colours and uploads
// about what it shows, not 128 x 128 a map.
int64_t map_side(float cell, const ViewOptions& options) {
  if (options.pixel_scale <= 0.0f) return options.max_map_pixels;
  const auto shown = uint64_t(std::max(4.0f, std::ceil(cell * options.pixel_scale)));
  return std::min(options.max_map_pixels, 2 * int64_t(std::bit_ceil(shown)));
}

std::string describe_cell(const Trace& trace, const HeadMatrix& m, const std::string& where,
                          int64_t row, int64_t col, HeadQuantity quantity, bool predicted) {
  const int64_t b = m.block;
  std::string text = where + "\n";
  if (b == 1) {
    text += "step " + std::to_string(row) + ", token " + std::to_string(col);
    if (col < int64_t(trace.tokens.size()))
      text += " '" + token_label(trace.tokens[size_t(col)].text, 24) + "'";
  } else {
    text += "steps " + std::to_string(row * b) + "-" + std::to_string(row * b + b - 1) +
            ", tokens " + std::to_string(col * b) + "-" + std::to_string(col * b + b - 1);
  }
  const size_t at = size_t(row * m.cols + col);
  if (col > row) return text + "\n(not yet a candidate)";
  if (m.visible[at] == 2) return text + "\n(no value: row not kept)";
  if (m.visible[at] == kOutsideWindow)
    return text + "\n(outside the sliding window: this layer cannot see " +
           (b > 1 ? "these tokens" : "this token") + ")";
  text += std::string("\n") + (b > 1 ? "largest " : "") + quantity_name(quantity, predicted) + " " +
          format_value(m.values[at]);
  text += m.visible[at] ? (b > 1 ? "\nsome seen" : "\nseen") : "\nhidden";
  return text;
}

// The hover's line for a head full_heads_at marks, with the gate its policy recorded (NaN: none).
std::string retrieval_note(float gate) {
  std::string note = "\nretrieval head: saw every cached token";
  if (std::isfinite(gate)) note += " (gate " + format_value(gate) + ")";
  return note;
}

// An "R" chip in a marked head's top-left corner, sized to the map (legible from 10 px cells).
void retrieval_mark(Figure& f, Box box, const Theme& theme) {
  const float size = std::clamp(box.w * 0.45f, 7.0f, 11.0f);
  TextItem mark;
  mark.anchor = {box.x + 1.5f, box.y + 1.5f};
  mark.text = "R";
  mark.size = size;
  mark.color = theme.background;
  mark.background = theme.foreground;
  mark.bold = true;
  mark.h = HAlign::Left;
  mark.v = VAlign::Top;
  f.add(std::move(mark));
}

void add_rows(DataTable& data, const Trace& trace, int64_t run, int64_t layer, int64_t head,
              HeadQuantity quantity, int64_t step) {
  const HeadRow row = head_row_at(trace, run, step, layer, head, quantity);
  if (!row.kept) return;
  for (size_t j = 0; j < row.values.size(); ++j) {
    data.rows.push_back({trace.runs[size_t(run)].policy, double(run), double(layer), double(head),
                         double(step), double(j), double(row.values[j]), double(row.visible[j])});
  }
}

constexpr float kLabelSize = 11.0f;  // layer, head and token labels: readable at 100%

// The smallest power of two k with k * pitch >= needed: every k-th label of a row of labels
// `pitch` apart keeps `needed` units for itself.
int64_t label_every(float pitch, float needed) {
  int64_t k = 1;
  while (float(k) * pitch < needed && k < (int64_t(1) << 20)) k *= 2;
  return k;
}

std::string quantity_title(const ViewOptions& options) {
  return std::string(quantity_name(options.quantity)) +
         (options.log_scale && options.quantity == HeadQuantity::Probabilities ? " (log scale)"
                                                                               : "");
}

// The legend under the title: the colour bar with its quantity and scale, how hidden cells look,
// and the marks the maps may carry, wrapped onto more lines where the width runs out. Returns the
// y below it.
float legend_row(Figure& f, float y, const ValueScale& scale, const ViewOptions& options,
                 const Theme& theme, bool grid, bool windowed) {
  float x = colorbar_row(f, {16, y, 160, 10}, sequential_colormap(), scale, quantity_title(options),
                         theme);
  // An entry of `width` units: on this line when it fits, else at the start of the next.
  auto place = [&](float width) {
    if (x + width > options.width - 16 && x > 16) x = 16, y += 30;
    const float at = x;
    x += width + 18;
    return at;
  };
  const std::string hidden = "hidden by the policy", blank = "no value", selected = "selected head",
                    searched = "searched token";
  float at = place(30 + text_width(hidden, kLabelSize));
  hidden_swatch(f, {at, y - 1, 24, 12}, hidden, theme);
  at = place(30 + text_width(blank, kLabelSize));
  f.rect({at, y - 1, 24, 12}, {0, 0, 0, 0}, theme.grid);
  f.text({at + 30, y + 5}, blank, kLabelSize, theme.foreground, HAlign::Left, VAlign::Middle);
  if (windowed) {
    // Keys a sliding-window layer cannot see: no candidates, not the policy's choice.
    const std::string outside = "outside the sliding window";
    at = place(30 + text_width(outside, kLabelSize));
    outside_window_swatch(f, {at, y - 1, 24, 12}, outside, theme);
  }
  if (grid) {
    at = place(30 + text_width(selected, kLabelSize));
    f.rect({at, y - 1, 24, 12}, {0, 0, 0, 0}, theme.accent, 2.0f);
    f.text({at + 30, y + 5}, selected, kLabelSize, theme.foreground, HAlign::Left, VAlign::Middle);
    // The summaries' scale (every summary is a share in [0, 1], linear).
    const std::string summaries = "per-head summaries";
    const float width = text_width(summaries, kLabelSize) + 6 + 4 + 56 + 4 + text_width("1", 10) +
                        text_width("0", 10);
    at = place(width);
    f.text({at, y + 5}, summaries, kLabelSize, theme.foreground, HAlign::Left, VAlign::Middle);
    inline_colorbar(f, {at + width, y + 9}, 0.0, 1.0, sequential_colormap(), theme);
  }
  if (!options.highlight_tokens.empty()) {
    at = place(30 + text_width(searched, kLabelSize));
    f.rect({at + 8, y - 1, 8, 12}, {theme.accent.r, theme.accent.g, theme.accent.b, 90},
           theme.accent);
    f.text({at + 30, y + 5}, searched, kLabelSize, theme.foreground, HAlign::Left, VAlign::Middle);
  }
  return y + 30;
}

// The y below the legend, before the maps (and so the scale's exact ticks) are known: the
// entries' widths do not depend on the ticks beyond a few units.
float legend_bottom(float y, const ViewOptions& options, const Theme& theme, bool grid,
                    bool windowed) {
  Figure scratch;
  return legend_row(scratch, y, scale_for(options, {}), options, theme, grid, windowed);
}

// An accent tint and outline over token j's column of a map in `box` (rows and columns of
// m.block tokens from the map's top left): the values stay visible under it.
void highlight_column(Figure& f, Box box, const HeadMatrix& m, int64_t j, int64_t last_step,
                      const Theme& theme) {
  if (j < 0 || j > last_step || m.cols == 0) return;
  const float cw = box.w / float(m.cols), ch = box.h / float(m.rows);
  const int64_t c = j / m.block;
  const float w = std::max(cw, 1.5f);
  const Box column{box.x + float(c) * cw + (cw - w) / 2, box.y + float(c) * ch, w,
                   box.h - float(c) * ch};
  const Color tint{theme.accent.r, theme.accent.g, theme.accent.b, 70};
  f.rect(column, tint, cw >= 4.0f ? theme.accent : Color{0, 0, 0, 0}, 1.0f);
}

View detail(const Trace& trace, const ViewOptions& options, int64_t step) {
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  const float top = title_block(
      f,
      "Layer " + std::to_string(options.layer) + ", head " + std::to_string(options.head) +
          " at step " + std::to_string(step),
      "rows: the query token at each step; columns: key tokens; outlined: visible at this step" +
          std::string(trace.coref.present ? "; bold: the answer" : ""),
      theme);
  std::vector<MapPointer> maps;
  for (const int64_t run : options.runs) {
    maps.push_back(std::make_shared<HeadMatrix>(
        head_matrix(trace, run, options.layer, options.head, options.quantity, step)));
  }
  const ValueScale scale = scale_for(options, maps);
  const float legend_end =
      legend_row(f, top + 6, scale, options, theme, false, has_keys_outside_window(trace, step));
  const int64_t n = int64_t(maps.size());
  const int64_t columns = step + 1;
  // Labels keep 11 to 22 device pixels however far the view is zoomed in, so that zoomed in the
  // same canvas holds more of them. (The app rounds pixel_scale up to a power of two p: the zoom
  // is in (p / 2, p], so 22 / p units are 11 to 22 pixels; at p <= 1, 11 units.)
  const float zoom = options.pixel_scale >= 2.0f ? options.pixel_scale / 2.0f : 1.0f;
  const float label_size = kLabelSize / zoom;
  auto label_of = [&](int64_t j) {
    return j < int64_t(trace.tokens.size()) ? token_label(trace.tokens[size_t(j)].text, 10)
                                            : std::string("#") + std::to_string(j);
  };
  float longest = 0;  // the widest label: the room rows and columns keep for their text
  for (int64_t j = 0; j < columns; ++j)
    longest = std::max(longest, text_width(label_of(j), label_size));
  const float left = 16 + longest + 8, gap = 28, title_h = 22;
  const float below = longest + 10;
  const float panel = (options.width - left - 16 - gap * float(n - 1)) / float(n);
  // (without a height to fill, as large as the view always was: exports keep their size)
  float side =
      std::min(panel - (n > 1 ? longest + 8 : 0.0f), options.height > 0 ? 1400.0f : 720.0f);
  const float y0 = legend_end + title_h;
  if (options.height > 0) side = std::min(side, options.height - y0 - below - 12);
  side = std::max(side, 40.0f);
  const float cell = side / float(columns);
  const int64_t every = label_every(cell, label_size * 1.25f);
  const float screen_side = side * (options.pixel_scale > 0 ? options.pixel_scale : 1.0f);
  view.data.columns = {"policy", "run", "layer", "head", "step", "token", "value", "visible"};
  auto emphasised = [&](int64_t j) {
    return std::find(options.highlight_tokens.begin(), options.highlight_tokens.end(), j) !=
           options.highlight_tokens.end();
  };
  // A regular label gives way to a searched token's within `every` of it (they would collide).
  auto near_searched = [&](int64_t j) {
    for (const int64_t p : options.highlight_tokens)
      if (p != j && std::abs(p - j) < every) return true;
    return false;
  };
  for (int64_t i = 0; i < n; ++i) {
    const MapPointer& shared = maps[size_t(i)];
    const HeadMatrix& m = *shared;
    const int64_t run = options.runs[size_t(i)];
    const float x0 = left + float(i) * (panel + gap);
    const Box box{x0, y0, side, side};
    f.text({box.x, box.y - 8}, run_title(trace, run), 13, run_color(trace, run, theme),
           HAlign::Left, VAlign::Baseline, true);
    f.add(heatmap(box, m.values, &m.visible, m.rows, m.cols, scale, sequential_colormap(), theme,
                  1024, hatch_scale_for(m.cols, screen_side)));
    f.rect(box, {0, 0, 0, 0}, theme.grid);
    for (const int64_t j : options.highlight_tokens) highlight_column(f, box, m, j, step, theme);
    // The current step's visible set: one outline per run of consecutive seen tokens.
    for (int64_t j = 0; j <= step;) {
      if (m.visible[size_t(step * m.cols + j)] != 1) {
        ++j;
        continue;
      }
      int64_t k = j;
      while (k <= step && m.visible[size_t(step * m.cols + k)] == 1) ++k;
      f.rect({box.x + float(j) * cell, box.y + float(step) * cell, float(k - j) * cell, cell},
             {0, 0, 0, 0}, theme.accent, 1.5f);
      j = k;
    }
    // Key tokens under the map, reading upwards, every `every`-th (and each searched token).
    for (int64_t j = 0; j < columns; ++j) {
      const bool searched = emphasised(j);
      if (!searched && (j % every != 0 || near_searched(j))) continue;
      TextItem label;
      label.anchor = {box.x + (float(j) + 0.5f) * cell, box.bottom() + 4};
      label.text = label_of(j);
      label.size = label_size;
      // The final mention's answer tokens of a co-reference sample stand out.
      const bool answer = trace.coref.present && j >= trace.coref.answer_token_begin &&
                          j < trace.coref.answer_token_end;
      label.color = searched || answer ? theme.accent : theme.foreground;
      label.bold = searched || answer;
      label.h = HAlign::Right;
      label.v = VAlign::Middle;
      label.rotation = 90.0f;
      f.add(std::move(label));
    }
    // Query tokens left of the map (every panel: panels side by side keep room for them).
    {
      for (int64_t t = 0; t <= step; ++t) {
        const bool current = t == step, searched = emphasised(t);
        if (!current && !searched && (t % every != 0 || near_searched(t) || step - t < every))
          continue;
        f.text({box.x - 5, box.y + (float(t) + 0.5f) * cell}, label_of(t), label_size,
               current || searched ? theme.accent : theme.foreground, HAlign::Right, VAlign::Middle,
               current || searched);
      }
    }
    const std::string where = run_title(trace, run) + ", L" + std::to_string(options.layer) + " H" +
                              std::to_string(options.head);
    const HeadQuantity quantity = options.quantity;
    const bool predicted = run_predicts_logits(trace, run);
    f.hover.push_back({box, m.rows, m.cols, "head " + std::to_string(run),
                       [&trace, shared, where, quantity, predicted](int64_t r, int64_t c) {
                         return describe_cell(trace, *shared, where, r, c, quantity, predicted);
                       },
                       "detail"});
    if (options.with_data)
      add_rows(view.data, trace, run, options.layer, options.head, options.quantity, step);
  }
  f.height = y0 + side + below + 12;
  return view;
}

// Where the grid's parts go: map side and pitch, one run's panel width, the summary strip's
// cell and whether it stands beside the maps (room to spare across) or under them.
struct GridLayout {
  float cell = 0, pitch = 0, panel = 0, strip_cell = 0;
  bool strip_beside = false;
  int64_t columns = 1;  // runs side by side; more runs go on further rows
};

constexpr float kMapGap = 3, kPanelGap = 28, kLeft = 44, kStripAxis = 30, kStripGap = 16;
constexpr float kStripTitle = 34;   // a summary map's title and head labels above its cells
constexpr float kStripAcross = 12;  // between the summaries side by side (under the maps)
constexpr float kStripTitleWidth = 120;
constexpr float kRowGap = 20;  // between rows of runs

// The summary maps' cell: as small as 3 units, as large as 12 across (under the grid: the maps
// take the height) or 16 down (beside it, in width the maps leave), the three maps fitting
// `room`: across, the panel's width from the maps' left edge (layer labels left of the first
// only); down, the height.
float strip_cell_for(float room, int64_t count, bool across) {
  const float fixed = across ? 2 * kStripAcross : 3 * (kStripTitle + kStripGap);
  return std::clamp(std::floor((room - fixed) / float(3 * count)), 3.0f, across ? 12.0f : 16.0f);
}

// One row of `columns` runs in `height` (0: none to fill): the strip under or beside the maps.
GridLayout row_layout(const ViewOptions& options, float height, int64_t L, int64_t H,
                      int64_t columns) {
  const float panel =
      (options.width - kLeft - 16 - kPanelGap * float(columns - 1)) / float(columns);
  auto fit = [&](float across, float down) {
    float cell = std::floor(across / float(H)) - kMapGap;
    if (height > 0)
      cell = std::min(cell, std::floor(down / float(L)) - kMapGap);
    else
      cell = std::min(cell, 120.0f);
    return std::max(cell, 6.0f);
  };
  // Under the maps: the strip takes height.
  GridLayout under;
  under.panel = panel;
  under.columns = columns;
  under.strip_cell = strip_cell_for(panel, H, true);
  under.cell = fit(panel, height - (kStripGap + kStripTitle + float(L) * under.strip_cell + 8));
  under.pitch = under.cell + kMapGap;
  if (height <= 0) return under;
  // Beside the maps: the strip takes width.
  GridLayout beside;
  beside.panel = panel;
  beside.columns = columns;
  beside.strip_beside = true;
  beside.strip_cell = strip_cell_for(height, L, false);
  const float strip_w =
      std::max(kStripAxis + float(H) * beside.strip_cell, kStripTitleWidth) + kStripGap;
  beside.cell = fit(panel - strip_w, height);
  beside.pitch = beside.cell + kMapGap;
  return beside.cell > under.cell ? beside : under;
}

// `row_top`: the room a further row of runs needs above its maps (its titles and head labels).
GridLayout grid_layout(const ViewOptions& options, float y0, float row_top, int64_t L, int64_t H,
                       int64_t n) {
  const float height = options.height > 0 ? options.height - y0 - 16 : 0.0f;
  GridLayout best = row_layout(options, height, L, H, n);
  if (height <= 0) return best;
  // Several runs in a tall area: on two rows the maps may be larger than all in one row (four
  // runs side by side leave most of a 16:10 screen's height empty).
  for (int64_t columns = (n + 1) / 2; columns < n; ++columns) {
    const int64_t rows = (n + columns - 1) / columns;
    const float per_row = (height - float(rows - 1) * (row_top + kRowGap)) / float(rows);
    const GridLayout stacked = row_layout(options, per_row, L, H, columns);
    if (stacked.cell > best.cell) best = stacked;
  }
  return best;
}

// A head's own budget at the step, for hovers: "kept 56 of 111 tokens (layer: 448 over 8 heads)",
// or why it has none.
std::string budget_line(const HeadBudgets& budgets, int64_t layer, int64_t head_in_layer,
                        int64_t H) {
  const int32_t kept = budgets.kept[size_t(layer * H + head_in_layer)];
  if (kept < 0) return "no budget (dense or skipped layer)";
  std::string line = "kept " + std::to_string(kept) + " of " + std::to_string(budgets.candidates) +
                     " tokens (layer " + std::to_string(budgets.layer_total[size_t(layer)]) +
                     " over " + std::to_string(H) + " heads)";
  // A weighted sample (magicpig): how many of them were sampled, at what mean weight 1/p.
  const size_t at = size_t(layer * H + head_in_layer);
  if (at < budgets.sampled.size() && budgets.sampled[at] >= 0) {
    line += "; " + std::to_string(budgets.sampled[at]) + " sampled";
    if (budgets.sampled[at] > 0)
      line += ", mean weight 1/p " + format_value(budgets.mean_weight[at]);
    line += ", the rest exact";
  }
  return line;
}

// The run's budgets at a glance, beside its title: one figure for a uniform policy, the range
// and mean where an allocator (or eviction running short) makes them differ; `compact` for a
// narrow panel.
std::string budget_caption(const HeadBudgets& budgets, bool compact) {
  if (budgets.min < 0) return compact ? "" : "no budgeted layer at this step";
  if (compact)  // "kept 29-78" or "kept 56": for a narrow panel
    return "kept " + std::to_string(budgets.min) +
           (budgets.uniform() ? "" : "-" + std::to_string(budgets.max));
  if (budgets.uniform())
    return "kept per head: " + std::to_string(budgets.min) + " of " +
           std::to_string(budgets.candidates);
  char mean[32];
  std::snprintf(mean, sizeof mean, "%.1f", budgets.mean);
  return "kept per head: " + std::to_string(budgets.min) + "-" + std::to_string(budgets.max) +
         " of " + std::to_string(budgets.candidates) + " (mean " + mean + ")";
}

// One run's per-head summary: three [layers][heads] heatmaps with layer and head axes, each cell
// a "head R:L:H" hover region (clicking selects the head). Returns the strip's bottom.
float summary_strip(Figure& f, const Trace& trace, int64_t run, int64_t step, Point origin, float s,
                    bool down, const ViewOptions& options, const Theme& theme) {
  const int64_t L = trace.model.layers, H = trace.model.heads;
  const auto summary = std::make_shared<HeadSummary>(head_summary(trace, run, step));
  const auto budgets = std::make_shared<HeadBudgets>(head_budgets(trace, run, step));
  const std::vector<double>* metrics[3] = {&summary->recall, &summary->hit_rate,
                                           &summary->sparsity};
  const char* titles[3] = {"recall vs dense", "top-50% hit rate", "effective sparsity"};
  const char* short_titles[3] = {"recall", "hit rate", "sparsity"};  // (narrow maps)
  const int64_t every_layer = label_every(s, 12), every_head = label_every(s, 16);
  const float map_w = float(H) * s, map_h = float(L) * s;
  const std::string title = run_title(trace, run);
  float bottom = origin.y;
  for (int k = 0; k < 3; ++k) {
    const float x =
        down ? origin.x + kStripAxis : origin.x + kStripAxis + float(k) * (map_w + kStripAcross);
    const float y = down ? origin.y + float(k) * (kStripTitle + map_h + kStripGap) : origin.y;
    const Box box{x, y + kStripTitle, map_w, map_h};
    // Down, a title may use the strip's width from its left; across, its own map's and the gap.
    const float room = down ? std::max(kStripAxis + map_w, kStripTitleWidth) : map_w + kStripAcross;
    const char* shown =
        text_width(titles[k], kLabelSize) * 1.08f <= room ? titles[k] : short_titles[k];
    f.text({down ? x - kStripAxis : x, y + 11}, shown, kLabelSize, theme.foreground, HAlign::Left,
           VAlign::Baseline, true);
    std::vector<float> values(metrics[k]->begin(), metrics[k]->end());
    f.add(heatmap(box, values, nullptr, L, H, ValueScale{0.0, 1.0, false}, sequential_colormap(),
                  theme, std::max(L, H)));
    f.rect(box, {0, 0, 0, 0}, theme.grid);
    for (int64_t h = 0; h < H; h += every_head)
      f.text({box.x + (float(h) + 0.5f) * s, box.y - 3}, std::to_string(h), 10, theme.foreground,
             HAlign::Center, VAlign::Bottom);
    if (down || k == 0) {  // side by side, the first map's layer labels serve all three
      for (int64_t l = 0; l < L; l += every_layer)
        f.text({box.x - 4, box.y + (float(l) + 0.5f) * s}, std::to_string(l), 10, theme.foreground,
               HAlign::Right, VAlign::Middle);
      f.text({box.x - 4, box.y - 3}, "L\\H", 10, theme.muted, HAlign::Right, VAlign::Bottom);
    }
    const bool selected_shown = options.layer < L && options.head < H;
    if (selected_shown) {
      f.rect({box.x + float(options.head) * s, box.y + float(options.layer) * s, s, s},
             {0, 0, 0, 0}, theme.accent, 1.5f);
    }
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t h = 0; h < H; ++h) {
        const std::string name = std::to_string(l) + ":" + std::to_string(h);
        f.hover.push_back({{box.x + float(h) * s, box.y + float(l) * s, s, s},
                           1,
                           1,
                           "head " + std::to_string(run) + ":" + name,
                           [summary, budgets, title, l, h, H](int64_t, int64_t) {
                             const size_t at = size_t(l * H + h);
                             return title + ", L" + std::to_string(l) + " H" + std::to_string(h) +
                                    "\n" + budget_line(*budgets, l, h, H) + "\nrecall vs dense " +
                                    format_value(summary->recall[at]) + "\ntop-50% hit rate " +
                                    format_value(summary->hit_rate[at]) + "\neffective sparsity " +
                                    format_value(summary->sparsity[at]) + "\n(click: select)";
                           },
                           "summary " + name});
      }
    }
    bottom = std::max(bottom, box.bottom());
  }
  return bottom;
}

}  // namespace

View heads_view(const Trace& trace, const ViewOptions& options, int64_t step) {
  if (options.head_detail) return detail(trace, options, step);
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  const int64_t L = trace.model.layers, H = trace.model.heads, n = int64_t(options.runs.size());
  std::string token;
  if (step < int64_t(trace.tokens.size()))
    token = " (token '" + token_label(trace.tokens[size_t(step)].text, 20) + "')";
  const float top = title_block(
      f, "Attention of every head at step " + std::to_string(step) + token,
      "each map: steps 0-" + std::to_string(step) +
          " (rows) x tokens (columns); per-head summaries at this step: click a head to select it",
      theme);
  // The maps' scale spans every map, so the legend is placed once they are read; its row is
  // reserved here.
  const bool windowed = has_keys_outside_window(trace, step);
  const float legend_y = top + 6,
              first_panel_top = legend_bottom(legend_y, options, theme, true, windowed);
  const float title_h = 18, head_labels_h = 16;
  const GridLayout layout = grid_layout(options, first_panel_top + title_h + head_labels_h,
                                        title_h + head_labels_h, L, H, n);
  const float cell = layout.cell, pitch = layout.pitch;

  // Every map first: the colour scale spans all of them.
  // (from the app's cache when given: only the steps added since its last call are read)
  std::vector<MapPointer> maps;
  maps.reserve(size_t(n * L * H));
  const int64_t side = map_side(cell, options);
  if (options.head_maps)
    options.head_maps->update(trace, options.runs, options.quantity, step, side);
  for (const int64_t run : options.runs) {
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t h = 0; h < H; ++h) {
        maps.push_back(options.head_maps
                           ? options.head_maps->get(trace, run, l, h, options.quantity, step, side)
                           : std::make_shared<HeadMatrix>(
                                 head_matrix(trace, run, l, h, options.quantity, step, side)));
      }
    }
  }
  const ValueScale scale = scale_for(options, maps);
  const ValueColors colors(scale, sequential_colormap());  // once for every map
  legend_row(f, legend_y, scale, options, theme, true, windowed);
  view.data.columns = {"policy", "run", "layer", "head", "step", "token", "value", "visible"};
  // Labels keep kLabelSize and some air: thinned to every k-th where maps are small.
  const int64_t every_layer = label_every(pitch, kLabelSize + 3);
  const int64_t every_head =
      label_every(pitch, text_width("H" + std::to_string(H - 1), kLabelSize) + 6);
  const float screen_cell = cell * (options.pixel_scale > 0 ? options.pixel_scale : 1.0f);
  int64_t missing = 0, retrieval_marks = 0;
  float panel_top = first_panel_top, y0 = panel_top + title_h + head_labels_h;
  float bottom = y0 + float(L) * pitch;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t run = options.runs[size_t(i)];
    const bool predicted = run_predicts_logits(trace, run);
    const FullHeads retrieval = full_heads_at(trace, run, step);
    if (i > 0 && i % layout.columns == 0) {  // the next row of runs, under the last one's bottom
      panel_top = bottom + kRowGap;
      y0 = panel_top + title_h + head_labels_h;
      bottom = y0 + float(L) * pitch;
    }
    const float x0 = kLeft + float(i % layout.columns) * (layout.panel + kPanelGap);
    f.text({x0, panel_top + 13}, run_title(trace, run), 13, run_color(trace, run, theme),
           HAlign::Left, VAlign::Baseline, true);
    const auto budgets = std::make_shared<HeadBudgets>(head_budgets(trace, run, step));
    {
      // Beside the title where the panel has room for it, else left out (the hovers say it).
      const float title_w = text_width(run_title(trace, run), 13) * 1.08f;
      std::string caption = budget_caption(*budgets, false);
      if (title_w + 12 + text_width(caption, kLabelSize) > layout.panel)
        caption = budget_caption(*budgets, true);
      // (The reference has no budget: nothing to say.)
      if (!is_reference_policy(trace.runs[size_t(run)].policy) &&
          title_w + 12 + text_width(caption, kLabelSize) <= layout.panel)
        f.text({x0 + title_w + 12, panel_top + 13}, caption, kLabelSize, theme.muted, HAlign::Left,
               VAlign::Baseline);
    }
    for (int64_t h = 0; h < H; h += every_head) {
      f.text({x0 + float(h) * pitch + cell / 2, y0 - 4}, "H" + std::to_string(h), kLabelSize,
             theme.foreground, HAlign::Center, VAlign::Baseline);
    }
    for (int64_t l = 0; l < L; ++l) {
      if (l % every_layer == 0) {
        f.text({x0 - 5, y0 + float(l) * pitch + cell / 2}, "L" + std::to_string(l), kLabelSize,
               theme.foreground, HAlign::Right, VAlign::Middle);
      }
      for (int64_t h = 0; h < H; ++h) {
        const MapPointer& shared = maps[size_t((i * L + l) * H + h)];
        const HeadMatrix& m = *shared;
        missing += m.missing_rows;
        const Box box{x0 + float(h) * pitch, y0 + float(l) * pitch, cell, cell};
        // (at most 2 x max_map_pixels a side: a zoomed-in grid of many maps stays cheap to
        // colour and upload; the hatch then spans a few cells instead of a few pixels)
        const int64_t hatch = std::min(hatch_scale_for(m.cols, screen_cell),
                                       std::max<int64_t>(1, 2 * options.max_map_pixels / m.cols));
        f.add(heatmap(box, m.values, &m.visible, m.rows, m.cols, colors, theme, m.rows, hatch));
        for (const int64_t j : options.highlight_tokens)
          highlight_column(f, box, m, j, step, theme);
        const bool selected = l == options.layer && h == options.head;
        f.rect(box, {0, 0, 0, 0}, selected ? theme.accent : theme.grid, selected ? 2.0f : 0.5f);
        std::string where =
            run_title(trace, run) + ", L" + std::to_string(l) + " H" + std::to_string(h);
        if (retrieval.full[size_t(l * H + h)]) {
          retrieval_marks += 1;
          where += retrieval_note(retrieval.score[size_t(l * H + h)]);
          retrieval_mark(f, box, theme);
        }
        const HeadQuantity quantity = options.quantity;
        f.hover.push_back(
            {box, m.rows, m.cols,
             "head " + std::to_string(run) + ":" + std::to_string(l) + ":" + std::to_string(h),
             [&trace, shared, where, quantity, predicted, budgets, l, h, H](int64_t r, int64_t c) {
               return describe_cell(trace, *shared, where, r, c, quantity, predicted) +
                      "\nat this step: " + budget_line(*budgets, l, h, H);
             },
             "head " + std::to_string(l) + ":" + std::to_string(h)});
        if (options.with_data) add_rows(view.data, trace, run, l, h, options.quantity, step);
      }
    }
    const Point strip = layout.strip_beside
                            ? Point{x0 + float(H) * pitch + kStripGap, y0 - head_labels_h}
                            : Point{x0 - kStripAxis, y0 + float(L) * pitch + kStripGap};
    bottom = std::max(bottom, summary_strip(f, trace, run, step, strip, layout.strip_cell,
                                            layout.strip_beside, options, theme));
  }
  f.height = bottom + 16;
  if (retrieval_marks > 0) {
    f.text({16, f.height - 2},
           "R: a retrieval head, which saw every cached token while other heads of its layer saw "
           "fewer (DuoAttention's; its gate in the hover)",
           11, theme.foreground);
    f.height += 14;
  }
  if (missing > 0) {
    f.text({16, f.height - 2},
           "Some rows were not kept (the trace's memory budget): those steps are blank.", 11,
           theme.accent);
    f.height += 14;
  }
  return view;
}

}  // namespace kvlens::viz
