// Dashboard's sidebar: the text, the runs to record (each its own policy, budget and knobs, with
// the change not yet recorded marked), stepping, the runs to compare, the selected head, a token
// search and view options, the co-reference answer. Every control says what it does on hover.
#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>
#include <cstdio>

#include "app/gui/dashboard.h"
#include "engine/policy/registry.h"
#include "engine/trace/trace_queries.h"
#include "viz/layout.h"

namespace kvlens::app {
namespace {

void tooltip(const char* text) {
  if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", text);
}

ImVec4 to_imgui(viz::Color c) {
  return ImVec4(c.r / 255.f, c.g / 255.f, c.b / 255.f, c.a / 255.f);
}

// A progress bar in the style's button colours (ImGui's default histogram yellow reads as a
// warning).
void progress(float fraction, const char* label) {
  ImGui::PushStyleColor(ImGuiCol_PlotHistogram, ImGui::GetStyleColorVec4(ImGuiCol_ButtonActive));
  ImGui::ProgressBar(fraction, ImVec2(-1, 0), label);
  ImGui::PopStyleColor();
}

}  // namespace

void Dashboard::sidebar() {
  text_section();
  runs_section();
  step_section();
  compare_section();
  head_section();
  coref_section();
}

void Dashboard::text_section() {
  const Trace* trace = engine_.trace();
  if (!ImGui::CollapsingHeader("Text", ImGuiTreeNodeFlags_DefaultOpen)) return;
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
  // The other models on this machine (a fetched real model), one click away.
  for (const std::string& path : fetched_models) {
    if (trace && engine_.config().model_dir == path) continue;
    const std::string name = path.substr(path.find_last_of('/') + 1);
    ImGui::PushID(path.c_str());
    if (ImGui::Button("Open") && on_open_model) on_open_model(path);
    ImGui::PopID();
    tooltip("Open this model (fetched by tools/get_model.sh) on the same text and runs");
    ImGui::SameLine();
    ImGui::TextWrapped("%s", name.c_str());
  }
  const bool sample = pending_.source.coref_index >= 0;
  if (ImGui::RadioButton("Co-reference sample", sample) && !sample) pending_.source.coref_index = 0;
  tooltip("A generated co-reference text whose answer every run must retrieve from the cache");
  ImGui::SameLine();
  if (ImGui::RadioButton("Prompt", !sample) && sample) pending_.source.coref_index = -1;
  tooltip("Your own text: every token of it is stepped; Generate continues it");
  if (pending_.source.coref_index >= 0) {
    int index = int(pending_.source.coref_index);
    ImGui::SetNextItemWidth(140);
    if (ImGui::InputInt("sample", &index)) pending_.source.coref_index = std::max(0, index);
    tooltip("Which co-reference sample (the same index gives the same text)");
    ImGui::Checkbox("hard (2-3 locations)", &pending_.source.hard);
    tooltip("Samples whose answer needs two or three retrievals");
  } else {
    ImGui::BeginChild("prompt preview", ImVec2(0, 90), true);
    if (pending_.source.prompt.empty()) {
      ImGui::TextDisabled("(no prompt yet: Edit...)");
    } else {
      ImGui::TextWrapped("%s", pending_.source.prompt.c_str());
    }
    ImGui::EndChild();
    if (ImGui::Button("Edit prompt...") && on_edit_prompt) on_edit_prompt();
    tooltip("Type or paste the text to step through (a wrapping editor)");
  }
}

void Dashboard::runs_section() {
  if (!ImGui::CollapsingHeader("Runs", ImGuiTreeNodeFlags_DefaultOpen)) return;
  if (run_rows_.rows().empty()) run_rows_ = RunRows::parse(pending_.policies, pending_.sparsities);
  const auto& infos = policy_infos();
  std::vector<RunRow>& rows = run_rows_.rows();
  int remove = -1;
  for (size_t i = 0; i < rows.size(); ++i) {
    RunRow& row = rows[i];
    ImGui::PushID(int(i));
    const viz::Color color = viz::policy_color(row.policy, viz::theme_of(options_));
    ImGui::ColorButton("##colour", to_imgui(color),
                       ImGuiColorEditFlags_NoTooltip | ImGuiColorEditFlags_NoDragDrop,
                       ImVec2(ImGui::GetFrameHeight() * 0.6f, ImGui::GetFrameHeight()));
    tooltip("The policy's colour in every view");
    ImGui::SameLine();
    ImGui::SetNextItemWidth(130);
    if (ImGui::BeginCombo("##policy", row.policy.c_str())) {
      for (const PolicyInfo& info : infos) {
        if (ImGui::Selectable(info.id.c_str(), info.id == row.policy)) {
          row.policy = info.id;
          row.knobs.clear();
          pending_.policies_asked = true;
        }
        if (ImGui::IsItemHovered()) {
          const std::string source = policy_source(info.id);
          ImGui::SetTooltip("%s%s%s", info.description.c_str(),
                            source.empty() ? "" : "\nplug-in: ", source.c_str());
        }
      }
      // Scorers with a budget allocator (SCORER+ALLOCATOR ids, not in the registry's list).
      ImGui::Separator();
      for (const std::string& id : composed_policy_ids()) {
        if (ImGui::Selectable(id.c_str(), id == row.policy)) {
          row.policy = id;
          row.knobs.clear();
          pending_.policies_asked = true;
        }
        if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", policy_composition_rule().c_str());
      }
      ImGui::EndCombo();
    }
    tooltip("This run's policy");
    ImGui::SameLine();
    ImGui::SetNextItemWidth(96);
    if (is_reference_policy(row.policy)) {
      ImGui::TextDisabled("reference");
    } else {
      if (ImGui::InputFloat("##sparsity", &row.sparsity, 0.05f, 0.1f, "%.2f")) {
        row.sparsity = std::clamp(row.sparsity, 0.0f, 0.99f);
        pending_.policies_asked = true;
      }
      tooltip(pending_.match_effective
                  ? "This run's target effective sparsity: the nominal sparsity that hides this "
                    "share of the tokens on this text is searched before recording"
                  : "This run's sparsity: the share of cached tokens it hides (type, or -/+)");
    }
    ImGui::SameLine();
    if (ImGui::Button("x")) remove = int(i);
    tooltip("Remove this run");
    ImGui::SetNextItemWidth(-1);
    if (ImGui::InputTextWithHint("##knobs", "knobs: key=value:key=value", &row.knobs))
      pending_.policies_asked = true;
    tooltip("This run's own parameters, e.g. recent=16:sinks=4 (kvlens-cli policies lists them)");
    ImGui::PopID();
  }
  if (remove >= 0 && rows.size() > 1) {
    rows.erase(rows.begin() + remove);
    pending_.policies_asked = true;
  }
  if (ImGui::Button("+ Add run")) {
    rows.push_back(rows.empty() ? RunRow{"dense", 0.0f, {}} : RunRow{rows.back()});
    pending_.policies_asked = true;
  }
  tooltip("Another run: the same policy at another budget, or another policy");
  sync_runs_to_config();

  const bool pending = changes_pending();
  if (pending) {
    ImGui::PushStyleColor(ImGuiCol_Button, to_imgui(viz::theme_of(options_).accent));
    ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1, 1, 1, 1));
  }
  ImGui::SameLine();
  if (ImGui::Button(engine_.trace() ? (pending ? "Apply: record these" : "Record again")
                                    : "Record")) {
    restart();
  }
  if (pending) ImGui::PopStyleColor(2);
  tooltip("Record the text with these runs; the view keeps its step, picks and head");
  if (pending) {
    ImGui::TextColored(to_imgui(viz::theme_of(options_).accent), "\u25CF changes not recorded yet");
  }
  if (engine_.pending_steps() >= 0) {
    char label[96];
    std::snprintf(label, sizeof label, "re-recording %lld / %lld",
                  (long long)engine_.pending_steps(), (long long)engine_.pending_total());
    progress(engine_.pending_total() > 0
                 ? float(engine_.pending_steps()) / float(engine_.pending_total())
                 : 0.0f,
             label);
    tooltip("The view switches to the new recording when it reaches the step on screen");
  }
  if (ImGui::Checkbox("match effective sparsity", &pending_.match_effective))
    pending_.policies_asked = true;
  tooltip(
      "Compare at matched effective sparsity: each run's sparsity becomes its target, and the "
      "nominal budget that hides that share of the tokens, on average over this text's steps "
      "(within 0.005), is searched before recording. Without it one nominal budget hides "
      "different shares under different policies (dense layer 0, sinks, rounding), and "
      "tokenfilter's is a share of attention computations, not of tokens.");
  if (engine_.trace() && !engine_.match_report().isEmpty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled));
    // The figures on a line of their own under each run: wrapped in a narrow sidebar, ImGui would
    // break a number at its point ("effective 0." / "498").
    QString shown = engine_.match_report();
    shown.replace(QStringLiteral(": nominal "), QStringLiteral(":\n    nominal "));
    ImGui::TextWrapped("matched, on this text:\n%s", shown.toUtf8().constData());
    ImGui::PopStyleColor();
    tooltip(
        "The nominal sparsity each run records with, and the effective sparsity it gave on "
        "this text (the status bar shows each step's)");
  }
  // Budgets that are capped or not a share of tokens are said beside the runs they concern.
  if (engine_.trace() && !engine_.budget_note().isEmpty()) {
    ImGui::PushStyleColor(ImGuiCol_Text, to_imgui(viz::theme_of(options_).accent));
    ImGui::TextWrapped("%s", engine_.budget_note().toUtf8().constData());
    ImGui::PopStyleColor();
  }
}

