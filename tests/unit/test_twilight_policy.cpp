// twilight (docs/policies/twilight.md): the top-p op on hand-made estimates (each head's k is
// the fewest candidates whose softmax mass reaches p, forced columns kept, hidden ones ignored),
// the policy over quest's page bounds on hand-made keys (k per head differs, never above B(t)),
// its knobs and errors, then real decodes on the demo model with the rule recomputed from the
// recorded scores (base quest with one-token pages, and base doublesparsity).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "engine/eval/sparsity_match.h"
#include "engine/model/model.h"
#include "engine/policy/registry.h"
#include "engine/policy/top_p_math.h"
#include "engine/policy/top_p_ops.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/error_message.h"
#include "tests/support/json_fixture.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"

using Catch::Matchers::Contains;
using namespace kvlens;
using kvlens::test::Harness;
using kvlens::test::kStride;

namespace {

// Scores [4, kStride] (rows padded with 0) and a visible mask (all of 0..cols-1 unless given).
struct PruneCase {
  Harness h;
  void set_scores(const std::vector<std::vector<float>>& rows) {
    std::vector<float> host(size_t(4 * kStride), 0.0f);
    for (size_t r = 0; r < rows.size(); ++r)
      std::copy(rows[r].begin(), rows[r].end(), host.begin() + int64_t(r) * kStride);
    h.backend->from_host(h.scores, host.data(), host.size() * sizeof(float));
  }
  void set_visible(const std::vector<std::vector<int64_t>>& rows) {
    std::vector<uint8_t> host(size_t(4 * kStride), 0);
    for (size_t r = 0; r < rows.size(); ++r)
      for (const int64_t j : rows[r]) host[r * kStride + size_t(j)] = 1;
    h.backend->from_host(h.visible, host.data(), host.size());
  }
  std::vector<std::set<int64_t>> prune(int64_t cols, float p, int64_t sink_end,
                                       int64_t recent_begin) {
    top_p_ops(*h.backend).top_p_prune(h.scores, cols, p, sink_end, recent_begin, h.visible);
    std::vector<uint8_t> host(size_t(4 * kStride));
    h.backend->to_host(h.visible, host.data(), host.size());
    std::vector<std::set<int64_t>> sets(4);
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t j = 0; j < kStride; ++j)
        if (host[size_t(r * kStride + j)]) sets[size_t(r)].insert(j);
    return sets;
  }
};

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> out(static_cast<size_t>(n), 0);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

float ln(double x) {
  return float(std::log(x));
}

}  // namespace

TEST_CASE("top_p exp: within 4e-7 of exp over the softmax range, 0 past it", "[policy]") {
  for (double x = -86.0; x <= 0.0; x += 0.0137) {
    INFO(x);
    CHECK(double(exp_nonpositive(float(x))) == Approx(std::exp(double(float(x)))).epsilon(4e-7));
  }
  CHECK(exp_nonpositive(0.0f) == 1.0f);
  CHECK(exp_nonpositive(-90.0f) == 0.0f);
  CHECK(exp_nonpositive(-INFINITY) == 0.0f);
  CHECK(exp_nonpositive(NAN) == 0.0f);
}

