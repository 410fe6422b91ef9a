// Policies on small hand-made inputs with hand-computed visible sets (POLICIES.md): parameters,
// the budget rule and its priority truncation, then dense/oracle/random/streaming/h2o step by
// step, and a policy at sparsity 0 reproducing dense logits through a real decode.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "engine/model/model.h"
#include "engine/policy/registry.h"
#include "engine/session/scoring.h"
#include "tests/support/error_message.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using kvlens::test::Harness;

namespace {

template <class F>
void require_error_mentions(F&& action, const std::vector<std::string>& parts) {
  const std::string message = test::error_message(action);
  for (const std::string& part : parts) CHECK_THAT(message, Catch::Contains(part));
}

std::set<int64_t> range(int64_t begin, int64_t end) {
  std::set<int64_t> out;
  for (int64_t j = begin; j < end; ++j) out.insert(j);
  return out;
}

}  // namespace

TEST_CASE("policy parameters: defaults, parsing and errors", "[policy]") {
  const PolicyInfo& h2o = policy_info("h2o");
  const ParamValues defaults = resolve_params(h2o.params, {}, "policy h2o");
  CHECK(defaults.get_int("sinks") == 4);
  CHECK(defaults.get_float("heavy_frac") == 0.5);
  CHECK(defaults.get_choice("score") == "accumulated");
  CHECK_FALSE(defaults.get_bool("budget_excludes_sinks"));
  const ParamValues set =
      resolve_params(h2o.params, {"sinks=2", "heavy_frac=0.25", "budget_excludes_sinks=on"}, "p");
  CHECK(set.get_int("sinks") == 2);
  CHECK(set.get_float("heavy_frac") == 0.25);
  CHECK(set.get_bool("budget_excludes_sinks"));

  auto fails = [&](std::vector<std::string> args, std::vector<std::string> parts) {
    INFO(args.front());
    require_error_mentions([&] { resolve_params(h2o.params, args, "policy h2o"); }, parts);
  };
  fails({"nosuch=1"}, {"policy h2o", "nosuch", "sinks"});
  fails({"sinks"}, {"key=value"});
  fails({"sinks=two"}, {"sinks", "integer"});
  fails({"sinks=-1"}, {"sinks", ">= 0"});
  fails({"heavy_frac=1.5"}, {"heavy_frac", "[0, 1]"});
  fails({"score=max"}, {"score", "accumulated, current_logit"});
  fails({"budget_excludes_sinks=maybe"}, {"budget_excludes_sinks", "true or false"});
  fails({"sinks=1", "sinks=2"}, {"sinks", "twice"});
  require_error_mentions([] { policy_info("nosuch"); }, {"nosuch", "dense", "h2o"});
  require_error_mentions([] { validate_policy_config({"h2o", 1.0, {}}); }, {"sparsity", "[0, 1)"});
}

TEST_CASE("budget B(t) and its priority truncation", "[policy]") {
  CommonKnobs knobs;
  knobs.sparsity = 0.5;
  CHECK(knobs.budget(0) == 1);
  CHECK(knobs.budget(9) == 5);   // ceil(0.5 * 10)
  CHECK(knobs.budget(10) == 6);  // ceil(0.5 * 11)
  knobs.sparsity = 0.3;
  CHECK(knobs.budget(9) == 7);  // 0.7 * 10 is 7.000000000000001 in doubles: still 7
  knobs.min_keep = 9;
  CHECK(knobs.budget(9) == 9);
  CHECK(knobs.budget(3) == 4);  // never more than the candidates
  knobs = CommonKnobs{};
  knobs.budget_tokens = 3;
  CHECK(knobs.budget(1) == 2);
  CHECK(knobs.budget(20) == 3);
  knobs.budget_excludes_sinks = true;  // 4 sinks on top
  CHECK(knobs.budget(20) == 7);

  // Room for everything: sinks [0, 4), the window's 3 tokens [18, 21).
  ForcedColumns f = forced_columns(20, 10, 4, 3);
  CHECK(f.sink_end == 4);
  CHECK(f.recent_begin == 18);
  CHECK(f.count(20) == 7);
  // Budget smaller than sinks + window: the current token, then sinks, then the most recent.
  f = forced_columns(20, 5, 4, 3);
  CHECK(f.sink_end == 4);
  CHECK(f.recent_begin == 20);
  f = forced_columns(20, 3, 4, 3);
  CHECK(f.sink_end == 2);
  CHECK(f.recent_begin == 20);
  f = forced_columns(20, 1, 4, 3);
  CHECK(f.count(20) == 1);
  CHECK(f.recent_begin == 20);
  // Early steps: fewer candidates than sinks.
  f = forced_columns(2, 3, 4, 0);
  CHECK(f.sink_end == 2);
  CHECK(f.recent_begin == 2);
}

