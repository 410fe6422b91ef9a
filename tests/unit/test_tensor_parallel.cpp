// Tensor parallelism on the CPU (engine/arch/tensor_parallel.h, tensor_parallel_session.h): a
// model split over 2 and 4 CPU backends, their all-reduce a HostReduceGroup, gives one backend's
// logits, for every family's layer math and for runs in lockstep, and a trace of every head;
// what cannot be split is a clear error, and a failing rank frees the others. Each policy's
// greedy tokens and visible sets: test_tensor_parallel_policies.cpp.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "engine/arch/tensor_parallel.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/common/error.h"
#include "engine/policy/plugin_policy.h"
#include "engine/policy/registry.h"
#include "engine/session/tensor_parallel_session.h"
#include "engine/session/trace_recorder.h"
#include "tests/support/backend_checks.h"
#include "tests/support/cpu_rank_group.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

namespace {

// The logits of a prompt fed as one chunk, then of `steps` single tokens, concatenated.
template <typename Session>
std::vector<float> chunk_then_steps(Session& session, Backend& lead,
                                    const std::vector<int32_t>& prompt,
                                    const std::vector<int32_t>& steps) {
  std::vector<float> all = test::read_f32(lead, session.forward(prompt));
  for (const int32_t token : steps) {
    const std::vector<float> step = test::read_f32(lead, session.forward(std::span(&token, 1)));
    all.insert(all.end(), step.begin(), step.end());
  }
  return all;
}

}  // namespace

TEST_CASE("tensor parallel: each family's logits split over 2 and 4 ranks equal one backend's",
          "[tensor_parallel]") {
  const std::string fixture =
      GENERATE("llama-gqa-f32", "qwen2-bias-f32", "gemma3-window-softcap-f32", "qwen3-qknorm-f32",
               "phi3-fused-partial-f32", "mistral-window-bf16");
  const int ranks = GENERATE(2, 4);
  INFO(fixture << " over " << ranks << " ranks");
  const auto model = Model::load(test::source_path("tests/fixtures/" + fixture));
  const std::vector<int32_t> prompt = test::split_token_ids(9, model->config.vocab_size, 1);
  const std::vector<int32_t> steps = test::split_token_ids(6, model->config.vocab_size, 2);

  const auto one = make_cpu_backend(1);
  DecoderSession alone(upload_model(model, *one));
  const std::vector<float> want = chunk_then_steps(alone, *one, prompt, steps);

  test::CpuRankGroup group(ranks);
  TensorParallelSession split(model, upload_tensor_parallel(model, group.pointers));
  CHECK(split.ranks() == ranks);
  // Each rank holds its heads' caches only: G / R KV heads, or one where R > G.
  CHECK(split.rank_session(0).model().config().num_kv_heads ==
        std::max<int64_t>(1, model->config.num_kv_heads / ranks));
  test::check_split_close(want, chunk_then_steps(split, *group.backends[0], prompt, steps));
}

TEST_CASE("tensor parallel: a split that keeps KV groups whole allows per-group selection",
          "[tensor_parallel]") {
  // The demo model's 4 KV heads over 4 ranks: each rank holds one whole group, so kv_head
  // granularity (and sparq's per-group channels) choose what one backend does. The check reads
  // the whole model's KV heads, not a shard's (one each here, as when groups are split).
  const auto model = Model::load(test::source_path("assets/models/demo"));
  const std::vector<int32_t> prompt = test::split_token_ids(20, model->config.vocab_size, 5);
  const auto one = make_cpu_backend(1);
  test::CpuRankGroup four(4);
  const auto shards = upload_tensor_parallel(model, four.pointers);
  GenerateOptions options;
  options.max_new = 8;
  options.stop_at_eos = false;
  options.policy = {"h2o", 0.5, {"granularity=kv_head"}};
  CHECK(generate_greedy_tensor_parallel(model, shards, prompt, options) ==
        generate_greedy(upload_model(model, *one), prompt, options));
}

