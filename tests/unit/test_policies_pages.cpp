// quest and tokenfilter (POLICIES.md) on small hand-made caches (tests/support/policy_harness.h:
// H = 4 query heads over G = 2 KV heads, D = 4, rows of 16 columns) with hand-computed visible
// sets, page bounds, similarities, thresholds and skip decisions; then both on the bundled demo
// model at sparsity 0, where they must give the dense logits bit for bit.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "engine/model/model.h"
#include "engine/policy/registry.h"
#include "engine/session/scoring.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"

using namespace kvlens;
using kvlens::test::Harness;

namespace {

using Vec = std::vector<float>;
const Vec e1 = {1, 0, 0, 0}, e2 = {0, 1, 0, 0}, minus_e1 = {-1, 0, 0, 0}, zero = {0, 0, 0, 0};

std::set<int64_t> range(int64_t begin, int64_t end) {
  std::set<int64_t> out;
  for (int64_t j = begin; j < end; ++j) out.insert(j);
  return out;
}

std::set<int64_t> join(std::set<int64_t> a, const std::set<int64_t>& b) {
  a.insert(b.begin(), b.end());
  return a;
}

void check_all_heads(const std::vector<std::set<int64_t>>& sets, const std::set<int64_t>& want) {
  for (size_t h = 0; h < sets.size(); ++h) {
    INFO("head " << h);
    CHECK(sets[h] == want);
  }
}

// Keys of 14 positions in pages of 4 (the current page 3 holds positions 12 and 13), the same
// for both KV heads. Page 0 ("A"): channel 1 in [-5, -4]; page 1 ("B"): channel 0 in [2, 3];
// pages 2 and 3 zero. For q = (1, -1, 0, 0): Quest's bound of A is max(-1 * -5, -1 * -4) = 5,
// of B max(1 * 2, 1 * 3) = 3, of the zero pages 0; the max_only bound sum |q_c| max_c gives A
// -4 (its channel-1 maximum is negative), B 3.
std::vector<Vec> page_keys() {
  std::vector<Vec> keys = {{0, -5, 0, 0}, {0, -4, 0, 0}, {0, -4.5f, 0, 0}, {0, -4, 0, 0},
                           {2, 0, 0, 0},  {3, 0, 0, 0},  {2.5f, 0, 0, 0},  {2, 0, 0, 0}};
  keys.resize(14, zero);
  return keys;
}

void set_page_keys(Harness& h) {
  h.set_keys({page_keys(), page_keys()});
}

const std::vector<std::string> kQuestArgs = {"page_size=4", "sinks=0", "dense_layers=0",
                                             "budget_tokens=8"};

std::vector<std::string> with(std::vector<std::string> args, const std::string& extra) {
  args.push_back(extra);
  return args;
}

}  // namespace

