// Lockstep: several policy runs in one DecoderSession advance together (one batched pass over the
// weights per step) and each run's logits equal those of the same policy run alone, in the decode
// simulation, in prefill + decode, and when every run follows its own tokens.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "engine/policy/registry.h"
#include "engine/session/scoring.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;

namespace {

struct Loaded {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const BackendModel> model;
};

Loaded load_tiny(const std::string& tag, const test::TinyLlamaSpec& spec = {}, int threads = 2) {
  const std::string dir = test::write_tiny_llama(test::make_temp_dir(tag), spec);
  Loaded loaded;
  CpuBackendOptions options;
  options.threads = threads;
  options.cache_bytes = size_t(32) << 20;  // the tiny weights' group passes fit: 2 threads split
  loaded.backend = make_cpu_backend(options);
  loaded.model = upload_model(Model::load(dir), *loaded.backend);
  return loaded;
}

std::vector<float> to_host(Backend& backend, const DeviceTensor& tensor) {
  std::vector<float> host(size_t(tensor.numel()));
  backend.to_host(tensor, host.data(), host.size() * sizeof(float));
  return host;
}

const std::vector<int32_t> kTokens = {1, 5, 9, 2, 33, 7, 7, 12, 40, 3, 8, 61, 17, 4, 22, 9, 50};

// Every registered policy at a real sparsity, with settings that make them act on a short text.
std::vector<PolicyConfig> mixed_policies() {
  std::vector<PolicyConfig> policies;
  for (const PolicyInfo& info : policy_infos()) {
    PolicyConfig config{info.id, info.id == "dense" ? 0.0 : 0.5, {}};
    for (const ParamSpec& spec : info.params) {
      if (spec.name == "sinks") config.args.push_back("sinks=1");
      if (spec.name == "obs_window") config.args.push_back("obs_window=4");
      if (spec.name == "page_size") config.args.push_back("page_size=4");
    }
    // magicpig's default window (64) would keep this short text exact: one recent token only.
    if (info.id == "magicpig") config.args.push_back("window=1");
    policies.push_back(config);
  }
  return policies;
}

}  // namespace

TEST_CASE("lockstep runs give each policy's logits of a run alone", "[lockstep]") {
  // 2 threads split the step into groups of runs once the rows differ (the tiny weights fit in
  // any cache); 1 thread takes every run through every op.
  const int threads = GENERATE(1, 2);
  INFO(threads << " threads");
  Loaded loaded = load_tiny("lockstep", {}, threads);
  REQUIRE(loaded.backend->lockstep_groups(10, loaded.model->layer_weight_bytes(),
                                          int64_t(loaded.model->layers.size())) ==
          (threads == 2 ? 2 : 1));
  const std::vector<PolicyConfig> policies = mixed_policies();
  REQUIRE(policies.size() >= 8);

  const std::vector<ScoreResult> together =
      score_tokens_lockstep(loaded.model, kTokens, policies, {});
  REQUIRE(together.size() == policies.size());
  for (size_t p = 0; p < policies.size(); ++p) {
    INFO(policies[p].id);
    ScoreOptions alone_options;
    alone_options.policy = policies[p];
    const ScoreResult alone = score_tokens(loaded.model, kTokens, alone_options);
    // The CPU matmul computes each output row with the same kernel and summation order whatever
    // the number of rows, and attention and the policy work run per run: equal to the last bit.
    CHECK(together[p].nll == alone.nll);
    CHECK(together[p].argmax == alone.argmax);
    CHECK(together[p].sparsity.hidden_sum == alone.sparsity.hidden_sum);
    CHECK(together[p].sparsity.steps == alone.sparsity.steps);
  }
  // The policies really differ from each other (the lockstep does not hand one run's state to
  // another): at s = 0.5 the streaming run's predictions are not the dense ones.
  CHECK(together[0].nll != together[3].nll);
}

