// The budget allocators (docs/policies/pyramidkv.md, adakv.md): PyramidKV's schedule on its own,
// Ada-KV on a hand-made layer (a head whose attention is concentrated gets less than heads whose
// attention is spread), the SCORER+ALLOCATOR composition and its errors, and real decodes on the
// demo model in lockstep with the scorers alone: the totals match, pyramid budgets shrink with
// depth, and Ada-KV's kept set is one top-k over the layer (recomputed from the recorded scores).
#include <catch2/catch.hpp>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/policy/allocator.h"
#include "engine/policy/registry.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace_queries.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"

using namespace kvlens;
using kvlens::test::Harness;

TEST_CASE("pyramid schedule: the mean budget exactly, shrinking with depth",
          "[policy][allocator]") {
  for (const int64_t layers : {2, 3, 7, 8, 32}) {
    for (const int64_t extra : {0, 1, 5, 17, 100}) {
      for (const int64_t capacity : {extra, extra + 3, 4 * extra + 1}) {
        for (const int64_t beta : {1, 2, 20}) {
          INFO(layers << " layers, extra " << extra << ", capacity " << capacity << ", beta "
                      << beta);
          const std::vector<int64_t> x = pyramid_schedule(extra, capacity, layers, beta);
          REQUIRE(int64_t(x.size()) == layers);
          CHECK(std::accumulate(x.begin(), x.end(), int64_t(0)) == layers * extra);
          for (size_t i = 1; i < x.size(); ++i) CHECK(x[i] <= x[i - 1]);
          for (const int64_t v : x) {
            CHECK(v >= 0);
            CHECK(v <= capacity);
          }
        }
      }
    }
  }
  // The authors' ends: min = base // beta, max = 2 * base - min; linear in between (195, 147.5,
  // 100, 52.5, 5: the half units go to the shallower of the tied layers).
  CHECK(pyramid_schedule(100, 1000, 5, 20) == std::vector<int64_t>{195, 148, 100, 52, 5});
  // A max past the candidates is lowered to them, the min raised to keep the mean.
  CHECK(pyramid_schedule(100, 120, 3, 20) == std::vector<int64_t>{120, 100, 80});
  CHECK(pyramid_schedule(7, 7, 1, 20) == std::vector<int64_t>{7});
  CHECK_THROWS_AS(pyramid_schedule(5, 4, 3, 20), Error);
}

TEST_CASE("pyramid allocation: a layer held to its room passes the rest on, shallowest first",
          "[policy][allocator]") {
  // Targets 195, 148, 100, 52, 5 (above); layer 0 can take 150, layer 1 160: of the 45 over,
  // 12 fill layer 1, 33 go to layer 2.
  CHECK(pyramid_allocation(100, 1000, {150, 160, -1, -1, -1}, 20) ==
        std::vector<int64_t>{150, 160, 133, 52, 5});
  CHECK(pyramid_allocation(100, 1000, {-1, -1, -1, -1, -1}, 20) ==
        pyramid_schedule(100, 1000, 5, 20));
  // No room anywhere: the total falls short rather than a layer taking what it cannot keep.
  const std::vector<int64_t> short_of_room = pyramid_allocation(10, 100, {3, 3}, 20);
  CHECK(short_of_room == std::vector<int64_t>{3, 3});
}