TEST_CASE("quest: the pages with the highest bound fill the budget, the current page always",
          "[policy]") {
  Harness h;
  set_page_keys(h);
  h.set_q({{1, -1, 0, 0}, {1, -1, 0, 0}, {1, -1, 0, 0}, {1, -1, 0, 0}});
  // t = 13, B = 8: the current page {12, 13} is forced (2 tokens), 6 remain: one whole page of 4
  // fits, the next does not (2 left are not spent on part of a page).
  auto exact = h.make("quest", 0.0, kQuestArgs);
  check_all_heads(h.run(*exact, 13, 0), join(range(0, 4), {12, 13}));
  // The scores are each token's page bound on the logit scale (divided by sqrt(D) = 2).
  for (int64_t head = 0; head < 4; ++head) {
    const std::vector<float> row = h.score_row(head, 13);
    for (int64_t j = 0; j <= 13; ++j) {
      INFO("head " << head << " column " << j);
      CHECK(row[size_t(j)] == (j < 4 ? 2.5f : j < 8 ? 1.5f : 0.0f));
    }
  }

  SECTION("max_only ranks by sum |q_c| max_c: page B wins") {
    auto max_only = h.make("quest", 0.0, with(kQuestArgs, "max_only=true"));
    check_all_heads(h.run(*max_only, 13, 0), join(range(4, 8), {12, 13}));
    const std::vector<float> row = h.score_row(0, 13);
    CHECK(row[0] == -2.0f);
    CHECK(row[5] == 1.5f);
    CHECK(row[9] == 0.0f);
  }

  SECTION("equal bounds go to the more recent page") {
    h.set_q({zero, zero, zero, zero});
    auto policy = h.make("quest", 0.0, kQuestArgs);
    check_all_heads(h.run(*policy, 13, 0), range(8, 14));
  }

  SECTION("a larger budget takes pages in bound order") {
    // B = 12: current page (2) + A (4) + B (4) = 10; the zero page 2 (4) no longer fits.
    auto policy =
        h.make("quest", 0.0, {"page_size=4", "sinks=0", "dense_layers=0", "budget_tokens=12"});
    check_all_heads(h.run(*policy, 13, 0), join(range(0, 8), {12, 13}));
  }

  SECTION("summaries built step by step equal those built at once (prefill + decode)") {
    auto stepwise = h.make("quest", 0.0, kQuestArgs);
    std::vector<std::set<int64_t>> sets;
    for (int64_t t = 0; t <= 13; ++t) sets = h.run(*stepwise, t, 0);
    check_all_heads(sets, join(range(0, 4), {12, 13}));
    CHECK(h.score_row(0, 13) == h.score_row(1, 13));
    CHECK(h.score_row(0, 13)[2] == 2.5f);
    CHECK(h.score_row(0, 13)[6] == 1.5f);
  }
}

TEST_CASE("quest: kv_head granularity ranks pages by the bound summed over the group", "[policy]") {
  Harness h;
  set_page_keys(h);
  // Heads 0 and 2: q = (0, -1, 0, 0) bounds A by 5, B by 0. Heads 1 and 3: q = (2, 0, 0, 0)
  // bounds A by 0, B by max(4, 6) = 6. Each query head alone picks its page; the group's sums
  // (A 5, B 6) pick B for both heads of each group.
  const Vec a_lover = {0, -1, 0, 0}, b_lover = {2, 0, 0, 0};
  h.set_q({a_lover, b_lover, a_lover, b_lover});
  auto per_head = h.make("quest", 0.0, kQuestArgs);
  const auto sets = h.run(*per_head, 13, 0);
  CHECK(sets[0] == join(range(0, 4), {12, 13}));
  CHECK(sets[1] == join(range(4, 8), {12, 13}));
  CHECK(sets[2] == sets[0]);
  CHECK(sets[3] == sets[1]);
  auto grouped = h.make("quest", 0.0, with(kQuestArgs, "granularity=kv_head"));
  check_all_heads(h.run(*grouped, 13, 0), join(range(4, 8), {12, 13}));
  // The exposed scores stay per query head.
  CHECK(h.score_row(0, 13)[0] == 2.5f);
  CHECK(h.score_row(1, 13)[0] == 0.0f);
  CHECK(h.score_row(1, 13)[4] == 3.0f);
}

TEST_CASE("quest: sinks and window are forced as tokens, B(t) stays a hard cap", "[policy]") {
  Harness h;
  set_page_keys(h);
  h.set_q({{1, -1, 0, 0}, {1, -1, 0, 0}, {1, -1, 0, 0}, {1, -1, 0, 0}});

  SECTION("a page holding sinks costs only its other tokens; the first misfit ends the choice") {
    // sinks {0, 1} + current page {12, 13} forced, 4 remain. Page A costs 2 (tokens 2, 3) and is
    // taken; B (cost 4) does not fit in the 2 left and ends the choice: 6 of 8 visible.
    auto policy =
        h.make("quest", 0.0, {"page_size=4", "sinks=2", "dense_layers=0", "budget_tokens=8"});
    check_all_heads(h.run(*policy, 13, 0), join(range(0, 4), {12, 13}));
  }

  SECTION("a window reaching past the current page is forced too") {
    // window 5: {9..13} forced, 3 remain: no page of 4 fits.
    auto policy = h.make("quest", 0.0, with(kQuestArgs, "window=5"));
    check_all_heads(h.run(*policy, 13, 0), range(9, 14));
  }

  SECTION("a budget below sinks + current page keeps the current token, then sinks, then recent") {
    // B = 3 with 4 sinks and the current page {12, 13}: token 13, then sinks 0 and 1.
    auto policy =
        h.make("quest", 0.0, {"page_size=4", "sinks=4", "dense_layers=0", "budget_tokens=3"});
    check_all_heads(h.run(*policy, 13, 0), {0, 1, 13});
    // B = 5 with 2 sinks and a current page of 4 ({12..15} at t = 15): 15, the sinks, then the
    // most recent 14 and 13; 12, the rest of the current page, does not fit.
    std::vector<Vec> keys = page_keys();
    keys.resize(16, zero);
    h.set_keys({keys, keys});
    auto full_page =
        h.make("quest", 0.0, {"page_size=4", "sinks=2", "dense_layers=0", "budget_tokens=5"});
    check_all_heads(h.run(*full_page, 15, 0), {0, 1, 13, 14, 15});
  }
}

