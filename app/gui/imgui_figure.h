// The live renderer of viz figures: draws a Figure's primitives into the current ImGui window's
// draw list (images as nearest-filtered textures, text from the bundled font at the figure's
// sizes, rotated where asked), scaled by a zoom, and turns the pointer over a hover region into
// a tooltip and a click into a hit the window acts on (select a head, jump to a step).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "viz/figure.h"

namespace kvlens::app {

class ImGuiCanvas;

struct FigureHit {
  std::string id;  // the HoverGrid's id
  int64_t row = 0, col = 0;
};

class FigureDrawer {
 public:
  explicit FigureDrawer(ImGuiCanvas& canvas) : canvas_(canvas) {}
  // A new figure: its images are uploaded at the next draw (the old textures released).
  void set_figure(std::shared_ptr<const viz::Figure> figure);
  const viz::Figure* figure() const { return figure_.get(); }
  // Draws at the cursor position, figure units times `zoom` in screen units, reserving the
  // space; returns the region cell clicked this frame.
  std::optional<FigureHit> draw(float zoom);

 private:
  ImGuiCanvas& canvas_;
  std::shared_ptr<const viz::Figure> figure_;
  // The figure's images packed into atlas pages (one texture and one draw call for many maps:
  // a software renderer pays per call); per item, its page texture and UV rectangle.
  struct Placement {
    void* texture = nullptr;
    float u0 = 0, v0 = 0, u1 = 0, v1 = 0;
  };
  std::vector<Placement> placements_;
  bool uploaded_ = false;
  void upload();
};

}  // namespace kvlens::app
