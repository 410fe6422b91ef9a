// OKLab conversions (Ottosson 2020), the two maps' paths and the dichromacy simulation.
#include "viz/colormap.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvlens::viz {
namespace {

double to_linear(uint8_t channel) {
  const double c = channel / 255.0;
  return c <= 0.04045 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4);
}

double to_encoded(double linear) {
  return linear <= 0.0031308 ? 12.92 * linear : 1.055 * std::pow(linear, 1.0 / 2.4) - 0.055;
}

uint8_t to_byte(double encoded) {
  return uint8_t(std::clamp(std::lround(encoded * 255.0), 0L, 255L));
}

struct Linear {
  double r, g, b;
};

Linear linear_of(Color c) {
  return {to_linear(c.r), to_linear(c.g), to_linear(c.b)};
}

Color color_of(Linear x, uint8_t alpha, bool* clipped) {
  const double lo = std::min({x.r, x.g, x.b}), hi = std::max({x.r, x.g, x.b});
  if (clipped) *clipped = lo < -1e-3 || hi > 1.0 + 1e-3;
  auto channel = [](double v) { return to_byte(to_encoded(std::clamp(v, 0.0, 1.0))); };
  return {channel(x.r), channel(x.g), channel(x.b), alpha};
}

OkLab lerp(OkLab x, OkLab y, double t) {
  return {x.L + (y.L - x.L) * t, x.a + (y.a - x.a) * t, x.b + (y.b - x.b) * t};
}

// The paths' end points, chosen inside the sRGB gamut (the tests check every entry) with as much
// chroma as the gamut allows at those lightnesses.
// (The low end is lifted above the dark theme's background, L 0.18, so that near-zero attention
// stays distinct from "no value" there.)
constexpr OkLab kSequentialLow{0.32, 0.005, -0.125};   // dark blue
constexpr OkLab kSequentialHigh{0.93, -0.035, 0.155};  // light yellow
constexpr OkLab kDivergingLow{0.47, -0.03, -0.15};     // blue
constexpr OkLab kDivergingMid{0.96, 0.0, 0.0};         // near white
constexpr OkLab kDivergingHigh{0.47, 0.085, 0.095};    // burnt orange

}  // namespace

OkLab to_oklab(Color color) {
  const Linear x = linear_of(color);
  const double l = std::cbrt(0.4122214708 * x.r + 0.5363325363 * x.g + 0.0514459929 * x.b);
  const double m = std::cbrt(0.2119034982 * x.r + 0.6806995451 * x.g + 0.1073969566 * x.b);
  const double s = std::cbrt(0.0883024619 * x.r + 0.2817188376 * x.g + 0.6299787005 * x.b);
  return {0.2104542553 * l + 0.7936177850 * m - 0.0040720468 * s,
          1.9779984951 * l - 2.4285922050 * m + 0.4505937099 * s,
          0.0259040371 * l + 0.7827717662 * m - 0.8086757660 * s};
}

Color from_oklab(OkLab lab, bool* clipped) {
  const double l = std::pow(lab.L + 0.3963377774 * lab.a + 0.2158037573 * lab.b, 3.0);
  const double m = std::pow(lab.L - 0.1055613458 * lab.a - 0.0638541728 * lab.b, 3.0);
  const double s = std::pow(lab.L - 0.0894841775 * lab.a - 1.2914855480 * lab.b, 3.0);
  const Linear x{4.0767416621 * l - 3.3077115913 * m + 0.2309699292 * s,
                 -1.2684380046 * l + 2.6097574011 * m - 0.3413193965 * s,
                 -0.0041960863 * l - 0.7034186147 * m + 1.7076147010 * s};
  return color_of(x, 255, clipped);
}

double oklab_distance(Color x, Color y) {
  const OkLab p = to_oklab(x), q = to_oklab(y);
  return std::sqrt((p.L - q.L) * (p.L - q.L) + (p.a - q.a) * (p.a - q.a) +
                   (p.b - q.b) * (p.b - q.b));
}

