// Figure helpers, themes and the data table's CSV / JSON writers.
#include "viz/figure.h"

#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace kvlens::viz {

bool HoverGrid::cell_at(Point p, int64_t& row, int64_t& col) const {
  if (!box.contains(p) || rows <= 0 || cols <= 0) return false;
  row = std::min<int64_t>(rows - 1, int64_t((p.y - box.y) / box.h * float(rows)));
  col = std::min<int64_t>(cols - 1, int64_t((p.x - box.x) / box.w * float(cols)));
  return true;
}

const Theme& light_theme() {
  static const Theme theme{.background = {255, 255, 255, 255},
                           .foreground = {28, 28, 32, 255},
                           .muted = {110, 110, 120, 255},
                           .grid = {205, 205, 212, 255},
                           .accent = {213, 94, 0, 255},
                           .dimmed = {255, 255, 255, 255},
                           .dark = false};
  return theme;
}

const Theme& dark_theme() {
  // (A near-black background: the sequential map's darkest blue, L 0.32, stays distinct on it.)
  static const Theme theme{.background = {17, 18, 22, 255},
                           .foreground = {228, 228, 232, 255},
                           .muted = {150, 150, 160, 255},
                           .grid = {70, 72, 82, 255},
                           .accent = {213, 94, 0, 255},  // Okabe-Ito vermillion: no run's colour
                           .dimmed = {17, 18, 22, 255},
                           .dark = true};
  return theme;
}

void Figure::text(Point anchor, std::string text, float size, Color color, HAlign h, VAlign v,
                  bool bold) {
  TextItem item;
  item.anchor = anchor;
  item.text = std::move(text);
  item.size = size;
  item.color = color;
  item.h = h;
  item.v = v;
  item.bold = bold;
  items.push_back(std::move(item));
}

void Figure::line(Point a, Point b, Color color, float line_width, bool dashed) {
  items.push_back(LineItem{{a, b}, color, line_width, dashed});
}

void Figure::rect(Box box, Color fill, Color stroke, float stroke_width) {
  items.push_back(RectItem{box, fill, stroke, stroke_width});
}

float text_width(const std::string& text, float size) {
  int64_t characters = 0;
  for (const unsigned char c : text) characters += (c & 0xC0) != 0x80;  // UTF-8 lead bytes
  return 0.58f * size * float(characters);
}

namespace {

std::string number_text(double value) {
  if (std::isnan(value)) return "";
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", value);
  return text;
}

std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (const char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

}  // namespace

std::string DataTable::to_csv() const {
  std::string out;
  for (size_t c = 0; c < columns.size(); ++c) out += (c ? "," : "") + csv_field(columns[c]);
  out += "\n";
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      if (c) out += ",";
      if (const double* value = std::get_if<double>(&row[c])) {
        out += number_text(*value);
      } else {
        out += csv_field(std::get<std::string>(row[c]));
      }
    }
    out += "\n";
  }
  return out;
}

std::string DataTable::to_json() const {
  nlohmann::json rows_json = nlohmann::json::array();
  for (const auto& row : rows) {
    nlohmann::json object = nlohmann::json::object();
    for (size_t c = 0; c < row.size() && c < columns.size(); ++c) {
      if (const double* value = std::get_if<double>(&row[c])) {
        object[columns[c]] = std::isfinite(*value) ? nlohmann::json(*value) : nlohmann::json();
      } else {
        object[columns[c]] = std::get<std::string>(row[c]);
      }
    }
    rows_json.push_back(std::move(object));
  }
  return nlohmann::json{{"columns", columns}, {"rows", rows_json}}.dump(1) + "\n";
}

}  // namespace kvlens::viz
