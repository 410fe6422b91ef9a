// Dashboard's Generate tab: N tokens generated after the text under each run, every run decoding
// freely under its own policy (session/generation.h); the texts side by side, one column per run,
// each token from the first departure from dense's text on drawn in the run's colour after a
// marker, so where a policy changes what the model says is seen at once.
#include <imgui.h>

#include <algorithm>
#include <cstdio>

#include "app/gui/dashboard.h"
#include "app/gui/imgui_canvas.h"
#include "engine/policy/registry.h"
#include "viz/layout.h"

namespace kvlens::app {
namespace {

ImVec4 to_imgui(viz::Color c) {
  return ImVec4(c.r / 255.f, c.g / 255.f, c.b / 255.f, c.a / 255.f);
}

// The pieces flowed into the column's width, token by token (ImGui 1.86's wrapped text cannot
// change colour mid-paragraph); from `departure` on in `departed` after a bar marking the place.
void flow_pieces(const std::vector<std::string>& pieces, int64_t departure, ImVec4 departed) {
  ImDrawList* draw = ImGui::GetWindowDrawList();
  const float left = ImGui::GetCursorScreenPos().x;
  const float right = left + ImGui::GetContentRegionAvail().x;
  const float line = ImGui::GetTextLineHeightWithSpacing();
  ImVec2 at = ImGui::GetCursorScreenPos();
  const ImU32 normal = ImGui::GetColorU32(ImGuiCol_Text);
  const ImU32 changed = ImGui::GetColorU32(departed);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const bool after = departure >= 0 && int64_t(i) >= departure;
    if (departure >= 0 && int64_t(i) == departure) {
      draw->AddRectFilled(ImVec2(at.x, at.y), ImVec2(at.x + 3, at.y + line - 2), changed);
      at.x += 5;
    }
    // Words of a piece; a newline starts a line.
    size_t begin = 0;
    const std::string& piece = pieces[i];
    while (begin <= piece.size()) {
      const size_t newline = piece.find('\n', begin);
      const std::string part =
          piece.substr(begin, newline == std::string::npos ? std::string::npos : newline - begin);
      const float width = ImGui::CalcTextSize(part.c_str()).x;
      if (at.x + width > right && at.x > left) {
        at.x = left;
        at.y += line;
      }
      draw->AddText(at, after ? changed : normal, part.c_str());
      at.x += width;
      if (newline == std::string::npos) break;
      at.x = left;
      at.y += line;
      begin = newline + 1;
    }
  }
  ImGui::Dummy(ImVec2(right - left, at.y + line - ImGui::GetCursorScreenPos().y));
}

}  // namespace

void Dashboard::generate_area() {
  const Trace* trace = engine_.trace();
  int max_new = int(generate_tokens_);
  ImGui::SetNextItemWidth(120);
  if (ImGui::InputInt("tokens", &max_new, 8, 32)) generate_tokens_ = std::clamp(max_new, 1, 4096);
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("How many tokens each run generates");
  ImGui::SameLine();
  if (engine_.generating()) {
    if (ImGui::Button("Stop")) engine_.stop_generating();
  } else {
    ImGui::BeginDisabled(!trace || engine_.config().model_dir.empty());
    if (ImGui::Button("Generate")) generate(generate_tokens_);
    ImGui::EndDisabled();
  }
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip(
        "Continue the text under each run's policy, greedily, every run on its own "
        "(after the recording has finished)");
  const std::vector<session::GeneratedText>& texts = engine_.generated();
  if (engine_.generating()) {
    ImGui::SameLine();
    const size_t done = texts.empty() ? 0 : texts.front().ids.size();
    ImGui::TextDisabled("generating %zu of %lld...", done, (long long)engine_.generated_max_new());
    canvas_.request_frames();
  }
  if (!trace) return;
  if (texts.empty() || texts.size() != trace->runs.size()) {
    ImGui::TextWrapped(
        "Generate continues the text (%zu tokens) under each run: each run feeds back its own "
        "greedy tokens, so its text shows what its policy makes the model say. The first token "
        "where a run departs from dense's text is marked.",
        trace->tokens.size());
    return;
  }
  // The text's end, for context.
  std::string tail;
  for (size_t t = trace->tokens.size() > 24 ? trace->tokens.size() - 24 : 0;
       t < trace->tokens.size(); ++t)
    tail += trace->tokens[t].text;
  ImGui::TextDisabled("...%s", tail.c_str());
  const int columns = int(texts.size());
  const ImGuiTableFlags flags = ImGuiTableFlags_Borders | ImGuiTableFlags_ScrollX |
                                ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingFixedFit;
  if (!ImGui::BeginTable("generated", columns, flags, ImVec2(0, 0))) return;
  const float width = std::max(220.0f, ImGui::GetContentRegionAvail().x / float(columns) - 12);
  for (int c = 0; c < columns; ++c)
    ImGui::TableSetupColumn(viz::run_title(*trace, c).c_str(), ImGuiTableColumnFlags_WidthFixed,
                            width);
  ImGui::TableNextRow();
  for (int c = 0; c < columns; ++c) {
    ImGui::TableSetColumnIndex(c);
    const session::GeneratedText& text = texts[size_t(c)];
    const viz::Color color = viz::run_color(*trace, c, viz::theme_of(options_));
    ImGui::TextColored(to_imgui(color), "%s", viz::run_title(*trace, c).c_str());
    if (is_reference_policy(trace->runs[size_t(c)].policy)) {
      ImGui::TextDisabled("the reference");
    } else if (text.first_departure < 0) {
      ImGui::TextDisabled("same as dense for all %zu tokens", text.ids.size());
    } else {
      ImGui::TextColored(to_imgui(color), "departs from dense at token %lld",
                         (long long)text.first_departure);
    }
    ImGui::Separator();
    flow_pieces(text.pieces, text.first_departure, to_imgui(color));
  }
  ImGui::EndTable();
}

void Dashboard::generate(int64_t max_new) {
  generate_tokens_ = std::clamp<int64_t>(max_new, 1, 4096);
  engine_.generate(generate_tokens_);
  tab_ = Tab::Generate;
}

}  // namespace kvlens::app