TEST_CASE("adakv: a head with concentrated attention gets less than heads with spread attention",
          "[policy][allocator]") {
  // SnapKV's scores are last step's attention (obs_window 1, no pooling, only the current token
  // forced); B = 4 tokens per head, 4 heads: 16 over the layer.
  const std::vector<std::string> args = {"budget_tokens=4", "sinks=0", "obs_window=1",
                                         "pool_kernel=1", "protect_window=false"};
  auto run = [&](const std::string& id, std::vector<std::string> extra_args) {
    Harness h;
    std::vector<std::string> all = args;
    if (id.starts_with("h2o")) all.resize(2);  // no observation window
    all.insert(all.end(), extra_args.begin(), extra_args.end());
    auto policy = h.make(id, 0.0, all);
    for (int64_t t = 0; t < 3; ++t) {
      h.set_logits(std::vector<float>(size_t(t + 1), 0.0f));
      h.run(*policy, t);
    }
    // Step 3: head 0 attends to token 0 alone, heads 1-3 spread evenly over tokens 0-3.
    h.set_logits({{10, -10, -10, -10}, {0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}});
    h.run(*policy, 3);
    // Step 4: 5 candidates, 4 kept per head on average. (h2o's score=current_logit ranks by
    // this step's logits: the same contrast, now.)
    if (id.starts_with("h2o"))
      h.set_logits({{10, -10, -10, -10, 0}, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}});
    else
      h.set_logits(std::vector<float>(5, 0.0f));
    return h.run(*policy, 4);
  };
  SECTION("one top-12 over the heads (floor_alpha 0)") {
    const auto sets = run("adakv", {"floor_alpha=0"});
    // Token 0 of head 0 (p ~ 1) and 11 of the 12 spread tokens (p = 0.25; ties go to the later
    // head, then the later token): head 0 keeps {0, 4}, head 1 three of four, heads 2-3 all.
    CHECK(sets[0] == std::set<int64_t>{0, 4});
    CHECK(sets[1] == std::set<int64_t>{1, 2, 3, 4});
    CHECK(sets[2] == std::set<int64_t>{0, 1, 2, 3, 4});
    CHECK(sets[3] == std::set<int64_t>{0, 1, 2, 3, 4});
    size_t total = 0;
    for (const auto& s : sets) total += s.size();
    CHECK(total == 16);  // what snapkv keeps over the 4 heads
  }
  SECTION("floor_alpha 1: every head keeps its own mean budget, as snapkv") {
    const auto ada = run("adakv", {"floor_alpha=1"});
    const auto snap = run("snapkv", {});
    CHECK(ada == snap);
    for (const auto& s : ada) CHECK(s.size() == 4);
  }
  SECTION("composed with h2o: the same share-out by h2o's scores") {
    const auto sets = run("h2o+adakv", {"floor_alpha=0", "heavy_frac=1", "score=current_logit"});
    CHECK(sets[0] == std::set<int64_t>{0, 4});
    CHECK(sets[0].size() < sets[1].size());
    size_t total = 0;
    for (const auto& s : sets) total += s.size();
    CHECK(total == 16);
  }
}

TEST_CASE("allocator ids: built-ins, SCORER+ALLOCATOR compositions and their errors",
          "[policy][allocator]") {
  CHECK(find_policy_info("pyramidkv") != nullptr);
  CHECK(find_policy_info("adakv") != nullptr);
  const std::vector<std::string> composed = composed_policy_ids();
  CHECK(composed.size() == 6);
  for (const std::string& id : composed) {
    INFO(id);
    const PolicyInfo* info = find_policy_info(id);
    REQUIRE(info != nullptr);
    CHECK(info->id == id);
    validate_policy_config({id, 0.5, {}});
  }
  // The allocator's knob comes after the scorer's.
  const PolicyInfo& h2o_pyramid = policy_info("h2o+pyramid");
  CHECK(h2o_pyramid.params.back().name == "pyramid_beta");
  CHECK(std::any_of(h2o_pyramid.params.begin(), h2o_pyramid.params.end(),
                    [](const ParamSpec& p) { return p.name == "heavy_frac"; }));
  validate_policy_config({"tova+adakv", 0.5, {"floor_alpha=0.5"}});
  CHECK_THROWS_AS(validate_policy_config({"tova+adakv", 0.5, {"floor_alpha=2"}}), Error);
  // Only budgeted token scorers compose, with a known allocator.
  for (const std::string bad : {"quest+adakv", "snapkv+quest", "snapkv+", "+adakv",
                                "snapkv+adakv+pyramidkv", "dense+pyramidkv"}) {
    INFO(bad);
    CHECK(find_policy_info(bad) == nullptr);
    try {
      validate_policy_config({bad, 0.5, {}});
      FAIL("accepted");
    } catch (const Error& e) {
      const std::string message = e.what();
      CHECK(message.find("snapkv, h2o, tova") != std::string::npos);
      CHECK(message.find("pyramidkv") != std::string::npos);
      CHECK(message.find("'" + bad + "'") != std::string::npos);
    }
  }
}

namespace {

// Sum of the visible counts of run r at step t over the layers in [first, last).
int64_t kept_total(const StepRecord& record, int64_t heads, int64_t first, int64_t last) {
  int64_t total = 0;
  for (int64_t l = first; l < last; ++l)
    for (int64_t h = 0; h < heads; ++h) total += record.visible_counts[size_t(l * heads + h)];
  return total;
}

}  // namespace

