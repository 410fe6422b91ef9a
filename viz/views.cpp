// build_view: option checks and dispatch to the per-view builders.
#include "viz/views.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <utility>

#include "engine/common/comma_list.h"
#include "engine/common/error.h"
#include "engine/policy/allocator.h"
#include "engine/policy/policy_params.h"
#include "engine/policy/registry.h"

namespace kvlens::viz {

ViewKind parse_view(const std::string& name) {
  for (const ViewKind kind : {ViewKind::Heads, ViewKind::Predicted, ViewKind::Retention,
                              ViewKind::Consensus, ViewKind::Logits, ViewKind::History}) {
    if (name == view_name(kind)) return kind;
  }
  throw Error("view", "name", "one of heads, predicted, retention, consensus, logits, history",
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
    case ViewKind::History:
      return "history";
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

namespace {

// Two parameter values: numbers compare by value ("0.30" names a recorded 0.29999999999999999),
// anything else by its text.
bool same_value(const std::string& a, const std::string& b) {
  char *end_a = nullptr, *end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  const bool numbers = !a.empty() && !b.empty() && *end_a == 0 && *end_b == 0;
  return numbers ? x == y : a == b;
}

std::string value_of(const std::vector<std::string>& params, const std::string& key, bool& found) {
  for (const std::string& param : params) {
    const size_t eq = param.find('=');
    if (param.compare(0, eq, key) == 0 && eq == key.size()) {
      found = true;
      return param.substr(eq + 1);
    }
  }
  found = false;
  return {};
}

// How well a run spec ID[@SPARSITY][:KEY=VALUE...] (docs/policy_specs.md) names a trace run: 0
// not at all; 1 the id, the sparsity when given and every knob among its recorded parameters; 2
// also no other parameter off its default (the run that spec recorded).
int spec_match(const TraceRun& run, const std::string& spec) {
  const size_t colon = spec.find(':');
  const std::string head = spec.substr(0, colon);
  const size_t at = head.find('@');
  if (head.substr(0, at) != run.policy) return 0;
  if (at != std::string::npos) {
    const std::string text = head.substr(at + 1);
    char* end = nullptr;
    const double sparsity = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != 0 || sparsity != run.sparsity) return 0;
  }
  std::vector<std::string> knobs;
  for (size_t begin = colon; begin != std::string::npos;) {
    const size_t end = spec.find(':', begin + 1);
    knobs.push_back(spec.substr(begin + 1, end == std::string::npos ? end : end - begin - 1));
    begin = end;
  }
  for (const std::string& knob : knobs) {
    const size_t eq = knob.find('=');
    if (eq == std::string::npos) return 0;
    bool found = false;
    const std::string value = value_of(run.params, knob.substr(0, eq), found);
    if (!found || !same_value(value, knob.substr(eq + 1))) return 0;
  }
  const PolicyInfo* info = find_policy_info(run.policy);
  if (!info) return 1;
  for (const ParamSpec& param : info->params) {
    bool recorded = false, given = false;
    const std::string value = value_of(run.params, param.name, recorded);
    value_of(knobs, param.name, given);
    if (recorded && !given && !same_value(value, param.default_value)) return 1;
  }
  return 2;
}

// A trace run as a spec, for messages: id@sparsity and the parameters off their defaults.
std::string spec_text(const TraceRun& run) {
  if (is_reference_policy(run.policy)) return run.policy;
  char number[32];
  std::snprintf(number, sizeof number, "@%g", run.sparsity);
  std::string text = run.policy + number;
  const PolicyInfo* info = find_policy_info(run.policy);
  for (const std::string& param : run.params) {
    const size_t eq = param.find('=');
    const std::string key = param.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : param.substr(eq + 1);
    const ParamSpec* spec = nullptr;
    if (info) {
      for (const ParamSpec& candidate : info->params)
        if (candidate.name == key) spec = &candidate;
    }
    if (spec && same_value(value, spec->default_value)) continue;
    if (spec && spec->type == ParamType::Float) {
      std::snprintf(number, sizeof number, "%g", std::strtod(value.c_str(), nullptr));
      text += ":" + key + "=" + number;
    } else {
      text += ":" + param;
    }
  }
  return text;
}

}  // namespace

std::vector<int64_t> parse_runs(const Trace& trace, const std::string& list,
                                const std::string& flag) {
  std::vector<int64_t> runs;
  for (const std::string& item : split_comma_list(list)) {
    int64_t index = -1;
    for (size_t r = 0; r < trace.runs.size() && index < 0; ++r)
      if (trace.runs[r].policy == item) index = int64_t(r);
    // A run spec: the run it recorded, else the first run that has everything it says.
    if (index < 0 && item.find_first_of("@:") != std::string::npos) {
      int best = 0;
      for (size_t r = 0; r < trace.runs.size() && best < 2; ++r) {
        const int match = spec_match(trace.runs[r], item);
        if (match > best) best = match, index = int64_t(r);
      }
    }
    if (index < 0) {
      char* end = nullptr;
      const long long value = std::strtoll(item.c_str(), &end, 10);
      if (!item.empty() && end && *end == 0 && value >= 0 && value < (long long)trace.runs.size())
        index = value;
    }
    if (index < 0) {
      std::string known;
      for (size_t r = 0; r < trace.runs.size(); ++r)
        known += (r ? ", " : "") + std::to_string(r) + " " + spec_text(trace.runs[r]);
      throw Error(flag, "run",
                  "a run index, policy id or run spec (h2o@0.3) of the trace (" + known + ")",
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
  std::string title = r.policy + text;
  // The knobs that differ from the policy's defaults: two runs of one policy at one budget differ
  // only there (h2o s=0.5 window=16).
  if (const PolicyInfo* info = find_policy_info(r.policy)) {
    try {
      const std::vector<std::string> defaults =
          resolve_params(info->params, {}, "policy " + r.policy).describe();
      for (const std::string& param : r.params) {
        if (std::find(defaults.begin(), defaults.end(), param) != defaults.end()) continue;
        const size_t equals = param.find('=');
        char* end = nullptr;
        const double number = std::strtod(param.c_str() + equals + 1, &end);
        std::snprintf(text, sizeof text, "%g", number);
        title += " " + (equals != std::string::npos && end && *end == 0
                            ? param.substr(0, equals + 1) + text
                            : param);
      }
    } catch (const Error&) {
      // (defaults this build cannot resolve: the title keeps policy and budget)
    }
  }
  return title;
}

Color run_color(const Trace& trace, int64_t run, const Theme& theme) {
  return policy_color(trace.runs[size_t(run)].policy, theme);
}

Color policy_color(const std::string& id, const Theme& theme) {
  // One colour per built-in policy, the usual comparison (dense, tokenbutler, h2o, quest) on the
  // four Okabe-Ito colours dichromats tell apart best; dense, the reference, neutral. Okabe-Ito's
  // vermillion is left out: it is the themes' accent (selection, current step). Policies added
  // later take the colours farthest from all of these after legible_on (tova's magenta: at least
  // 0.19 OKLab from every other and the accent on both themes, the existing pairs' least is 0.06).
  // The allocators pyramidkv (lime) and adakv (crimson) likewise (at least 0.1 OKLab from every
  // other and the accent on both themes); their SCORER+ALLOCATOR compositions take the hash as any
  // other id.
  // Then the approximate-logit policies (sparq's lavender, loki's pink, doublesparsity's
  // periwinkle), each the sRGB grid colour (steps of 8) farthest, as drawn on both themes, from
  // all before it and the accent: at least 0.106 OKLab (the next two, {8, 56, 240} and
  // {152, 0, 152}, at 0.103, go to rocketkv and twilight; then duoattention's pale mint, which
  // legible_on darkens on white, at 0.102, and seerattention's violet at
  // 0.101); magicpig's salmon, a free grid colour at least 0.1 from all of them).
  // test_viz_heads.cpp holds every built-in added since
  // the first eleven to 0.1.
  static const std::pair<const char*, Color> kPolicyColors[] = {
      {"dense", {40, 40, 46, 255}},
      {"tokenbutler", {0, 114, 178, 255}},
      {"h2o", {230, 159, 0, 255}},
      {"quest", {0, 158, 115, 255}},
      {"snapkv", {204, 121, 167, 255}},
      {"streaming", {86, 180, 233, 255}},
      {"oracle", {240, 228, 66, 255}},
      {"random", {150, 120, 96, 255}},
      {"keydiff", {120, 94, 200, 255}},
      {"tokenfilter", {60, 130, 60, 255}},
      {"lazyllm", {170, 60, 110, 255}},
      {"tova", {240, 0, 240, 255}},
      {"pyramidkv", {96, 192, 0, 255}},
      {"adakv", {248, 0, 64, 255}},
      {"sparq", {200, 112, 248, 255}},
      {"doublesparsity", {160, 152, 240, 255}},
      {"loki", {248, 0, 160, 255}},
      {"duoattention", {216, 248, 240, 255}},
      {"seerattention", {152, 32, 248, 255}},
      {"rocketkv", {8, 56, 240, 255}},
      {"twilight", {152, 0, 152, 255}},
      {"magicpig", {248, 104, 112, 255}},
  };
  Color base{};
  bool found = false;
  for (const auto& [policy, color] : kPolicyColors)
    if (id == policy) base = color, found = true;
  // A scorer with an allocator (h2o+pyramidkv) takes the allocator's colour: it reads as the
  // allocator's and never as the scorer alone (the hash could give it h2o's orange). Runs of one
  // allocator with different scorers share it; their titles tell them apart.
  const size_t plus = id.find('+');
  if (!found && plus != std::string::npos) {
    const std::string allocator = allocator_id(allocator_kind(id.substr(plus + 1)));
    for (const auto& [policy, color] : kPolicyColors)
      if (!allocator.empty() && allocator == policy) base = color, found = true;
  }
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
    case ViewKind::History:
      view = history_view(trace, options, step);
      break;
  }
  // (the grid-sized tables are skipped as they are built; the small ones are dropped here)
  if (!options.with_data) view.data = DataTable{};
  return view;
}

}  // namespace kvlens::viz