void Dashboard::step_section() {
  const Trace* trace = engine_.trace();
  if (!ImGui::CollapsingHeader("Step", ImGuiTreeNodeFlags_DefaultOpen)) return;
  const int64_t recorded = trace ? trace->step_count() : 0;
  if (ImGui::Button("|<")) go_to_step(0);
  tooltip("First step (Home)");
  ImGui::SameLine();
  if (ImGui::Button("<")) step_back(1);
  tooltip("One step back (Left; Shift+Left: 10)");
  ImGui::SameLine();
  if (ImGui::Button(">")) step_forward(1);
  tooltip("One step forward (Right)");
  ImGui::SameLine();
  if (ImGui::Button(">>10")) step_forward(10);
  tooltip("Ten steps forward (Shift+Right)");
  ImGui::SameLine();
  if (ImGui::Button(">|")) go_to_step(engine_.steps_total() - 1);
  tooltip("Last step (End)");
  ImGui::SameLine();
  if (ImGui::Button(playing_ ? "Pause" : "Play", ImVec2(56, 0))) set_playing(!playing_);
  tooltip("Play the steps at the rate below (Space)");
  ImGui::SetNextItemWidth(180);
  ImGui::SliderFloat("steps/s", &play_rate_, 1.0f, 60.0f, "%.0f");
  tooltip("Playback rate (Ctrl+click to type a value)");
  if (recorded > 0) {
    int step = int(std::max<int64_t>(cursor_, 0));
    ImGui::SetNextItemWidth(180);
    if (ImGui::SliderInt("step", &step, 0, int(recorded - 1))) go_to_step(step);
    scrubbing_ = ImGui::IsItemActive();
    tooltip("Drag to scrub through the recorded steps (Ctrl+click to type one)");
    const int64_t total = std::max<int64_t>(engine_.steps_total(), 1);
    char label[96];
    std::snprintf(label, sizeof label, "%s %lld of %lld steps",
                  engine_.busy() && engine_.pending_steps() < 0 ? "recording" : "recorded",
                  (long long)recorded, (long long)engine_.steps_total());
    progress(float(recorded) / float(total), label);
    tooltip("The whole text records in the background; the views show each step as it arrives");
    if (target_step_ >= 0) ImGui::TextDisabled("going to step %lld...", (long long)target_step_);
    if (cursor_ >= 0 && cursor_ < int64_t(trace->tokens.size()))
      ImGui::Text("step %lld, token '%s'", (long long)cursor_,
                  viz::token_label(trace->tokens[size_t(cursor_)].text, 24).c_str());
  } else {
    ImGui::TextDisabled(engine_.busy() ? "recording..."
                        : trace        ? "nothing to step"
                                       : "open a model or a trace");
  }
}