TEST_CASE("the CPU backend splits a lockstep only for small layers whose passes fit the cache",
          "[lockstep]") {
  constexpr size_t kMiB = size_t(1) << 20;
  // The demo model (8 layers, 11.6 MB of layer weights) on this 2-core VM with 32 MiB of L3,
  // and on 16 threads with 300 MiB: one group per thread, at most one per run.
  CHECK(cpu_lockstep_groups(10, 2, 11'600'000, 8, 32 * kMiB) == 2);
  CHECK(cpu_lockstep_groups(10, 16, 11'600'000, 8, 300 * kMiB) == 10);
  // Two groups' passes over 8 x 3 MB no longer fit 32 MiB; in 300 MiB they do.
  CHECK(cpu_lockstep_groups(10, 2, 24'000'000, 8, 32 * kMiB) == 1);
  CHECK(cpu_lockstep_groups(10, 2, 24'000'000, 8, 300 * kMiB) == 2);
  // A 200 MB model (12 layers of about 10 MB): large layers, no split even in a large cache.
  CHECK(cpu_lockstep_groups(10, 2, 118'000'000, 12, 300 * kMiB) == 1);
  CHECK(cpu_lockstep_groups(10, 2, 4 * 12 * int64_t(kMiB), 12, 300 * kMiB) == 2);  // the limit
  CHECK(cpu_lockstep_groups(10, 2, 4 * 12 * int64_t(kMiB) + 1, 12, 300 * kMiB) == 1);
  // One run or one thread: nothing to split; an unknown cache size or no layers: no split.
  CHECK(cpu_lockstep_groups(1, 16, 1000, 2, 32 * kMiB) == 1);
  CHECK(cpu_lockstep_groups(10, 1, 1000, 2, 32 * kMiB) == 1);
  CHECK(cpu_lockstep_groups(10, 2, 1000, 2, 0) == 1);
  CHECK(cpu_lockstep_groups(10, 2, 1000, 0, 32 * kMiB) == 1);
}

TEST_CASE("lockstep in prefill + decode copies the dense prompt into every run", "[lockstep]") {
  Loaded loaded = load_tiny("lockstep-prefill");
  const std::vector<PolicyConfig> policies = {
      {"dense", 0.0, {}}, {"h2o", 0.5, {"sinks=1"}}, {"streaming", 0.6, {"sinks=2"}}};
  ScoreOptions options;
  options.prefill = 6;
  options.chunk = 4;  // the prompt in chunks of 4 and 2, then one token per step
  const std::vector<ScoreResult> together =
      score_tokens_lockstep(loaded.model, kTokens, policies, options);
  for (size_t p = 0; p < policies.size(); ++p) {
    INFO(policies[p].id);
    ScoreOptions alone_options = options;
    alone_options.policy = policies[p];
    const ScoreResult alone = score_tokens(loaded.model, kTokens, alone_options);
    CHECK(together[p].nll == alone.nll);
    CHECK(together[p].argmax == alone.argmax);
    // Dense runs count no policy steps; the others count the steps after the prefill.
    CHECK(together[p].sparsity.steps == (p == 0 ? 0 : int64_t(kTokens.size()) - 6));
  }
}

TEST_CASE("lockstep: a long prefill stored once in every run, through cache growth and reset",
          "[lockstep]") {
  // KV caches of [2, 256, 32] F32 (64 KiB) are page-mapped on the CPU, so the prompt's pages are
  // shared copy-on-write between the runs; 300 prompt tokens in chunks of 100 grow the caches
  // from 256 to 512 positions with 200 shared ones. Each run must still equal itself alone.
  test::TinyLlamaSpec spec;
  spec.hidden = 64;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.max_positions = 512;
  // Three layers: past layer 1 (the first sparse one) each run's keys and values of the decoded
  // tokens differ from the other runs', so reading them from the wrong run changes the results.
  spec.layers = 3;
  Loaded loaded = load_tiny("lockstep-shared", spec);
  std::vector<int32_t> tokens(312);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + i / 7) % 64);
  // Every policy: their attention reads the shared prompt's rows once for all runs.
  const std::vector<PolicyConfig> policies = mixed_policies();
  ScoreOptions options;
  options.prefill = 300;
  options.chunk = 100;
  for (int pass = 0; pass < 2; ++pass) {  // scoring twice reuses nothing stale
    const std::vector<ScoreResult> together =
        score_tokens_lockstep(loaded.model, tokens, policies, options);
    for (size_t p = 0; p < policies.size(); ++p) {
      INFO(policies[p].id << ", pass " << pass);
      ScoreOptions alone_options = options;
      alone_options.policy = policies[p];
      const ScoreResult alone = score_tokens(loaded.model, tokens, alone_options);
      CHECK(together[p].nll == alone.nll);
      CHECK(together[p].argmax == alone.argmax);
    }
  }
}

