// Tensor parallelism for the policies that read files made for the whole model (loki,
// doublesparsity, duoattention, seerattention, twilight), gather every head of a layer
// (tokenfilter, Ada-KV's budgets) or share a budget out over layers (PyramidKV): over 2 and 4 CPU
// ranks (a HostReduceGroup) each gives one backend's greedy tokens (as every other policy does:
// one test over all of them), logits and per-layer visible sets, on the demo model (its committed
// per-head files) and on a tiny model whose 2 KV heads are shared by 4 ranks (files whose rows
// differ by head, so a shard reading the wrong rows shows).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "engine/arch/tensor_parallel.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/policy/channel_calibration.h"
#include "engine/policy/registry.h"
#include "engine/session/tensor_parallel_session.h"
#include "tests/support/backend_checks.h"
#include "tests/support/cpu_rank_group.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;

namespace {

std::string describe(const PolicyConfig& policy) {
  std::string text = policy.id;
  for (const std::string& arg : policy.args) text += " " + arg;
  return text;
}

// Feeds `tokens` one at a time to one backend's session and to a split one, both running
// `policy` from the first token on, and checks at every step: the logits within check_split_close,
// every layer's decision, and where a layer was masked each rank's heads' visible columns
// against the same heads of the one backend. Returns how many (step, layer) were masked, so a
// caller can tell that the policy did select.
int64_t check_steps_equal(const std::shared_ptr<const Model>& model, const PolicyConfig& policy,
                          int ranks, const std::vector<int32_t>& tokens) {
  const ModelConfig& config = model->config;
  const auto one = make_cpu_backend(1);
  DecoderSession alone(upload_model(model, *one));
  alone.set_policy(0, make_run_policy(policy, alone.policy_shape(), *one));
  test::CpuRankGroup group(ranks);
  TensorParallelSession split(model, upload_tensor_parallel(model, group.pointers));
  split.set_policy(0, policy);
  int64_t masked = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    INFO(describe(policy) << " over " << ranks << " ranks, step " << t);
    const std::span<const int32_t> token(&tokens[t], 1);
    test::check_split_close(test::read_f32(*one, alone.forward(token)),
                            test::read_f32(*group.backends[0], split.forward(token)));
    const SessionRun& want = alone.run(0);
    const int64_t cols = int64_t(t) + 1;
    for (int64_t l = 0; l < config.num_layers; ++l) {
      INFO("layer " << l);
      const LayerDecision decision = want.decisions[size_t(l)];
      for (int64_t r = 0; r < ranks; ++r) {
        INFO("rank " << r);
        const SessionRun& got = split.rank_session(r).run(0);
        REQUIRE(got.decisions[size_t(l)] == decision);
      }
      if (decision != LayerDecision::Masked) continue;
      ++masked;
      const DeviceTensor& want_rows = want.visible[size_t(l)];
      const std::vector<uint8_t> want_visible = test::read_u8(*one, want_rows);
      for (int64_t r = 0; r < ranks; ++r) {
        const ShardHeads heads = shard_heads(config, r, ranks);
        const DeviceTensor& got_rows = split.rank_session(r).run(0).visible[size_t(l)];
        const std::vector<uint8_t> got_visible =
            test::read_u8(*group.backends[size_t(r)], got_rows);
        for (int64_t h = 0; h < heads.heads; ++h) {
          const auto want_row = want_visible.begin() + (heads.first_head + h) * want_rows.dim(1);
          const auto got_row = got_visible.begin() + h * got_rows.dim(1);
          INFO("rank " << r << ", model head " << heads.first_head + h);
          CHECK(std::vector<uint8_t>(got_row, got_row + cols) ==
                std::vector<uint8_t>(want_row, want_row + cols));
        }
      }
    }
  }
  return masked;
}

