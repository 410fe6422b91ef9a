// Heatmap rasters, colour bars, ticks, axes and label formatting (layout.h).
#include "viz/layout.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

namespace kvlens::viz {

double ValueScale::normalise(double value) const {
  if (!std::isfinite(value)) return std::numeric_limits<double>::quiet_NaN();
  if (log) {
    // log10(value / lo) / log10(hi / lo): one logarithm per value.
    return std::log10(std::max(value, lo) / lo) / std::log10(hi / lo);
  }
  return hi > lo ? (value - lo) / (hi - lo) : 0.5;
}

ValueScale ValueScale::fitted(const std::vector<float>& values) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const float v : values) {
    if (std::isfinite(v)) lo = std::min(lo, double(v)), hi = std::max(hi, double(v));
  }
  if (!(lo <= hi)) return {0.0, 1.0, false};
  if (lo == hi) return {lo - 1.0, hi + 1.0, false};
  return {lo, hi, false};
}

ValueColors::ValueColors(const ValueScale& scale, const Colormap& map) : scale_(scale), map_(&map) {
  // Entry k from normalise = (k - 0.5) / 255 on, as Colormap::at rounds.
  const size_t entries = map.table().size();
  for (size_t k = 1; k < entries && scale.log; ++k) {
    const double t = (double(k) - 0.5) / double(entries - 1);
    boundaries_.push_back(scale.lo * std::pow(scale.hi / scale.lo, t));
  }
}

Color ValueColors::operator()(double value) const {
  if (!scale_.log) return map_->at(scale_.normalise(value));
  const auto k =
      size_t(std::upper_bound(boundaries_.begin(), boundaries_.end(), value) - boundaries_.begin());
  return map_->table()[k];
}

HiddenStyle hidden_style(const Theme& theme) {
  // OKLab: a (red-green) well off the map's near-zero a, lightness away from the background.
  if (theme.dark) return {from_oklab({0.40, 0.05, -0.005}), from_oklab({0.52, 0.07, -0.01})};
  return {from_oklab({0.80, 0.05, -0.005}), from_oklab({0.66, 0.07, -0.01})};
}

OutsideStyle outside_window_style(const Theme& theme) {
  // OKLab with a = b = 0: no hue, so it never reads as a value of the map or as the pink hatch.
  if (theme.dark) return {from_oklab({0.30, 0.0, 0.0}), from_oklab({0.46, 0.0, 0.0})};
  return {from_oklab({0.91, 0.0, 0.0}), from_oklab({0.72, 0.0, 0.0})};
}

namespace {
Color outside_pixel(const OutsideStyle& style, int64_t x, int64_t y) {
  return x % kDotPeriod == 0 && y % kDotPeriod == 0 ? style.dot : style.fill;
}
}  // namespace

int64_t hatch_scale_for(int64_t pixels, float screen) {
  if (pixels <= 0 || !(screen > 0)) return 1;
  return std::clamp<int64_t>(std::lround(screen / float(pixels) / 1.5f), 1, 8);
}

ImageItem heatmap(Box box, const std::vector<float>& values, const std::vector<uint8_t>* visible,
                  int64_t rows, int64_t cols, const ValueScale& scale, const Colormap& map,
                  const Theme& theme, int64_t max_pixels, int64_t hatch_scale) {
  return heatmap(box, values, visible, rows, cols, ValueColors(scale, map), theme, max_pixels,
                 hatch_scale);
}

