// snapkv, keydiff and lazyllm (POLICIES.md) on small hand-made logits and keys with hand-computed
// visible sets over several steps: eviction permanence, ties to the recent, GQA granularity,
// budgets below sinks + window, snapkv's window protection and pooling, keydiff's anchor moving
// after an eviction, lazyllm's keep schedule and pruned tokens returning.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "engine/common/error.h"
#include "engine/policy/policy_factories.h"
#include "engine/policy/registry.h"
#include "tests/support/policy_harness.h"

using namespace kvlens;
using kvlens::test::Harness;
using kvlens::test::kStride;

namespace {

// t + 1 logits of 0 except `favourite`.
std::vector<float> favouring(int64_t t, int64_t favourite, float logit) {
  std::vector<float> row(size_t(t + 1), 0.0f);
  row[size_t(favourite)] = logit;
  return row;
}

std::vector<float> uniform(int64_t t) {
  return std::vector<float>(size_t(t + 1), 0.0f);
}

void check_all_heads(const std::vector<std::set<int64_t>>& sets, const std::set<int64_t>& want) {
  for (size_t h = 0; h < sets.size(); ++h) {
    INFO("head " << h);
    CHECK(sets[h] == want);
  }
}

const std::vector<float> e1 = {1, 0, 0, 0}, e2 = {0, 1, 0, 0}, e3 = {0, 0, 1, 0};
const std::vector<float> minus_e1 = {-1, 0, 0, 0};

std::set<int64_t> range(int64_t begin, int64_t end) {
  std::set<int64_t> out;
  for (int64_t j = begin; j < end; ++j) out.insert(j);
  return out;
}

}  // namespace

TEST_CASE("snapkv: the observation window is protected and evicted tokens never return",
          "[policy]") {
  Harness h;
  // budget_tokens = 4, w = 2, no pooling, no sinks. Steps 0-3 keep everything; token 0 takes
  // almost all the attention (logit 10, the others 0).
  std::vector<std::string> args = {"sinks=0", "dense_layers=0", "budget_tokens=4", "obs_window=2",
                                   "pool_kernel=1"};
  auto policy = h.make("snapkv", 0.0, args);
  args.push_back("protect_window=false");
  auto unprotected = h.make("snapkv", 0.0, args);
  for (int64_t t = 0; t <= 3; ++t) {
    h.set_logits(favouring(t, 0, 10.0f));
    check_all_heads(h.run(*policy, t, 0), range(0, t + 1));
    check_all_heads(h.run(*unprotected, t, 0), range(0, t + 1));
  }
  // t = 4: the window {2, 3} and the current token are forced; one more among {0, 1} by the
  // attention of steps 2 and 3: token 0 (about 2) beats token 1 (about 2e^-10), 1 is evicted.
  h.set_logits(favouring(4, 0, 10.0f));
  check_all_heads(h.run(*policy, 4, 0), {0, 2, 3, 4});
  // Unprotected: only the current token is forced; 3 more among {0, 1, 2, 3}. Tokens 1 and 2
  // received the same attention at steps 2 and 3 (a tie: the recent 2 first), 3 only at step 3:
  // the window token 3 is dropped.
  check_all_heads(h.run(*unprotected, 4, 0), {0, 1, 2, 4});
  // t = 5: token 1 gets a huge logit, but it is gone for good. Forced {3, 4, 5}; one among
  // {0, 2}: token 0 (attention ~1 at steps 3 and 4) over 2 (~e^-10): 2 is evicted.
  h.set_logits(favouring(5, 1, 50.0f));
  check_all_heads(h.run(*policy, 5, 0), {0, 3, 4, 5});
  // t = 6, uniform logits: forced {4, 5, 6}; one among {0, 3}: 0 (step 4: ~1; step 5: 1/4) over
  // 3 (step 4: ~e^-10; step 5: 1/4). Tokens 1 and 2 stay out.
  h.set_logits(uniform(6));
  check_all_heads(h.run(*policy, 6, 0), {0, 4, 5, 6});
}

