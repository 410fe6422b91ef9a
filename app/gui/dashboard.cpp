// Dashboard: the sidebar, the view area and the stepping logic.
#include "app/gui/dashboard.h"

#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "app/gui/imgui_canvas.h"
#include "engine/common/comma_list.h"
#include "engine/policy/registry.h"
#include "engine/trace/trace_queries.h"
#include "viz/layout.h"

namespace kvlens::app {
namespace {

double now_seconds() {
  return ImGui::GetTime();
}

const char* const kViewTitles[] = {"Heads", "Predicted vs true", "Retention", "Consensus",
                                   "Logits"};

}  // namespace

Dashboard::Dashboard(ImGuiCanvas& canvas, EngineController& engine)
    : canvas_(canvas), engine_(engine), drawer_(canvas) {}

void Dashboard::on_opened() {
  head_maps_.clear();  // a new trace
  options_.head_maps = &head_maps_;
  options_.with_data = false;  // drawn each step; view_for_export() for exports
  cursor_ = -1;
  follow_ = true;
  key_.clear();
  built_.reset();
  const Trace& trace = *engine_.trace();
  options_.runs = viz::default_runs(trace);
  options_.layer = std::min<int64_t>(options_.layer, trace.model.layers - 1);
  options_.head = std::min<int64_t>(options_.head, trace.model.heads - 1);
}

void Dashboard::on_stepped(int64_t step) {
  if (follow_ || cursor_ < 0) cursor_ = step;
}

void Dashboard::step_forward(int count) {
  const Trace* trace = engine_.trace();
  if (!trace) return;
  const int64_t recorded = trace->step_count();
  if (cursor_ + count < recorded) {
    cursor_ += count;
    follow_ = cursor_ == recorded - 1;
    return;
  }
  cursor_ = recorded - 1;
  follow_ = true;
  engine_.step(int(cursor_ + count - (recorded - 1)));
}

void Dashboard::step_back(int count) {
  if (cursor_ < 0) return;
  cursor_ = std::max<int64_t>(0, cursor_ - count);
  follow_ = false;
}

void Dashboard::go_to_step(int64_t step) {
  const Trace* trace = engine_.trace();
  if (!trace || trace->step_count() == 0) return;
  cursor_ = std::clamp<int64_t>(step, 0, trace->step_count() - 1);
  follow_ = cursor_ == trace->step_count() - 1;
}

void Dashboard::set_playing(bool playing) {
  playing_ = playing;
  last_play_seconds_ = 0.0;
}

void Dashboard::restart() {
  set_playing(false);
  std::string policies;
  const auto& infos = policy_infos();
  for (size_t i = 0; i < infos.size() && i < policy_checked_.size(); ++i)
    if (policy_checked_[i]) policies += (policies.empty() ? "" : ",") + infos[i].id;
  // Ids without a check box (not in this build's registry) stay: the recording reports them
  // (or, in the default list, leaves tokenbutler out with a note).
  for (const std::string& id : split_comma_list(pending_.policies)) {
    bool known = false;
    for (const PolicyInfo& info : infos) known = known || info.id == id;
    if (!known && !policy_checked_.empty()) policies += (policies.empty() ? "" : ",") + id;
  }
  if (!policies.empty()) pending_.policies = policies;
  engine_.open(pending_);
}

void Dashboard::set_policies(const std::string& policies) {
  pending_.policies = policies;
  pending_.policies_asked = true;
  policy_checked_.clear();  // the check boxes are set from the list at the next frame
}

void Dashboard::playback() {
  if (!playing_ || engine_.busy()) return;
  const double now = now_seconds();
  if (now - last_play_seconds_ < 1.0 / std::max(0.5f, play_rate_)) return;
  last_play_seconds_ = now;
  const Trace* trace = engine_.trace();
  if (!trace) return;
  if (engine_.done() && cursor_ >= trace->step_count() - 1) {
    playing_ = false;  // the end of the text
    return;
  }
  step_forward(1);
}

std::string Dashboard::view_key() const {
  const Trace* trace = engine_.trace();
  std::string key = std::to_string(int(view_)) + "|" + std::to_string(cursor_) + "|" +
                    std::to_string(trace ? trace->step_count() : -1) + "|" +
                    std::to_string(reinterpret_cast<uintptr_t>(trace));
  for (const int64_t r : options_.runs) key += "," + std::to_string(r);
  char tail[160];
  std::snprintf(tail, sizeof tail, "|%lld|%lld|%d|%d|%d|%d|%lld|%lld|%d|%.0f|%g",
                (long long)options_.layer, (long long)options_.head, int(options_.head_detail),
                int(options_.quantity), int(options_.log_scale), int(options_.consensus),
                (long long)options_.retention_layer, (long long)options_.retention_head,
                int(options_.dark), double(options_.width), double(options_.pixel_scale));
  return key + tail;
}

std::shared_ptr<const viz::View> Dashboard::current_view() {
  const Trace* trace = engine_.trace();
  if (!trace || cursor_ < 0 || cursor_ >= trace->step_count()) return nullptr;
  const std::string key = view_key();
  if (key == key_) return built_;
  // While playing, recording or dragging the step slider, the figure follows the steps at most
  // every max(80 ms, 3x the last build's time): a big grid over a long text then slows the
  // figure's updates, not the window, which keeps drawing between rebuilds (a step back rebuilds
  // every map afresh). Explicit steps and option changes rebuild at once.
  const double now = now_seconds();
  const double interval = std::max(0.08, 3.0 * build_seconds_);
  if (built_ && (playing_ || engine_.busy() || scrubbing_) && now - built_seconds_ < interval)
    return built_;
  built_seconds_ = now;
  key_ = key;
  options_.step = cursor_;
  const auto start = std::chrono::steady_clock::now();
  try {
    built_ = std::make_shared<viz::View>(viz::build_view(*trace, view_, options_));
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
  if (!trace || cursor_ < 0 || cursor_ >= trace->step_count()) return nullptr;
  viz::ViewOptions options = options_;
  options.step = cursor_;
  options.with_data = with_data;
  // Full detail (not the screen's), without disturbing the screen's kept maps.
  options.pixel_scale = 0.0f;
  options.head_maps = nullptr;
  return std::make_shared<viz::View>(viz::build_view(*trace, view_, options));
}

void Dashboard::apply_hit(const FigureHit& hit) {
  int a = 0, l = 0, h = 0;
  if (std::sscanf(hit.id.c_str(), "head %d:%d:%d", &a, &l, &h) == 3) {
    options_.layer = l;
    options_.head = h;
  } else if (hit.id == "steps") {
    go_to_step(hit.col);
  } else if (hit.id == "hit rate grid") {
    options_.layer = hit.row;
    options_.head = hit.col;
  }
}

void Dashboard::frame() {
  playback();
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
  ImGui::BeginChild("sidebar", ImVec2(310, 0), true);
  sidebar();
  ImGui::EndChild();
  ImGui::SameLine();
  ImGui::BeginChild("views", ImVec2(0, 0), false);
  view_area();
  ImGui::EndChild();
  ImGui::PopFont();
  ImGui::End();
  ImGui::PopStyleVar();
}

void Dashboard::sidebar() {
  const Trace* trace = engine_.trace();
  if (ImGui::CollapsingHeader("Text and policies", ImGuiTreeNodeFlags_DefaultOpen)) {
    // What the open recording runs on: the model folder and its TokenButler predictor.
    if (trace && !engine_.config().model_dir.empty()) {
      ImGui::TextWrapped("model: %s", engine_.config().model_dir.c_str());
      ImGui::TextWrapped("predictor: %s", engine_.predictor().toUtf8().constData());
      if (!engine_.note().isEmpty()) {
        ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
        ImGui::TextWrapped("(%s)", engine_.note().toUtf8().constData());
        ImGui::PopStyleColor();
      }
    } else if (trace) {
      ImGui::TextDisabled("a saved trace: no model or predictor loaded");
    }
    bool sample = pending_.source.coref_index >= 0;
    if (ImGui::RadioButton("Co-reference sample", sample)) pending_.source.coref_index = 0;
    ImGui::SameLine();
    if (ImGui::RadioButton("Prompt", !sample)) pending_.source.coref_index = -1;
    if (pending_.source.coref_index >= 0) {
      int index = int(pending_.source.coref_index);
      if (ImGui::InputInt("sample", &index)) pending_.source.coref_index = std::max(0, index);
      ImGui::Checkbox("hard (2-3 locations)", &pending_.source.hard);
    } else {
      ImGui::InputTextMultiline("##prompt", &pending_.source.prompt, ImVec2(-1, 80));
    }
    const auto& infos = policy_infos();
    if (policy_checked_.size() != infos.size()) {
      const std::vector<std::string> chosen = split_comma_list(pending_.policies);
      policy_checked_.assign(infos.size(), 0);
      for (size_t i = 0; i < infos.size(); ++i)
        policy_checked_[i] = std::find(chosen.begin(), chosen.end(), infos[i].id) != chosen.end();
    }
    ImGui::TextUnformatted("Policies");
    for (size_t i = 0; i < infos.size(); ++i) {
      bool checked = policy_checked_[i];
      if (i % 2) ImGui::SameLine(150);
      if (ImGui::Checkbox(infos[i].id.c_str(), &checked)) {
        policy_checked_[i] = checked;
        pending_.policies_asked = true;  // the user's own list from now on
      }
      if (ImGui::IsItemHovered()) {
        const std::string source = policy_source(infos[i].id);
        ImGui::SetTooltip("%s%s%s", infos[i].description.c_str(),
                          source.empty() ? "" : "\nplug-in: ", source.c_str());
      }
    }
    float sparsity = float(std::atof(pending_.sparsities.c_str()));
    if (ImGui::SliderFloat("sparsity", &sparsity, 0.0f, 0.95f, "%.2f")) {
      char text[16];
      std::snprintf(text, sizeof text, "%.2f", sparsity);
      pending_.sparsities = text;
    }
    if (ImGui::Button(engine_.trace() ? "Restart with these" : "Start")) restart();
  }

  if (ImGui::CollapsingHeader("Step", ImGuiTreeNodeFlags_DefaultOpen)) {
    const int64_t recorded = trace ? trace->step_count() : 0;
    if (ImGui::Button("|<")) go_to_step(0);
    ImGui::SameLine();
    if (ImGui::Button("<")) step_back(1);
    ImGui::SameLine();
    if (ImGui::Button(">")) step_forward(1);
    ImGui::SameLine();
    if (ImGui::Button(">>10")) step_forward(10);
    ImGui::SameLine();
    if (ImGui::Button(playing_ ? "Pause" : "Play")) set_playing(!playing_);
    ImGui::SliderFloat("steps/s", &play_rate_, 1.0f, 60.0f, "%.0f");
    if (recorded > 0) {
      int step = int(std::max<int64_t>(cursor_, 0));
      if (ImGui::SliderInt("step", &step, 0, int(recorded - 1))) go_to_step(step);
      scrubbing_ = ImGui::IsItemActive();
      ImGui::Text("recorded %lld of %lld%s", (long long)recorded, (long long)engine_.steps_total(),
                  engine_.busy() ? "  (stepping...)" : "");
      if (cursor_ >= 0 && cursor_ < int64_t(trace->tokens.size()))
        ImGui::Text("token: '%s'",
                    viz::token_label(trace->tokens[size_t(cursor_)].text, 24).c_str());
    } else {
      ImGui::TextDisabled(trace ? "press > to step" : "start a recording");
    }
  }

  if (trace && ImGui::CollapsingHeader("Compare (up to 4)", ImGuiTreeNodeFlags_DefaultOpen)) {
    for (int64_t r = 0; r < int64_t(trace->runs.size()); ++r) {
      auto found = std::find(options_.runs.begin(), options_.runs.end(), r);
      bool shown = found != options_.runs.end();
      ImGui::PushStyleColor(ImGuiCol_Text, [&] {
        const viz::Color c =
            shown ? viz::run_color(found - options_.runs.begin()) : viz::Color{160, 160, 168, 255};
        return ImVec4(c.r / 255.f, c.g / 255.f, c.b / 255.f, 1.f);
      }());
      if (ImGui::Checkbox(viz::run_title(*trace, r).c_str(), &shown)) {
        if (shown && options_.runs.size() < 4) options_.runs.push_back(r);
        if (!shown && options_.runs.size() > 1) options_.runs.erase(found);
      }
      ImGui::PopStyleColor();
    }
  }

  if (trace && ImGui::CollapsingHeader("Head and view options", ImGuiTreeNodeFlags_DefaultOpen)) {
    int layer = int(options_.layer), head = int(options_.head);
    if (ImGui::SliderInt("layer", &layer, 0, int(trace->model.layers - 1))) options_.layer = layer;
    if (ImGui::SliderInt("head", &head, 0, int(trace->model.heads - 1))) options_.head = head;
    ImGui::Checkbox("selected head in detail", &options_.head_detail);
    int quantity = int(options_.quantity);
    if (ImGui::Combo("show", &quantity,
                     "logits\0probabilities\0policy scores (a predictor's: predicted logits)\0"))
      options_.quantity = HeadQuantity(quantity);
    ImGui::Checkbox("log scale", &options_.log_scale);
    int metric = int(options_.consensus);
    if (ImGui::Combo("consensus", &metric, "Pearson\0Jaccard\0"))
      options_.consensus = ConsensusMetric(metric);
    int scope = options_.retention_layer < 0 ? 0 : options_.retention_head < 0 ? 1 : 2;
    if (ImGui::Combo("retention", &scope, "all heads\0selected layer\0selected head\0")) {
      options_.retention_layer = scope == 0 ? -1 : options_.layer;
      options_.retention_head = scope == 2 ? options_.head : -1;
    }
    if (scope >= 1) options_.retention_layer = options_.layer;
    if (scope == 2) options_.retention_head = options_.head;
  }

  if (trace && trace->coref.present &&
      ImGui::CollapsingHeader("Co-reference answer", ImGuiTreeNodeFlags_DefaultOpen)) {
    ImGui::TextWrapped("answer '%s': tokens %lld-%lld (boxed in Retention)",
                       trace->coref.answer.c_str(), (long long)trace->coref.answer_token_begin,
                       (long long)trace->coref.answer_token_end - 1);
    for (const int64_t r : options_.runs) {
      const std::vector<AnswerPrediction> predictions = answer_predictions(*trace, r);
      std::string line = viz::run_title(*trace, r) + ":";
      if (predictions.empty()) line += " not reached yet";
      for (const AnswerPrediction& p : predictions) {
        line += std::string(" ") + (p.correct ? "[ok] " : "[x] ") +
                (p.predicted_text.empty() ? "#" + std::to_string(p.predicted)
                                          : viz::token_label(p.predicted_text, 16));
      }
      ImGui::TextWrapped("%s", line.c_str());
    }
  }
}

void Dashboard::view_area() {
  // A view chosen elsewhere (menu, script) selects its tab; until the tab bar shows it, the
  // tabs do not overwrite the choice.
  const bool forcing = shown_tab_ != int(view_);
  if (ImGui::BeginTabBar("view tabs")) {
    for (int v = 0; v < 5; ++v) {
      const ImGuiTabItemFlags flags =
          forcing && int(view_) == v ? ImGuiTabItemFlags_SetSelected : 0;
      if (ImGui::BeginTabItem(kViewTitles[v], nullptr, flags)) {
        if (!forcing) view_ = viz::ViewKind(v);
        if (forcing && int(view_) == v) shown_tab_ = v;
        ImGui::EndTabItem();
      }
    }
    ImGui::EndTabBar();
  }
  if (!forcing) shown_tab_ = int(view_);
  ImGui::SameLine(ImGui::GetWindowWidth() - 270);
  if (zoom_ > 0) {
    ImGui::TextDisabled("%4.0f%%", double(zoom_) * 100.0);
  } else {
    ImGui::TextDisabled(" fit ");
  }
  ImGui::SameLine();
  if (ImGui::SmallButton("Fit")) zoom_ = 0.0f;
  ImGui::SameLine();
  if (ImGui::SmallButton("100%")) zoom_ = 1.0f;
  ImGui::SameLine();
  if (ImGui::SmallButton("-")) zoom_ = std::max(0.25f, (zoom_ > 0 ? zoom_ : 1.0f) / 1.25f);
  ImGui::SameLine();
  if (ImGui::SmallButton("+")) zoom_ = std::min(8.0f, (zoom_ > 0 ? zoom_ : 1.0f) * 1.25f);

  // Fit: the figure is laid out at the area's width (text at its own size, no scaling);
  // zoomed: at the default width, scaled.
  const float available = ImGui::GetContentRegionAvail().x - ImGui::GetStyle().ScrollbarSize;
  options_.width = zoom_ > 0 ? 1280.0f : std::max(640.0f, std::floor(available));
  // Grid maps pooled to the pixels they cover; the scale rounded up to a power of two so that a
  // zoom rebuilds the maps only when it crosses one.
  const float pixels = (zoom_ > 0 ? zoom_ : 1.0f) * ImGui::GetIO().DisplayFramebufferScale.x;
  options_.pixel_scale = std::exp2(std::ceil(std::log2(std::max(pixels, 0.25f))));
  const std::shared_ptr<const viz::View> view = current_view();
  ImGui::BeginChild("figure", ImVec2(0, 0), false, ImGuiWindowFlags_HorizontalScrollbar);
  if (!view) {
    if (!build_error_.empty()) {
      ImGui::TextWrapped("%s", build_error_.c_str());
    } else {
      ImGui::TextDisabled(engine_.trace() ? "No step recorded yet: press > (Right arrow)."
                                          : "Open a model or a .kvtrace (File menu).");
    }
  } else {
    if (ImGui::IsWindowHovered() && ImGui::GetIO().KeyCtrl && ImGui::GetIO().MouseWheel != 0)
      zoom_ = std::clamp((zoom_ > 0 ? zoom_ : 1.0f) * (ImGui::GetIO().MouseWheel > 0 ? 1.1f : 0.9f),
                         0.25f, 8.0f);
    const std::optional<FigureHit> hit = drawer_.draw(zoom_ > 0 ? zoom_ : 1.0f);
    if (hit) apply_hit(*hit);
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
