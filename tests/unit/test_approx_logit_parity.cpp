// sparq, loki and doublesparsity against the authors' scoring (tests/fixtures/approx_logits,
// made by tools/make_approx_logit_fixtures.py, which re-implements the lines of their code it
// cites): the same approximate scores (doublesparsity's rescaled from the authors' 1/sqrt(r) to
// the true logits' 1/sqrt(D)) and the same kept sets at the same budget.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/policy/channel_calibration.h"
#include "tests/support/json_fixture.h"
#include "tests/support/policy_harness.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using kvlens::test::Harness;

namespace {

nlohmann::json fixture() {
  return test::read_json_fixture("tests/fixtures/approx_logits/reference.json");
}

void check_scores(Harness& h, const nlohmann::json& expected, int64_t t, double factor = 1.0) {
  const std::vector<float> want = test::json_floats(expected);
  for (int64_t head = 0; head < 4; ++head) {
    const std::vector<float> row = h.score_row(head, t);
    for (int64_t j = 0; j <= t; ++j) {
      INFO("head " << head << " token " << j);
      CHECK(row[size_t(j)] == Approx(want[size_t(head * (t + 1) + j)] * factor).margin(1e-5));
    }
  }
}

std::set<int64_t> as_set(const nlohmann::json& ids) {
  std::set<int64_t> out;
  for (const auto& id : ids) out.insert(id.get<int64_t>());
  return out;
}

std::vector<std::string> budget_args(const nlohmann::json& f, const std::string& knob) {
  return {"sinks=0", "window=0", "budget_tokens=" + std::to_string(int(f["keep_others"]) + 1),
          knob};
}

}  // namespace

TEST_CASE("sparq matches the authors' SparseQ scores and group top-k", "[policy][parity]") {
  const nlohmann::json f = fixture();
  Harness h;
  const int64_t t = test::load_qk_example(h, f);
  std::vector<std::string> args =
      budget_args(f, "channels=" + std::to_string(int(f["sparq"]["channels"])));
  args.push_back("granularity=kv_head");  // the authors' one set per KV head
  auto policy = h.make("sparq", 0.0, args);
  const auto sets = h.run(*policy, t);
  check_scores(h, f["sparq"]["scores"], t);
  for (int64_t head = 0; head < 4; ++head) {
    INFO("head " << head);
    CHECK(sets[size_t(head)] == as_set(f["sparq"]["kept_per_kv_head"][size_t(head / 2)]));
  }
}

TEST_CASE("loki and doublesparsity match the authors' scores and per-head top-k",
          "[policy][parity]") {
  const nlohmann::json f = fixture();
  Harness h;
  const int64_t t = test::load_qk_example(h, f);
  h.shape.model_dir = test::make_temp_dir("approx-parity");
  // Layer 1 gets the fixture's calibration (layer 0 is dense: any values).
  const std::vector<float> basis = test::json_floats(f["loki"]["basis"]);
  std::vector<float> bases(basis.size() * 2, 0.0f);
  std::copy(basis.begin(), basis.end(), bases.begin() + std::ptrdiff_t(basis.size()));
  test::write_safetensors(h.shape.model_dir + "/" + kLokiCalibrationFile,
                          {test::make_tensor("basis", "F32", {2, 2, 4, 4}, bases)});
  std::vector<float> order;
  for (int i = 0; i < 16; ++i) order.push_back(float(i % 4));
  for (const float c : test::json_floats(f["doublesparsity"]["order"])) order.push_back(c);
  test::write_safetensors(h.shape.model_dir + "/" + kDoubleSparsityCalibrationFile,
                          {test::make_tensor("channels", "F32", {2, 4, 4}, order)});

  SECTION("loki") {
    auto policy =
        h.make("loki", 0.0, budget_args(f, "dims=" + std::to_string(int(f["loki"]["dims"]))));
    const auto sets = h.run(*policy, t);
    check_scores(h, f["loki"]["scores"], t);
    for (int64_t head = 0; head < 4; ++head)
      CHECK(sets[size_t(head)] == as_set(f["loki"]["kept"][size_t(head)]));
  }
  SECTION("doublesparsity") {
    const int channels = f["doublesparsity"]["channels"];
    auto policy =
        h.make("doublesparsity", 0.0, budget_args(f, "channels=" + std::to_string(channels)));
    const auto sets = h.run(*policy, t);
    // The authors divide by sqrt(r), kvlens by sqrt(D): the same order, another scale.
    check_scores(h, f["doublesparsity"]["scores_authors_scale"], t,
                 std::sqrt(double(channels)) / 2.0);
    for (int64_t head = 0; head < 4; ++head)
      CHECK(sets[size_t(head)] == as_set(f["doublesparsity"]["kept"][size_t(head)]));
  }
}
