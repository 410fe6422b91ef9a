// A figure: a canvas size and a list of primitives (images, rectangles, lines, circles, text) in
// canvas units (1 unit = 1 pixel at scale 1; y down), plus hover regions. The live app draws it
// through ImGui draw lists and export through QPainter (PNG, SVG, PDF): both renderers read the
// same list, so the screen and the paper show the same figure. Images are RGBA8, row-major.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "viz/colormap.h"

namespace kvlens::viz {

struct Point {
  float x = 0, y = 0;
};

struct Box {
  float x = 0, y = 0, w = 0, h = 0;
  float right() const { return x + w; }
  float bottom() const { return y + h; }
  bool contains(Point p) const { return p.x >= x && p.x < x + w && p.y >= y && p.y < y + h; }
};

// A raster drawn into `box`, pixels kept sharp (nearest) when scaled: one pixel per data cell.
struct ImageItem {
  Box box;
  int32_t width = 0, height = 0;
  std::vector<Color> pixels;  // [height][width]
};

struct RectItem {
  Box box;
  Color fill{0, 0, 0, 0};    // alpha 0: not filled
  Color stroke{0, 0, 0, 0};  // alpha 0: no outline
  float stroke_width = 1.0f;
};

struct LineItem {
  std::vector<Point> points;  // a polyline
  Color color;
  float width = 1.0f;
  bool dashed = false;
};

struct CircleItem {
  Point center;
  float radius = 2.0f;
  Color fill;
  Color stroke{0, 0, 0, 0};
};

enum class HAlign { Left, Center, Right };
enum class VAlign { Top, Middle, Baseline, Bottom };

struct TextItem {
  Point anchor;
  std::string text;    // UTF-8
  float size = 11.0f;  // font size in canvas units
  Color color;
  HAlign h = HAlign::Left;
  VAlign v = VAlign::Baseline;
  bool bold = false;
  bool strike = false;    // struck through (a hidden token)
  float rotation = 0.0f;  // degrees, counter-clockwise about the anchor (vertical axis labels)
  Color background{0, 0, 0, 0};  // a box behind the text (token chips), alpha 0: none
};

using Item = std::variant<ImageItem, RectItem, LineItem, CircleItem, TextItem>;

// A region whose cells describe themselves on hover (and map a click to a cell): rows x cols
// equal cells over `box`. `describe(row, col)` gives the tooltip text.
struct HoverGrid {
  Box box;
  int64_t rows = 1, cols = 1;
  std::string id;  // what the region is ("head 3.5", "consensus"), for linking selections
  std::function<std::string(int64_t row, int64_t col)> describe;
  // Regions with the same non-empty link show the same data cell (one head in each compared
  // run): hovering one marks the cell in all of them.
  std::string link;
  // The cell under p, or false when p is outside.
  bool cell_at(Point p, int64_t& row, int64_t& col) const;
};

struct Theme {
  Color background, foreground, muted, grid, accent, dimmed;
  bool dark = false;
};
const Theme& light_theme();
const Theme& dark_theme();

struct Figure {
  float width = 0, height = 0;
  Color background;
  Color highlight;  // what a live renderer outlines hovered cells with (the theme's accent)
  std::vector<Item> items;
  std::vector<HoverGrid> hover;

  void add(Item item) { items.push_back(std::move(item)); }
  void text(Point anchor, std::string text, float size, Color color, HAlign h = HAlign::Left,
            VAlign v = VAlign::Baseline, bool bold = false);
  void line(Point a, Point b, Color color, float line_width = 1.0f, bool dashed = false);
  void rect(Box box, Color fill, Color stroke = {0, 0, 0, 0}, float stroke_width = 1.0f);
};

// An estimate of a text's advance width for layout (DejaVu Sans averages about 0.58 em per
// character; renderers draw with the real font, so layouts leave slack).
float text_width(const std::string& text, float size);

// The data behind a figure, for CSV and JSON export: named columns, rows of cells (numbers are
// written with full precision; NaN as empty in CSV and null in JSON).
struct DataTable {
  std::vector<std::string> columns;
  std::vector<std::vector<std::variant<double, std::string>>> rows;
  std::string to_csv() const;
  std::string to_json() const;
};

}  // namespace kvlens::viz
