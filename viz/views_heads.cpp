// The heads view: a grid of per-(layer, head) attention maps (rows: steps, columns: tokens) per
// run, hidden tokens dimmed; or one head in detail with token labels and its visible set at the
// current step outlined. Data: every shown head's row at the current step.
#include <algorithm>
#include <bit>
#include <cmath>
#include <memory>

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
  text += std::string("\n") + (b > 1 ? "largest " : "") + quantity_name(quantity, predicted) + " " +
          format_value(m.values[at]);
  text += m.visible[at] ? (b > 1 ? "\nsome seen" : "\nseen") : "\nhidden";
  return text;
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

View detail(const Trace& trace, const ViewOptions& options, int64_t step) {
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  const float top = title_block(
      f,
      "Layer " + std::to_string(options.layer) + ", head " + std::to_string(options.head) +
          " at step " + std::to_string(step),
      std::string(quantity_name(options.quantity)) +
          (options.log_scale && options.quantity == HeadQuantity::Probabilities ? " (log scale)"
                                                                                : "") +
          "; rows are steps, columns tokens; hidden tokens dimmed, the visible set at this step "
          "outlined" +
          (trace.coref.present ? "; the answer's tokens labelled in bold" : ""),
      theme);
  std::vector<MapPointer> maps;
  for (const int64_t run : options.runs) {
    maps.push_back(std::make_shared<HeadMatrix>(
        head_matrix(trace, run, options.layer, options.head, options.quantity, step)));
  }
  const ValueScale scale = scale_for(options, maps);
  const int64_t n = int64_t(maps.size());
  const float left = 56, gap = 28, bar = 90;
  const float panel = (options.width - left - bar - gap * float(n - 1)) / float(n);
  const float side = std::min(panel, 720.0f);
  const float y0 = top + 24;
  view.data.columns = {"policy", "run", "layer", "head", "step", "token", "value", "visible"};
  for (int64_t i = 0; i < n; ++i) {
    const MapPointer& shared = maps[size_t(i)];
    const HeadMatrix& m = *shared;
    const int64_t run = options.runs[size_t(i)];
    const Box box{left + float(i) * (panel + gap), y0, side, side};
    f.text({box.x, box.y - 8}, run_title(trace, run), 13, run_color(i), HAlign::Left,
           VAlign::Baseline, true);
    f.add(heatmap(box, m.values, &m.visible, m.rows, m.cols, scale, sequential_colormap(), theme,
                  1024));
    f.rect(box, {0, 0, 0, 0}, theme.grid);
    const float cell = side / float(m.cols);
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
    // Token labels under the map, as many as fit.
    const int64_t every = std::max<int64_t>(1, int64_t(std::ceil(11.0f / cell)));
    for (int64_t j = 0; j <= step && j < int64_t(trace.tokens.size()); j += every) {
      TextItem label;
      label.anchor = {box.x + (float(j) + 0.5f) * cell, box.bottom() + 4};
      label.text = token_label(trace.tokens[size_t(j)].text, 10);
      label.size = std::min(10.0f, std::max(7.0f, cell * 0.9f));
      // The final mention's answer tokens of a co-reference sample stand out.
      const bool answer = trace.coref.present && j >= trace.coref.answer_token_begin &&
                          j < trace.coref.answer_token_end;
      label.color = answer ? theme.accent : theme.foreground;
      label.bold = answer;
      label.h = HAlign::Right;
      label.v = VAlign::Middle;
      label.rotation = 90.0f;
      f.add(std::move(label));
    }
    const std::vector<double> ticks = nice_ticks(0, double(step), 6);
    for (const double t : ticks) {
      const float y = box.y + (float(t) + 0.5f) * cell;
      f.text({box.x - 6, y}, format_value(t), 10, theme.foreground, HAlign::Right, VAlign::Middle);
    }
    f.text({box.x - 40, box.y - 8}, "step", 10, theme.muted);
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
  colorbar(f, {options.width - bar + 20, y0 + 20, 14, std::min(side, 300.0f)},
           sequential_colormap(), scale, quantity_name(options.quantity), theme);
  f.height = y0 + side + 90;
  return view;
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
      std::string(quantity_name(options.quantity)) +
          (options.log_scale && options.quantity == HeadQuantity::Probabilities ? " (log scale)"
                                                                                : "") +
          "; each map: rows are steps 0-" + std::to_string(step) +
          ", columns tokens; hidden tokens dimmed",
      theme);
  const float left = 34, gap = 24, bar = 90, label_h = 16;
  const float panel = (options.width - left - bar - gap * float(n - 1)) / float(n);
  const float cell = std::min(120.0f, std::floor((panel - 2.0f * float(H)) / float(H)));
  const float pitch = cell + 2.0f;

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
  const float y0 = top + 20 + label_h;
  view.data.columns = {"policy", "run", "layer", "head", "step", "token", "value", "visible"};
  int64_t missing = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t run = options.runs[size_t(i)];
    const bool predicted = run_predicts_logits(trace, run);
    const float x0 = left + float(i) * (panel + gap);
    f.text({x0, y0 - label_h - 4}, run_title(trace, run), 13, run_color(i), HAlign::Left,
           VAlign::Baseline, true);
    for (int64_t h = 0; h < H; h += std::max<int64_t>(1, H / 8)) {
      f.text({x0 + float(h) * pitch + cell / 2, y0 - 4}, "H" + std::to_string(h), 9, theme.muted,
             HAlign::Center, VAlign::Baseline);
    }
    for (int64_t l = 0; l < L; ++l) {
      if (i == 0) {
        f.text({x0 - 6, y0 + float(l) * pitch + cell / 2}, "L" + std::to_string(l), 9, theme.muted,
               HAlign::Right, VAlign::Middle);
      }
      for (int64_t h = 0; h < H; ++h) {
        const MapPointer& shared = maps[size_t((i * L + l) * H + h)];
        const HeadMatrix& m = *shared;
        missing += m.missing_rows;
        const Box box{x0 + float(h) * pitch, y0 + float(l) * pitch, cell, cell};
        f.add(heatmap(box, m.values, &m.visible, m.rows, m.cols, colors, theme, m.rows));
        const bool selected = l == options.layer && h == options.head;
        f.rect(box, {0, 0, 0, 0}, selected ? theme.accent : theme.grid, selected ? 2.0f : 0.5f);
        const std::string where =
            run_title(trace, run) + ", L" + std::to_string(l) + " H" + std::to_string(h);
        const HeadQuantity quantity = options.quantity;
        f.hover.push_back(
            {box, m.rows, m.cols,
             "head " + std::to_string(run) + ":" + std::to_string(l) + ":" + std::to_string(h),
             [&trace, shared, where, quantity, predicted](int64_t r, int64_t c) {
               return describe_cell(trace, *shared, where, r, c, quantity, predicted);
             },
             "head " + std::to_string(l) + ":" + std::to_string(h)});
        if (options.with_data) add_rows(view.data, trace, run, l, h, options.quantity, step);
      }
    }
  }
  const float grid_h = float(L) * pitch;
  colorbar(f, {options.width - bar + 20, y0 + 20, 14, std::min(grid_h - 20, 260.0f)},
           sequential_colormap(), scale, quantity_name(options.quantity), theme);
  f.height = y0 + grid_h + 24;
  if (missing > 0) {
    f.text({left, f.height - 6},
           "Some rows were not kept (the trace's memory budget): those steps are blank.", 11,
           theme.accent);
    f.height += 12;
  }
  return view;
}

}  // namespace kvlens::viz