TEST_CASE("dense and dense_layers: every candidate visible", "[policy]") {
  Harness h;
  h.set_logits({{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 4}});
  auto dense = h.make("dense", 0.0);
  for (const auto& set : h.run(*dense, 3)) CHECK(set == range(0, 4));
  auto streaming = h.make("streaming", 0.5, {"sinks=1"});
  for (const auto& set : h.run(*streaming, 3, 0)) CHECK(set == range(0, 4));  // layer 0 dense
}

TEST_CASE("streaming: sinks plus the most recent B - sinks, the same for every head", "[policy]") {
  Harness h;
  std::vector<float> row(10, 0.0f);
  h.set_logits({row, row, row, row});
  auto policy = h.make("streaming", 0.5, {"sinks=2"});
  // t = 9: B = 5 -> {0, 1} + {7, 8, 9}
  for (const auto& set : h.run(*policy, 9)) CHECK(set == std::set<int64_t>{0, 1, 7, 8, 9});
  // Budget below the sinks: B = 2 at t = 3 with 4 sinks -> the current token, then sink 0.
  auto tight = h.make("streaming", 0.5, {"sinks=4"});
  for (const auto& set : h.run(*tight, 3)) CHECK(set == std::set<int64_t>{0, 3});
}

TEST_CASE("oracle: top-B by this step's probability, ties to the recent, per head or group",
          "[policy]") {
  Harness h;
  // t = 7, B = ceil(0.5 * 8) = 4, no sinks: the current token + the 3 best of the rest.
  h.set_logits({{5, 1, 4, 1, 3, 1, 1, 0},
                {0, 0, 0, 0, 0, 0, 0, 0},  // all tied: the most recent win
                {1, 9, 1, 8, 1, 1, 7, 0},
                {9, 1, 1, 1, 1, 1, 1, 9}});
  auto policy = h.make("oracle", 0.5, {"sinks=0"});
  auto sets = h.run(*policy, 7);
  CHECK(sets[0] == std::set<int64_t>{0, 2, 4, 7});
  CHECK(sets[1] == std::set<int64_t>{4, 5, 6, 7});
  CHECK(sets[2] == std::set<int64_t>{1, 3, 6, 7});
  CHECK(sets[3] == std::set<int64_t>{0, 5, 6, 7});  // 0 is best; then ties 1..6 -> 6, 5

  // kv_head: heads 0,1 share KV head 0; their probabilities are summed. Head 1 is uniform, so
  // the group follows head 0; heads 2,3 pool to {0, 1, 3} (9 and 9 and 8 dominate).
  auto grouped = h.make("oracle", 0.5, {"sinks=0", "granularity=kv_head"});
  sets = h.run(*grouped, 7);
  CHECK(sets[0] == std::set<int64_t>{0, 2, 4, 7});
  CHECK(sets[1] == sets[0]);
  CHECK(sets[2] == std::set<int64_t>{0, 1, 3, 7});
  CHECK(sets[3] == sets[2]);
}

