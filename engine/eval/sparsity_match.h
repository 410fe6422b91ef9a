// Comparisons at matched effective sparsity (`--match effective`): each run's nominal sparsity is
// searched so that the effective sparsity it achieves on the evaluation's own steps (SparsityStats
// overall: the mean over steps, layers and heads of the hidden share) lands within a tolerance of
// the run's target, the nominal sparsity it was given. Also the warnings a nominal budget earns
// when it is capped or measures something other than tokens (tokenfilter, lazyllm, budget_tokens).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/policy/policy.h"
#include "engine/policy/sparsity_stats.h"
#include "engine/session/scoring.h"

namespace kvlens {

enum class SparsityMatch { None, Effective };

// "none" or "effective"; anything else is a kvlens::Error naming `field`.
SparsityMatch parse_sparsity_match(const std::string& text, const std::string& field = "--match");

struct MatchOptions {
  // Accepted |effective - target|. 0.005 is below the spread between policies at one nominal
  // budget (0.43 against 0.48 on the demo model) and reachable on a few samples.
  double tolerance = 0.005;
  int max_evaluations = 16;  // per run, the first (nominal = target) included
  // The highest nominal sparsity tried (sparsity must stay below 1).
  double max_nominal = 0.999;
};
// Checks the options (tolerance in (0, 0.5], max_evaluations >= 1, max_nominal in (0, 1)),
// throwing kvlens::Error naming `owner` and the field.
void validate_match_options(const MatchOptions& options, const std::string& owner);

// One run's search. The match holds on average over the calibration's steps, layers and heads (the
// evaluation's own samples or windows), not at every step: a per-step match would need a budget
// that varies per step, which no policy's nominal sparsity expresses.
struct MatchOutcome {
  double target = 0.0;     // the effective sparsity asked for (the run's nominal as given)
  double nominal = 0.0;    // the nominal sparsity chosen
  double effective = 0.0;  // what `nominal` achieved over the calibration's steps
  int evaluations = 0;
  bool matched = false;  // |effective - target| <= tolerance
  std::string warning;   // why it is not matched (empty when it is)
};

// The effective sparsity a result reports (0 for runs that counted no policy step: dense).
double effective_of(const SparsityStats& stats);

// Evaluates every run's candidate nominal sparsity, in lockstep: `which` are the runs' indices in
// the list given to match_effective_sparsity, configs their candidates; returns one effective
// sparsity per candidate.
using MatchEvaluateFn = std::function<std::vector<double>(std::span<const size_t> which,
                                                          std::span<const PolicyConfig> configs)>;

// Per run: first its target as nominal, then a bracketed search (a secant step inside the
// bracket, a bisection step when one end has been kept twice running; before a run has an upper
// end, the secant through the origin), until |effective - target| <= tolerance, the bracket
// narrows below 1e-4 (effective jumps over the target: the closest side is kept), the budget of
// evaluations is spent or max_nominal falls short. Deterministic when `evaluate` is. The outcome
// is the closest candidate evaluated (the lower nominal on a tie).
std::vector<MatchOutcome> match_effective_sparsity(std::span<const PolicyConfig> runs,
                                                   const MatchEvaluateFn& evaluate,
                                                   const MatchOptions& options = {});

// The matched evaluation of any result type with a `sparsity` (SparsityStats) member:
// `evaluate` runs a list of configs in lockstep (evaluate_coref_lockstep,
// evaluate_perplexity_lockstep, ...). Returns each run's result at its chosen nominal sparsity;
// the calibration is the evaluation itself, so no result is computed twice for one candidate.
template <class Result>
std::vector<Result> evaluate_matched(
    std::span<const PolicyConfig> runs,
    const std::function<std::vector<Result>(std::span<const PolicyConfig>)>& evaluate,
    const MatchOptions& options, std::vector<MatchOutcome>& outcomes) {
  std::vector<std::vector<std::pair<double, Result>>> tried(runs.size());
  outcomes = match_effective_sparsity(
      runs,
      [&](std::span<const size_t> which, std::span<const PolicyConfig> configs) {
        std::vector<Result> results = evaluate(configs);
        std::vector<double> effective;
        for (size_t k = 0; k < which.size(); ++k) {
          effective.push_back(effective_of(results[k].sparsity));
          tried[which[k]].emplace_back(configs[k].sparsity, std::move(results[k]));
        }
        return effective;
      },
      options);
  std::vector<Result> chosen;
  for (size_t i = 0; i < runs.size(); ++i) {
    for (auto& [nominal, result] : tried[i]) {
      if (nominal == outcomes[i].nominal) {
        chosen.push_back(std::move(result));
        break;
      }
    }
  }
  return chosen;
}

// The runs matched on one text (the app's recording): the calibration is score_tokens_lockstep
// over `tokens` with the first `prefill` tokens dense (TraceOptions::prefill; 0: the decode
// simulation), the steps a recording of that text under those runs counts.
std::vector<MatchOutcome> match_on_tokens(std::shared_ptr<const BackendModel> model,
                                          std::span<const int32_t> tokens,
                                          std::span<const PolicyConfig> runs, int64_t prefill = 0,
                                          const MatchOptions& options = {});

// `run` with its sparsity replaced by the outcome's nominal.
PolicyConfig matched_config(const PolicyConfig& run, const MatchOutcome& outcome);

// Why a run's nominal sparsity is not a share of tokens it hides, one line each, for a model of
// `layers` layers: tokenfilter (a share of the attention computations of its tail layers, capped
// where the tail cannot skip that much), lazyllm (capped where its dense layers keep more than
// 1 - s on average), a fixed budget_tokens (the sparsity is not used). Empty for the others.
// Throws kvlens::Error for an unknown policy or a bad parameter (validate_policy_config's).
std::vector<std::string> nominal_budget_warnings(const PolicyConfig& run, int64_t layers);

}  // namespace kvlens