Colormap::Colormap(ColormapKind kind) : kind_(kind) {
  for (size_t i = 0; i < table_.size(); ++i) {
    const double t = double(i) / double(table_.size() - 1);
    OkLab lab;
    if (kind == ColormapKind::Sequential) {
      lab = lerp(kSequentialLow, kSequentialHigh, t);
    } else {
      lab = t < 0.5 ? lerp(kDivergingLow, kDivergingMid, t * 2.0)
                    : lerp(kDivergingMid, kDivergingHigh, (t - 0.5) * 2.0);
    }
    table_[i] = from_oklab(lab);
  }
  missing_ = Color{0, 0, 0, 0};  // transparent: the figure's background shows through
}

Color Colormap::at(double t) const {
  if (std::isnan(t)) return missing_;
  const double index = std::clamp(t, 0.0, 1.0) * double(table_.size() - 1);
  return table_[size_t(index + 0.5)];  // round to nearest (index >= 0)
}

const Colormap& sequential_colormap() {
  static const Colormap map(ColormapKind::Sequential);
  return map;
}

const Colormap& diverging_colormap() {
  static const Colormap map(ColormapKind::Diverging);
  return map;
}

Color run_color(int64_t index) {
  static constexpr std::array<Color, 8> kOkabeIto{{{230, 159, 0, 255},
                                                   {86, 180, 233, 255},
                                                   {0, 158, 115, 255},
                                                   {240, 228, 66, 255},
                                                   {0, 114, 178, 255},
                                                   {213, 94, 0, 255},
                                                   {204, 121, 167, 255},
                                                   {0, 0, 0, 255}}};
  const int64_t n = int64_t(kOkabeIto.size());
  return kOkabeIto[size_t(((index % n) + n) % n)];
}

double contrast_ratio(Color x, Color y) {
  auto luminance = [](Color c) {
    const Linear l = linear_of(c);
    return 0.2126 * l.r + 0.7152 * l.g + 0.0722 * l.b;
  };
  const double a = luminance(x), b = luminance(y);
  return (std::max(a, b) + 0.05) / (std::min(a, b) + 0.05);
}

Color legible_on(Color color, Color background, double min_contrast) {
  const OkLab start = to_oklab(color);
  const double direction = to_oklab(background).L > 0.5 ? -1.0 : 1.0;
  OkLab lab = start;
  Color out = color;
  // Steps of 0.005 in lightness (a quarter of a just-noticeable difference): the first colour
  // that reaches the contrast, as close to the palette's as it can be.
  for (int i = 0; i < 200 && contrast_ratio(out, background) < min_contrast; ++i) {
    lab.L = std::clamp(lab.L + direction * 0.005, 0.0, 1.0);
    bool clipped = true;
    for (double chroma = 1.0; clipped && chroma > 0.0; chroma -= 0.05) {
      out = from_oklab({lab.L, start.a * chroma, start.b * chroma}, &clipped);
    }
  }
  out.a = color.a;
  return out;
}

Color simulate_dichromacy(Color color, Dichromacy kind) {
  // Vienot et al. 1999 as 3x3 matrices on linear sRGB (the LMS projection folded in).
  static constexpr double kProtan[9] = {0.11238, 0.88762, 0.0,      0.11238, 0.88762,
                                        0.0,     0.00401, -0.00401, 1.0};
  static constexpr double kDeutan[9] = {0.29275, 0.70725,  0.0,     0.29275, 0.70725,
                                        0.0,     -0.02234, 0.02234, 1.0};
  const double* m = kind == Dichromacy::Protanopia ? kProtan : kDeutan;
  const Linear x = linear_of(color);
  const Linear y{m[0] * x.r + m[1] * x.g + m[2] * x.b, m[3] * x.r + m[4] * x.g + m[5] * x.b,
                 m[6] * x.r + m[7] * x.g + m[8] * x.b};
  return color_of(y, color.a, nullptr);
}

std::string hex(Color color) {
  char text[8];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", color.r, color.g, color.b);
  return text;
}

Color mix(Color under, Color over, double amount) {
  const double t = std::clamp(amount, 0.0, 1.0);
  auto channel = [&](uint8_t x, uint8_t y) { return uint8_t(std::lround(x + (y - x) * t)); };
  return {channel(under.r, over.r), channel(under.g, over.g), channel(under.b, over.b),
          channel(under.a, over.a)};
}

}  // namespace kvlens::viz