TEST_CASE("snapkv: ties go to the recent, budget below sinks + window", "[policy]") {
  Harness h;
  // w = 1: the scores are step t-1's attention. Uniform logits: at t = 3 tokens 0, 1, 2 all got
  // 1/3 at step 2, so the most recent win.
  auto policy = h.make("snapkv", 0.0,
                       {"sinks=0", "dense_layers=0", "budget_tokens=3", "obs_window=1",
                        "pool_kernel=1", "protect_window=false"});
  for (int64_t t = 0; t <= 3; ++t) {
    h.set_logits(uniform(t));
    const auto sets = h.run(*policy, t, 0);
    if (t == 3) check_all_heads(sets, {1, 2, 3});
  }
  // 2 sinks, w = 4 protected, budget 3: the forced part alone exceeds B, so the current token,
  // then the sinks: {0, 1, t} at every step from 3 on.
  auto tight =
      h.make("snapkv", 0.0, {"sinks=2", "dense_layers=0", "budget_tokens=3", "obs_window=4"});
  for (int64_t t = 0; t <= 8; ++t) {
    h.set_logits(uniform(t));
    const auto sets = h.run(*tight, t, 0);
    check_all_heads(sets, t < 3 ? range(0, t + 1) : std::set<int64_t>{0, 1, t});
  }
}

TEST_CASE("snapkv: pooling along the keys changes which token goes", "[policy]") {
  // w = 1, budget 5, nothing forced but the current token: at t = 5 one of 0..4 is dropped by
  // step 4's attention, p proportional to exp of logits {0, 5, -1, 1, 2}: about
  // {1, 148.4, 0.37, 2.72, 7.39} / Z.
  auto run = [](const std::string& pool, const std::string& kernel) {
    Harness h;
    auto policy = h.make("snapkv", 0.0,
                         {"sinks=0", "dense_layers=0", "budget_tokens=5", "obs_window=1",
                          "protect_window=false", "pool=" + pool, "pool_kernel=" + kernel});
    for (int64_t t = 0; t <= 3; ++t) {
      h.set_logits(uniform(t));
      h.run(*policy, t, 0);
    }
    h.set_logits(std::vector<float>{0, 5, -1, 1, 2});
    h.run(*policy, 4, 0);
    h.set_logits(uniform(5));
    return h.run(*policy, 5, 0);
  };
  // No pooling: the least attended token 2 goes.
  check_all_heads(run("max", "1"), {0, 1, 3, 4, 5});
  // Max over 3 neighbours: 2 borrows its neighbour 1's 148; 3 and 4 both pool to 7.39 (column 5
  // is padding: step 4 had no column 5): the tie drops the older, 3.
  check_all_heads(run("max", "3"), {0, 1, 2, 4, 5});
  // Average over 3 (padding counts 0): 3 -> (0.37 + 2.72 + 7.39) / 3 = 3.49,
  // 4 -> (2.72 + 7.39 + 0) / 3 = 3.37: 4 goes.
  check_all_heads(run("avg", "3"), {0, 1, 2, 3, 5});
  // An even kernel is refused.
  CHECK_THROWS_AS(Harness{}.make("snapkv", 0.5, {"pool_kernel=4"}), Error);
}