ImageItem heatmap(Box box, const std::vector<float>& values, const std::vector<uint8_t>* visible,
                  int64_t rows, int64_t cols, const ValueColors& color_of, const Theme& theme,
                  int64_t max_pixels, int64_t hatch_scale) {
  ImageItem image;
  image.box = box;
  const int64_t block_rows = std::max<int64_t>(1, (rows + max_pixels - 1) / max_pixels);
  const int64_t block_cols = std::max<int64_t>(1, (cols + max_pixels - 1) / max_pixels);
  const int64_t k = std::max<int64_t>(1, hatch_scale);
  const int64_t pooled_h = (rows + block_rows - 1) / block_rows;
  const int64_t pooled_w = (cols + block_cols - 1) / block_cols;
  image.height = int32_t(pooled_h * k);
  image.width = int32_t(pooled_w * k);
  image.pixels.assign(size_t(image.width) * size_t(image.height), Color{0, 0, 0, 0});
  const HiddenStyle hidden = hidden_style(theme);
  const OutsideStyle outside_style = outside_window_style(theme);
  for (int64_t py = 0; py < pooled_h; ++py) {
    for (int64_t px = 0; px < pooled_w; ++px) {
      double best = -std::numeric_limits<double>::infinity();
      int64_t seen = 0, unseen = 0, outside = 0;
      for (int64_t r = py * block_rows; r < std::min(rows, (py + 1) * block_rows); ++r) {
        for (int64_t c = px * block_cols; c < std::min(cols, (px + 1) * block_cols); ++c) {
          const size_t at = size_t(r * cols + c);
          if (visible && (*visible)[at] == kOutsideWindow) {
            ++outside;
            continue;
          }
          if (!std::isfinite(values[at])) continue;
          best = std::max(best, double(values[at]));
          const uint8_t v = visible ? (*visible)[at] : 1;
          seen += v == 1;
          unseen += v == 0;
        }
      }
      if (!std::isfinite(best)) {
        // Only keys outside the window (or no values): the window's own style.
        if (outside == 0) continue;
        for (int64_t y = py * k; y < (py + 1) * k; ++y) {
          Color* out = image.pixels.data() + y * image.width;
          for (int64_t x = px * k; x < (px + 1) * k; ++x)
            out[x] = outside_pixel(outside_style, x, y);
        }
        continue;
      }
      // A block counts as hidden only when none of its cells was seen.
      const bool is_hidden = unseen > 0 && seen == 0;
      const Color color = color_of(best);
      for (int64_t y = py * k; y < (py + 1) * k; ++y) {
        Color* out = image.pixels.data() + y * image.width;
        for (int64_t x = px * k; x < (px + 1) * k; ++x) {
          // Stripes run along x + y of the whole image: continuous across neighbouring cells.
          out[x] = !is_hidden                                  ? color
                   : (x + y) % kHatchPeriod < kHatchPeriod / 2 ? hidden.stripe
                                                               : hidden.fill;
        }
      }
    }
  }
  return image;
}

void hidden_swatch(Figure& figure, Box box, const std::string& label, const Theme& theme) {
  const HiddenStyle hidden = hidden_style(theme);
  ImageItem swatch;
  swatch.box = box;
  // About 1.5 canvas units a pixel: the stripes look as they do on a map at 100%.
  swatch.width = int32_t(std::max(4.0f, std::round(box.w / 1.5f)));
  swatch.height = int32_t(std::max(4.0f, std::round(box.h / 1.5f)));
  for (int32_t y = 0; y < swatch.height; ++y)
    for (int32_t x = 0; x < swatch.width; ++x)
      swatch.pixels.push_back((x + y) % kHatchPeriod < kHatchPeriod / 2 ? hidden.stripe
                                                                        : hidden.fill);
  figure.add(std::move(swatch));
  figure.rect(box, {0, 0, 0, 0}, theme.grid);
  figure.text({box.right() + 6, box.y + box.h / 2}, label, 11, theme.foreground, HAlign::Left,
              VAlign::Middle);
}

void outside_window_swatch(Figure& figure, Box box, const std::string& label, const Theme& theme) {
  const OutsideStyle style = outside_window_style(theme);
  ImageItem swatch;
  swatch.box = box;
  swatch.width = int32_t(std::max(4.0f, std::round(box.w / 1.5f)));
  swatch.height = int32_t(std::max(4.0f, std::round(box.h / 1.5f)));
  for (int32_t y = 0; y < swatch.height; ++y)
    for (int32_t x = 0; x < swatch.width; ++x) swatch.pixels.push_back(outside_pixel(style, x, y));
  figure.add(std::move(swatch));
  figure.rect(box, {0, 0, 0, 0}, theme.grid);
  figure.text({box.right() + 6, box.y + box.h / 2}, label, 11, theme.foreground, HAlign::Left,
              VAlign::Middle);
}

