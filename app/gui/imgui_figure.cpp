// FigureDrawer: viz primitives into ImGui draw lists (the screen's half of the two renderers).
#include "app/gui/imgui_figure.h"

#include <imgui.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>

#include "app/gui/imgui_canvas.h"

namespace kvlens::app {
namespace {

ImU32 color32(viz::Color c) {
  return IM_COL32(c.r, c.g, c.b, c.a);
}

void draw_text(ImDrawList* list, ImFont* font, const viz::TextItem& item, ImVec2 origin,
               float zoom) {
  if (item.text.empty()) return;
  const float size = item.size * zoom;
  const float scale = size / font->FontSize;
  const char* begin = item.text.data();
  const char* end = begin + item.text.size();
  const ImVec2 extent = font->CalcTextSizeA(size, FLT_MAX, 0.0f, begin, end);
  const float ascent = font->Ascent * scale, descent = font->Descent * scale;  // descent < 0
  float dx = 0, dy = 0;  // the text box's top-left relative to the anchor
  if (item.h == viz::HAlign::Center) dx = -extent.x / 2;
  if (item.h == viz::HAlign::Right) dx = -extent.x;
  switch (item.v) {
    case viz::VAlign::Top:
      dy = 0;
      break;
    case viz::VAlign::Middle:
      dy = (ascent + descent) / 2 - ascent;
      break;
    case viz::VAlign::Baseline:
      dy = -ascent;
      break;
    case viz::VAlign::Bottom:
      dy = descent - ascent;
      break;
  }
  const ImVec2 anchor(origin.x + item.anchor.x * zoom, origin.y + item.anchor.y * zoom);
  const int first_vertex = list->VtxBuffer.Size;
  if (item.background.a > 0) {
    const float pad = 2 * zoom;
    list->AddRectFilled(
        ImVec2(anchor.x + dx - pad, anchor.y + dy - pad),
        ImVec2(anchor.x + dx + extent.x + pad, anchor.y + dy + ascent - descent + pad),
        color32(item.background));
  }
  list->AddText(font, size, ImVec2(anchor.x + dx, anchor.y + dy), color32(item.color), begin, end);
  if (item.strike) {
    const float y = anchor.y + dy + ascent * 0.62f;
    list->AddLine(ImVec2(anchor.x + dx, y), ImVec2(anchor.x + dx + extent.x, y),
                  color32(item.color), std::max(1.0f, zoom));
  }
  if (item.rotation != 0.0f) {
    // Counter-clockwise on screen (y down) about the anchor.
    const float angle = item.rotation * float(M_PI) / 180.0f;
    const float c = std::cos(angle), s = std::sin(angle);
    for (int v = first_vertex; v < list->VtxBuffer.Size; ++v) {
      ImVec2& p = list->VtxBuffer[v].pos;
      const float rx = p.x - anchor.x, ry = p.y - anchor.y;
      p = ImVec2(anchor.x + rx * c + ry * s, anchor.y - rx * s + ry * c);
    }
  }
}

void draw_polyline(ImDrawList* list, const viz::LineItem& line, ImVec2 origin, float zoom) {
  static std::vector<ImVec2> points;  // drawn every frame on the UI thread: kept, not reallocated
  points.clear();
  for (const viz::Point& p : line.points)
    points.emplace_back(origin.x + p.x * zoom, origin.y + p.y * zoom);
  const ImU32 color = color32(line.color);
  const float width = std::max(1.0f, line.width * zoom);
  if (!line.dashed) {
    list->AddPolyline(points.data(), int(points.size()), color, 0, width);
    return;
  }
  const float on = 5 * zoom, off = 4 * zoom;
  for (size_t i = 1; i < points.size(); ++i) {
    const ImVec2 a = points[i - 1], b = points[i];
    const float length = std::hypot(b.x - a.x, b.y - a.y);
    for (float t = 0; t < length; t += on + off) {
      const float u0 = t / length, u1 = std::min(1.0f, (t + on) / length);
      list->AddLine(ImVec2(a.x + (b.x - a.x) * u0, a.y + (b.y - a.y) * u0),
                    ImVec2(a.x + (b.x - a.x) * u1, a.y + (b.y - a.y) * u1), color, width);
    }
  }
}

}  // namespace

void FigureDrawer::upload() {
  canvas_.release_textures();
  const viz::Figure& f = *figure_;
  placements_.assign(f.items.size(), {});
  // Shelf packing into pages up to kPage pixels a side; each image keeps a 1-pixel gap so that
  // nearest sampling at the edges never reads a neighbour.
  constexpr int kPage = 4096;
  std::vector<size_t> order;
  for (size_t i = 0; i < f.items.size(); ++i) {
    const auto* image = std::get_if<viz::ImageItem>(&f.items[i]);
    if (image && image->width > 0 && image->height > 0 && image->width <= kPage &&
        image->height <= kPage)
      order.push_back(i);
  }
  // First where each image goes (pages of kPage x kPage at most), then each page's pixels.
  struct Slot {
    size_t item;
    int page, x, y;
  };
  std::vector<Slot> placed;
  std::vector<std::array<int, 2>> pages;  // width, used height
  int x = 0, y = 0, shelf = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    const auto& image = std::get<viz::ImageItem>(f.items[order[k]]);
    if (pages.empty() || x + image.width > pages.back()[0]) x = 0, y += shelf, shelf = 0;
    if (pages.empty() || y + image.height > kPage) {
      int widest = 0;
      for (size_t j = k; j < order.size(); ++j)
        widest = std::max(widest, std::get<viz::ImageItem>(f.items[order[j]]).width + 1);
      pages.push_back({std::min(kPage, std::max(1024, widest)), 0});
      x = y = shelf = 0;
    }
    placed.push_back({order[k], int(pages.size()) - 1, x, y});
    x += image.width + 1;
    shelf = std::max(shelf, image.height + 1);
    pages.back()[1] = std::max(pages.back()[1], y + shelf);
  }
  std::vector<viz::Color> pixels;
  for (int p = 0; p < int(pages.size()); ++p) {
    const int width = pages[size_t(p)][0], height = pages[size_t(p)][1];
    pixels.assign(size_t(width) * size_t(height), viz::Color{0, 0, 0, 0});
    for (const Slot& slot : placed) {
      if (slot.page != p) continue;
      const auto& image = std::get<viz::ImageItem>(f.items[slot.item]);
      for (int32_t row = 0; row < image.height; ++row) {
        std::copy_n(image.pixels.data() + size_t(row) * size_t(image.width), image.width,
                    pixels.data() + size_t(slot.y + row) * size_t(width) + size_t(slot.x));
      }
    }
    void* texture =
        canvas_.make_texture(reinterpret_cast<const uint8_t*>(pixels.data()), width, height);
    for (const Slot& slot : placed) {
      if (slot.page != p) continue;
      const auto& image = std::get<viz::ImageItem>(f.items[slot.item]);
      placements_[slot.item] = {
          texture, float(slot.x) / float(width), float(slot.y) / float(height),
          float(slot.x + image.width) / float(width), float(slot.y + image.height) / float(height)};
    }
  }
  uploaded_ = true;
}

