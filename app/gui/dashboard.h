// The window's content, drawn with ImGui each frame: a sidebar (dashboard_sidebar.cpp: the text,
// the runs to record each with its own policy, budget and knobs, stepping, the runs to compare,
// the selected head, a token search, view options, generation) and the view area (a tab per view;
// the figure is rebuilt only when what it shows changes), with tooltips, clicks that select a
// head, a token or a step, zoom and pan. The recording runs in the background from the moment a
// text opens; the cursor follows it until the user moves it. The state here is what the menus,
// the shortcuts and the script mode drive.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "app/gui/engine_controller.h"
#include "app/gui/imgui_figure.h"
#include "app/gui/run_rows.h"
#include "viz/views.h"

namespace kvlens::app {

class ImGuiCanvas;

// The tabs of the view area: the figure views in this order, then the generated texts.
enum class Tab { Heads, Predicted, Retention, History, Consensus, Logits, Generate };
inline constexpr int kTabCount = 7;
const char* tab_title(Tab tab);
// The figure view a tab shows (Generate has none: false).
bool tab_view(Tab tab, viz::ViewKind& kind);
Tab tab_of(viz::ViewKind kind);

class Dashboard {
 public:
  Dashboard(ImGuiCanvas& canvas, EngineController& engine);

  void frame();

  // Stepping. Forward moves over recorded steps; past the last one recorded, the cursor goes on
  // as the background recording reaches it (presses are never dropped). Back only moves the view.
  void step_forward(int count);
  void step_back(int count);
  void go_to_step(int64_t step);
  void set_playing(bool playing);
  bool playing() const { return playing_; }
  void set_play_rate(float steps_per_second) { play_rate_ = steps_per_second; }
  // Records the sidebar's settings: the same text keeps the step, the compare picks and the
  // selected head, and the view shows the old recording until the new one reaches the step.
  void restart();
  // The runs to record next as run specs ("dense,h2o@0.3,h2o@0.7:recent=16"): the sidebar's run
  // rows follow.
  void set_policies(const std::string& policies);
  // A change in the sidebar not yet recorded.
  bool changes_pending() const;

  void set_view(viz::ViewKind kind) { tab_ = tab_of(kind); }
  void set_tab(Tab tab) { tab_ = tab; }
  Tab tab() const { return tab_; }
  // 0: the figure fits the view area; else a scale in [0.25, 8] of the figure laid out at 1280
  // units.
  void set_zoom(float zoom) { zoom_ = zoom <= 0.0f ? 0.0f : std::clamp(zoom, 0.25f, 8.0f); }
  viz::ViewKind view() const;
  viz::ViewOptions& options() { return options_; }
  int64_t cursor() const { return cursor_; }
  // The step the cursor goes to once recorded (-1: none pending).
  int64_t target_step() const { return target_step_; }
  // Highlights the tokens whose text contains `query` (case-insensitive; empty: none) in every
  // view; returns how many matched.
  size_t find_token(const std::string& query);
  // The token whose history the History view outlines (-1: none).
  void focus_token(int64_t token);
  // What a click on a figure's hover region does (select a head, a token's history, a step).
  void act_on_hit(const FigureHit& hit);
  // The sidebar hidden gives the figure the window's width (Ctrl+B).
  void set_sidebar_shown(bool shown) { sidebar_shown_ = shown; }
  bool sidebar_shown() const { return sidebar_shown_; }
  // Generates max_new tokens under each run (the Generate tab shows them).
  void generate(int64_t max_new);

  // The recording opened (a new text), was replaced (the same text, other runs) or stepped.
  void on_opened();
  void on_replaced();
  void on_stepped(int64_t step);
  // The recording reached its end: unless the user chose a head, the typical head of the
  // predicting run is selected (policy_defaults.h); returns why, or empty.
  std::string on_recorded();
  // Selects a head as the user does (it then stays across recordings).
  void select_head(int64_t layer, int64_t head);

  // The figure of the current view as the screen shows it: without its data, its head maps
  // pooled to the screen's pixels (null before a step is recorded or on the Generate tab).
  std::shared_ptr<const viz::View> current_view();
  // The same view built for an export: full detail whatever the zoom, with the data behind it
  // when asked (null before a step is recorded).
  std::shared_ptr<const viz::View> view_for_export(bool with_data);
  // The view area the figure was last laid out for (Fit: its size), in canvas units.
  float area_width() const { return area_width_; }
  float area_height() const { return area_height_; }
  // How long the last figure took to build (for the status bar and benchmarks).
  double last_build_seconds() const { return build_seconds_; }
  // Token text and the runs to compare for a fresh recording.
  SessionConfig& pending_config() { return pending_; }
  RunRows& run_rows() { return run_rows_; }

  std::function<void(const std::string&)> on_error;  // bad options the view rejects
  std::function<void()> on_edit_prompt;              // opens the prompt editor (a Qt dialog)
  std::function<void(const std::string&)> on_open_model;  // a model folder or .gguf file
  // Real models fetched onto this machine (tools/get_model.sh), offered in the sidebar.
  std::vector<std::string> fetched_models;

 private:
  // dashboard_sidebar.cpp
  void sidebar();
  void text_section();
  void runs_section();
  void step_section();
  void compare_section();
  void head_section();
  void coref_section();
  // dashboard.cpp
  void view_area();
  void generate_area();  // dashboard_generate.cpp
  void zoom_controls();
  void playback();
  std::string view_key() const;
  void sync_runs_to_config();

  ImGuiCanvas& canvas_;
  EngineController& engine_;
  FigureDrawer drawer_;
  SessionConfig pending_;
  RunRows run_rows_;
  Tab tab_ = Tab::Heads;
  viz::ViewOptions options_;
  HeadMapCache head_maps_;  // the heads grid's maps, grown step by step
  int64_t cursor_ = -1;
  int64_t target_step_ = -1;
  bool follow_ = true;  // the cursor follows newly recorded steps
  bool playing_ = false;
  bool scrubbing_ = false;    // the step slider is being dragged
  bool head_chosen_ = false;  // the user selected a head: no default replaces it
  bool sidebar_shown_ = true;
  int64_t generate_tokens_ = 32;  // the Generate tab's token count
  float area_width_ = 0, area_height_ = 0;
  float play_rate_ = 8.0f;  // steps per second
  double last_play_seconds_ = 0.0;
  float zoom_ = 0.0f;    // 0: fit the view area
  int shown_tab_ = -1;   // the tab the tab bar last showed
  int style_dark_ = -1;  // the ImGui style in use (-1: not set yet)
  std::string token_query_;
  // The compare picks and the selected head, kept across a re-recording of the same text.
  std::vector<RunKey> kept_runs_;
  std::string key_;
  std::shared_ptr<const viz::View> built_;
  double built_seconds_ = -1.0;  // when built_ was made (ImGui time)
  double build_seconds_ = 0.0;   // how long making it took
  std::string build_error_;
};

}  // namespace kvlens::app