TEST_CASE("quest: a single partial page before page_size tokens, default dense layers 2",
          "[policy]") {
  Harness h;
  set_page_keys(h);
  h.set_q({{1, -1, 0, 0}, {1, -1, 0, 0}, {1, -1, 0, 0}, {1, -1, 0, 0}});
  // page_size 16 (default): at t = 5 every token is in the current page. B(5) = 3 at s = 0.5:
  // the current token, sink 0, then the most recent token 4 (as streaming would).
  auto policy = h.make("quest", 0.5, {"sinks=1", "dense_layers=0"});
  check_all_heads(h.run(*policy, 5, 0), {0, 4, 5});
  // Its scores: the one page's bound for every column. Keys 0..5 (A's four, then (2, 0, 0, 0)
  // and (3, 0, 0, 0)): channel 0 in [0, 3], channel 1 in [-5, 0]; max(0, 3) + max(5, 0) = 8, / 2.
  for (float s : h.score_row(0, 5)) CHECK(s == 4.0f);
  // A fresh policy at t = 0: B(0) = 1 is every candidate, the layer stays dense.
  auto first = h.make("quest", 0.5, {"sinks=1", "dense_layers=0"});
  check_all_heads(h.run(*first, 0, 0), {0});
  CHECK(h.last_decision == LayerDecision::Dense);
  // Quest's own default leaves the first two layers dense: both layers of the bench.
  for (const ParamSpec& spec : policy_info("quest").params) {
    if (spec.name == "dense_layers") CHECK(spec.default_value == "2");
    if (spec.name == "page_size") CHECK(spec.default_value == "16");
  }
  auto defaults = h.make("quest", 0.5);
  check_all_heads(h.run(*defaults, 13, 1), range(0, 14));
  CHECK(h.last_decision == LayerDecision::Dense);
}

namespace {

// tokenfilter on the bench: 2 layers, the tail (tail_frac 0.5) is layer 1. Keys and values for
// steps 0..keys.size()-1 of both KV heads; runs layer 0 (always dense) then layer 1 and returns
// layer 1's decisions.
std::vector<LayerDecision> tokenfilter_decisions(Harness& h, Policy& policy,
                                                 const std::vector<std::vector<Vec>>& keys,
                                                 const std::vector<std::vector<Vec>>& values) {
  std::vector<Vec> k0, k1, v0, v1;
  for (size_t t = 0; t < keys.size(); ++t) {
    k0.push_back(keys[t][0]);
    k1.push_back(keys[t][1]);
    v0.push_back(values[t][0]);
    v1.push_back(values[t][1]);
  }
  h.set_keys({k0, k1});
  h.set_values({v0, v1});
  std::vector<LayerDecision> decisions;
  for (int64_t t = 0; t < int64_t(keys.size()); ++t) {
    h.run(policy, t, 0);
    CHECK(h.last_decision == LayerDecision::Dense);  // layer 0 is not in the tail
    h.run(policy, t, 1);
    decisions.push_back(h.last_decision);
  }
  return decisions;
}

constexpr LayerDecision kDense = LayerDecision::Dense, kSkip = LayerDecision::Skipped;

}  // namespace