TEST_CASE("tensor parallel: runs in lockstep give one backend's lockstep logits",
          "[tensor_parallel]") {
  const auto model = Model::load(test::source_path("assets/models/demo"));
  const std::vector<int32_t> prompt = test::split_token_ids(12, model->config.vocab_size, 3);
  const std::vector<PolicyConfig> runs = {
      {"dense", 0.0, {}}, {"h2o", 0.5, {}}, {"streaming", 0.7, {}}};
  // Two threads a rank: the CPU would split the runs into groups stepped as concurrent tasks,
  // which a rank of a group must not (their all-reduces would pair up across ranks wrongly).
  const auto one = make_cpu_backend(2);
  DecoderSession alone(upload_model(model, *one), {}, int64_t(runs.size()));
  test::CpuRankGroup group(2, 2);
  TensorParallelSession split(model, upload_tensor_parallel(model, group.pointers), {},
                              int64_t(runs.size()));
  for (size_t r = 0; r < runs.size(); ++r) {
    if (auto made = make_run_policy(runs[r], alone.policy_shape(), *one))
      alone.set_policy(int64_t(r), std::move(made));
    split.set_policy(int64_t(r), runs[r]);
  }
  test::check_split_close(test::read_f32(*one, alone.forward(prompt)),
                          test::read_f32(*group.backends[0], split.forward(prompt)));
  std::vector<int32_t> tokens = {3, 3, 3};
  for (int step = 0; step < 8; ++step) {
    const std::vector<float> want = test::read_f32(*one, alone.forward_runs(tokens));
    test::check_split_close(want, test::read_f32(*group.backends[0], split.forward_runs(tokens)));
    // Each run feeds back its own greedy token (the runs' rows then differ).
    for (size_t r = 0; r < runs.size(); ++r) {
      const auto row = want.begin() + int64_t(r) * model->config.vocab_size;
      tokens[r] = int32_t(std::max_element(row, row + model->config.vocab_size) - row);
    }
  }
}

TEST_CASE("tensor parallel: a trace over 2 and 4 ranks holds every head as one backend's",
          "[tensor_parallel]") {
  const auto model = Model::load(test::source_path("assets/models/demo"));
  const std::vector<int32_t> tokens = model->require_tokenizer().encode(
      "A town by the river. The place is: Mirewick. The town by the river is called:", true);
  const std::vector<PolicyConfig> policies = {{"dense", 0.0, {}},
                                              {"h2o", 0.5, {}},
                                              {"quest", 0.5, {"page_size=4"}},
                                              {"tokenbutler", 0.5, {}}};
  const auto one = make_cpu_backend(1);
  TraceRecorder alone(upload_model(model, *one), nullptr, tokens, policies);
  while (alone.step()) {
  }
  const int ranks = GENERATE(2, 4);
  test::CpuRankGroup group(ranks);
  TraceRecorder split(model, upload_tensor_parallel(model, group.pointers), nullptr, tokens,
                      policies);
  while (split.step()) {
  }
  const Trace& want = alone.trace();
  const Trace& got = split.trace();
  CHECK(got.model.heads == want.model.heads);
  REQUIRE(got.step_count() == want.step_count());
  for (int64_t t = 0; t < want.step_count(); ++t) {
    for (size_t r = 0; r < policies.size(); ++r) {
      INFO("step " << t << ", " << policies[r].id << ", " << ranks << " ranks");
      const StepRecord& w = want.steps()[size_t(t)][r];
      const StepRecord& g = got.steps()[size_t(t)][r];
      CHECK(g.decisions == w.decisions);
      CHECK(g.kept_heads == w.kept_heads);
      CHECK(g.visible == w.visible);
      CHECK(g.visible_counts == w.visible_counts);
      CHECK(g.argmax == w.argmax);
      test::check_split_close(w.logits, g.logits);
      REQUIRE(g.scores.size() == w.scores.size());
      for (size_t i = 0; i < w.scores.size(); ++i) {
        // NaN where a layer was not ranked; the scores are the logits' kind of sums otherwise.
        if (std::isnan(w.scores[i])) {
          CHECK(std::isnan(g.scores[i]));
        } else {
          CHECK(g.scores[i] == Approx(w.scores[i]).margin(1e-4).epsilon(1e-4));
        }
      }
      CHECK(g.metrics.kl_vs_dense == Approx(w.metrics.kl_vs_dense).margin(1e-5));
      CHECK(g.metrics.effective_sparsity == Approx(w.metrics.effective_sparsity).margin(1e-12));
    }
  }
}

TEST_CASE("tensor parallel: a split the config cannot divide names the field",
          "[tensor_parallel]") {
  const auto model = Model::load(test::source_path("tests/fixtures/llama-gqa-f32"));
  const std::string heads = test::error_message([&] { check_tensor_parallel(*model, 3); });
  CHECK(heads.find("config.json: num_attention_heads") != std::string::npos);
  CHECK(heads.find("3 GPUs") != std::string::npos);
  const auto qwen3 = Model::load(test::source_path("tests/fixtures/qwen3-qknorm-f32"));
  // 4 heads, 2 KV heads, 144 columns: 8 ranks leave no head for some of them.
  CHECK(test::error_message([&] {
          check_tensor_parallel(*qwen3, 8);
        }).find("num_attention_heads") != std::string::npos);
  CHECK_THROWS_AS(check_tensor_parallel(*model, 0), Error);
  // A group of the wrong size for the backends' ranks.
  test::CpuRankGroup group(2);
  std::vector<Backend*> one_of_two = {group.pointers[1]};
  CHECK(test::error_message([&] {
          upload_tensor_parallel(model, one_of_two);
        }).find("rank 0 of a group of 1") != std::string::npos);
}

