// Colormaps for kvlens figures: a sequential map (dark blue to light yellow) and a diverging map
// (blue through light grey to orange), both straight paths in OKLab so that equal steps of the
// value are equal perceptual steps, with lightness monotone (sequential) or symmetric (diverging)
// and hue confined near the blue-yellow axis that dichromats keep. Plus a qualitative palette for
// runs (Okabe and Ito's colour-blind-safe set). Colours are 8-bit sRGB.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace kvlens::viz {

struct Color {
  uint8_t r = 0, g = 0, b = 0, a = 255;
  friend bool operator==(const Color&, const Color&) = default;
};

// OKLab coordinates (Ottosson 2020): L in [0, 1], a and b about [-0.4, 0.4].
struct OkLab {
  double L = 0.0, a = 0.0, b = 0.0;
};

OkLab to_oklab(Color color);
// Clamps each channel into [0, 255] after rounding; `clipped` (optional) tells whether any linear
// channel left [0, 1] by more than 1e-3 (the colour was outside the sRGB gamut).
Color from_oklab(OkLab lab, bool* clipped = nullptr);
// Euclidean distance in OKLab (about 0.02 is a just-noticeable difference).
double oklab_distance(Color x, Color y);

enum class ColormapKind { Sequential, Diverging };

// A 256-entry lookup table built once from the map's OKLab path.
class Colormap {
 public:
  explicit Colormap(ColormapKind kind);
  ColormapKind kind() const { return kind_; }
  // t in [0, 1] (clamped; NaN gives the map's `missing` colour).
  Color at(double t) const;
  Color missing() const { return missing_; }
  const std::array<Color, 256>& table() const { return table_; }

 private:
  ColormapKind kind_;
  std::array<Color, 256> table_{};
  Color missing_{};
};

const Colormap& sequential_colormap();
const Colormap& diverging_colormap();

// Okabe-Ito: orange, sky blue, bluish green, yellow, blue, vermillion, reddish purple, black.
// (A position's colour: views colour a run by its policy, viz::run_color(trace, run, theme).)
Color run_color(int64_t index);

// WCAG 2 contrast ratio of two colours' relative luminances, in [1, 21] (3 is the minimum for
// large text and graphics, 4.5 for body text).
double contrast_ratio(Color x, Color y);
// `color` with its OKLab lightness moved away from `background`'s (darker on a light background,
// lighter on a dark one), hue kept and chroma reduced only where the gamut requires, until the
// contrast ratio reaches min_contrast: a palette colour legible as text and lines on either theme.
Color legible_on(Color color, Color background, double min_contrast = 3.0);

// Colour as a red-green dichromat sees it (Vienot, Brettel and Mollon 1999, in linear sRGB): the
// two most common colour-vision deficiencies, for checking the maps and palettes.
enum class Dichromacy { Protanopia, Deuteranopia };
Color simulate_dichromacy(Color color, Dichromacy kind);

// "#rrggbb" (alpha ignored).
std::string hex(Color color);
// Blends `over` onto `under` by `amount` in [0, 1] in sRGB (for dimming).
Color mix(Color under, Color over, double amount);

}  // namespace kvlens::viz