TEST_CASE("top_p_prune keeps each head's fewest candidates whose estimated mass reaches p",
          "[policy]") {
  PruneCase c;
  // Head 0: weights 0.05, 0.1, 0.5, 0.05, 0.05, 0.2, 0.03, 0.02: 2 (0.5), 5 (0.7), 1 (0.8)
  // reach 0.75: k = 3. Head 1: one logit 10 above seven 0s: 0.9997 alone, k = 1. Head 2: eight
  // equal: 0.125 each, exactly 0.75 at the sixth (ties to the more recent): k = 6. Head 3: only
  // 0, 4 and 6 are candidates (0.7, 0.2, 0.1; hidden column 1's 100 counts for nothing): 0 and
  // 4 reach 0.9, k = 2.
  c.set_scores({{ln(0.05), ln(0.1), ln(0.5), ln(0.05), ln(0.05), ln(0.2), ln(0.03), ln(0.02)},
                {0, 0, 0, 10, 0, 0, 0, 0},
                {0, 0, 0, 0, 0, 0, 0, 0},
                {ln(0.7), 100, 0, 0, ln(0.2), 0, ln(0.1), 0}});
  SECTION("no forced columns") {
    c.set_visible({iota(8), iota(8), iota(8), {0, 4, 6}});
    const auto sets = c.prune(8, 0.75f, 0, 8);
    CHECK(sets[0] == std::set<int64_t>{1, 2, 5});
    CHECK(sets[1] == std::set<int64_t>{3});
    CHECK(sets[2] == std::set<int64_t>{2, 3, 4, 5, 6, 7});
    CHECK(sets[3] == std::set<int64_t>{0, 4});
  }
  SECTION("forced columns stay whatever their mass; hidden ones stay hidden") {
    c.set_visible({iota(8), iota(8), iota(8), {0, 4, 6}});
    const auto sets = c.prune(8, 0.75f, 1, 7);
    CHECK(sets[0] == std::set<int64_t>{0, 1, 2, 5, 7});
    CHECK(sets[1] == std::set<int64_t>{0, 3, 7});
    CHECK(sets[2] == std::set<int64_t>{0, 2, 3, 4, 5, 6, 7});
    CHECK(sets[3] == std::set<int64_t>{0, 4});
  }
  SECTION("p = 1 keeps every candidate") {
    c.set_visible({iota(8), iota(8), iota(8), {0, 4, 6}});
    const auto sets = c.prune(8, 1.0f, 0, 8);
    const std::vector<int64_t> all = iota(8);
    for (size_t r = 0; r < 3; ++r) CHECK(sets[r] == std::set<int64_t>(all.begin(), all.end()));
    CHECK(sets[3] == std::set<int64_t>{0, 4, 6});
  }
  SECTION("bad arguments name the field") {
    c.set_visible({iota(8)});
    CHECK_THROWS_WITH(c.prune(8, 0.0f, 0, 8), Contains("top_p") && Contains("(0, 1]"));
    CHECK_THROWS_WITH(c.prune(8, 0.5f, 3, 2), Contains("forced columns"));
  }
}

TEST_CASE("top_p_prune: the CPU's sorted walk keeps what the GPU's per-pick scan keeps",
          "[policy]") {
  // The GPU finds each next column by a block-wide maximum of the keys below the last one; the
  // CPU sorts once. Run here on the host with top_p_math.h, the scan must give the op's columns
  // on random rows with ties (scores on a coarse grid) and random candidates.
  PruneCase c;
  uint64_t state = 12345;
  const auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return uint32_t(state >> 33);
  };
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::vector<float>> rows(4, std::vector<float>(size_t(kStride)));
    std::vector<std::vector<int64_t>> candidates(4);
    for (size_t r = 0; r < 4; ++r)
      for (int64_t j = 0; j < kStride; ++j) {
        rows[r][size_t(j)] = float(int(next() % 9) - 4) * 0.75f;
        if (next() % 4 != 0) candidates[r].push_back(j);
      }
    c.set_scores(rows);
    c.set_visible(candidates);
    const float p = 0.2f + 0.15f * float(trial % 6);
    const auto sets = c.prune(kStride, p, 1, kStride - 1);
    for (size_t r = 0; r < 4; ++r) {
      INFO("trial " << trial << " row " << r);
      std::vector<uint8_t> v(size_t(kStride), 0);
      for (const int64_t j : candidates[r]) v[size_t(j)] = 1;
      const float* s = rows[r].data();
      const float best = visible_max(s, v.data(), kStride);
      const float total = visible_mass(s, v.data(), kStride, best);
      const uint64_t last = top_p_last_key(s, best, total, p, [&](uint64_t bound) {
        uint64_t found = 0;
        for (int64_t j = 0; j < kStride; ++j) {
          const uint64_t key = top_k_key(s[j], uint32_t(j));
          if (v[size_t(j)] != 0 && key < bound && key > found) found = key;
        }
        return found;
      });
      std::set<int64_t> want;
      for (int64_t j = 0; j < kStride; ++j)
        if (v[size_t(j)] != 0 && top_p_keeps(s, j, last, 1, kStride - 1)) want.insert(j);
      CHECK(sets[r] == want);
    }
  }
}