void Dashboard::compare_section() {
  const Trace* trace = engine_.trace();
  if (!trace || !ImGui::CollapsingHeader("Compare (up to 4)", ImGuiTreeNodeFlags_DefaultOpen))
    return;
  for (int64_t r = 0; r < int64_t(trace->runs.size()); ++r) {
    auto found = std::find(options_.runs.begin(), options_.runs.end(), r);
    bool shown = found != options_.runs.end();
    const viz::Color color =
        shown ? viz::run_color(*trace, r, viz::theme_of(options_)) : viz::theme_of(options_).muted;
    ImGui::PushStyleColor(ImGuiCol_Text, to_imgui(color));
    std::string label = viz::run_title(*trace, r);
    const int64_t place = shown ? int64_t(found - options_.runs.begin()) : -1;
    if (options_.runs.size() == 2 && place >= 0) label += place == 0 ? "  (A)" : "  (B)";
    // (the index keeps ids unique: two runs may share a title, and other sections use ids too)
    label += "##compare" + std::to_string(r);
    if (ImGui::Checkbox(label.c_str(), &shown)) {
      if (shown && options_.runs.size() < 4) options_.runs.push_back(r);
      if (!shown && options_.runs.size() > 1) options_.runs.erase(found);
    }
    ImGui::PopStyleColor();
    tooltip("Show this run in the views (1 to 4). With two, Retention shows A \u2212 B");
  }
}