std::vector<double> nice_ticks(double lo, double hi, int count) {
  std::vector<double> ticks;
  if (!(hi > lo) || count < 1) {
    if (std::isfinite(lo)) ticks.push_back(lo);
    return ticks;
  }
  const double raw = (hi - lo) / count;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (const double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    step = m * magnitude;
    if (step >= raw) break;
  }
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    ticks.push_back(std::abs(v) < step * 1e-9 ? 0.0 : v);
  return ticks;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", value);
  return text;
}

std::string token_label(const std::string& text, size_t max_chars) {
  std::string out;
  for (const char c : text) {
    if (c == '\n') {
      out += "\u21b5";  // ↵
    } else if (c == '\t') {
      out += "\u21e5";
    } else if (c == '\r') {
      continue;
    } else if ((unsigned char)c < 0x20 || c == 0x7f) {
      out += "\u00bf";
    } else {
      out += c;
    }
  }
  if (!out.empty() && out.front() == ' ') out = "\u00b7" + out.substr(1);
  if (out.size() > 1 && out.back() == ' ') out = out.substr(0, out.size() - 1) + "\u00b7";
  // Cut at a character boundary.
  size_t chars = 0, cut = out.size();
  for (size_t i = 0; i < out.size(); ++i) {
    if ((static_cast<unsigned char>(out[i]) & 0xC0) == 0x80) continue;
    if (chars == max_chars) {
      cut = i;
      break;
    }
    ++chars;
  }
  if (cut < out.size()) out = out.substr(0, cut) + "\u2026";
  return out;
}

float title_block(Figure& figure, const std::string& title, const std::string& subtitle,
                  const Theme& theme) {
  figure.text({16, 26}, title, 17, theme.foreground, HAlign::Left, VAlign::Baseline, true);
  if (subtitle.empty()) return 40;
  figure.text({16, 46}, subtitle, 12, theme.muted);
  return 60;
}

void colorbar(Figure& figure, Box box, const Colormap& map, const ValueScale& scale,
              const std::string& label, const Theme& theme) {
  ImageItem bar;
  bar.box = box;
  bar.width = 1;
  bar.height = 256;
  for (int i = 0; i < 256; ++i) bar.pixels.push_back(map.table()[size_t(255 - i)]);
  figure.add(std::move(bar));
  figure.rect(box, {0, 0, 0, 0}, theme.grid);
  figure.text({box.x, box.y - 8}, label, 11, theme.foreground);
  std::vector<double> ticks;
  if (scale.log) {
    for (double p = std::ceil(std::log10(scale.lo)); p <= std::log10(scale.hi) + 1e-9; p += 1.0)
      ticks.push_back(std::pow(10.0, p));
  } else {
    ticks = nice_ticks(scale.lo, scale.hi, 5);
  }
  for (const double v : ticks) {
    const float y = box.bottom() - float(scale.normalise(v)) * box.h;
    figure.line({box.right(), y}, {box.right() + 4, y}, theme.foreground);
    std::string text = format_value(v);
    if (scale.log) {
      char exponent[16];
      std::snprintf(exponent, sizeof exponent, "1e%d", int(std::lround(std::log10(v))));
      text = v == 1.0 ? "1" : exponent;
    }
    figure.text({box.right() + 7, y}, text, 10, theme.foreground, HAlign::Left, VAlign::Middle);
  }
}

namespace {

// The tick values of a colour bar and their labels ("1e-3" on a log scale).
std::vector<std::pair<double, std::string>> bar_ticks(const ValueScale& scale) {
  std::vector<std::pair<double, std::string>> ticks;
  if (scale.log) {
    for (double p = std::ceil(std::log10(scale.lo)); p <= std::log10(scale.hi) + 1e-9; p += 1.0) {
      const double v = std::pow(10.0, p);
      ticks.emplace_back(v, v == 1.0 ? "1" : "1e" + std::to_string(int(std::lround(p))));
    }
  } else {
    for (const double v : nice_ticks(scale.lo, scale.hi, 5)) ticks.emplace_back(v, format_value(v));
  }
  return ticks;
}

}  // namespace

