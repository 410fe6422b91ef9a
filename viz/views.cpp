// build_view: option checks and dispatch to the per-view builders.
#include "viz/views.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>

#include "engine/common/comma_list.h"
#include "engine/common/error.h"
#include "engine/policy/registry.h"

namespace kvlens::viz {

ViewKind parse_view(const std::string& name) {
  for (const ViewKind kind : {ViewKind::Heads, ViewKind::Predicted, ViewKind::Retention,
                              ViewKind::Consensus, ViewKind::Logits}) {
    if (name == view_name(kind)) return kind;
  }
  throw Error("view", "name", "one of heads, predicted, retention, consensus, logits",
              "'" + name + "'");
}

const char* view_name(ViewKind kind) {
  switch (kind) {
    case ViewKind::Heads:
      return "heads";
    case ViewKind::Predicted:
      return "predicted";
    case ViewKind::Retention:
      return "retention";
    case ViewKind::Consensus:
      return "consensus";
    case ViewKind::Logits:
      return "logits";
  }
  return "heads";
}

HeadQuantity parse_quantity(const std::string& text, const std::string& flag) {
  if (text == "logits") return HeadQuantity::Logits;
  if (text == "probabilities") return HeadQuantity::Probabilities;
  if (text == "scores") return HeadQuantity::Scores;
  throw Error(flag, "quantity", "logits, probabilities or scores", "'" + text + "'");
}

ConsensusMetric parse_consensus(const std::string& text, const std::string& flag) {
  if (text == "pearson") return ConsensusMetric::Pearson;
  if (text == "jaccard") return ConsensusMetric::Jaccard;
  throw Error(flag, "metric", "pearson or jaccard", "'" + text + "'");
}

std::vector<int64_t> parse_runs(const Trace& trace, const std::string& list,
                                const std::string& flag) {
  std::vector<int64_t> runs;
  for (const std::string& item : split_comma_list(list)) {
    int64_t index = -1;
    for (size_t r = 0; r < trace.runs.size() && index < 0; ++r)
      if (trace.runs[r].policy == item) index = int64_t(r);
    if (index < 0) {
      char* end = nullptr;
      const long long value = std::strtoll(item.c_str(), &end, 10);
      if (!item.empty() && end && *end == 0 && value >= 0 && value < (long long)trace.runs.size())
        index = value;
    }
    if (index < 0) {
      std::string known;
      for (size_t r = 0; r < trace.runs.size(); ++r)
        known += (r ? ", " : "") + std::to_string(r) + " " + trace.runs[r].policy;
      throw Error(flag, "run", "a run index or policy id of the trace (" + known + ")",
                  "'" + item + "'");
    }
    runs.push_back(index);
  }
  return runs;
}

const Theme& theme_of(const ViewOptions& options) {
  return options.dark ? dark_theme() : light_theme();
}

View empty_view(const ViewOptions& options) {
  View view;
  view.figure.width = options.width;
  view.figure.background = theme_of(options).background;
  view.figure.highlight = theme_of(options).accent;
  return view;
}

std::vector<int64_t> default_runs(const Trace& trace) {
  std::vector<int64_t> runs;
  for (int64_t r = 0; r < std::min<int64_t>(3, int64_t(trace.runs.size())); ++r) runs.push_back(r);
  return runs;
}

std::string run_title(const Trace& trace, int64_t run) {
  const TraceRun& r = trace.runs[size_t(run)];
  if (is_reference_policy(r.policy)) return r.policy;
  char text[64];
  std::snprintf(text, sizeof text, " s=%.2g", r.sparsity);
  return r.policy + text;
}

Color run_color(const Trace& trace, int64_t run, const Theme& theme) {
  // One colour per built-in policy, the usual comparison (dense, tokenbutler, h2o, quest) on the
  // four Okabe-Ito colours dichromats tell apart best; dense, the reference, neutral. Okabe-Ito's
  // vermillion is left out: it is the themes' accent (selection, current step).
  static const std::pair<const char*, Color> kPolicyColors[] = {
      {"dense", {40, 40, 46, 255}},     {"tokenbutler", {0, 114, 178, 255}},
      {"h2o", {230, 159, 0, 255}},      {"quest", {0, 158, 115, 255}},
      {"snapkv", {204, 121, 167, 255}}, {"streaming", {86, 180, 233, 255}},
      {"oracle", {240, 228, 66, 255}},  {"random", {150, 120, 96, 255}},
      {"keydiff", {120, 94, 200, 255}}, {"tokenfilter", {60, 130, 60, 255}},
      {"lazyllm", {170, 60, 110, 255}},
  };
  const std::string& id = trace.runs[size_t(run)].policy;
  Color base{};
  bool found = false;
  for (const auto& [policy, color] : kPolicyColors)
    if (id == policy) base = color, found = true;
  // A policy this build has no colour for (a plug-in's) by a hash of its id: the same in every
  // view and session.
  if (!found) base = kPolicyColors[1 + std::hash<std::string>{}(id) % 10].second;
  // The reference reads as the theme's text does: near black, or light grey on the dark theme
  // (a mid grey there would pass for quest's green to a deuteranope).
  if (is_reference_policy(id) && theme.dark) base = {205, 205, 212, 255};
  // Dark enough on the light background, light enough on the dark one (Okabe-Ito's yellow and
  // orange are unreadable on white). On white the contrast stops at 3 (WCAG's for graphics and
  // large text; the run titles are 13-unit bold): darker, h2o's orange would turn into the accent's
  // vermillion for protanopes. On the dark theme lighter costs nothing, so body text's 4.5.
  return legible_on(base, theme.background, theme.dark ? 4.5 : 3.0);
}

bool run_predicts_logits(const Trace& trace, int64_t run) {
  const PolicyInfo* info = find_policy_info(trace.runs[size_t(run)].policy);
  return info && info->predicts_logits;
}

int64_t resolved_step(const Trace& trace, const ViewOptions& options) {
  if (trace.step_count() == 0) throw Error("view", "trace", "at least one recorded step", "none");
  const int64_t step = options.step < 0 ? trace.step_count() - 1 : options.step;
  if (step >= trace.step_count()) {
    throw Error("view", "step", "a step in [0, " + std::to_string(trace.step_count()) + ")",
                std::to_string(options.step));
  }
  return step;
}

View build_view(const Trace& trace, ViewKind kind, const ViewOptions& options) {
  const int64_t step = resolved_step(trace, options);
  if (options.runs.empty() || options.runs.size() > 4) {
    throw Error("view", "runs", "1 to 4 runs", std::to_string(options.runs.size()));
  }
  for (const int64_t run : options.runs) {
    if (run < 0 || run >= int64_t(trace.runs.size())) {
      throw Error("view", "run", "a run in [0, " + std::to_string(trace.runs.size()) + ")",
                  std::to_string(run));
    }
  }
  if (options.layer < 0 || options.layer >= trace.model.layers) {
    throw Error("view", "layer", "a layer in [0, " + std::to_string(trace.model.layers) + ")",
                std::to_string(options.layer));
  }
  if (options.head < 0 || options.head >= trace.model.heads) {
    throw Error("view", "head", "a head in [0, " + std::to_string(trace.model.heads) + ")",
                std::to_string(options.head));
  }
  View view;
  switch (kind) {
    case ViewKind::Heads:
      view = heads_view(trace, options, step);
      break;
    case ViewKind::Predicted:
      view = predicted_view(trace, options, step);
      break;
    case ViewKind::Retention:
      view = retention_view(trace, options, step);
      break;
    case ViewKind::Consensus:
      view = consensus_view(trace, options, step);
      break;
    case ViewKind::Logits:
      view = logits_view(trace, options, step);
      break;
  }
  // (the grid-sized tables are skipped as they are built; the small ones are dropped here)
  if (!options.with_data) view.data = DataTable{};
  return view;
}

}  // namespace kvlens::viz