TEST_CASE("snapkv: kv_head granularity sums the group's scores", "[policy]") {
  // w = 1, budget 5: one of 0..4 goes at t = 5, by step 4's attention. Head 0 dislikes token 2
  // (logit -3), head 1 likes token 2 (3) and dislikes 0 (-3); heads 2 and 3 are uniform.
  auto run = [](const std::string& granularity) {
    Harness h;
    auto policy = h.make("snapkv", 0.0,
                         {"sinks=0", "dense_layers=0", "budget_tokens=5", "obs_window=1",
                          "protect_window=false", "pool_kernel=1", "granularity=" + granularity});
    for (int64_t t = 0; t <= 3; ++t) {
      h.set_logits(uniform(t));
      h.run(*policy, t, 0);
    }
    h.set_logits({{0, 0, -3, 0, 0}, {-3, 0, 3, 0, 0}, {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0}});
    h.run(*policy, 4, 0);
    h.set_logits(uniform(5));
    return h.run(*policy, 5, 0);
  };
  // Per query head: head 0 drops 2, head 1 drops 0, heads 2 and 3 tie everywhere: the oldest, 0.
  const auto per_head = run("query_head");
  CHECK(per_head[0] == std::set<int64_t>{0, 1, 3, 4, 5});
  CHECK(per_head[1] == std::set<int64_t>{1, 2, 3, 4, 5});
  CHECK(per_head[2] == std::set<int64_t>{1, 2, 3, 4, 5});
  CHECK(per_head[3] == std::set<int64_t>{1, 2, 3, 4, 5});
  // Per group: heads 0 + 1 give token 0 0.247 + 0.002 and token 2 0.012 + 0.868, the others
  // 0.247 + 0.043: token 0 goes for both heads of the group.
  check_all_heads(run("kv_head"), {1, 2, 3, 4, 5});
}

TEST_CASE("keydiff: evicts the keys closest to the anchor, which moves after an eviction",
          "[policy]") {
  Harness h;
  // KV head 0: k0 = e1, k1 = e1, k2 = e2, k3 = e3, k4 = e2, k5 = -e1.
  // KV head 1: k0 = e1, k1 = e2, k2 = e2, k3 = e3 (only step 3 is checked for heads 2 and 3).
  h.set_keys({{e1, e1, e2, e3, e2, minus_e1}, {e1, e2, e2, e3, e2, minus_e1}});
  for (const std::string granularity : {"query_head", "kv_head"}) {
    INFO(granularity);
    auto policy =
        h.make("keydiff", 0.0,
               {"sinks=0", "dense_layers=0", "budget_tokens=3", "granularity=" + granularity});
    for (int64_t t = 0; t <= 2; ++t) check_all_heads(h.run(*policy, t), range(0, t + 1));
    // t = 3, KV head 0: anchor (2, 1, 1, 0) / 4; cos 0.816 for tokens 0 and 1, 0.408 for 2. Keep
    // 2 of {0, 1, 2} by -cos: 2, then the tie 0/1 goes to the recent 1: token 0 is evicted.
    // KV head 1: anchor (1, 2, 1, 0) / 4; cos 0.408 for 0, 0.816 for 1 and 2: keep 0 and 2.
    auto sets = h.run(*policy, 3);
    CHECK(sets[0] == std::set<int64_t>{1, 2, 3});
    CHECK(sets[1] == sets[0]);  // a group's query heads get the same scores, hence the same set
    CHECK(sets[2] == std::set<int64_t>{0, 2, 3});
    CHECK(sets[3] == sets[2]);
    // t = 4: the anchor is over the cached keys only, {1, 2, 3, 4} = e1, e2, e3, e2 ->
    // (1, 2, 1, 0) / 4: cos 0.408 for 1 and 3, 0.816 for 2: token 2 goes. (With the evicted
    // k0 still in the anchor, (2, 2, 1, 0) / 5, the tie 1/2 would have dropped 1 instead.)
    sets = h.run(*policy, 4);
    CHECK(sets[0] == std::set<int64_t>{1, 3, 4});
    CHECK(sets[1] == sets[0]);
    // t = 5: members {1, 3, 4, 5} = e1, e3, e2, -e1 -> anchor (0, 1, 1, 0) / 4: cos 0 for token 1,
    // 0.707 for 3 and 4 (a tie: 4 stays). Token 0 (also e1, score 0, as good as 1) was evicted
    // and never returns, else the set would be {0, 1, 5}.
    sets = h.run(*policy, 5);
    CHECK(sets[0] == std::set<int64_t>{1, 4, 5});
    CHECK(sets[1] == sets[0]);
  }
}

