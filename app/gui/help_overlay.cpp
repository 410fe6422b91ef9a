// The keys-and-gestures overlay: one table per kind of input, centred over the window.
#include "app/gui/help_overlay.h"

#include <imgui.h>

#include <iterator>

namespace kvlens::app {
namespace {

struct Binding {
  const char* input;
  const char* action;
};

struct Section {
  const char* title;
  const Binding* bindings;
  int count;
};

constexpr Binding kStepping[] = {
    {"Right / Left", "next / previous step"},
    {"Shift+Right / Shift+Left", "10 steps forward / back"},
    {"Home / End", "first / last recorded step"},
    {"Space", "play / pause"},
};
constexpr Binding kViews[] = {
    {"Ctrl+1 .. Ctrl+7", "switch view (the tabs, in their order)"},
    {"Ctrl+wheel", "zoom the figure"},
    {"Ctrl+B", "hide / show the sidebar (the figure takes the width)"},
    {"Right- or middle-drag", "pan the figure"},
    {"Hover", "the value under the cursor, per run"},
    {"Click a head", "select it (layer and head in the sidebar)"},
    {"Click a token in Retention", "open that token's history"},
    {"Click a History cell", "that token's story, at that step"},
    {"Find token (sidebar)", "highlight a token's column in every view"},
};
constexpr Binding kFiles[] = {
    {"Ctrl+O", "open a model folder"},
    {"Ctrl+G", "open a GGUF model file (llama.cpp, Ollama, LM Studio)"},
    {"Ctrl+Shift+O", "open a saved .kvtrace"},
    {"Ctrl+S", "save the recording as a .kvtrace"},
    {"Ctrl+E", "export the view (PNG, SVG, PDF, CSV, JSON)"},
    {"Ctrl+R", "record the text with the sidebar's runs"},
};
constexpr Binding kControls[] = {
    {"Ctrl+click a slider", "type an exact value (Enter to apply)"},
    {"Runs: policy, budget, knobs", "each run its own (h2o@0.3 beside h2o@0.7)"},
    {"Hover a control", "what it does"},
    {"F1 or ?", "show / hide this help"},
    {"Esc", "close this help"},
};

constexpr Section kSections[] = {
    {"Stepping", kStepping, int(std::size(kStepping))},
    {"Views and the figure", kViews, int(std::size(kViews))},
    {"Files", kFiles, int(std::size(kFiles))},
    {"Controls", kControls, int(std::size(kControls))},
};

bool shown_last_frame = false;

}  // namespace

void draw_help_overlay(bool* open) {
  shown_last_frame = *open;
  if (!*open) return;
  const ImGuiViewport* viewport = ImGui::GetMainViewport();
  // The window dimmed behind the overlay; it also takes the click that dismisses the overlay, so
  // that click does not press what lies under it.
  ImGui::SetNextWindowPos(viewport->Pos);
  ImGui::SetNextWindowSize(viewport->Size);
  ImGui::SetNextWindowBgAlpha(0.0f);
  ImGui::Begin("##kvlens help dim", nullptr,
               ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoSavedSettings |
                   ImGuiWindowFlags_NoBringToFrontOnFocus | ImGuiWindowFlags_NoNav |
                   ImGuiWindowFlags_NoMove);
  ImGui::GetWindowDrawList()->AddRectFilled(
      viewport->Pos, ImVec2(viewport->Pos.x + viewport->Size.x, viewport->Pos.y + viewport->Size.y),
      IM_COL32(0, 0, 0, 90));
  ImGui::End();
  ImGui::SetNextWindowPos(viewport->GetCenter(), ImGuiCond_Always, ImVec2(0.5f, 0.5f));
  ImGui::SetNextWindowFocus();
  ImGui::SetNextWindowBgAlpha(1.0f);  // (the dark style's windows are translucent)
  const ImGuiWindowFlags flags = ImGuiWindowFlags_AlwaysAutoResize | ImGuiWindowFlags_NoCollapse |
                                 ImGuiWindowFlags_NoSavedSettings | ImGuiWindowFlags_NoMove;
  if (ImGui::Begin("Keys and gestures  (F1 or ? to close)###kvlens help", open, flags)) {
    for (const Section& section : kSections) {
      ImGui::Spacing();
      ImGui::TextUnformatted(section.title);
      ImGui::Separator();
      if (ImGui::BeginTable(section.title, 2, ImGuiTableFlags_SizingFixedFit)) {
        ImGui::TableSetupColumn("input", ImGuiTableColumnFlags_WidthFixed, 230.0f);
        ImGui::TableSetupColumn("action", ImGuiTableColumnFlags_WidthFixed, 380.0f);
        for (int i = 0; i < section.count; ++i) {
          ImGui::TableNextRow();
          ImGui::TableNextColumn();
          ImGui::TextColored(ImGui::GetStyleColorVec4(ImGuiCol_ButtonActive), "%s",
                             section.bindings[i].input);
          ImGui::TableNextColumn();
          ImGui::TextUnformatted(section.bindings[i].action);
        }
        ImGui::EndTable();
      }
    }
    ImGui::Spacing();
    if (ImGui::Button("Close")) *open = false;
    // A click anywhere else dismisses it, as a popup would.
    if (ImGui::IsMouseClicked(ImGuiMouseButton_Left) &&
        !ImGui::IsWindowHovered(ImGuiHoveredFlags_RootAndChildWindows |
                                ImGuiHoveredFlags_AllowWhenBlockedByActiveItem))
      *open = false;
  }
  ImGui::End();
}

bool help_overlay_shown() {
  return shown_last_frame;
}

}  // namespace kvlens::app
