// The consensus view: the cross-head matrix at the current step, Pearson of the true-logit rows
// (diverging, -1 to 1) or Jaccard of the visible sets (sequential, 0 to 1), layer boundaries
// drawn, its mean (the consensus score) shown; one panel per run.
#include <algorithm>
#include <cmath>
#include <memory>

#include "viz/layout.h"
#include "viz/views.h"

namespace kvlens::viz {

View consensus_view(const Trace& trace, const ViewOptions& options, int64_t step) {
  const Theme& theme = theme_of(options);
  View view = empty_view(options);
  Figure& f = view.figure;
  const bool pearson = options.consensus == ConsensusMetric::Pearson;
  const int64_t H = trace.model.heads;
  const float top =
      title_block(f, "Cross-head consensus at step " + std::to_string(step),
                  pearson ? "Pearson correlation of every pair of heads' true attention logits"
                          : "Jaccard overlap of every pair of heads' visible sets",
                  theme);
  const Colormap& map = pearson ? diverging_colormap() : sequential_colormap();
  const ValueScale scale = pearson ? ValueScale{-1.0, 1.0, false} : ValueScale{0.0, 1.0, false};
  const int64_t n = int64_t(options.runs.size());
  const float left = 44, gap = 56, bar = 90;
  const float panel =
      std::min(640.0f, (options.width - left - bar - gap * float(n - 1)) / float(n));
  const float y0 = top + 34;
  view.data.columns = {"policy", "run", "step", "layer_a", "head_a", "layer_b", "head_b", "value"};
  for (int64_t i = 0; i < n; ++i) {
    const int64_t run = options.runs[size_t(i)];
    const ConsensusMatrix c = consensus_matrix(trace, run, step, options.consensus);
    const int64_t m = int64_t(c.heads.size());
    const Box box{left + float(i) * (panel + gap), y0, panel, panel};
    f.text({box.x, box.y - 22}, run_title(trace, run), 13, run_color(trace, run, theme),
           HAlign::Left, VAlign::Baseline, true);
    f.text({box.x, box.y - 6},
           "mean " + format_value(c.mean) + " over " + std::to_string(m) + " heads", 11,
           theme.foreground);
    if (m == 0) {
      f.text({box.x + panel / 2, box.y + panel / 2}, "no rows kept at this step", 12, theme.muted,
             HAlign::Center, VAlign::Middle);
      continue;
    }
    std::vector<float> values(c.values.begin(), c.values.end());
    f.add(heatmap(box, values, nullptr, m, m, scale, map, theme, 2048));
    f.rect(box, {0, 0, 0, 0}, theme.grid);
    // Layer boundaries where the layer of consecutive rows changes.
    const float cell = panel / float(m);
    for (int64_t k = 1; k < m; ++k) {
      if (c.heads[size_t(k)] / H == c.heads[size_t(k - 1)] / H) continue;
      const float at = float(k) * cell;
      f.line({box.x + at, box.y}, {box.x + at, box.bottom()}, theme.foreground, 0.6f);
      f.line({box.x, box.y + at}, {box.right(), box.y + at}, theme.foreground, 0.6f);
    }
    for (int64_t k = 0; k < m; ++k) {
      if (k > 0 && c.heads[size_t(k)] / H == c.heads[size_t(k - 1)] / H) continue;
      const std::string label = "L" + std::to_string(c.heads[size_t(k)] / H);
      f.text({box.x - 4, box.y + (float(k) + 0.5f) * cell}, label, 9, theme.muted, HAlign::Right,
             VAlign::Top);
      f.text({box.x + float(k) * cell + 2, box.bottom() + 4}, label, 9, theme.muted, HAlign::Left,
             VAlign::Top);
    }
    for (int64_t a = 0; a < m && options.with_data; ++a) {
      for (int64_t b = a + 1; b < m; ++b) {
        view.data.rows.push_back({trace.runs[size_t(run)].policy, double(run), double(step),
                                  double(c.heads[size_t(a)] / H), double(c.heads[size_t(a)] % H),
                                  double(c.heads[size_t(b)] / H), double(c.heads[size_t(b)] % H),
                                  c.values[size_t(a * m + b)]});
      }
    }
    auto shared = std::make_shared<ConsensusMatrix>(c);
    const std::string metric = pearson ? "Pearson " : "Jaccard ";
    f.hover.push_back({box, m, m, "consensus " + std::to_string(run),
                       [shared, H, m, metric](int64_t r, int64_t col) {
                         const int32_t a = shared->heads[size_t(r)], b = shared->heads[size_t(col)];
                         return "L" + std::to_string(a / H) + " H" + std::to_string(a % H) +
                                " \u00d7 L" + std::to_string(b / H) + " H" + std::to_string(b % H) +
                                "\n" + metric + format_value(shared->values[size_t(r * m + col)]);
                       },
                       "consensus"});
  }
  colorbar(f, {options.width - bar + 20, y0 + 20, 14, std::min(panel - 20, 260.0f)}, map, scale,
           pearson ? "Pearson r" : "Jaccard", theme);
  f.height = y0 + panel + 30;
  return view;
}

}  // namespace kvlens::viz