TEST_CASE("keydiff: scores are -cos against the anchor, budget below sinks + window", "[policy]") {
  Harness h;
  h.set_keys({{e1, e2, e3, e2}, {e1, e1, e1, e1}});
  auto policy = h.make("keydiff", 0.0, {"sinks=0", "dense_layers=0"});
  h.run(*policy, 3);
  std::vector<float> scores(size_t(4 * kStride));
  h.backend->to_host(h.scores, scores.data(), scores.size() * sizeof(float));
  // KV head 0: anchor (1, 2, 1, 0) / 4, |.| = sqrt(6) / 4.
  const float low = float(-1.0 / std::sqrt(6.0)), high = float(-2.0 / std::sqrt(6.0));
  for (int64_t head : {0, 1}) {
    CHECK(scores[size_t(head * kStride + 0)] == Approx(low).epsilon(1e-6));
    CHECK(scores[size_t(head * kStride + 1)] == Approx(high).epsilon(1e-6));
    CHECK(scores[size_t(head * kStride + 2)] == Approx(low).epsilon(1e-6));
    CHECK(scores[size_t(head * kStride + 3)] == Approx(high).epsilon(1e-6));
  }
  // KV head 1: every key is the anchor: -1.
  for (int64_t j = 0; j < 4; ++j) CHECK(scores[size_t(2 * kStride + j)] == Approx(-1.0f));

  // 4 sinks, a window of 3, budget 3: the current token, then sinks 0 and 1.
  Harness tight;
  auto squeezed =
      tight.make("keydiff", 0.0, {"sinks=4", "window=3", "dense_layers=0", "budget_tokens=3"});
  for (int64_t t = 0; t <= 8; ++t)
    check_all_heads(tight.run(*squeezed, t), t < 3 ? range(0, t + 1) : std::set<int64_t>{0, 1, t});
}

TEST_CASE("lazyllm: the keep schedule by quarter, scaled to the mean 1 - s", "[policy]") {
  auto check = [](std::vector<double> got, std::vector<double> want, double mean) {
    REQUIRE(got.size() == want.size());
    double sum = 0.0;
    for (size_t l = 0; l < got.size(); ++l) {
      INFO("layer " << l);
      CHECK(got[l] == Approx(want[l]).margin(1e-9));
      sum += got[l];
    }
    CHECK(sum / double(got.size()) == Approx(mean).margin(1e-9));
  };
  // s = 0: everything kept (so the logits are dense).
  check(lazyllm_keep_schedule(8, 1, 0.0), std::vector<double>(8, 1.0), 1.0);
  // 8 layers: base 1, 1, 0.7, 0.7, 0.4, 0.4, 0.1, 0.1 with layer 0 dense. s = 0.5: the seven
  // others sum to c * 3.4 = 8 * 0.5 - 1, c = 3 / 3.4.
  const double c = 3.0 / 3.4;
  check(lazyllm_keep_schedule(8, 1, 0.5),
        {1, c, 0.7 * c, 0.7 * c, 0.4 * c, 0.4 * c, 0.1 * c, 0.1 * c}, 0.5);
  // s = 0.2: 6.4 to spread; c * 1 and c * 0.7 clamp at 1, then 4 + c * (0.4 + 0.4 + 0.1 + 0.1) =
  // 6.4 gives c = 2.4.
  check(lazyllm_keep_schedule(8, 1, 0.2), {1, 1, 1, 1, 0.96, 0.96, 0.24, 0.24}, 0.8);
  // Three dense layers at s = 0.5: 1 = c * (0.7 + 0.4 + 0.4 + 0.1 + 0.1).
  const double c3 = 1.0 / 1.7;
  check(lazyllm_keep_schedule(8, 3, 0.5),
        {1, 1, 1, 0.7 * c3, 0.4 * c3, 0.4 * c3, 0.1 * c3, 0.1 * c3}, 0.5);
  // Unreachable: 1 - s = 0.05 is below the dense layer's share 1/8: the others keep 0.
  check(lazyllm_keep_schedule(8, 1, 0.95), {1, 0, 0, 0, 0, 0, 0, 0}, 0.125);
  // 2 layers (the harness): layer 1 is in the third quarter (base 0.4); s = 0.25 -> keep 0.5.
  check(lazyllm_keep_schedule(2, 1, 0.25), {1, 0.5}, 0.75);
}

