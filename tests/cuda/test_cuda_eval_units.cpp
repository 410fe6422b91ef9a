// eval's work units on the GPU (issue 44 items 3 and 4): a shard that holds only part of a
// sample's runs, and engines on several GPUs, give the figures of the whole lockstep eval on one
// GPU exactly (each test says what it compares). The 2-GPU case runs where there are 2 GPUs.
#include <catch2/catch.hpp>

#include "engine/eval/coref_eval.h"
#include "engine/eval/eval_shards.h"
#include "engine/eval/eval_workers.h"
#include "engine/session/decoder_session.h"
#include "kernels/cuda_backend.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

namespace {

const std::vector<PolicyConfig> kRuns = {{"dense", 0.0, {}},
                                         {"h2o", 0.5, {}},
                                         {"quest", 0.5, {}},
                                         {"tova", 0.7, {}},
                                         {"duoattention", 0.5, {}}};

void require_same(const CorefSampleResult& got, const CorefSampleResult& expected) {
  CHECK(got.index == expected.index);
  CHECK(got.correct_tokens == expected.correct_tokens);
  CHECK(got.answer_nll == expected.answer_nll);
  CHECK(got.sparsity.steps == expected.sparsity.steps);
  CHECK(got.sparsity.hidden_sum == expected.sparsity.hidden_sum);
}

}  // namespace

TEST_CASE("GPU: shards cutting samples apart give the whole lockstep eval's figures", "[cuda]") {
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu = make_cuda_backend(0);
  const std::vector<std::shared_ptr<const BackendModel>> engines = {upload_model(model, *gpu)};
  const CorefPools pools = load_bundled_coref_pools();
  const int64_t count = 5;
  const std::vector<MarkedCorefSample> items =
      mark_coref_samples(model->config, pools, model->require_tokenizer(), 0, 0, count, false);
  const std::vector<CorefEvalResult> whole = evaluate_coref_lockstep(
      engines[0], pools, model->require_tokenizer(), 0, 0, count, false, {}, kRuns);
  // 20 units in 7 shards: some shards hold a sample's dense run alone, which must still step
  // token by token as it does beside the other policies.
  const int64_t units = count * int64_t(kRuns.size());
  for (int64_t s = 0; s < 7; ++s) {
    const UnitRange range = shard_units(units, {s, 7});
    const std::vector<CorefSampleResult> got =
        evaluate_coref_units(engines, items, kRuns, range, false, {});
    for (int64_t u = range.begin; u < range.end; ++u) {
      INFO("shard " << s << ", unit " << u);
      require_same(got[size_t(u - range.begin)],
                   whole[size_t(u) % kRuns.size()].per_sample[size_t(u) / kRuns.size()]);
    }
  }
}

TEST_CASE("GPU: engines on 2 GPUs give the figures of one", "[cuda]") {
  if (cuda_device_count() < 2) {
    WARN("skipped: one GPU");
    return;
  }
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu0 = make_cuda_backend(0), gpu1 = make_cuda_backend(1);
  const std::vector<std::shared_ptr<const BackendModel>> one = {upload_model(model, *gpu0)};
  const std::vector<std::shared_ptr<const BackendModel>> two = {one[0], upload_model(model, *gpu1)};
  const CorefPools pools = load_bundled_coref_pools();
  const int64_t count = 12;
  const std::vector<MarkedCorefSample> items =
      mark_coref_samples(model->config, pools, model->require_tokenizer(), 0, 0, count, false);
  const UnitRange all = {0, count * int64_t(kRuns.size())};
  const std::vector<CorefSampleResult> expected =
      evaluate_coref_units(one, items, kRuns, all, false, {});
  const std::vector<CorefSampleResult> got =
      evaluate_coref_units(two, items, kRuns, all, false, {});
  REQUIRE(got.size() == expected.size());
  for (size_t u = 0; u < got.size(); ++u) {
    INFO("unit " << u);
    require_same(got[u], expected[u]);
  }
}