TEST_CASE("allocators in a real decode: the scorer's total, pyramid by depth, one top-k over heads",
          "[policy][allocator]") {
  auto backend = make_cpu_backend(2);
  const auto model = upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 48; ++i) tokens.push_back((i * 37 + 11) % 300 + 3);
  // A short observation window, so that most of the budget is the scorers' to share out.
  const std::vector<std::string> snap_args = {"obs_window=4"};
  std::vector<std::string> ada_args = snap_args;
  ada_args.push_back("floor_alpha=0");
  const std::vector<PolicyConfig> runs = {
      {"snapkv", 0.5, snap_args}, {"pyramidkv", 0.5, snap_args},   {"adakv", 0.5, ada_args},
      {"h2o", 0.5, {}},           {"h2o+pyramidkv", 0.5, {}},      {"tova", 0.5, {}},
      {"tova+adakv", 0.5, {}},    {"snapkv+adakv", 0.5, snap_args}};
  TraceRecorder recorder(model, nullptr, tokens, runs);
  while (recorder.step()) {
  }
  const Trace& trace = recorder.trace();
  const int64_t L = trace.model.layers, H = trace.model.heads;
  const int64_t dense_layers = 1;  // the default
  int64_t differing_layers = 0, differing_heads = 0;
  for (int64_t t = 0; t < trace.step_count(); ++t) {
    const auto& step = trace.steps()[size_t(t)];
    INFO("step " << t);
    // The totals: pyramidkv over all layers = snapkv's, adakv per layer = snapkv's.
    CHECK(kept_total(step[1], H, 0, L) == kept_total(step[0], H, 0, L));
    CHECK(kept_total(step[4], H, 0, L) == kept_total(step[3], H, 0, L));
    for (int64_t l = 0; l < L; ++l) {
      INFO("layer " << l);
      CHECK(kept_total(step[2], H, l, l + 1) == kept_total(step[0], H, l, l + 1));
      CHECK(kept_total(step[7], H, l, l + 1) == kept_total(step[0], H, l, l + 1));
      CHECK(kept_total(step[6], H, l, l + 1) == kept_total(step[5], H, l, l + 1));
    }
    // Pyramid: one budget per layer, never growing with depth, recomputed from the schedule.
    const HeadBudgets snap = head_budgets(trace, 0, t), pyramid = head_budgets(trace, 1, t);
    if (step[1].decisions[size_t(dense_layers)] != LayerDecision::Masked) continue;
    CHECK(snap.uniform());
    for (int64_t l = dense_layers + 1; l < L; ++l) {
      CHECK(pyramid.layer_total[size_t(l)] <= pyramid.layer_total[size_t(l - 1)]);
      differing_layers += pyramid.layer_total[size_t(l)] != pyramid.layer_total[size_t(l - 1)];
    }
    // Every head of a layer keeps the layer's budget; the first policy layer the most.
    for (int64_t l = dense_layers; l < L; ++l)
      for (int64_t h = 0; h < H; ++h)
        CHECK(pyramid.kept[size_t(l * H + h)] == pyramid.kept[size_t(l * H)]);
    const HeadBudgets ada = head_budgets(trace, 2, t);
    differing_heads += !ada.uniform();
  }
  CHECK(differing_layers > 0);
  // At the last step, the schedule's ends: the first policy layer keeps about twice snapkv's
  // non-forced share, the last about 1/20 of it (forced: the current token, 4 sinks, window 4).
  {
    const int64_t t = trace.step_count() - 1;
    const HeadBudgets snap = head_budgets(trace, 0, t), pyramid = head_budgets(trace, 1, t);
    const int64_t forced = forced_columns(t, snap.min, 4, 5).count(t), extra = snap.min - forced;
    CHECK(pyramid.kept[size_t(dense_layers * H)] - forced >= 2 * extra - extra / 20 - 2);
    CHECK(pyramid.kept[size_t((L - 1) * H)] - forced <= extra / 20 + 2);
  }
  CHECK(differing_heads > 0);

  // Ada-KV's choice is one top-k over the layer's heads: every score it chose outside the forced
  // columns is at least every score it evicted at that step, whatever the head (floor_alpha 0).
  int64_t compared = 0;
  for (int64_t t = 1; t < trace.step_count(); ++t) {
    const StepRecord& now = trace.steps()[size_t(t)][2];
    const StepRecord& before = trace.steps()[size_t(t - 1)][2];
    const int64_t budget = head_budgets(trace, 0, t).min;
    const ForcedColumns forced = forced_columns(t, budget, 4, 5);
    for (int64_t l = dense_layers; l < L; ++l) {
      if (now.decisions[size_t(l)] != LayerDecision::Masked) continue;
      float lowest_chosen = INFINITY, highest_evicted = -INFINITY;
      for (int64_t h = 0; h < H; ++h) {
        const uint8_t* seen = now.visible_row(l, h, H);
        const uint8_t* seen_before = before.visible_row(l, h, H);
        const float* scores = now.scores_row(l, h, H);
        REQUIRE(seen != nullptr);
        for (int64_t j = 0; j < t; ++j) {
          const bool was = before.decisions[size_t(l)] != LayerDecision::Masked || seen_before[j];
          if (j < forced.sink_end || j >= forced.recent_begin || !was) continue;
          if (seen[j])
            lowest_chosen = std::min(lowest_chosen, scores[j]);
          else
            highest_evicted = std::max(highest_evicted, scores[j]);
        }
      }
      if (std::isfinite(lowest_chosen) && std::isfinite(highest_evicted)) {
        INFO("step " << t << " layer " << l);
        CHECK(lowest_chosen >= highest_evicted);
        ++compared;
      }
    }
  }
  CHECK(compared > 20);
}