TEST_CASE("lazyllm: ranks by the previous layer's head-averaged attention, pruned tokens return",
          "[policy]") {
  Harness h;
  // keep(1) = 0.5 (see the schedule test): B_1(t) = ceil(0.5 (t + 1)); layer 0 is dense.
  auto policy = h.make("lazyllm", 0.25, {"sinks=0"});
  for (int64_t t = 0; t <= 4; ++t) {
    h.set_logits(uniform(t));
    h.run_step(*policy, t);
  }
  // t = 5, B_1 = 3. Layer 0's heads: head 0 favours 1 (logit 8), head 1 favours 3 (6), heads 2
  // and 3 favour 0 a little (1). Averaged: 1 -> 0.315, 3 -> 0.312, 0 -> 0.177, 2 and 4 -> 0.065:
  // every head of layer 1 sees {1, 3} and the current token.
  h.set_logits(
      {favouring(5, 1, 8.0f), favouring(5, 3, 6.0f), favouring(5, 0, 1.0f), favouring(5, 0, 1.0f)});
  CHECK(h.run(*policy, 5, 0) == std::vector<std::set<int64_t>>(4, range(0, 6)));  // dense
  check_all_heads(h.run(*policy, 5, 1), {1, 3, 5});
  // t = 6, B_1 = 4: now 2 and 4, pruned at step 5, get the attention (logits 5 and 4): they
  // return; the fourth place is a tie among 0, 1, 3, 5: the recent 5.
  std::vector<float> row = uniform(6);
  row[2] = 5.0f;
  row[4] = 4.0f;
  h.set_logits(row);
  check_all_heads(h.run_step(*policy, 6), {2, 4, 5, 6});
  // The scores it ranked by: the averaged row, the same for every head.
  std::vector<float> scores(size_t(4 * kStride));
  h.backend->to_host(h.scores, scores.data(), scores.size() * sizeof(float));
  for (int64_t head = 1; head < 4; ++head)
    for (int64_t j = 0; j <= 6; ++j) CHECK(scores[size_t(head * kStride + j)] == scores[size_t(j)]);
  CHECK(scores[2] > scores[4]);

  // s = 0: every layer dense.
  auto dense = h.make("lazyllm", 0.0, {"sinks=0"});
  for (int64_t t = 0; t <= 6; ++t) check_all_heads(h.run_step(*dense, t), range(0, t + 1));

  // Budget below sinks + window: 4 sinks, window 3, budget_tokens 3 at keep 1 (s = 0): the
  // current token, then sinks 0 and 1.
  auto tight = h.make("lazyllm", 0.0, {"sinks=4", "window=3", "budget_tokens=3"});
  for (int64_t t = 0; t <= 8; ++t) {
    h.set_logits(uniform(t));
    check_all_heads(h.run_step(*tight, t), t < 3 ? range(0, t + 1) : std::set<int64_t>{0, 1, t});
  }
}