TEST_CASE("lockstep runs that stay alike through every layer each get the logits", "[lockstep]") {
  // At sparsity 0 every run sees everything, so the runs' rows stay equal to the last layer and
  // the session computes one row and copies it (lm_head included): each run's logits must still
  // be the dense run's, row by row.
  Loaded loaded = load_tiny("lockstep-alike");
  Backend& backend = *loaded.backend;
  DecoderSession together(loaded.model, {}, 3);
  together.set_policy(1, make_policy({"h2o", 0.0, {}}, together.policy_shape(), backend));
  together.set_policy(2, make_policy({"oracle", 0.0, {}}, together.policy_shape(), backend));
  DecoderSession alone(loaded.model);
  for (const int32_t token : std::vector<int32_t>(kTokens.begin(), kTokens.begin() + 6)) {
    const std::vector<float> rows = to_host(backend, together.forward(std::span(&token, 1)));
    const std::vector<float> dense = alone.step(token);
    REQUIRE(rows.size() == 3 * dense.size());
    for (size_t r = 0; r < 3; ++r) {
      INFO("run " << r);
      CHECK(std::vector<float>(rows.begin() + long(r * dense.size()),
                               rows.begin() + long((r + 1) * dense.size())) == dense);
    }
  }
}

TEST_CASE("lockstep runs may each follow their own tokens", "[lockstep]") {
  Loaded loaded = load_tiny("lockstep-own");
  Backend& backend = *loaded.backend;
  // The runs start on the same token (equal caches: one computation serves both), part, then
  // meet again on 9 and 7, where equal queries must not borrow logits over caches that differ.
  const std::vector<std::vector<int32_t>> texts = {{1, 5, 9, 2, 33, 7}, {1, 4, 9, 1, 60, 7}};
  DecoderSession together(loaded.model, {}, 2);
  together.set_policy(1,
                      make_policy({"keydiff", 0.5, {"sinks=1"}}, together.policy_shape(), backend));
  DecoderSession first(loaded.model), second(loaded.model);
  second.set_policy(make_policy({"keydiff", 0.5, {"sinks=1"}}, second.policy_shape(), backend));
  CHECK(together.run_step_seconds().empty());  // the breakdown exists from the first step on
  for (size_t i = 0; i < texts[0].size(); ++i) {
    const std::vector<int32_t> step_tokens = {texts[0][i], texts[1][i]};
    const std::vector<float> both = to_host(backend, together.forward_runs(step_tokens));
    const std::vector<float> a = first.step(texts[0][i]), b = second.step(texts[1][i]);
    REQUIRE(both.size() == a.size() + b.size());
    CHECK(std::vector<float>(both.begin(), both.begin() + long(a.size())) == a);
    CHECK(std::vector<float>(both.begin() + long(a.size()), both.end()) == b);
  }
  CHECK(together.position() == 6);
  CHECK(together.run(1).sparsity.hidden_sum == second.sparsity().hidden_sum);
  REQUIRE(together.run_step_seconds().size() == 2);
  for (double seconds : together.run_step_seconds()) CHECK(seconds >= 0.0);
}

TEST_CASE("lockstep session: bad run counts and indices are clear errors", "[lockstep]") {
  Loaded loaded = load_tiny("lockstep-errors");
  CHECK_THAT(test::error_message([&] { DecoderSession session(loaded.model, {}, 0); }),
             Catch::Contains("runs") && Catch::Contains("at least one"));
  DecoderSession session(loaded.model, {}, 3);
  CHECK_THAT(test::error_message([&] {
               session.forward_runs(std::vector<int32_t>{1, 2});
             }),
             Catch::Contains("one token per run (3)") && Catch::Contains("found 2"));
  CHECK_THAT(test::error_message([&] {
               session.set_policy(
                   3, make_policy({"h2o", 0.5, {}}, session.policy_shape(), *loaded.backend));
             }),
             Catch::Contains("run index in [0, 3)"));
  CHECK_THAT(test::error_message([&] { session.step(1); }), Catch::Contains("single-run"));
  CHECK_THAT(test::error_message([&] {
               session.forward_runs(std::vector<int32_t>{1, 2, 999});
             }),
             Catch::Contains("token id"));
  CHECK(session.position() == 0);  // nothing was fed by the failed calls
}