// The policies this file splits, with knobs that make them select on short texts.
std::vector<PolicyConfig> split_policies(bool with_seer_gate) {
  std::vector<PolicyConfig> policies = {
      {"loki", 0.5, {}},
      {"doublesparsity", 0.5, {"channels=0.25"}},
      {"duoattention", 0.5, {"recent_tokens=6"}},
      {"twilight", 0.5, {"page_size=4"}},
      {"twilight", 0.5, {"base=doublesparsity", "channels=0.25"}},
      {"pyramidkv", 0.5, {"obs_window=8"}},
      {"h2o+pyramidkv", 0.5, {}},
      {"tova+pyramidkv", 0.5, {}},
      {"tokenfilter", 0.2, {}},
      {"adakv", 0.5, {"obs_window=8"}},
      {"h2o+adakv", 0.5, {}},
      {"tova+adakv", 0.5, {}},
  };
  if (with_seer_gate) policies.push_back({"seerattention", 0.5, {}});
  return policies;
}

// A tiny Llama of 8 query heads over 2 KV heads (4 ranks share each KV head between 2), with
// per-head files whose rows differ by head: loki's bases permute the channels by layer and KV
// head, doublesparsity's channel orders by layer and query head; duoattention's gates and the
// seerattention gate are the test writers' (distinct per KV head).
std::string tiny_shared_kv_model() {
  test::TinyLlamaSpec spec;
  spec.vocab = 64;
  spec.hidden = 64;
  spec.intermediate = 64;
  spec.layers = 3;
  spec.heads = 8;
  spec.kv_heads = 2;
  spec.predictor = false;
  spec.calibration = false;
  spec.seed = 7;
  // write_tiny_llama writes the duoattention gates and the seerattention gate too.
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("tp-policies"), spec);
  const int64_t L = spec.layers, H = spec.heads, G = spec.kv_heads, D = spec.hidden / spec.heads;
  std::vector<float> basis(size_t(L * G * D * D), 0.0f), order(size_t(L * H * D));
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < D; ++i) {
        const int64_t channel = (i + 3 * g + l) % D;  // direction i: a signed unit vector
        basis[size_t(((l * G + g) * D + channel) * D + i)] = i % 2 ? -1.0f : 1.0f;
      }
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D; ++i)
        order[size_t((l * H + h) * D + i)] = float((i + 5 * h + l) % D);
  }
  test::write_safetensors(dir + "/" + kLokiCalibrationFile,
                          {test::make_tensor("basis", "F32", {L, G, D, D}, basis)});
  test::write_safetensors(dir + "/" + kDoubleSparsityCalibrationFile,
                          {test::make_tensor("channels", "F32", {L, H, D}, order)});
  return dir;
}

}  // namespace

TEST_CASE("tensor parallel: greedy continuations on the demo model equal one backend's",
          "[tensor_parallel][policy]") {
  const auto model = Model::load(test::source_path("assets/models/demo"));
  const std::vector<int32_t> prompt = model->require_tokenizer().encode(
      "A town by the river. The place is: Mirewick. The town by the river is called:", true);
  const auto one = make_cpu_backend(1);
  const auto alone = upload_model(model, *one);
  test::CpuRankGroup two(2), four(4);
  const auto shards2 = upload_tensor_parallel(model, two.pointers);
  const auto shards4 = upload_tensor_parallel(model, four.pointers);
  // The policies whose rule stays within each head or sums over heads, then those that read
  // per-head files or gather every head (split_policies).
  std::vector<PolicyConfig> policies = {{"dense", 0.0, {}}};
  for (const char* id : {"h2o", "streaming", "quest", "snapkv", "keydiff", "oracle", "tova",
                         "lazyllm", "random", "tokenbutler", "sparq", "rocketkv", "magicpig"})
    policies.push_back({id, 0.5, {}});
  for (const PolicyConfig& policy : split_policies(true)) policies.push_back(policy);
  // The demo's 4 KV heads over 4 ranks: each holds a whole group, so Ada-KV may pool groups.
  policies.push_back({"adakv", 0.5, {"granularity=kv_head"}});
  for (const PolicyConfig& policy : policies) {
    INFO(describe(policy));
    GenerateOptions options;
    options.max_new = 12;
    options.stop_at_eos = false;
    options.policy = policy;
    const std::vector<int32_t> want = generate_greedy(alone, prompt, options);
    CHECK(generate_greedy_tensor_parallel(model, shards2, prompt, options) == want);
    CHECK(generate_greedy_tensor_parallel(model, shards4, prompt, options) == want);
  }
}