TEST_CASE("snapkv: window sums span chunks of w steps and start at the first policy step",
          "[policy]") {
  // Windows of 10 (one chunk boundary in the 16 steps), 3, 4 and 1 (a boundary every few steps),
  // and 4 from step 5 on (the prefill + decode mode: a partial first chunk, steps 0-4 never
  // observed), no pooling, nothing dropped: the scores at step t are the attention probabilities
  // of the observed steps among t - w .. t - 1, summed. Tokens 1 and 2 get the same logit at every
  // step, so once both have been there for the whole window their sums must tie exactly.
  const std::vector<std::pair<int64_t, int64_t>> cases = {{10, 0}, {3, 0}, {4, 0}, {1, 0}, {4, 5}};
  for (const auto& [window, first_step] : cases) {
    INFO("obs_window " << window << ", first policy step " << first_step);
    Harness h;
    auto policy = h.make("snapkv", 0.0,
                         {"sinks=0", "dense_layers=0", "budget_tokens=16", "pool_kernel=1",
                          "obs_window=" + std::to_string(window)});
    auto logit = [](int64_t s, int64_t j) {
      return float(3.0 * std::sin(1.3 * double(s) + 0.7 * double(j == 2 ? 1 : j)));
    };
    std::vector<std::vector<double>> probs;  // per step, softmax over columns 0..s (in double)
    for (int64_t t = 0; t < kStride; ++t) {
      std::vector<float> row(size_t(t + 1));
      for (int64_t j = 0; j <= t; ++j) row[size_t(j)] = logit(t, j);
      double total = 0.0;
      std::vector<double> p(size_t(t + 1));
      for (int64_t j = 0; j <= t; ++j) total += std::exp(double(row[size_t(j)]));
      for (int64_t j = 0; j <= t; ++j) p[size_t(j)] = std::exp(double(row[size_t(j)])) / total;
      probs.push_back(p);
      if (t < first_step) continue;
      h.set_logits(row);
      h.run(*policy, t, 0);
      const std::vector<float> scores = h.score_row(0, t);
      for (int64_t j = 0; j <= t; ++j) {
        double want = 0.0;
        for (int64_t s = std::max(first_step, t - window); s < t; ++s)
          if (j <= s) want += probs[size_t(s)][size_t(j)];
        INFO("step " << t << " token " << j);
        // At most w F32 additions of probabilities <= 1: below w * 2^-24 ~ 6e-7.
        CHECK(scores[size_t(j)] == Approx(want).margin(2e-6));
      }
      // Once step 1 (which token 2 did not exist for) has left the window.
      if (t - window >= std::max<int64_t>(2, first_step)) CHECK(scores[1] == scores[2]);
    }
  }
}

TEST_CASE("policies ask for probabilities only at the layers whose observation they use",
          "[policy]") {
  // Four layers; a dense layer is never ranked, so probabilities there are wasted work (and in
  // a lockstep step they keep the run from sharing the dense attention of the others).
  Harness h;
  h.shape.layers = 4;
  auto wants = [&](const std::string& id, std::vector<std::string> args) {
    const auto policy = make_policy({id, 0.5, std::move(args)}, h.shape, *h.backend);
    std::vector<bool> layers;
    for (int64_t layer = 0; layer < 4; ++layer)
      layers.push_back(policy->wants_probs(h.step(9, layer)));
    return layers;
  };
  CHECK(wants("h2o", {"dense_layers=1"}) == std::vector<bool>{false, true, true, true});
  CHECK(wants("h2o", {"dense_layers=2", "score=current_logit"}) ==
        std::vector<bool>{false, false, false, false});
  CHECK(wants("snapkv", {"dense_layers=2"}) == std::vector<bool>{false, false, true, true});
  // lazyllm ranks layer l by layer l - 1: the last layer's probabilities rank nothing.
  CHECK(wants("lazyllm", {"dense_layers=1"}) == std::vector<bool>{true, true, true, false});
  CHECK(wants("lazyllm", {"dense_layers=3"}) == std::vector<bool>{false, false, true, false});
  CHECK(wants("oracle", {}) == std::vector<bool>{false, false, false, false});
}