TEST_CASE("head_budgets: each head's kept count, -1 on dense layers, the spread", "[trace]") {
  auto backend = make_cpu_backend(2);
  const auto model = upload_model(Model::load(test::source_path("assets/models/demo")), *backend);
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 24; ++i) tokens.push_back((i * 31 + 7) % 300 + 3);
  TraceRecorder recorder(model, nullptr, tokens,
                         {{"streaming", 0.5, {}}, {"adakv", 0.5, {"obs_window=2"}}});
  while (recorder.step()) {
  }
  const Trace& trace = recorder.trace();
  const int64_t L = trace.model.layers, H = trace.model.heads, t = trace.step_count() - 1;
  const HeadBudgets uniform = head_budgets(trace, 0, t);
  CHECK(uniform.candidates == t + 1);
  CHECK(uniform.uniform());
  CHECK(uniform.mean == double(uniform.min));
  for (int64_t h = 0; h < H; ++h) CHECK(uniform.kept[size_t(h)] == -1);  // layer 0 is dense
  CHECK(uniform.layer_total[0] == -1);
  CHECK(uniform.layer_total[1] == H * uniform.min);
  const StepRecord& record = trace.steps()[size_t(t)][1];
  const HeadBudgets ada = head_budgets(trace, 1, t);
  CHECK_FALSE(ada.uniform());
  for (int64_t i = H; i < L * H; ++i)
    CHECK(ada.kept[size_t(i)] == record.visible_counts[size_t(i)]);
  CHECK(ada.mean == Approx(double(uniform.min)));
  CHECK(ada.min < ada.max);
  CHECK_THROWS_AS(head_budgets(trace, 2, t), Error);
  CHECK_THROWS_AS(head_budgets(trace, 0, t + 1), Error);
}

TEST_CASE("kvlens-cli: policies lists the allocators and how they compose, eval runs composed ids",
          "[cli][allocator]") {
  const auto listing = test::run_command(test::cli_path() + " policies");
  REQUIRE(listing.exit_code == 0);
  CHECK(listing.out.find("pyramidkv") != std::string::npos);
  CHECK(listing.out.find("adakv") != std::string::npos);
  CHECK(listing.out.find("SCORER+ALLOCATOR") != std::string::npos);
  CHECK(listing.out.find("h2o+pyramidkv") != std::string::npos);
  // --json lists them too (a script picks ids from it), marked composed, with both parts' knobs.
  const auto json = test::run_command(test::cli_path() + " policies --json");
  REQUIRE(json.exit_code == 0);
  const nlohmann::json registry = nlohmann::json::parse(json.out);
  std::set<std::string> composed;
  for (const nlohmann::json& entry : registry) {
    if (!entry.at("composed").get<bool>()) continue;
    const std::string id = entry.at("id").get<std::string>();
    composed.insert(id);
    const std::string scorer = id.substr(0, id.find('+'));
    // The scorer's own knobs and the allocator's after them (allocated_info).
    std::set<std::string> knobs;
    for (const nlohmann::json& param : entry.at("params")) knobs.insert(param.at("name"));
    for (const ParamSpec& spec : find_policy_info(scorer)->params) CHECK(knobs.count(spec.name));
    if (id.ends_with("+pyramidkv")) CHECK(knobs.count("pyramid_beta") == 1);
  }
  CHECK(composed.count("tova+adakv") == 1);
  CHECK(composed.count("h2o+pyramidkv") == 1);
  CHECK(composed.count("snapkv") == 0);
  const auto eval = test::run_command(
      test::cli_path() + " eval --model " + test::source_path("assets/models/demo") +
      " --task coref --samples 2 --threads 1 --policies dense,snapkv,snapkv+adakv,h2o+pyramid");
  INFO(eval.err);
  REQUIRE(eval.exit_code == 0);
  CHECK(eval.out.find("snapkv+adakv") != std::string::npos);
  CHECK(eval.out.find("h2o+pyramid") != std::string::npos);
  const auto bad = test::run_command(test::cli_path() + " eval --model " +
                                     test::source_path("assets/models/demo") +
                                     " --task coref --samples 1 --policies quest+adakv");
  CHECK(bad.exit_code != 0);
  CHECK(bad.err.find("SCORER+ALLOCATOR with SCORER one of snapkv, h2o, tova") != std::string::npos);
}