TEST_CASE("random: seeded, B tokens, sinks kept", "[policy]") {
  Harness h;
  std::vector<float> row(12, 0.0f);
  h.set_logits({row, row, row, row});
  auto a = h.make("random", 0.5, {"sinks=2", "seed=7"});
  auto b = h.make("random", 0.5, {"sinks=2", "seed=7"});
  auto c = h.make("random", 0.5, {"sinks=2", "seed=8"});
  const auto sa = h.run(*a, 11), sb = h.run(*b, 11), sc = h.run(*c, 11);
  CHECK(sa == sb);
  CHECK(sa != sc);
  for (const auto& set : sa) {
    CHECK(set.size() == 6);  // ceil(0.5 * 12)
    CHECK(set.count(0) == 1);
    CHECK(set.count(1) == 1);
    CHECK(set.count(11) == 1);
  }
}

TEST_CASE("h2o: recent part + heavy hitters by accumulated attention, eviction is permanent",
          "[policy]") {
  Harness h;
  // budget_tokens = 3, heavy_frac 1/3 -> 1 heavy + 2 recent (the current token included), no
  // sinks. Steps 0-2 keep everything (B >= candidates). Token 0 attracts most attention.
  auto policy =
      h.make("h2o", 0.0, {"sinks=0", "budget_tokens=3", "heavy_frac=0.34", "dense_layers=0"});
  auto logits_for = [](int64_t t, float favourite_logit, int64_t favourite) {
    std::vector<float> row(size_t(t + 1), 0.0f);
    row[size_t(favourite)] = favourite_logit;
    return std::vector<std::vector<float>>(4, row);
  };
  for (int64_t t = 0; t <= 2; ++t) {
    h.set_logits(logits_for(t, 4.0f, 0));
    for (const auto& set : h.run(*policy, t, 0)) CHECK(set == range(0, t + 1));
  }
  // t = 3: recent {2, 3}; heavy among {0, 1}: token 0 (it received the most) -> 1 is evicted.
  h.set_logits(logits_for(3, 4.0f, 0));
  for (const auto& set : h.run(*policy, 3, 0)) CHECK(set == std::set<int64_t>{0, 2, 3});
  // t = 4: token 1 now gets a huge logit, but it was evicted: it never returns. Recent {3, 4};
  // heavy among {0, 2}: 0.
  h.set_logits(logits_for(4, 50.0f, 1));
  for (const auto& set : h.run(*policy, 4, 0)) CHECK(set == std::set<int64_t>{0, 3, 4});
  // t = 5: 2 was evicted at t = 4 as well; recent {4, 5}; heavy among {0, 3}: 0 (accumulated).
  h.set_logits(logits_for(5, 0.0f, 0));
  for (const auto& set : h.run(*policy, 5, 0)) CHECK(set == std::set<int64_t>{0, 4, 5});

  // score=current_logit ranks by this step's logit among the survivors.
  auto current = h.make(
      "h2o", 0.0,
      {"sinks=0", "budget_tokens=3", "heavy_frac=0.34", "dense_layers=0", "score=current_logit"});
  for (int64_t t = 0; t <= 2; ++t) {
    h.set_logits(logits_for(t, 4.0f, 0));
    h.run(*current, t, 0);
  }
  h.set_logits(logits_for(3, 9.0f, 1));  // token 1 is this step's favourite
  for (const auto& set : h.run(*current, 3, 0)) CHECK(set == std::set<int64_t>{1, 2, 3});
}

TEST_CASE("a policy at sparsity 0 gives the dense logits in a real decode", "[policy]") {
  test::TinyLlamaSpec spec;
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("policy-model"), spec);
  auto backend = make_cpu_backend(2);
  const auto resident = upload_model(Model::load(dir), *backend);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 33, 7, 7, 12, 40, 3, 8, 61};
  ScoreOptions dense;
  const ScoreResult reference = score_tokens(resident, tokens, dense);
  for (const std::string id :
       {"oracle",         "random",        "streaming",     "h2o",       "snapkv",
        "keydiff",        "lazyllm",       "tova",          "pyramidkv", "adakv",
        "snapkv+adakv",   "h2o+pyramidkv", "tova+adakv",    "sparq",     "loki",
        "doublesparsity", "duoattention",  "seerattention", "rocketkv",  "twilight"}) {
    INFO(id);
    ScoreOptions options;
    options.policy = {id, 0.0, {}};
    const ScoreResult result = score_tokens(resident, tokens, options);
    REQUIRE(result.nll.size() == reference.nll.size());
    CHECK(result.argmax == reference.argmax);
    for (size_t i = 0; i < result.nll.size(); ++i) {
      // Same visible set, same arithmetic order (attention_visible over every column equals
      // the plain attention op): equal to the last bits.
      CHECK(result.nll[i] == reference.nll[i]);
    }
  }
  // And a real sparsity changes them (the policy is actually applied).
  ScoreOptions sparse;
  sparse.policy = {"streaming", 0.5, {"sinks=1"}};
  const ScoreResult hidden = score_tokens(resident, tokens, sparse);
  CHECK(hidden.nll != reference.nll);
}

