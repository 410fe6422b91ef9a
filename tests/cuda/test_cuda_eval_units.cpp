// eval's work units on the GPU (issue 44 items 3 and 4): a shard that holds only part of a
// sample's runs, and engines on several GPUs, give the figures of the whole lockstep eval on one
// GPU exactly (each test says what it compares), and an engine split over GPUs within its
// arithmetic. The 2-GPU cases run where there are 2 GPUs.
#include <catch2/catch.hpp>
#include <cstdlib>

#include "engine/eval/coref_eval.h"
#include "engine/eval/eval_shards.h"
#include "engine/eval/eval_workers.h"
#include "engine/session/decoder_session.h"
#include "engine/session/tensor_parallel_session.h"
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

// An eval's engine may be a model split over GPUs (eval --tensor-parallel): its figures are one
// GPU's within the split's arithmetic. On one GPU the two ranks share it (their sums through host
// memory), which checks everything but NCCL.
TEST_CASE("GPU: an eval engine split over 2 GPUs scores as one GPU does", "[cuda]") {
  const bool two = cuda_device_count() >= 2;
  const std::vector<int> devices = two ? std::vector<int>{0, 1} : std::vector<int>{0, 0};
  INFO((two ? "GPUs 0 and 1" : "two ranks sharing GPU 0"));
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu = make_cuda_backend(0);
  const std::vector<std::shared_ptr<const BackendModel>> one = {upload_model(model, *gpu)};
  std::vector<std::unique_ptr<Backend>> group = make_cuda_backend_group(devices);
  std::vector<Backend*> ranks;
  for (const auto& b : group) ranks.push_back(b.get());
  const std::vector<std::shared_ptr<const BackendModel>> split = {
      lead_tensor_parallel(model, upload_tensor_parallel(model, ranks))};
  const CorefPools pools = load_bundled_coref_pools();
  const int64_t count = 6;
  const std::vector<MarkedCorefSample> items =
      mark_coref_samples(model->config, pools, model->require_tokenizer(), 0, 0, count, false);
  const UnitRange all = {0, count * int64_t(kRuns.size())};
  const std::vector<CorefSampleResult> expected =
      evaluate_coref_units(one, items, kRuns, all, true, {});
  const std::vector<CorefSampleResult> got =
      evaluate_coref_units(split, items, kRuns, all, true, {});
  REQUIRE(got.size() == expected.size());
  // The demo model's weights are BF16: the split rounds its o_proj and down_proj partial sums
  // before adding them (1e-2 relative, the cuda BF16 tolerance), which can flip a near tie of the
  // argmax or of a policy's choice now and then, never many.
  int64_t flipped_tokens = 0;
  for (size_t u = 0; u < got.size(); ++u) {
    INFO("unit " << u << " (" << kRuns[u % kRuns.size()].id << ")");
    CHECK(got[u].index == expected[u].index);
    flipped_tokens += std::abs(got[u].correct_tokens - expected[u].correct_tokens);
    CHECK(got[u].answer_nll == Approx(expected[u].answer_nll).epsilon(2e-2).margin(1e-2));
    CHECK(got[u].sparsity.steps == expected[u].sparsity.steps);
    if (expected[u].sparsity.steps > 0)
      CHECK(got[u].sparsity.overall() == Approx(expected[u].sparsity.overall()).margin(1e-2));
    CHECK(got[u].hit_rate.rows == expected[u].hit_rate.rows);
  }
  CHECK(flipped_tokens <= 2);
}
