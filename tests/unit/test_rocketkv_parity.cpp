// rocketkv against the authors' rule (tests/fixtures/rocketkv, made by
// tools/make_rocketkv_fixture.py, which re-implements the lines of NVlabs/RocketKV's rocket.py it
// cites): the budget split of get_params_for_token_budget, stage 2's page estimate on random
// queries and keys, and the kept sets at the same budget.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/policy/policy_factories.h"
#include "tests/support/json_fixture.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"

using namespace kvlens;
using kvlens::test::Harness;

namespace {

nlohmann::json fixture() {
  return test::read_json_fixture("tests/fixtures/rocketkv/reference.json");
}

std::set<int64_t> as_set(const nlohmann::json& ids) {
  std::set<int64_t> out;
  for (const auto& id : ids) out.insert(id.get<int64_t>());
  return out;
}

}  // namespace

TEST_CASE("rocketkv's split matches get_params_for_token_budget", "[policy][parity]") {
  // Held in a variable: a range-for over a member of the temporary fixture() would read it after
  // its end (ASan's heap-use-after-free in the sanitizer build).
  const nlohmann::json f = fixture();
  for (const auto& split : f["splits"]) {
    const double sparsity = split["sparsity"];
    const int64_t head_dim = split["head_dim"];
    INFO("sparsity " << sparsity << " head_dim " << head_dim);
    const RocketkvSplit ours = rocketkv_split(sparsity, head_dim);
    CHECK(1.0 - ours.stage1_sparsity == Approx(double(split["capacity_share"])).margin(1e-5));
    CHECK(ours.page_size == int64_t(split["chunk_size"]));
    CHECK(ours.channels == int64_t(split["r"]));
  }
}

TEST_CASE("rocketkv's stage 2 matches rocket_attn's estimate and top-k", "[policy][parity]") {
  const nlohmann::json f = fixture();
  Harness h;
  const int64_t t = test::load_qk_example(h, f);
  const double sparsity = f["sparsity"];
  const std::vector<std::string> args = {"sinks=0", "dense_layers=0",
                                         "page_size=" + std::to_string(int(f["chunk_size"])),
                                         "channels=" + std::to_string(int(f["r"]))};
  // At this sparsity stage 1 keeps all 12 tokens at step 11: every token is stage 2's to rank.
  auto policy = h.make("rocketkv", sparsity, args);
  const auto sets = h.run(*policy, t, 0);
  const std::vector<float> want = test::json_floats(f["scores"]);
  for (int64_t head = 0; head < 4; ++head) {
    const std::vector<float> row = h.score_row(head, t);
    for (int64_t j = 0; j <= t; ++j) {
      INFO("head " << head << " token " << j);
      CHECK(row[size_t(j)] == Approx(want[size_t(head * (t + 1) + j)]).margin(1e-5));
    }
    INFO("head " << head);
    CHECK(int64_t(sets[size_t(head)].size()) == int64_t(f["keep_others"]) + 1);
    CHECK(sets[size_t(head)] == as_set(f["kept_per_head"][size_t(head)]));
  }
  // One set per KV group: the authors sum the heads' softmaxes, kvlens the estimates (the docs
  // page's differences); on this example both pick the same tokens.
  std::vector<std::string> grouped = args;
  grouped.push_back("granularity=kv_head");
  auto by_group = h.make("rocketkv", sparsity, grouped);
  const auto group_sets = h.run(*by_group, t, 0);
  for (int64_t head = 0; head < 4; ++head) {
    INFO("head " << head);
    CHECK(group_sets[size_t(head)] == as_set(f["kept_per_kv_head"][size_t(head / 2)]));
  }
}