TEST_CASE("tensor parallel: a policy whose rule spans heads is refused by name",
          "[tensor_parallel]") {
  const auto model = Model::load(test::source_path("tests/fixtures/llama-gqa-f32"));
  test::CpuRankGroup group(4);
  TensorParallelSession split(model, upload_tensor_parallel(model, group.pointers));
  // A plug-in's rule is its own code, which may read any head's rows: refused, naming its file.
  const std::string plugin =
      load_policy_plugin(std::string(KVLENS_EXAMPLE_PLUGIN_DIR) + "/libkvlens_h2o_c.so").id;
  const std::string message = test::error_message([&] {
    split.set_policy(0, PolicyConfig{plugin, 0.5, {}});
  });
  CHECK(message.find("policy " + plugin + ": tensor parallel") != std::string::npos);
  CHECK(message.find("libkvlens_h2o_c.so") != std::string::npos);
  CHECK(message.find("h2o") != std::string::npos);  // the list of those that can
  CHECK(message.find("tova") != std::string::npos);
  CHECK(message.find("tokenfilter") != std::string::npos);
  CHECK(message.find("loki") != std::string::npos);
  // tova, tokenfilter and Ada-KV's budgets gather heads through collectives: one run a session.
  TensorParallelSession two_runs(model, upload_tensor_parallel(model, group.pointers), {}, 2);
  for (const char* id : {"tova", "tokenfilter", "adakv", "h2o+adakv"}) {
    INFO(id);
    CHECK(test::error_message([&] {
            two_runs.set_policy(1, PolicyConfig{id, 0.5, {}});
          }).find("one run") != std::string::npos);
  }
  // PyramidKV's layer budgets are the same on every rank: several runs are fine.
  CHECK_NOTHROW(two_runs.set_policy(1, PolicyConfig{"h2o+pyramidkv", 0.5, {}}));
  // 4 ranks over 2 KV heads: a KV group is split, so a selection per group cannot be made.
  PolicyConfig grouped{"h2o", 0.5, {"granularity=kv_head"}};
  CHECK(test::error_message([&] { split.set_policy(0, grouped); }).find("granularity") !=
        std::string::npos);
  // 4 ranks over 2 KV heads: sparq ranks channels by a whole group's queries, seerattention's
  // gate reads them together.
  for (const char* id : {"sparq", "seerattention"}) {
    INFO(id);
    CHECK(test::error_message([&] {
            split.set_policy(0, PolicyConfig{id, 0.5, {}});
          }).find("reads each KV group's query heads together") != std::string::npos);
  }
  // The session is still usable after refused calls.
  const int32_t token = 5;
  CHECK_NOTHROW(split.forward(std::span(&token, 1)));
}

TEST_CASE("tensor parallel: bad input fails before any rank starts, and the session goes on",
          "[tensor_parallel]") {
  const auto model = Model::load(test::source_path("tests/fixtures/llama-gqa-f32"));
  test::CpuRankGroup group(2);
  TensorParallelSession split(model, upload_tensor_parallel(model, group.pointers));
  const int32_t bad = int32_t(model->config.vocab_size);
  CHECK(test::error_message([&] { split.forward(std::span(&bad, 1)); }).find("token id") !=
        std::string::npos);
  const int32_t good = 7;
  CHECK_NOTHROW(split.forward(std::span(&good, 1)));
  CHECK(split.position() == 1);
}

TEST_CASE("HostReduceGroup: rank-order sums on every rank, and an abort frees a waiting rank",
          "[tensor_parallel]") {
  HostReduceGroup group(3);
  std::vector<std::vector<float>> data = {{1.0f, 1e8f}, {2.0f, 1.0f}, {3.0f, -1e8f}};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] { group.all_reduce_sum(r, data[size_t(r)].data(), 2); });
  for (auto& t : threads) t.join();
  for (const auto& d : data) {
    CHECK(d[0] == 6.0f);
    CHECK(d[1] == (1e8f + 1.0f) + -1e8f);  // rank order: (p0 + p1) + p2, the same on each rank
  }
  HostReduceGroup waiting(2);
  float value = 1.0f;
  std::string message;
  std::thread rank0(
      [&] { message = test::error_message([&] { waiting.all_reduce_sum(0, &value, 1); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  waiting.abort();
  rank0.join();
  CHECK(message.find("a rank failed") != std::string::npos);
  CHECK_THROWS_AS(waiting.all_reduce_sum(1, &value, 1), Error);
}