TEST_CASE("twilight prunes quest's candidates by their bounds: k per head, never above B(t)",
          "[policy]") {
  Harness h;
  // D = 4, q = (2, 0, 0, 0) for every head: with one-token pages quest's bound of token j is
  // q . k_j / sqrt(4) = k_j[0], the estimate. KV head 0 (query heads 0, 1) and KV head 1
  // (heads 2, 3) at step 7, B = 6.
  h.set_q({{2, 0, 0, 0}, {2, 0, 0, 0}, {2, 0, 0, 0}, {2, 0, 0, 0}});
  const std::vector<float> head0 = {-5, 1, 4, -5, -5, 3, -5, 0};
  std::vector<std::vector<float>> keys0, keys1;
  for (const float k : head0) keys0.push_back({k, 0, 0, 0});
  for (int j = 0; j < 8; ++j) keys1.push_back({2, 0, 0, 0});
  h.set_keys({keys0, keys1});
  const std::vector<std::string> args = {"sinks=0", "budget_tokens=6", "page_size=1",
                                         "dense_layers=1"};
  // Quest's candidates: the current token (7) and the 5 best pages before it: 2 (4), 5 (3),
  // 1 (1), then the -5 ties, the more recent first: 6, 4. On KV head 1 every bound ties: 2..7.
  auto quest = h.make("quest", 0.0, args);
  const auto base = h.run(*quest, 7);
  CHECK(base[0] == std::set<int64_t>{1, 2, 4, 5, 6, 7});
  CHECK(base[2] == std::set<int64_t>{2, 3, 4, 5, 6, 7});
  SECTION("top_p 0.85: k = 3 on KV head 0's heads, all 6 on KV head 1's") {
    std::vector<std::string> twilight_args = args;
    twilight_args.push_back("top_p=0.85");
    auto twilight = h.make("twilight", 0.0, twilight_args);
    const auto sets = h.run(*twilight, 7);
    CHECK(h.last_decision == LayerDecision::Masked);
    // Weights e^4, e^3, e^1, e^0 (the current token), 2 e^-5 (total 78.43, 0.85 of it 66.7):
    // 2 (54.6) then 5 (74.7) reach it; 7 is forced anyway.
    CHECK(sets[0] == std::set<int64_t>{2, 5, 7});
    CHECK(sets[1] == std::set<int64_t>{2, 5, 7});
    // Six equal weights: 5/6 < 0.85, so all six.
    CHECK(sets[2] == base[2]);
    CHECK(sets[3] == base[2]);
    // The scores are quest's bounds, the estimate the views show as predicted logits.
    CHECK(h.score_row(0, 7) == head0);
    CHECK(policy_info("twilight").predicts_logits);
  }
  SECTION("top_p 1 keeps quest's candidates; a smaller p never keeps more") {
    std::vector<std::string> all = args;
    all.push_back("top_p=1");
    auto twilight = h.make("twilight", 0.0, all);
    CHECK(h.run(*twilight, 7) == base);
    size_t previous = 1000;
    for (const char* p : {"top_p=0.99", "top_p=0.9", "top_p=0.5", "top_p=0.01"}) {
      INFO(p);
      std::vector<std::string> fewer = args;
      fewer.push_back(p);
      auto pruned = h.make("twilight", 0.0, fewer);
      const auto sets = h.run(*pruned, 7);
      for (size_t head = 0; head < 4; ++head) {
        CHECK(std::includes(base[head].begin(), base[head].end(), sets[head].begin(),
                            sets[head].end()));
        CHECK(sets[head].count(7) == 1);  // the current token is always kept
      }
      CHECK(sets[0].size() <= previous);
      previous = sets[0].size();
    }
    CHECK(previous == 2);  // p = 0.01: the best token and the current one
  }
  SECTION("sinks stay whatever their estimate") {
    std::vector<std::string> sinks = {"sinks=1", "budget_tokens=6", "page_size=1", "dense_layers=1",
                                      "top_p=0.85"};
    auto twilight = h.make("twilight", 0.0, sinks);
    const auto sets = h.run(*twilight, 7);
    CHECK(sets[0] == std::set<int64_t>{0, 2, 5, 7});
  }
}

TEST_CASE("twilight: dense layers and sparsity 0 stay dense, knobs and errors", "[policy]") {
  Harness h;
  h.set_q({{1, 0, 0, 0}, {0, 1, 0, 0}, {0, 0, 1, 0}, {0, 0, 0, 1}});
  auto twilight = h.make("twilight", 0.0, {"dense_layers=1"});
  h.run(*twilight, 9);
  CHECK(h.last_decision == LayerDecision::Dense);
  auto sparse = h.make("twilight", 0.5, {});
  h.run(*sparse, 9, 1);  // dense_layers is 2 by default (the authors' skipped layers)
  CHECK(h.last_decision == LayerDecision::Dense);
  CHECK_FALSE(sparse->reads_logits(h.step(9, 1)));
  // The knobs: the base's own ones only where they apply, bad values named.
  CHECK_THROWS_WITH(h.make("twilight", 0.5, {"top_p=0"}),
                    Contains("top_p") && Contains("policy twilight"));
  CHECK_THROWS_WITH(h.make("twilight", 0.5, {"base=h2o"}),
                    Contains("base") && Contains("doublesparsity"));
  // doublesparsity needs its calibration beside the model: the harness has no model folder.
  CHECK_THROWS_WITH(h.make("twilight", 0.5, {"base=doublesparsity"}),
                    Contains("calibrate_channels"));
}