namespace {

// A policy that only watches: what a learned predictor would read at each (step, layer).
class InputProbe final : public Policy {
 public:
  explicit InputProbe(Backend& backend) : backend_(backend) {}
  LayerDecision select(const LayerStep& step, DeviceTensor&, DeviceTensor&) override {
    if (step.layer == 0 && step.layer_input) inputs.push_back(read(*step.layer_input));
    if (step.layer_input) all_inputs.push_back(read(*step.layer_input));
    if (step.q) queries.push_back(read(*step.q));
    return LayerDecision::Dense;
  }
  std::vector<std::vector<float>> inputs;               // layer 0's
  std::vector<std::vector<float>> all_inputs, queries;  // every layer's

 private:
  std::vector<float> read(const DeviceTensor& tensor) const {
    std::vector<float> host(size_t(tensor.numel()));
    backend_.to_host(tensor, host.data(), host.size() * sizeof(float));
    return host;
  }

  Backend& backend_;
};

// An InputProbe as the policy of `run`.
InputProbe& attach_probe(DecoderSession& session, int64_t run, Backend& backend) {
  auto probe = std::make_unique<InputProbe>(backend);
  InputProbe& seen = *probe;
  session.set_policy(run, std::move(probe));
  return seen;
}

}  // namespace

TEST_CASE("a policy sees each run's layer-0 attention input, as a predictor needs", "[lockstep]") {
  Loaded loaded = load_tiny("lockstep-input");
  Backend& backend = *loaded.backend;
  DecoderSession session(loaded.model, {}, 2);
  InputProbe& seen = attach_probe(session, 1, backend);
  const std::vector<int32_t> tokens = {3, 14, 15};
  for (const int32_t token : tokens) session.forward_runs(std::vector<int32_t>{1, token});
  REQUIRE(seen.inputs.size() == tokens.size());
  // The reference: the token's embedding through layer 0's input RMSNorm, computed apart.
  const BackendModel& model = *loaded.model;
  const int64_t E = model.config().hidden_size;
  DeviceTensor embedded = backend.alloc(DType::F32, {1, E}),
               normed = backend.alloc(DType::F32, {1, E});
  for (size_t i = 0; i < tokens.size(); ++i) {
    backend.embed(model.embed, std::vector<int32_t>{tokens[i]}, embedded);
    backend.rmsnorm(embedded, model.layers[0].attn_norm, float(model.config().rms_norm_eps),
                    normed);
    CHECK(seen.inputs[i] == to_host(backend, normed));
  }
}

TEST_CASE("runs whose rows are alike, computed once, each see their own inputs and queries",
          "[lockstep]") {
  // Every run gets the same token and layer 0 is dense in all of them, so the session computes
  // each layer-0 row once (and layer 1's input, query, key and value rows) and copies it to the
  // other runs: a policy in run 2 must read exactly what the same policy reads alone.
  Loaded loaded = load_tiny("lockstep-alike-inputs");
  Backend& backend = *loaded.backend;
  DecoderSession together(loaded.model, {}, 3);
  InputProbe& seen_together = attach_probe(together, 2, backend);
  DecoderSession alone(loaded.model);
  InputProbe& seen_alone = attach_probe(alone, 0, backend);
  for (const int32_t token : {3, 14, 15}) {
    together.forward(std::span(&token, 1));
    alone.step(token);
  }
  REQUIRE(seen_together.all_inputs.size() == seen_alone.all_inputs.size());
  REQUIRE(seen_together.all_inputs.size() == 3 * loaded.model->layers.size());
  CHECK(seen_together.all_inputs == seen_alone.all_inputs);
  CHECK(seen_together.queries == seen_alone.queries);
}

TEST_CASE("a run that chooses before its logits gets the results of one that computes them all",
          "[lockstep]") {
  // A policy that does not read this step's logits chooses first and gets its logits at the
  // chosen columns only; a session that records the logits computes every column first. Both
  // must give the same next-token logits, bit for bit, for every registered policy.
  Loaded loaded = load_tiny("lockstep-choose-first");
  SessionOptions recording;
  recording.record_attention_logits = true;
  for (const PolicyConfig& config : mixed_policies()) {
    INFO(config.id);
    DecoderSession first(loaded.model), every_column(loaded.model, recording);
    first.set_policy(make_policy(config, first.policy_shape(), *loaded.backend));
    every_column.set_policy(make_policy(config, every_column.policy_shape(), *loaded.backend));
    for (const int32_t token : kTokens) CHECK(first.step(token) == every_column.step(token));
  }
}
