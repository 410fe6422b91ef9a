// The in-app help: an ImGui window over the views listing every key and mouse gesture the app
// understands (stepping, views, files, zoom and pan, selecting, typing into sliders). The canvas
// (imgui_canvas.h) draws it while open and toggles it with F1 or '?'.
#pragma once

namespace kvlens::app {

// Draws the overlay for this frame when *open; its close button, a click outside it, or the
// canvas's Esc set *open to false. Call between ImGui::NewFrame and ImGui::Render.
void draw_help_overlay(bool* open);

// Whether the last frame drew the overlay (for scripts and tests).
bool help_overlay_shown();

}  // namespace kvlens::app