TEST_CASE("effective sparsity: measured from the visible sets, per layer and head", "[policy]") {
  test::TinyLlamaSpec spec;  // 2 layers, 4 heads
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("sparsity-model"), spec);
  auto backend = make_cpu_backend(1);
  const auto resident = upload_model(Model::load(dir), *backend);
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 33, 7, 7, 12, 40, 3};
  ScoreOptions options;
  options.policy = {"streaming", 0.5, {"sinks=1"}};  // layer 0 dense (dense_layers = 1)
  const ScoreResult result = score_tokens(resident, tokens, options);
  // Layer 1 sees B(t) = ceil((t + 1) / 2) of t + 1 candidates at each of the 10 steps.
  double expected_layer1 = 0.0;
  for (int64_t t = 0; t < 10; ++t) {
    const double candidates = double(t + 1);
    expected_layer1 += 1.0 - std::ceil(0.5 * candidates) / candidates;
  }
  expected_layer1 /= 10.0;
  const SparsityStats& stats = result.sparsity;
  CHECK(stats.steps == 10);
  REQUIRE(stats.per_layer().size() == 2);
  CHECK(stats.per_layer()[0] == 0.0);
  CHECK(stats.per_layer()[1] == Approx(expected_layer1).epsilon(1e-12));
  CHECK(stats.overall() == Approx(expected_layer1 / 2.0).epsilon(1e-12));
  for (const double head : stats.per_head()) CHECK(head == Approx(expected_layer1 / 2.0));

  // Merging two runs weighs them by their steps.
  SparsityStats merged;
  merged.merge(stats);
  merged.merge(stats);
  CHECK(merged.steps == 20);
  CHECK(merged.overall() == Approx(stats.overall()));
  // Dense runs count no steps.
  CHECK(score_tokens(resident, tokens).sparsity.steps == 0);
}

TEST_CASE("eviction policies keep the sinks that an early small budget hid for a step",
          "[policy]") {
  // s = 0.5: B(1) = 1 hides sink 0 at step 1 (the current token comes first). It must not count
  // as evicted: once the budget grows, the sinks are back. (They were dropped for good before.)
  for (const std::string id :
       {"h2o", "snapkv", "keydiff", "tova", "pyramidkv", "adakv", "h2o+pyramidkv", "tova+adakv"}) {
    INFO(id);
    Harness h;
    auto policy = h.make(id, 0.5, {"sinks=2", "dense_layers=0"});
    std::vector<std::set<int64_t>> sets;
    for (int64_t t = 0; t <= 7; ++t) {
      h.set_logits(std::vector<std::vector<float>>(4, std::vector<float>(size_t(t + 1), 0.0f)));
      sets = h.run(*policy, t, 0);
      if (t == 1) CHECK(sets[0] == std::set<int64_t>{1});
    }
    size_t total = 0;
    for (const auto& set : sets) {
      CHECK(set.count(0) == 1);
      CHECK(set.count(1) == 1);
      // B(7) = 4; Ada-KV shares 4 per head out over the heads, PyramidKV gives the first of two
      // layers more.
      if (id.find("adakv") == std::string::npos && id.find("pyramid") == std::string::npos)
        CHECK(set.size() == 4);
      total += set.size();
    }
    if (id.find("adakv") != std::string::npos) CHECK(total == 16);
  }
}