float colorbar_row(Figure& figure, Box box, const Colormap& map, const ValueScale& scale,
                   const std::string& label, const Theme& theme) {
  figure.text({box.x, box.y + box.h / 2}, label, 11, theme.foreground, HAlign::Left,
              VAlign::Middle);
  Box bar_box = box;
  bar_box.x += text_width(label, 11) + 8;
  ImageItem bar;
  bar.box = bar_box;
  bar.width = int32_t(map.table().size());
  bar.height = 1;
  bar.pixels.assign(map.table().begin(), map.table().end());
  figure.add(std::move(bar));
  figure.rect(bar_box, {0, 0, 0, 0}, theme.grid);
  float right = bar_box.right();
  for (const auto& [v, text] : bar_ticks(scale)) {
    const float x = bar_box.x + float(scale.normalise(v)) * bar_box.w;
    figure.line({x, bar_box.bottom()}, {x, bar_box.bottom() + 3}, theme.foreground);
    figure.text({x, bar_box.bottom() + 4}, text, 10, theme.foreground, HAlign::Center, VAlign::Top);
    right = std::max(right, x + text_width(text, 10) / 2);
  }
  return right + 18;
}

void inline_colorbar(Figure& figure, Point right_baseline, double lo, double hi,
                     const Colormap& map, const Theme& theme) {
  const float bar_w = 56;
  const std::string high = format_value(hi);
  ImageItem bar;
  bar.box = {right_baseline.x - bar_w - text_width(high, 10) - 4, right_baseline.y - 8, bar_w, 8};
  bar.width = int32_t(map.table().size());
  bar.height = 1;
  bar.pixels.assign(map.table().begin(), map.table().end());
  figure.text({bar.box.x - 4, right_baseline.y}, format_value(lo), 10, theme.muted, HAlign::Right);
  figure.text(right_baseline, high, 10, theme.muted, HAlign::Right);
  figure.add(std::move(bar));
}

void axes(Figure& figure, Box plot, const std::vector<double>& x_ticks, double x_lo, double x_hi,
          const std::vector<double>& y_ticks, double y_lo, double y_hi, const std::string& x_label,
          const std::string& y_label, const Theme& theme) {
  figure.rect(plot, {0, 0, 0, 0}, theme.muted);
  auto x_at = [&](double v) { return plot.x + float((v - x_lo) / (x_hi - x_lo)) * plot.w; };
  auto y_at = [&](double v) { return plot.bottom() - float((v - y_lo) / (y_hi - y_lo)) * plot.h; };
  for (const double v : x_ticks) {
    if (v < x_lo || v > x_hi) continue;
    const float x = x_at(v);
    figure.line({x, plot.bottom()}, {x, plot.bottom() + 4}, theme.foreground);
    figure.text({x, plot.bottom() + 6}, format_value(v), 10, theme.foreground, HAlign::Center,
                VAlign::Top);
  }
  for (const double v : y_ticks) {
    if (v < y_lo || v > y_hi) continue;
    const float y = y_at(v);
    figure.line({plot.x - 4, y}, {plot.x, y}, theme.foreground);
    figure.text({plot.x - 6, y}, format_value(v), 10, theme.foreground, HAlign::Right,
                VAlign::Middle);
  }
  figure.text({plot.x + plot.w / 2, plot.bottom() + 30}, x_label, 11, theme.foreground,
              HAlign::Center, VAlign::Baseline);
  TextItem y_title;
  y_title.anchor = {plot.x - 38, plot.y + plot.h / 2};
  y_title.text = y_label;
  y_title.size = 11;
  y_title.color = theme.foreground;
  y_title.h = HAlign::Center;
  y_title.v = VAlign::Baseline;
  y_title.rotation = 90.0f;
  figure.add(std::move(y_title));
}

}  // namespace kvlens::viz