TEST_CASE(
    "tensor parallel policies: each step's logits, decisions and visible sets on the demo "
    "model equal one backend's",
    "[tensor_parallel][policy]") {
  const auto model = Model::load(test::source_path("assets/models/demo"));
  const std::vector<int32_t> tokens = test::split_token_ids(40, 300, 4);
  const int ranks = GENERATE(2, 4);
  std::vector<PolicyConfig> policies = split_policies(true);
  policies.push_back({"adakv", 0.5, {"granularity=kv_head"}});
  for (const PolicyConfig& policy : policies) {
    const int64_t masked = check_steps_equal(model, policy, ranks, tokens);
    INFO(describe(policy));
    // Every policy but tokenfilter (which skips, never masks) chose sets that were compared.
    if (policy.id != "tokenfilter") CHECK(masked > 0);
  }
}

TEST_CASE("tensor parallel policies: ranks sharing a KV head read its rows of the per-head files",
          "[tensor_parallel][policy]") {
  // 8 query heads over 2 KV heads: 2 ranks hold one KV head each, 4 ranks hold half a group.
  const auto model = Model::load(tiny_shared_kv_model());
  const std::vector<int32_t> tokens = test::split_token_ids(32, model->config.vocab_size, 6);
  const int ranks = GENERATE(2, 4);
  // seerattention's gate reads a KV group's query heads together: whole groups only.
  for (const PolicyConfig& policy : split_policies(ranks == 2)) {
    const int64_t masked = check_steps_equal(model, policy, ranks, tokens);
    INFO(describe(policy));
    if (policy.id != "tokenfilter") CHECK(masked > 0);
  }
}

TEST_CASE("tensor parallel policies: tokenfilter's skips over a split follow one backend's",
          "[tensor_parallel][policy]") {
  // A sparsity whose threshold makes tokens skip tail layers: the gathered similarities decide.
  const auto model = Model::load(test::source_path("assets/models/demo"));
  const std::vector<int32_t> tokens = test::split_token_ids(40, 300, 9);
  const auto one = make_cpu_backend(1);
  DecoderSession alone(upload_model(model, *one));
  const PolicyConfig policy{"tokenfilter", 0.4, {"tau=0.2"}};
  alone.set_policy(0, make_run_policy(policy, alone.policy_shape(), *one));
  test::CpuRankGroup four(4);
  TensorParallelSession split(model, upload_tensor_parallel(model, four.pointers));
  split.set_policy(0, policy);
  int64_t skipped = 0;
  for (const int32_t token : tokens) {
    alone.forward(std::span(&token, 1));
    split.forward(std::span(&token, 1));
    for (int64_t r = 0; r < split.ranks(); ++r)
      REQUIRE(split.rank_session(r).run(0).decisions == alone.run(0).decisions);
    skipped += std::count(alone.run(0).decisions.begin(), alone.run(0).decisions.end(),
                          LayerDecision::Skipped);
  }
  CHECK(skipped > 0);
}

TEST_CASE("tensor parallel policies: bad per-head files name the file and the whole model's shape",
          "[tensor_parallel][policy]") {
  // A file made for the shard's heads only is not the whole model's: the error says which shape.
  const std::string dir = tiny_shared_kv_model();
  test::write_safetensors(
      dir + "/" + kLokiCalibrationFile,
      {test::make_tensor("basis", "F32", {3, 1, 8, 8}, std::vector<float>(3 * 8 * 8, 0.0f))});
  const auto model = Model::load(dir);
  test::CpuRankGroup two(2);
  TensorParallelSession split(model, upload_tensor_parallel(model, two.pointers));
  const std::string message = test::error_message([&] {
    split.set_policy(0, PolicyConfig{"loki", 0.5, {}});
  });
  CHECK(message.find(kLokiCalibrationFile) != std::string::npos);
  CHECK(message.find("basis") != std::string::npos);
  CHECK(message.find("[3, 2, 8, 8]") != std::string::npos);
}
