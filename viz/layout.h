// Building blocks the views share: heatmap rasters (with level of detail and hidden-token
// dimming), colour bars, axes with ticks, titles and number / token text formatting.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/trace/trace_queries.h"  // kOutsideWindow
#include "viz/colormap.h"
#include "viz/figure.h"

namespace kvlens::viz {

// How values map to [0, 1] on a colormap: linear over [lo, hi], or log10 over [lo, hi] (both
// > 0; values below lo clamp to lo).
struct ValueScale {
  double lo = 0.0, hi = 1.0;
  bool log = false;
  // (a heatmap normalises every pixel: the log scale's end points are taken once per scale)
  double normalise(double value) const;
  // The finite range of `values` (a degenerate range is widened by 1 on each side; none: [0, 1]).
  static ValueScale fitted(const std::vector<float>& values);
};

// The colour of a value on a scale and colormap, without a logarithm per value on a log scale
// (a grid of many maps has millions): the 255 values where the map's entry changes are found once
// and each value's entry by binary search. Build one per figure and share it between its maps.
class ValueColors {
 public:
  ValueColors(const ValueScale& scale, const Colormap& map);
  Color operator()(double value) const;

 private:
  ValueScale scale_;
  const Colormap* map_;
  std::vector<double> boundaries_;  // log scale: entry k from boundaries_[k - 1] on
};

// How a cell hidden by the policy looks: diagonal stripes of two greyish pinks, a hue the
// sequential map never takes, with the stripes' texture as a second cue for dichromats (to whom
// the hue may read as grey). Lighter than the dark theme's background, darker than the light's.
struct HiddenStyle {
  Color fill, stripe;
};
HiddenStyle hidden_style(const Theme& theme);
// The stripe period in image pixels (a stripe is half of it, 45 degrees).
inline constexpr int64_t kHatchPeriod = 4;

// How a key outside a sliding window looks (no candidate of that layer, not a policy's choice):
// a flat neutral grey, no hue at all, with a sparse dot grid as its texture (the hatch is
// stripes), between the background and the hidden style's lightness.
struct OutsideStyle {
  Color fill, dot;
};
OutsideStyle outside_window_style(const Theme& theme);
// The dot grid's period in image pixels (one dot pixel per period x period).
inline constexpr int64_t kDotPeriod = 3;

// A rows x cols matrix as an image of at most max_pixels x max_pixels: blocks of cells become one
// pixel holding the block's largest value (peaks stay visible when zoomed out). Cells with
// visible == 0 (when given; a block when none of its cells was seen) are hatched in
// hidden_style(theme) instead of coloured, so that they never read as a value; cells with visible
// == kOutsideWindow (a block when all its known cells are) are drawn in outside_window_style,
// whatever their value; visible == 2 or NaN values are transparent. Each pixel is repeated
// hatch_scale x hatch_scale times so that the stripes stay a few screen pixels wide where a cell
// covers many (1: one image pixel per block). The image fills `box`.
ImageItem heatmap(Box box, const std::vector<float>& values, const std::vector<uint8_t>* visible,
                  int64_t rows, int64_t cols, const ValueColors& colors, const Theme& theme,
                  int64_t max_pixels, int64_t hatch_scale = 1);
ImageItem heatmap(Box box, const std::vector<float>& values, const std::vector<uint8_t>* visible,
                  int64_t rows, int64_t cols, const ValueScale& scale, const Colormap& map,
                  const Theme& theme, int64_t max_pixels, int64_t hatch_scale = 1);
// The hatch_scale that makes each of `pixels` image pixels spread over `screen` device pixels
// about 1.5 screen pixels (a stripe 3 px wide): 1 where the image is as dense as the screen.
int64_t hatch_scale_for(int64_t pixels, float screen);

// A hatched swatch (the hidden style) in `box` with `label` to its right, for legends.
void hidden_swatch(Figure& figure, Box box, const std::string& label, const Theme& theme);
// The same in the outside-the-window style.
void outside_window_swatch(Figure& figure, Box box, const std::string& label, const Theme& theme);

// A vertical colour bar in `box` with tick labels to its right and `label` above.
void colorbar(Figure& figure, Box box, const Colormap& map, const ValueScale& scale,
              const std::string& label, const Theme& theme);

// A legend's horizontal colour bar: `label` (11 units) left of a bar of `box`, tick labels (10
// units) under it; returns the x where the next legend entry may start.
float colorbar_row(Figure& figure, Box box, const Colormap& map, const ValueScale& scale,
                   const std::string& label, const Theme& theme);

// A small horizontal colour bar with its end values, in one line of 10-unit text ending at
// `right_baseline` (the right end of the line, on its baseline): "lo [bar] hi".
void inline_colorbar(Figure& figure, Point right_baseline, double lo, double hi,
                     const Colormap& map, const Theme& theme);

// Up to about `count` round tick values covering [lo, hi].
std::vector<double> nice_ticks(double lo, double hi, int count);
// A value for a label: 3 significant digits, "-" for NaN.
std::string format_value(double value);
// A token's text for a label: control characters and newlines shown visibly, spaces as "·" at the
// ends, at most max_chars characters (UTF-8 aware, "…" when cut).
std::string token_label(const std::string& text, size_t max_chars = 12);

// A figure title and subtitle at the top; returns the y where content may start.
float title_block(Figure& figure, const std::string& title, const std::string& subtitle,
                  const Theme& theme);

// Axis frame of a plot box with tick marks and labels (x below, y left) and axis titles.
void axes(Figure& figure, Box plot, const std::vector<double>& x_ticks, double x_lo, double x_hi,
          const std::vector<double>& y_ticks, double y_lo, double y_hi, const std::string& x_label,
          const std::string& y_label, const Theme& theme);

}  // namespace kvlens::viz