TEST_CASE("twilight's nominal budget is reported as an upper bound", "[policy][eval]") {
  const std::vector<std::string> warnings =
      nominal_budget_warnings({"twilight", 0.5, {"base=doublesparsity", "top_p=0.9"}}, 8);
  REQUIRE(warnings.size() == 1);
  CHECK_THAT(warnings[0], Contains("twilight at nominal sparsity 0.500") &&
                              Contains("upper bound") && Contains("doublesparsity") &&
                              Contains("top_p=0.900"));
  CHECK(nominal_budget_warnings({"quest", 0.5, {}}, 8).empty());
}

namespace {

// Every masked (step, layer, head) of run `run`: the base's token-level candidates (forced
// columns + the best B - forced by the recorded estimate, ties to the more recent) pruned by
// top-p in double precision give the recorded set, unless the mass sits within 1e-5 of p at
// the boundary. Returns the distinct per-head k seen.
std::set<int64_t> check_twilight_trace(const Trace& trace, int64_t run, double sparsity, double p,
                                       int64_t sinks, int64_t dense_layers) {
  const StepRecord& first = trace.steps()[0][size_t(run)];
  const int64_t layers = int64_t(first.decisions.size());
  const int64_t heads = int64_t(first.visible_counts.size()) / layers;
  CommonKnobs knobs;
  knobs.sparsity = sparsity;
  knobs.sinks = sinks;
  std::set<int64_t> ks;
  int64_t compared = 0, pruned = 0;
  for (int64_t t = 0; t < trace.step_count(); ++t) {
    const int64_t budget = knobs.budget(t);
    const ForcedColumns forced = forced_columns(t, budget, sinks, 1);
    for (int64_t layer = 0; layer < layers; ++layer) {
      const LayerDecision decision = trace.steps()[size_t(t)][size_t(run)].decisions[size_t(layer)];
      if (layer < dense_layers || budget >= t + 1) {
        CHECK(decision == LayerDecision::Dense);
        continue;
      }
      REQUIRE(decision == LayerDecision::Masked);
      for (int64_t head = 0; head < heads; ++head) {
        INFO("step " << t << " layer " << layer << " head " << head);
        const HeadRow row = head_row_at(trace, run, t, layer, head, HeadQuantity::Scores);
        if (!row.kept) continue;
        const auto key = [&](int64_t j) { return top_k_key(row.values[size_t(j)], uint32_t(j)); };
        std::vector<int64_t> candidates;
        std::vector<int64_t> rest;
        for (int64_t j = 0; j <= t; ++j) {
          if (j < forced.sink_end || j >= forced.recent_begin)
            candidates.push_back(j);
          else
            rest.push_back(j);
        }
        std::sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) { return key(a) > key(b); });
        const int64_t extra = budget - forced.count(t);
        candidates.insert(candidates.end(), rest.begin(), rest.begin() + extra);
        std::sort(candidates.begin(), candidates.end(),
                  [&](int64_t a, int64_t b) { return key(a) > key(b); });
        double top = -INFINITY, total = 0.0;
        for (const int64_t j : candidates) top = std::max(top, double(row.values[size_t(j)]));
        for (const int64_t j : candidates) total += std::exp(row.values[size_t(j)] - top);
        std::vector<uint8_t> want(size_t(t + 1), 0);
        double taken = 0.0;
        bool near_boundary = false;
        for (const int64_t j : candidates) {
          want[size_t(j)] = 1;
          taken += std::exp(row.values[size_t(j)] - top);
          if (std::abs(taken - p * total) < 1e-5 * total) near_boundary = true;
          if (taken >= p * total) break;
        }
        for (int64_t j = 0; j <= t; ++j)
          if (j < forced.sink_end || j >= forced.recent_begin) want[size_t(j)] = 1;
        const int64_t k = std::count(row.visible.begin(), row.visible.end(), uint8_t(1));
        CHECK(k <= budget);
        CHECK(k ==
              trace.steps()[size_t(t)][size_t(run)].visible_counts[size_t(layer * heads + head)]);
        for (int64_t j = 0; j <= t; ++j)
          if (j < forced.sink_end || j >= forced.recent_begin) CHECK(row.visible[size_t(j)] == 1);
        if (near_boundary) continue;
        CHECK(row.visible == want);
        ks.insert(k);
        pruned += k < budget;
        ++compared;
      }
    }
  }
  CHECK(compared > 100);
  CHECK(pruned > 0);
  return ks;
}

}  // namespace