void FigureDrawer::set_figure(std::shared_ptr<const viz::Figure> figure) {
  figure_ = std::move(figure);
  uploaded_ = false;
}

std::optional<FigureHit> FigureDrawer::draw(float zoom) {
  if (!figure_) return std::nullopt;
  const viz::Figure& f = *figure_;
  if (!uploaded_) upload();
  ImDrawList* list = ImGui::GetWindowDrawList();
  const ImVec2 origin = ImGui::GetCursorScreenPos();
  ImFont* font = canvas_.figure_font();
  list->AddRectFilled(origin, ImVec2(origin.x + f.width * zoom, origin.y + f.height * zoom),
                      color32(f.background));
  auto at = [&](float x, float y) { return ImVec2(origin.x + x * zoom, origin.y + y * zoom); };
  // Images first (no view draws anything under an image but the background), so that they
  // share their atlas page's draw call; then the rest in order.
  for (size_t i = 0; i < f.items.size(); ++i) {
    const auto* image = std::get_if<viz::ImageItem>(&f.items[i]);
    const Placement& place = placements_[i];
    if (!image || !place.texture) continue;
    list->AddImage(place.texture, at(image->box.x, image->box.y),
                   at(image->box.right(), image->box.bottom()), ImVec2(place.u0, place.v0),
                   ImVec2(place.u1, place.v1));
  }
  for (size_t i = 0; i < f.items.size(); ++i) {
    const viz::Item& item = f.items[i];
    if (std::holds_alternative<viz::ImageItem>(item)) {
      continue;
    } else if (const auto* rect = std::get_if<viz::RectItem>(&item)) {
      const ImVec2 a = at(rect->box.x, rect->box.y), b = at(rect->box.right(), rect->box.bottom());
      if (rect->fill.a > 0) list->AddRectFilled(a, b, color32(rect->fill));
      if (rect->stroke.a > 0)
        list->AddRect(a, b, color32(rect->stroke), 0, 0, std::max(1.0f, rect->stroke_width * zoom));
    } else if (const auto* line = std::get_if<viz::LineItem>(&item)) {
      draw_polyline(list, *line, origin, zoom);
    } else if (const auto* circle = std::get_if<viz::CircleItem>(&item)) {
      const ImVec2 center = at(circle->center.x, circle->center.y);
      const float radius = circle->radius * zoom;
      if (circle->fill.a > 0) list->AddCircleFilled(center, radius, color32(circle->fill), 12);
      if (circle->stroke.a > 0) list->AddCircle(center, radius, color32(circle->stroke), 12);
    } else if (const auto* text = std::get_if<viz::TextItem>(&item)) {
      draw_text(list, font, *text, origin, zoom);
    }
  }
  ImGui::Dummy(ImVec2(f.width * zoom, f.height * zoom));
  std::optional<FigureHit> hit;
  if (!ImGui::IsWindowHovered()) return hit;
  const ImVec2 mouse = ImGui::GetIO().MousePos;
  const viz::Point p{(mouse.x - origin.x) / zoom, (mouse.y - origin.y) / zoom};
  for (auto grid = f.hover.rbegin(); grid != f.hover.rend(); ++grid) {
    int64_t row = 0, col = 0;
    if (!grid->cell_at(p, row, col)) continue;
    ImGui::BeginTooltip();
    ImGui::TextUnformatted(grid->describe(row, col).c_str());
    ImGui::EndTooltip();
    if (ImGui::IsMouseClicked(0)) hit = FigureHit{grid->id, row, col};
    // Linked hover: the same cell outlined in every region showing the same data (each run).
    if (!grid->link.empty()) {
      for (const viz::HoverGrid& other : f.hover) {
        if (other.link != grid->link || other.rows != grid->rows || other.cols != grid->cols)
          continue;
        const float cw = other.box.w / float(other.cols), ch = other.box.h / float(other.rows);
        const ImVec2 a(origin.x + (other.box.x + float(col) * cw) * zoom,
                       origin.y + (other.box.y + float(row) * ch) * zoom);
        list->AddRect(ImVec2(a.x - 1, a.y - 1), ImVec2(a.x + cw * zoom + 1, a.y + ch * zoom + 1),
                      color32(f.highlight), 0, 0, 2.0f);
      }
    }
    break;
  }
  return hit;
}

}  // namespace kvlens::app
