// The window's content, drawn with ImGui each frame: a sidebar (text and policies to run, stepping
// and playback, runs to compare, the selected head and view options, the co-reference answer as
// each run predicts it) and the current view's figure (viz, rebuilt only when what it shows
// changes), with tooltips, clicks that select a head or jump to a step, zoom and pan. The state
// here is what the menus, the shortcuts and the script mode drive.
#pragma once

#include <algorithm>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "app/gui/engine_controller.h"
#include "app/gui/imgui_figure.h"
#include "viz/views.h"

namespace kvlens::app {

class ImGuiCanvas;

class Dashboard {
 public:
  Dashboard(ImGuiCanvas& canvas, EngineController& engine);

  void frame();

  // Stepping. Forward replays recorded steps before recording new ones; back only moves the view.
  void step_forward(int count);
  void step_back(int count);
  void go_to_step(int64_t step);
  void set_playing(bool playing);
  bool playing() const { return playing_; }
  void set_play_rate(float steps_per_second) { play_rate_ = steps_per_second; }
  // A new recording from the sidebar's settings (the model folder from the session config).
  void restart();
  // The policies to record next, as the user names them (the sidebar's check boxes follow).
  void set_policies(const std::string& policies);

  void set_view(viz::ViewKind kind) { view_ = kind; }
  // 0: the figure fits the width; else a scale in [0.25, 8] of the figure laid out at 1280 units.
  void set_zoom(float zoom) { zoom_ = zoom <= 0.0f ? 0.0f : std::clamp(zoom, 0.25f, 8.0f); }
  viz::ViewKind view() const { return view_; }
  viz::ViewOptions& options() { return options_; }
  int64_t cursor() const { return cursor_; }
  // The recording opened or stepped: keep the view at the newest step when it was there.
  void on_opened();
  void on_stepped(int64_t step);

  // The figure of the current view as the screen shows it: without its data, its head maps
  // pooled to the screen's pixels (null before a step is recorded).
  std::shared_ptr<const viz::View> current_view();
  // The same view built for an export: full detail whatever the zoom, with the data behind it
  // when asked (null before a step is recorded).
  std::shared_ptr<const viz::View> view_for_export(bool with_data);
  // How long the last figure took to build (for the status bar and benchmarks).
  double last_build_seconds() const { return build_seconds_; }
  // Token text and the runs to compare for a fresh recording.
  SessionConfig& pending_config() { return pending_; }

  std::function<void(const std::string&)> on_error;  // bad options the view rejects

 private:
  void sidebar();
  void view_area();
  void playback();
  void apply_hit(const FigureHit& hit);
  std::string view_key() const;

  ImGuiCanvas& canvas_;
  EngineController& engine_;
  FigureDrawer drawer_;
  SessionConfig pending_;
  viz::ViewKind view_ = viz::ViewKind::Heads;
  viz::ViewOptions options_;
  HeadMapCache head_maps_;  // the heads grid's maps, grown step by step
  int64_t cursor_ = -1;
  bool follow_ = true;  // the cursor follows newly recorded steps
  bool playing_ = false;
  bool scrubbing_ = false;  // the step slider is being dragged
  float play_rate_ = 8.0f;  // steps per second
  double last_play_seconds_ = 0.0;
  float zoom_ = 0.0f;    // 0: fit the width
  int shown_tab_ = -1;   // the view tab the tab bar last showed
  int style_dark_ = -1;  // the ImGui style in use (-1: not set yet)
  std::string key_;
  std::shared_ptr<const viz::View> built_;
  double built_seconds_ = -1.0;  // when built_ was made (ImGui time)
  double build_seconds_ = 0.0;   // how long making it took
  std::string build_error_;
  std::vector<char> policy_checked_;
};

}  // namespace kvlens::app