TEST_CASE("twilight in a real decode: the recorded sets follow the rule from the recorded scores",
          "[policy]") {
  auto backend = make_cpu_backend(2);
  const auto model = upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 40; ++i) tokens.push_back((i * 37 + 11) % 300 + 3);
  const PolicyConfig quest_tokens{"twilight", 0.5, {"page_size=1", "sinks=2", "top_p=0.8"}};
  const PolicyConfig doublesparsity{"twilight", 0.5, {"base=doublesparsity", "sinks=2"}};
  TraceRecorder recorder(model, nullptr, tokens,
                         {{"quest", 0.5, {}}, quest_tokens, doublesparsity});
  while (recorder.step()) {
  }
  const Trace& trace = recorder.trace();
  // Each head's own k: many different counts across heads and steps.
  CHECK(check_twilight_trace(trace, 1, 0.5, 0.8, 2, 2).size() > 3);
  CHECK(check_twilight_trace(trace, 2, 0.5, 0.85, 2, 2).size() > 3);
  // Top-p keeps fewer than the nominal budget: the effective sparsity is above the nominal 0.5.
  for (const int64_t run : {1, 2}) {
    int64_t kept = 0, budget = 0;
    const int64_t t = trace.step_count() - 1;
    const StepRecord& last = trace.steps()[size_t(t)][size_t(run)];
    const int64_t heads = int64_t(last.visible_counts.size()) / int64_t(last.decisions.size());
    for (size_t i = size_t(2 * heads); i < last.visible_counts.size(); ++i) {
      kept += last.visible_counts[i];
      budget += 20;  // B(39) = ceil(0.5 * 40)
    }
    CHECK(kept < budget);
  }
}

TEST_CASE("top_p_prune keeps the sets of the authors' pruner, re-implemented from their code",
          "[policy]") {
  // tests/fixtures/twilight/reference.json (tools/twilight_reference.py): random estimates and
  // base selections pruned as Twilight's attention_forward and TopPReturnMaskKernel do. Where
  // the sink (column 0) is selected and holds the row's largest estimate, as in a real model,
  // and no rounding can move the threshold, kvlens keeps exactly their set.
  const nlohmann::json reference =
      test::read_json_fixture("tests/fixtures/twilight/reference.json");
  const int64_t cols = reference["cols"].get<int64_t>();
  REQUIRE(cols <= kStride + 8);
  auto backend = make_cpu_backend(1);
  DeviceTensor scores = backend->alloc(DType::F32, {1, cols});
  DeviceTensor visible = backend->alloc(DType::U8, {1, cols});
  int64_t compared = 0, unpruned_without_sink = 0;
  for (size_t i = 0; i < reference["rows"].size(); ++i) {
    const nlohmann::json& row = reference["rows"][i];
    INFO("row " << i);
    const auto values = row["scores"].get<std::vector<float>>();
    const auto selected = row["selected"].get<std::vector<uint8_t>>();
    const auto want = row["kept"].get<std::vector<uint8_t>>();
    if (!row["sink_is_max"].get<bool>()) {
      // Their bisection starts from column 0's probability: with the sink not selected it is 0
      // and nothing is pruned (docs/policies/twilight.md, deliberate differences).
      if (selected[0] == 0) {
        CHECK(want == selected);
        ++unpruned_without_sink;
      }
      continue;
    }
    if (!row["clear"].get<bool>()) continue;
    backend->from_host(scores, values.data(), values.size() * sizeof(float));
    backend->from_host(visible, selected.data(), selected.size());
    top_p_ops(*backend).top_p_prune(scores, cols, row["top_p"].get<float>(), 0, cols, visible);
    std::vector<uint8_t> kept(static_cast<size_t>(cols), 0);
    backend->to_host(visible, kept.data(), kept.size());
    CHECK(kept == want);
    ++compared;
  }
  CHECK(compared >= 60);
  CHECK(unpruned_without_sink >= 5);
}