TEST_CASE("tokenfilter: similarities, variance weighting and the threshold update by hand",
          "[policy]") {
  Harness h;
  // ema 0: the anchor is the previous token's k/v. target = global_ratio / tail_frac = 0.5.
  auto policy = h.make("tokenfilter", 0.0,
                       {"ema=0", "eta=0.1", "tau=0.5", "global_ratio=0.25", "dense_layers=0"});
  // t = 0: anchors set, no skip; tau = 0.5 + 0.1 (0/1 - 0.5) = 0.45.
  // t = 1: s_k = (cos(e1, e1), cos(e2, e1)) = (1, 0), s_v = (1, 1). var_v = 0, so alpha = 0.5:
  //   S = 0.5 * 0.5 + 0.5 * 1 = 0.75 > 0.45: skip. Ratio 1/2 = target: tau stays 0.45.
  // t = 2: s_k = (1, 1), s_v = (cos(e2, e1), cos(-e1, e1)) = (0, -1). Over all per-head values,
  //   k {1, 0, 1, 1}: var 3/16; v {1, 1, 0, -1}: var 11/16. alpha = var_k / (var_k + var_v) =
  //   3/14; S = 3/14 * 1 + 11/14 * -0.5 = -5/28 < 0.45: no skip. Ratio 1/3 below the target:
  //   tau = 0.45 + 0.1 (1/3 - 1/2) = 0.4333 (skipping gets easier).
  // t = 3: s_k = (cos(e2, e1), cos(e2, e2)) = (0, 1), s_v = (1, 1). k {1,0,1,1,0,1}: var 2/9;
  //   v {1,1,0,-1,1,1}: var 7/12; alpha = 8/29; S = 8/29 * 0.5 + 21/29 * 1 = 25/29 > 0.4333: skip.
  const std::vector<std::vector<Vec>> keys = {{e1, e1}, {e1, e2}, {e1, e2}, {e2, e2}};
  const std::vector<std::vector<Vec>> values = {{e1, e1}, {e1, e1}, {e2, minus_e1}, {e2, minus_e1}};
  const std::vector<LayerDecision> decisions = tokenfilter_decisions(h, *policy, keys, values);
  CHECK(decisions == std::vector<LayerDecision>{kDense, kSkip, kDense, kSkip});
  // The scores row: S_kv at the current column for every head, 0 elsewhere.
  for (int64_t head = 0; head < 4; ++head) {
    const std::vector<float> row = h.score_row(head, 3);
    CHECK(row[0] == 0.0f);
    CHECK(row[1] == 0.0f);
    CHECK(row[2] == 0.0f);
    CHECK(row[3] == Approx(25.0 / 29.0).margin(1e-6));
  }
}

TEST_CASE("tokenfilter: a layer that skips more than its target raises its threshold", "[policy]") {
  Harness h;
  // Identical tokens: S = 1 every step. Target 0.5, eta 0.5, tau 0.5: tau goes 0.25 (after the
  // first step), then + 0.5 (r - 0.5) with r = 1/2, 2/3, 3/4, ..., 7/8 after steps 1..7, all
  // skipped: 0.25, 0.333, 0.458, 0.608, 0.775, 0.954, 1.141. At t = 8, S = 1 <= 1.141: no skip.
  auto policy = h.make("tokenfilter", 0.0, {"ema=0", "eta=0.5", "tau=0.5", "global_ratio=0.25"});
  const std::vector<std::vector<Vec>> same(10, {e1, e2});
  const std::vector<LayerDecision> decisions = tokenfilter_decisions(h, *policy, same, same);
  std::vector<LayerDecision> want(10, kSkip);
  want[0] = want[8] = want[9] = kDense;
  CHECK(decisions == want);
}

