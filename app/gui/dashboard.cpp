// Dashboard: the frame, the stepping logic and the view area (the sidebar is
// dashboard_sidebar.cpp).
#include "app/gui/dashboard.h"

#include <imgui.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "app/gui/imgui_canvas.h"
#include "app/gui/policy_defaults.h"
#include "engine/trace/trace_queries.h"
#include "viz/layout.h"

namespace kvlens::app {
namespace {

double now_seconds() {
  return ImGui::GetTime();
}

std::string lower(std::string text) {
  for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// Trims the spaces at both ends (a token's text often starts with one the user does not type).
std::string trimmed(const std::string& text) {
  const size_t begin = text.find_first_not_of(' ');
  if (begin == std::string::npos) return {};
  return text.substr(begin, text.find_last_not_of(' ') - begin + 1);
}

}  // namespace

const char* tab_title(Tab tab) {
  static const char* const titles[kTabCount] = {
      "Heads", "Predicted vs true", "Retention", "History", "Consensus", "Logits", "Generate"};
  return titles[int(tab)];
}

bool tab_view(Tab tab, viz::ViewKind& kind) {
  // The figure views in the tabs' order; Generate (the last tab) has none.
  static constexpr viz::ViewKind kTabViews[] = {viz::ViewKind::Heads,     viz::ViewKind::Predicted,
                                                viz::ViewKind::Retention, viz::ViewKind::History,
                                                viz::ViewKind::Consensus, viz::ViewKind::Logits};
  static_assert(std::size(kTabViews) == kTabCount - 1);
  if (tab == Tab::Generate) return false;
  kind = kTabViews[int(tab)];
  return true;
}

Tab tab_of(viz::ViewKind kind) {
  for (int t = 0; t < kTabCount; ++t) {
    viz::ViewKind shown;
    if (tab_view(Tab(t), shown) && shown == kind) return Tab(t);
  }
  return Tab::Heads;
}

Dashboard::Dashboard(ImGuiCanvas& canvas, EngineController& engine)
    : canvas_(canvas), engine_(engine), drawer_(canvas) {}

viz::ViewKind Dashboard::view() const {
  viz::ViewKind kind = viz::ViewKind::Heads;
  tab_view(tab_, kind);
  return kind;
}

void Dashboard::on_opened() {
  head_maps_.clear();  // a new trace
  options_.head_maps = &head_maps_;
  options_.with_data = false;  // drawn each step; view_for_export() for exports
  options_.highlight_tokens.clear();
  token_query_.clear();
  options_.focus_token = -1;
  cursor_ = -1;
  target_step_ = -1;
  follow_ = true;
  key_.clear();
  built_.reset();
  const Trace& trace = *engine_.trace();
  // Another text with the same runs keeps the runs compared.
  options_.runs = runs_with_keys(trace, kept_runs_);
  if (options_.runs.empty()) options_.runs = viz::default_runs(trace);
  options_.layer = std::min<int64_t>(options_.layer, trace.model.layers - 1);
  options_.head = std::min<int64_t>(options_.head, trace.model.heads - 1);
  if (trace.step_count() > 0) cursor_ = trace.step_count() - 1;
}

void Dashboard::on_replaced() {
  // The same text with other runs: the step, the selected head, the token search and the compare
  // picks stay (the picks by policy, budget and knobs; the ones no longer recorded drop out).
  head_maps_.clear();
  key_.clear();
  built_.reset();
  const Trace& trace = *engine_.trace();
  std::vector<int64_t> runs = runs_with_keys(trace, kept_runs_);
  if (runs.empty()) runs = viz::default_runs(trace);
  options_.runs = runs;
  if (cursor_ >= trace.step_count()) cursor_ = trace.step_count() - 1;
  if (follow_) cursor_ = trace.step_count() - 1;
}

void Dashboard::on_stepped(int64_t step) {
  if (target_step_ >= 0) {
    cursor_ = std::min(step, target_step_);
    if (cursor_ >= target_step_) target_step_ = -1;
  } else if (follow_ || cursor_ < 0) {
    cursor_ = step;
  }
}

std::string Dashboard::on_recorded() {
  const Trace* trace = engine_.trace();
  if (head_chosen_ || !trace) return {};
  const HeadChoice choice = typical_predicted_head(*trace, trace->step_count() - 1);
  if (!choice.found) return {};
  options_.layer = choice.layer;
  options_.head = choice.head;
  return "selected " + choice.why;
}

void Dashboard::select_head(int64_t layer, int64_t head) {
  options_.layer = layer;
  options_.head = head;
  head_chosen_ = true;
}

void Dashboard::step_forward(int count) {
  const Trace* trace = engine_.trace();
  if (!trace || count <= 0) return;
  const int64_t recorded = trace->step_count();
  const int64_t last = std::max<int64_t>(engine_.steps_total(), recorded) - 1;
  // Presses while the cursor waits for the recording add up.
  const int64_t from = std::max(cursor_, target_step_);
  const int64_t wanted = std::min<int64_t>(from + count, last);
  if (wanted < recorded) {
    cursor_ = wanted;
    target_step_ = -1;
    follow_ = cursor_ == recorded - 1 && engine_.busy();
    return;
  }
  cursor_ = recorded - 1;
  target_step_ = wanted;
  follow_ = false;
}

void Dashboard::step_back(int count) {
  if (cursor_ < 0) return;
  cursor_ = std::max<int64_t>(0, std::max(cursor_, target_step_) - count);
  target_step_ = -1;
  follow_ = false;
}

void Dashboard::go_to_step(int64_t step) {
  const Trace* trace = engine_.trace();
  if (!trace || trace->step_count() == 0) return;
  target_step_ = -1;
  const int64_t last = std::max<int64_t>(engine_.steps_total(), trace->step_count()) - 1;
  step = std::clamp<int64_t>(step, 0, last);
  if (step >= trace->step_count()) {
    cursor_ = trace->step_count() - 1;
    target_step_ = step;
    follow_ = false;
    return;
  }
  cursor_ = step;
  follow_ = cursor_ == trace->step_count() - 1 && engine_.busy();
}

void Dashboard::set_playing(bool playing) {
  playing_ = playing;
  last_play_seconds_ = 0.0;
  // Play from the start when the cursor is at the end of the text.
  const Trace* trace = engine_.trace();
  if (playing && trace && engine_.done() && cursor_ >= trace->step_count() - 1) cursor_ = 0;
  follow_ = false;
}

void Dashboard::sync_runs_to_config() {
  const std::string spec = run_rows_.spec();
  if (!spec.empty()) pending_.policies = spec;
}

bool Dashboard::changes_pending() const {
  if (!engine_.trace() || engine_.config().model_dir.empty()) return false;  // (a saved trace)
  const SessionConfig& shown = engine_.config();
  const RunRows shown_rows = RunRows::parse(shown.policies, shown.sparsities);
  const RunRows pending_rows = RunRows::parse(pending_.policies, pending_.sparsities);
  return shown.model_dir != pending_.model_dir || shown_rows.rows() != pending_rows.rows() ||
         shown.match_effective != pending_.match_effective ||
         shown.source.coref_index != pending_.source.coref_index ||
         shown.source.hard != pending_.source.hard ||
         (pending_.source.coref_index < 0 && shown.source.prompt != pending_.source.prompt);
}

void Dashboard::restart() {
  set_playing(false);
  sync_runs_to_config();
  const Trace* trace = engine_.trace();
  kept_runs_.clear();
  if (trace)
    for (const int64_t r : options_.runs) kept_runs_.push_back(run_key(*trace, r));
  // The same text keeps the step on screen: the old recording stays until the new one gets there.
  const SessionConfig& shown = engine_.config();
  const bool same_text = trace && shown.model_dir == pending_.model_dir &&
                         shown.source.coref_index == pending_.source.coref_index &&
                         shown.source.hard == pending_.source.hard &&
                         shown.source.prompt == pending_.source.prompt;
  const int64_t wanted = std::max(cursor_, target_step_);
  engine_.open(pending_, same_text ? wanted + 1 : 1);
}

void Dashboard::set_policies(const std::string& policies) {
  pending_.policies = policies;
  pending_.policies_asked = true;
  run_rows_ = RunRows::parse(pending_.policies, pending_.sparsities);
}

size_t Dashboard::find_token(const std::string& query) {
  token_query_ = query;
  options_.highlight_tokens.clear();
  const Trace* trace = engine_.trace();
  const std::string wanted = lower(trimmed(query));
  if (!trace || wanted.empty()) return 0;
  for (size_t t = 0; t < trace->tokens.size(); ++t) {
    const std::string text = lower(trimmed(trace->tokens[t].text));
    if (!text.empty() && text.find(wanted) != std::string::npos)
      options_.highlight_tokens.push_back(int64_t(t));
  }
  return options_.highlight_tokens.size();
}

void Dashboard::focus_token(int64_t token) {
  options_.focus_token = token;
}

void Dashboard::playback() {
  if (!playing_) return;
  const double now = now_seconds();
  if (now - last_play_seconds_ < 1.0 / std::max(0.5f, play_rate_)) return;
  last_play_seconds_ = now;
  const Trace* trace = engine_.trace();
  if (!trace) return;
  if (cursor_ >= trace->step_count() - 1) {
    if (engine_.done() || !engine_.busy()) playing_ = false;  // the end of the text
    return;                                                   // (else wait for the recording)
  }
  ++cursor_;
}

std::string Dashboard::view_key() const {
  const Trace* trace = engine_.trace();
  std::string key = std::to_string(int(tab_)) + "|" + std::to_string(cursor_) + "|" +
                    std::to_string(trace ? trace->step_count() : -1) + "|" +
                    std::to_string(reinterpret_cast<uintptr_t>(trace));
  for (const int64_t r : options_.runs) key += "," + std::to_string(r);
  key += "|t";
  for (const int64_t t : options_.highlight_tokens) key += "," + std::to_string(t);
  char tail[200];
  std::snprintf(tail, sizeof tail, "|%lld|%lld|%d|%d|%d|%d|%lld|%lld|%d|%.0f|%.0f|%g|%lld|%d",
                (long long)options_.layer, (long long)options_.head, int(options_.head_detail),
                int(options_.quantity), int(options_.log_scale), int(options_.consensus),
                (long long)options_.retention_layer, (long long)options_.retention_head,
                int(options_.dark), double(options_.width), double(options_.height),
                double(options_.pixel_scale), (long long)options_.focus_token,
                int(options_.history_per_head));
  return key + tail;
}

std::shared_ptr<const viz::View> Dashboard::current_view() {
  const Trace* trace = engine_.trace();
  viz::ViewKind kind;
  if (!trace || cursor_ < 0 || cursor_ >= trace->step_count() || !tab_view(tab_, kind))
    return nullptr;
  const std::string key = view_key();
  if (key == key_) return built_;
  // While playing, recording or dragging the step slider, the figure follows the steps at most
  // every max(80 ms, 3x the last build's time): a big grid over a long text then slows the
  // figure's updates, not the window, which keeps drawing between rebuilds (a step back rebuilds
  // every map afresh). Explicit steps and option changes rebuild at once.
  const double now = now_seconds();
  const double interval = std::max(0.08, 3.0 * build_seconds_);
  if (built_ && (playing_ || (engine_.busy() && follow_) || scrubbing_) &&
      now - built_seconds_ < interval) {
    canvas_.request_frames();  // (come back for the newest step)
    return built_;
  }
  built_seconds_ = now;
  key_ = key;
  options_.step = cursor_;
  const auto start = std::chrono::steady_clock::now();
  try {
    built_ = std::make_shared<viz::View>(viz::build_view(*trace, kind, options_));
    build_error_.clear();
  } catch (const std::exception& e) {
    built_.reset();
    build_error_ = e.what();
  }
  build_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  drawer_.set_figure(built_ ? std::shared_ptr<const viz::Figure>(built_, &built_->figure)
                            : nullptr);
  return built_;
}

std::shared_ptr<const viz::View> Dashboard::view_for_export(bool with_data) {
  const Trace* trace = engine_.trace();
  viz::ViewKind kind;
  if (!trace || cursor_ < 0 || cursor_ >= trace->step_count() || !tab_view(tab_, kind))
    return nullptr;
  viz::ViewOptions options = options_;
  options.step = cursor_;
  options.with_data = with_data;
  // Full detail (not the screen's), without disturbing the screen's kept maps; an export's size
  // follows its content, not the window's.
  options.pixel_scale = 0.0f;
  options.head_maps = nullptr;
  options.width = 1280.0f;
  options.height = 0.0f;
  return std::make_shared<viz::View>(viz::build_view(*trace, kind, options));
}

void Dashboard::act_on_hit(const FigureHit& hit) {
  int a = 0, l = 0, h = 0;
  long long t = 0;
  if (std::sscanf(hit.id.c_str(), "head %d:%d:%d", &a, &l, &h) == 3) {
    select_head(l, h);
  } else if (std::sscanf(hit.id.c_str(), "token %d:%lld", &a, &t) == 2) {
    // A token in the retention view: its history.
    focus_token(t);
    tab_ = Tab::History;
  } else if (std::sscanf(hit.id.c_str(), "history %d", &a) == 1) {
    // A cell of a token's history: that token, at that step.
    focus_token(hit.row);
    go_to_step(hit.col);
  } else if (hit.id == "steps") {
    go_to_step(hit.col);
  } else if (hit.id == "hit rate grid") {
    select_head(hit.row, hit.col);
  }
}

void Dashboard::frame() {
  playback();
  // (steps arriving, clicks and keys ask for frames themselves; playing and scrubbing animate)
  canvas_.set_animating(playing_ || scrubbing_);
  if (style_dark_ != int(options_.dark)) {  // the window's chrome follows the figures' theme
    style_dark_ = int(options_.dark);
    if (options_.dark) {
      ImGui::StyleColorsDark();
    } else {
      ImGui::StyleColorsLight();
    }
  }
  const ImGuiViewport* viewport = ImGui::GetMainViewport();
  ImGui::SetNextWindowPos(viewport->WorkPos);
  ImGui::SetNextWindowSize(viewport->WorkSize);
  ImGui::PushStyleVar(ImGuiStyleVar_WindowRounding, 0.0f);
  // No background: the renderer clears to the window colour, which on a software renderer is a
  // memset instead of a full-window blended quad.
  ImGui::Begin("kvlens", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove |
                   ImGuiWindowFlags_NoBringToFrontOnFocus | ImGuiWindowFlags_NoSavedSettings |
                   ImGuiWindowFlags_NoBackground);
  ImGui::PushFont(canvas_.ui_font());
  if (sidebar_shown_) {
    ImGui::BeginChild("sidebar", ImVec2(330, 0), true);
    sidebar();
    ImGui::EndChild();
    ImGui::SameLine();
  }
  ImGui::BeginChild("views", ImVec2(0, 0), false);
  view_area();
  ImGui::EndChild();
  ImGui::PopFont();
  ImGui::End();
  ImGui::PopStyleVar();
}

void Dashboard::zoom_controls() {
  // Fixed places from the right edge, so no button moves under the pointer as the zoom's label
  // changes width.
  const float right = ImGui::GetWindowContentRegionMax().x;
  const float button = ImGui::GetFrameHeight() * 1.6f;
  ImGui::SameLine(right - 4 * button - 3 * 4 - 64);
  if (zoom_ > 0) {
    ImGui::TextDisabled("%4.0f%%", double(zoom_) * 100.0);
  } else {
    ImGui::TextDisabled(" fit");
  }
  const auto small = [&](const char* label, const char* tip, int index) {
    ImGui::SameLine(right - float(4 - index) * (button + 4));
    const bool clicked = ImGui::Button(label, ImVec2(button, 0));
    if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", tip);
    return clicked;
  };
  if (small("Fit", "Fit the figure to the view area (Ctrl+0)", 0)) zoom_ = 0.0f;
  if (small("1:1", "Lay the figure out at 1280 units, 100% (Ctrl+wheel zooms)", 1)) zoom_ = 1.0f;
  if (small("\u2212##zoom", "Zoom out (Ctrl+wheel down)", 2))
    zoom_ = std::max(0.25f, (zoom_ > 0 ? zoom_ : 1.0f) / 1.25f);
  if (small("+##zoom", "Zoom in (Ctrl+wheel up)", 3))
    zoom_ = std::min(8.0f, (zoom_ > 0 ? zoom_ : 1.0f) * 1.25f);
}

void Dashboard::view_area() {
  // A tab chosen elsewhere (menu, script, a click) selects its tab; until the tab bar shows it,
  // the tabs do not overwrite the choice.
  const bool forcing = shown_tab_ != int(tab_);
  if (ImGui::Button(sidebar_shown_ ? "\u00AB##sidebar" : "\u00BB##sidebar"))
    sidebar_shown_ = !sidebar_shown_;
  if (ImGui::IsItemHovered())
    ImGui::SetTooltip(sidebar_shown_ ? "Hide the sidebar: the figure takes the width (Ctrl+B)"
                                     : "Show the sidebar (Ctrl+B)");
  ImGui::SameLine();
  if (ImGui::BeginTabBar("view tabs")) {
    for (int t = 0; t < kTabCount; ++t) {
      const ImGuiTabItemFlags flags = forcing && int(tab_) == t ? ImGuiTabItemFlags_SetSelected : 0;
      if (ImGui::BeginTabItem(tab_title(Tab(t)), nullptr, flags)) {
        if (!forcing) tab_ = Tab(t);
        if (forcing && int(tab_) == t) shown_tab_ = t;
        ImGui::EndTabItem();
      }
      if (ImGui::IsItemHovered()) ImGui::SetTooltip("Ctrl+%d", t + 1);
    }
    ImGui::EndTabBar();
  }
  if (!forcing) shown_tab_ = int(tab_);
  if (tab_ == Tab::Generate) {
    generate_area();
    return;
  }
  zoom_controls();

  // Fit: the figure is laid out at the area's size (text at its own size, no scaling); zoomed:
  // at the default width, scaled.
  const ImVec2 available = ImGui::GetContentRegionAvail();
  const float scrollbar = ImGui::GetStyle().ScrollbarSize;
  options_.width = zoom_ > 0 ? 1280.0f : std::max(640.0f, std::floor(available.x - scrollbar));
  options_.height = zoom_ > 0 ? 0.0f : std::max(360.0f, std::floor(available.y - scrollbar));
  area_width_ = available.x;
  area_height_ = available.y;
  // Grid maps pooled to the pixels they cover; the scale rounded up to a power of two so that a
  // zoom rebuilds the maps only when it crosses one.
  const float pixels = (zoom_ > 0 ? zoom_ : 1.0f) * ImGui::GetIO().DisplayFramebufferScale.x;
  options_.pixel_scale = std::exp2(std::ceil(std::log2(std::max(pixels, 0.25f))));
  const std::shared_ptr<const viz::View> view = current_view();
  ImGui::BeginChild("figure", ImVec2(0, 0), false, ImGuiWindowFlags_HorizontalScrollbar);
  if (!view) {
    if (!build_error_.empty()) {
      ImGui::TextWrapped("%s", build_error_.c_str());
    } else if (engine_.busy()) {
      ImGui::TextDisabled("Recording the first step...");
    } else {
      ImGui::TextDisabled(engine_.trace() ? "Nothing recorded: the text has no step to show."
                                          : "Open a model or a .kvtrace (File menu).");
    }
  } else {
    if (ImGui::IsWindowHovered() && ImGui::GetIO().KeyCtrl && ImGui::GetIO().MouseWheel != 0)
      zoom_ = std::clamp((zoom_ > 0 ? zoom_ : 1.0f) * (ImGui::GetIO().MouseWheel > 0 ? 1.1f : 0.9f),
                         0.25f, 8.0f);
    const std::optional<FigureHit> hit = drawer_.draw(zoom_ > 0 ? zoom_ : 1.0f);
    if (hit) act_on_hit(*hit);
    // Pan: drag with the right or middle button.
    if (ImGui::IsWindowHovered() && (ImGui::IsMouseDragging(ImGuiMouseButton_Right) ||
                                     ImGui::IsMouseDragging(ImGuiMouseButton_Middle))) {
      const ImVec2 delta = ImGui::GetIO().MouseDelta;
      ImGui::SetScrollX(ImGui::GetScrollX() - delta.x);
      ImGui::SetScrollY(ImGui::GetScrollY() - delta.y);
    }
  }
  ImGui::EndChild();
}

}  // namespace kvlens::app