void Dashboard::head_section() {
  const Trace* trace = engine_.trace();
  if (!trace || !ImGui::CollapsingHeader("Head, tokens and view", ImGuiTreeNodeFlags_DefaultOpen))
    return;
  int layer = int(options_.layer), head = int(options_.head);
  ImGui::SetNextItemWidth(180);
  if (ImGui::SliderInt("layer", &layer, 0, int(trace->model.layers - 1)))
    select_head(layer, options_.head);
  tooltip("The selected head's layer (or click a map; Ctrl+click to type)");
  ImGui::SetNextItemWidth(180);
  if (ImGui::SliderInt("head", &head, 0, int(trace->model.heads - 1)))
    select_head(options_.layer, head);
  tooltip("The selected head (or click a map; Ctrl+click to type)");
  ImGui::Checkbox("selected head in detail", &options_.head_detail);
  tooltip("Heads: the selected head alone, with its tokens labelled");
  std::string query = token_query_;
  ImGui::SetNextItemWidth(180);
  if (ImGui::InputTextWithHint("find token", "text of a token", &query)) find_token(query);
  tooltip("Highlight every token containing this text, in every view");
  if (!token_query_.empty())
    ImGui::TextDisabled("%zu token%s highlighted", options_.highlight_tokens.size(),
                        options_.highlight_tokens.size() == 1 ? "" : "s");
  int quantity = int(options_.quantity);
  ImGui::SetNextItemWidth(180);
  if (ImGui::Combo("show", &quantity, "logits\0probabilities\0policy scores\0"))
    options_.quantity = HeadQuantity(quantity);
  tooltip(
      "What the head maps show: attention logits, probabilities, or the policy's scores (a "
      "predictor's: predicted logits)");
  const bool probabilities = options_.quantity == HeadQuantity::Probabilities;
  ImGui::BeginDisabled(!probabilities);
  bool log_scale = options_.log_scale && probabilities;
  if (ImGui::Checkbox("log scale", &log_scale)) options_.log_scale = log_scale;
  ImGui::EndDisabled();
  if (ImGui::IsItemHovered(ImGuiHoveredFlags_AllowWhenDisabled))
    ImGui::SetTooltip(probabilities ? "Probabilities on a log10 scale"
                                    : "Only probabilities have a log scale (logits are logs)");
  int metric = int(options_.consensus);
  ImGui::SetNextItemWidth(180);
  if (ImGui::Combo("consensus", &metric, "Pearson\0Jaccard\0"))
    options_.consensus = ConsensusMetric(metric);
  tooltip("Consensus view: how heads agree (Pearson of logits, or Jaccard of visible sets)");
  int scope = options_.retention_layer < 0 ? 0 : options_.retention_head < 0 ? 1 : 2;
  ImGui::SetNextItemWidth(180);
  if (ImGui::Combo("retention", &scope, "all heads\0selected layer\0selected head\0")) {
    options_.retention_layer = scope == 0 ? -1 : options_.layer;
    options_.retention_head = scope == 2 ? options_.head : -1;
  }
  tooltip("Retention and History: over which heads a token counts as kept");
  ImGui::Checkbox("history of the selected head", &options_.history_per_head);
  tooltip(
      "History: the selected head's own states (visible, hidden, evicted, back) instead of "
      "the share of the heads above that see each token");
  if (options_.focus_token >= 0) {
    ImGui::Text("history of token %lld", (long long)options_.focus_token);
    ImGui::SameLine();
    if (ImGui::SmallButton("clear##focus")) focus_token(-1);
    tooltip(
        "Stop outlining this token in History (click a token in Retention or History to pick "
        "another)");
  }
  if (scope >= 1) options_.retention_layer = options_.layer;
  if (scope == 2) options_.retention_head = options_.head;
}

void Dashboard::coref_section() {
  const Trace* trace = engine_.trace();
  if (!trace || !trace->coref.present ||
      !ImGui::CollapsingHeader("Co-reference answer", ImGuiTreeNodeFlags_DefaultOpen))
    return;
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

}  // namespace kvlens::app