TEST_CASE("tokenfilter: EMA anchors, and sparsity 0 never skips", "[policy]") {
  Harness h;
  // ema 0.9: after e1 then e2 the key anchor is 0.9 e1 + 0.1 e2, so at t = 2 the key e2 has
  // s_k = 0.1 / sqrt(0.82); values stay e1 (s_v = 1, var_v = 0, alpha 0.5).
  // S = 0.5 * 0.1 / sqrt(0.82) + 0.5. tau = -1 would skip everything, but the target is 0.
  auto policy = h.make("tokenfilter", 0.0, {"tau=-1"});
  const std::vector<std::vector<Vec>> keys = {{e1, e1}, {e2, e2}, {e2, e2}};
  const std::vector<std::vector<Vec>> values(3, {e1, e1});
  CHECK(tokenfilter_decisions(h, *policy, keys, values) ==
        std::vector<LayerDecision>{kDense, kDense, kDense});
  CHECK(h.score_row(2, 2)[2] == Approx(0.5 * 0.1 / std::sqrt(0.82) + 0.5).margin(1e-6));
  CHECK(h.score_row(2, 2)[1] == 0.0f);

  // Identical tokens, a threshold below every similarity: at sparsity 0 (and with global_ratio
  // 0 given) nothing is skipped in 16 steps; at s = 0.25 the same run skips.
  const std::vector<std::vector<Vec>> same(16, {e1, e2});
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"tau=-1"}, std::vector<std::string>{"tau=-1", "global_ratio=0"}}) {
    auto never = h.make("tokenfilter", 0.0, args);
    for (LayerDecision d : tokenfilter_decisions(h, *never, same, same)) CHECK(d == kDense);
  }
  auto sometimes = h.make("tokenfilter", 0.25, {"tau=-1"});
  const std::vector<LayerDecision> skipping = tokenfilter_decisions(h, *sometimes, same, same);
  CHECK(skipping[0] == kDense);
  CHECK(skipping[1] == kSkip);
}

TEST_CASE("tokenfilter: only the tail layers are filtered", "[policy]") {
  Harness h;
  // tail_frac 1 with dense_layers 0: both layers filter (target = s); identical tokens skip at
  // t = 1 in both. tail_frac 0: nothing is ever skipped.
  h.set_keys({{e1, e1}, {e2, e2}});
  h.set_values({{e1, e1}, {e2, e2}});
  auto all = h.make("tokenfilter", 0.5, {"tail_frac=1", "dense_layers=0"});
  auto none = h.make("tokenfilter", 0.5, {"tail_frac=0"});
  for (int64_t layer = 0; layer < 2; ++layer) h.run(*all, 0, layer);
  for (int64_t layer = 0; layer < 2; ++layer) {
    h.run(*all, 1, layer);
    CHECK(h.last_decision == kSkip);
    CHECK(h.run(*none, 0, layer) == std::vector<std::set<int64_t>>(4, {0}));
    h.run(*none, 1, layer);
    CHECK(h.last_decision == kDense);
  }
}

TEST_CASE("quest and tokenfilter at sparsity 0 give the dense logits of the demo model",
          "[policy]") {
  auto backend = make_cpu_backend(2);
  const auto resident =
      upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 40; ++i) tokens.push_back((i * 977 + 13) % 8192);  // 3 pages of 16
  const ScoreResult reference = score_tokens(resident, tokens);
  for (const PolicyConfig& config :
       {PolicyConfig{"quest", 0.0, {}},
        PolicyConfig{"quest", 0.0, {"page_size=4", "max_only=true"}},
        PolicyConfig{"quest", 0.0, {"granularity=kv_head", "dense_layers=0"}},
        PolicyConfig{"tokenfilter", 0.0, {}}, PolicyConfig{"tokenfilter", 0.0, {"tau=-1"}}}) {
    INFO(config.id << " " << config.args.size());
    ScoreOptions options;
    options.policy = config;
    const ScoreResult result = score_tokens(resident, tokens, options);
    CHECK(result.argmax == reference.argmax);
    CHECK(result.nll == reference.nll);  // every layer dense: the same arithmetic, same bits
    CHECK(result.sparsity.overall() == 0.0);
  }
  // A real sparsity changes them: quest hides pages, tokenfilter skips tail attention.
  for (const PolicyConfig& config :
       {PolicyConfig{"quest", 0.5, {"page_size=4"}}, PolicyConfig{"tokenfilter", 0.3, {}}}) {
    INFO(config.id);
    ScoreOptions options;
    options.policy = config;
    const ScoreResult result = score_tokens(resident, tokens, options);
    CHECK(result.nll != reference.nll);
    CHECK(result.sparsity.overall() > 0.0);
  }
}
