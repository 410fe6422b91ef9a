// The matched-sparsity search (a safeguarded secant search per run, every pending run evaluated in
// lockstep each round) and the warnings of nominal budgets that are not token shares.
#include "engine/eval/sparsity_match.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "engine/common/error.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/policy_params.h"
#include "engine/policy/registry.h"

namespace kvlens {
namespace {

// Below this bracket width a nominal change moves a budget by under a token at 10,000 candidates.
constexpr double kMinBracket = 1e-4;

std::string fixed3(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", value);
  return text;
}

struct Point {
  double nominal = 0.0, effective = 0.0;
};

// One run's search state.
struct Search {
  double target = 0.0;
  // lo: effective below the target; the origin is assumed (nominal 0 keeps every token) until a
  // candidate replaces it. hi: effective above the target, once one was seen.
  Point lo;
  bool lo_measured = false;
  std::optional<Point> hi;
  int kept_lo = 0, kept_hi = 0;  // rounds the same end survived, for the bisection safeguard
  std::optional<Point> best;
  int evaluations = 0;
  bool done = false;
  std::string warning;
  double next = 0.0;  // the candidate to evaluate this round
};

bool closer(const Point& a, const Point& b, double target) {
  const double da = std::abs(a.effective - target), db = std::abs(b.effective - target);
  return da < db || (da == db && a.nominal < b.nominal);
}

// Takes one evaluated candidate and decides the next (or stops).
void advance(Search& s, const Point& got, const MatchOptions& options) {
  ++s.evaluations;
  if (!s.best || closer(got, *s.best, s.target)) s.best = got;
  if (std::abs(got.effective - s.target) <= options.tolerance) {
    s.done = true;
    return;
  }
  // A higher nominal that hid no more than the last lower end: the policy is capped below the
  // target, so the next try is the highest nominal at once.
  bool flat = false;
  if (got.effective < s.target) {
    flat = s.lo_measured && got.effective <= s.lo.effective;
    s.lo = got;
    s.lo_measured = true;
    ++s.kept_hi;
    s.kept_lo = 0;
  } else {
    s.hi = got;
    ++s.kept_lo;
    s.kept_hi = 0;
  }
  const std::string target_text = "target effective sparsity " + fixed3(s.target);
  if (!s.hi && s.lo.nominal >= options.max_nominal) {
    s.done = true;
    s.warning = "cannot reach the " + target_text + ": at most " + fixed3(s.best->effective) +
                " at nominal " + fixed3(s.lo.nominal);
    return;
  }
  if (s.hi && s.hi->nominal - s.lo.nominal < kMinBracket) {
    s.done = true;
    s.warning = s.hi->nominal <= 0.0
                    ? "cannot reach the " + target_text + ": already " + fixed3(s.hi->effective) +
                          " at nominal 0"
                    : "the " + target_text + " falls between two budgets; the closest gives " +
                          fixed3(s.best->effective);
    return;
  }
  if (s.evaluations >= options.max_evaluations) {
    s.done = true;
    s.warning = "no nominal sparsity within " + fixed3(options.tolerance) + " of the " +
                target_text + " after " + std::to_string(s.evaluations) +
                " evaluations; the closest gives " + fixed3(s.best->effective);
    return;
  }
  if (!s.hi) {
    // The secant through the origin, pushed at least a tolerance past the last try: effective
    // sparsity grows about linearly with the nominal one below the policy's cap.
    const double scaled = s.lo.effective > 0.0 ? s.lo.nominal * s.target / s.lo.effective
                                               : (s.lo.nominal + options.max_nominal) / 2.0;
    s.next =
        flat ? options.max_nominal
             : std::min(options.max_nominal, std::max(scaled, s.lo.nominal + options.tolerance));
    return;
  }
  const Point& lo = s.lo;
  const Point& hi = *s.hi;
  const double mid = (lo.nominal + hi.nominal) / 2.0;
  double next = mid;
  if (s.kept_lo < 2 && s.kept_hi < 2 && hi.effective > lo.effective) {
    next = lo.nominal +
           (s.target - lo.effective) * (hi.nominal - lo.nominal) / (hi.effective - lo.effective);
  }
  // Strictly inside the bracket, so every round narrows it.
  const double margin = (hi.nominal - lo.nominal) / 64.0;
  s.next = std::clamp(next, lo.nominal + margin, hi.nominal - margin);
  // The upper end kept falling toward the assumed origin: measure the origin itself, which
  // either closes the bracket there or replaces the assumption.
  if (!s.lo_measured && s.kept_lo >= 2) s.next = 0.0;
}

}  // namespace

SparsityMatch parse_sparsity_match(const std::string& text, const std::string& field) {
  if (text == "none") return SparsityMatch::None;
  if (text == "effective") return SparsityMatch::Effective;
  throw Error(field, "match", "effective or none", "'" + text + "'");
}

void validate_match_options(const MatchOptions& options, const std::string& owner) {
  if (!(options.tolerance > 0.0 && options.tolerance <= 0.5)) {
    throw Error(owner, "tolerance", "a number in (0, 0.5]", std::to_string(options.tolerance));
  }
  if (options.max_evaluations < 1) {
    throw Error(owner, "max evaluations", "at least 1", std::to_string(options.max_evaluations));
  }
  if (!(options.max_nominal > 0.0 && options.max_nominal < 1.0)) {
    throw Error(owner, "max nominal", "a number in (0, 1)", std::to_string(options.max_nominal));
  }
}

double effective_of(const SparsityStats& stats) {
  return stats.steps > 0 ? stats.overall() : 0.0;
}

std::vector<MatchOutcome> match_effective_sparsity(std::span<const PolicyConfig> runs,
                                                   const MatchEvaluateFn& evaluate,
                                                   const MatchOptions& options) {
  validate_match_options(options, "matched sparsity");
  std::vector<Search> searches(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    const double target = runs[i].sparsity;
    if (!(target >= 0.0 && target < 1.0)) {
      throw Error("matched sparsity", "target", "a number in [0, 1)", std::to_string(target));
    }
    searches[i].target = target;
    searches[i].next = std::min(target, options.max_nominal);
  }
  for (;;) {
    std::vector<size_t> which;
    std::vector<PolicyConfig> configs;
    for (size_t i = 0; i < runs.size(); ++i) {
      if (searches[i].done) continue;
      which.push_back(i);
      configs.push_back(runs[i]);
      configs.back().sparsity = searches[i].next;
    }
    if (which.empty()) break;
    const std::vector<double> effective = evaluate(which, configs);
    if (effective.size() != which.size()) {
      throw Error("matched sparsity", "evaluation", std::to_string(which.size()) + " results",
                  std::to_string(effective.size()));
    }
    for (size_t k = 0; k < which.size(); ++k) {
      advance(searches[which[k]], Point{configs[k].sparsity, effective[k]}, options);
    }
  }
  std::vector<MatchOutcome> outcomes;
  for (size_t i = 0; i < searches.size(); ++i) {
    const Search& s = searches[i];
    MatchOutcome outcome;
    outcome.target = s.target;
    outcome.nominal = s.best->nominal;
    outcome.effective = s.best->effective;
    outcome.evaluations = s.evaluations;
    outcome.matched = std::abs(outcome.effective - s.target) <= options.tolerance;
    outcome.warning = outcome.matched ? std::string() : s.warning;
    // The one built-in whose reach is set by another knob than its budget.
    if (!outcome.matched && runs[i].id == "tokenfilter") {
      outcome.warning +=
          " (tokenfilter skips only in its tail layers: a larger tail_frac reaches "
          "further)";
    }
    outcomes.push_back(std::move(outcome));
  }
  return outcomes;
}

std::vector<MatchOutcome> match_on_tokens(std::shared_ptr<const BackendModel> model,
                                          std::span<const int32_t> tokens,
                                          std::span<const PolicyConfig> runs, int64_t prefill,
                                          const MatchOptions& options) {
  ScoreOptions score;
  score.prefill = prefill;
  // Chunks apply to the dense prefill only; the policy steps go one token at a time.
  score.chunk = std::max<int64_t>(1, std::min<int64_t>(prefill, 512));
  return match_effective_sparsity(
      runs,
      [&](std::span<const size_t>, std::span<const PolicyConfig> configs) {
        std::vector<double> effective;
        for (const ScoreResult& result : score_tokens_lockstep(model, tokens, configs, score)) {
          effective.push_back(effective_of(result.sparsity));
        }
        return effective;
      },
      options);
}

PolicyConfig matched_config(const PolicyConfig& run, const MatchOutcome& outcome) {
  PolicyConfig config = run;
  config.sparsity = outcome.nominal;
  return config;
}

std::vector<std::string> nominal_budget_warnings(const PolicyConfig& run, int64_t layers) {
  const PolicyInfo& info = policy_info(run.id);
  if (info.reference) return {};
  const ParamValues params = resolve_params(info.params, run.args, "policy " + run.id);
  const auto declares = [&info](const std::string& name) {
    return std::any_of(info.params.begin(), info.params.end(),
                       [&name](const ParamSpec& spec) { return spec.name == name; });
  };
  const std::string who = run.id + " at nominal sparsity " + fixed3(run.sparsity);
  std::vector<std::string> warnings;
  if (run.id == "tokenfilter") {
    warnings.push_back(who + ": " + tokenfilter_nominal_budget_note(params, run.sparsity, layers));
  } else if (declares("budget_tokens") && params.get_int("budget_tokens") > 0) {
    warnings.push_back(who + ": budget_tokens=" + std::to_string(params.get_int("budget_tokens")) +
                       " fixes the budget, the nominal sparsity is not used");
  } else if (run.id == "lazyllm" && declares("dense_layers")) {
    const std::vector<double> keep =
        lazyllm_keep_schedule(layers, params.get_int("dense_layers"), run.sparsity);
    double mean = 0.0;
    for (const double k : keep) mean += k;
    mean /= double(std::max<size_t>(1, keep.size()));
    if (mean > 1.0 - run.sparsity + 1e-9) {
      warnings.push_back(who + ": capped, its dense layers keep every token, so the layers keep " +
                         fixed3(mean) + " on average, not " + fixed3(1.0 - run.sparsity));
    }
  } else if (run.id == "magicpig") {
    // LSH sampling keeps as many keys as collide: the budget picks K for an expected share.
    const int64_t tables = params.get_int("tables");
    const int64_t bits = params.get_int("bits") > 0 ? params.get_int("bits")
                                                    : magicpig_bits_for(run.sparsity, tables);
    warnings.push_back(who + ": the nominal budget is an expected value; bits=" +
                       std::to_string(bits) + " with tables=" + std::to_string(tables) +
                       " samples " + fixed3(magicpig_expected_share(bits, tables)) +
                       " of keys orthogonal to the query (more of keys nearer it), plus the exact "
                       "sinks and window");
  } else if (run.id == "twilight") {
    // Top-p keeps a share of the base's candidates that the estimates decide, step by step.
    warnings.push_back(who + ": the nominal budget is an upper bound (the base's " +
                       params.get_choice("base") +
                       " candidates); top_p=" + fixed3(params.get_float("top_p")) +
                       " keeps fewer per head, so the share kept is whatever top-p gives");
  }
  return warnings;
}

}  // namespace kvlens
