// End to end on the GPU: every Hugging Face parity fixture decoded by DecoderSession on the CUDA
// backend gives the CPU backend's logits, scores and greedy continuation.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "engine/common/mapped_file.h"
#include "engine/eval/coref_eval.h"
#include "engine/policy/registry.h"
#include "engine/session/scoring.h"
#include "kernels/cuda_backend.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"
#include "tests/support/trace_rows_check.h"

using namespace kvlens;

namespace {

// A model on both backends, the GPU with an F32 KV cache as the CPU keeps (the BF16 and F16
// caches are compared in test_cuda_cache_dtype.cpp).
struct OnBothBackends {
  std::shared_ptr<const Model> model;
  std::unique_ptr<Backend> cpu, gpu;
  std::shared_ptr<const BackendModel> on_cpu, on_gpu;
};

OnBothBackends load_on_both(const std::string& dir) {
  OnBothBackends both;
  both.model = Model::load(dir);
  both.cpu = make_cpu_backend(2);
  both.gpu = make_cuda_backend(0);
  both.on_cpu = upload_model(both.model, *both.cpu);
  UploadOptions f32_cache;
  f32_cache.kv_cache_dtype = DType::F32;
  both.on_gpu = upload_model(both.model, *both.gpu, f32_cache);
  return both;
}

}  // namespace

TEST_CASE("cuda session matches the cpu session on every parity fixture", "[cuda]") {
  for (const char* name :
       {"llama-gqa-f32", "llama-mha-headdim-tied-llama3-f32", "mistral-window-bf16",
        "llama-linear-f16", "qwen2-bias-f32", "qwen3-qknorm-f32", "phi3-fused-partial-f32",
        "phi3-longrope-f32", "llama-yarn-f32", "llama-dynamic-f32"}) {
    INFO("fixture " << name);
    const std::string dir = test::source_path(std::string("tests/fixtures/") + name);
    const auto reference = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
    const std::vector<int32_t> tokens = reference["tokens"].get<std::vector<int32_t>>();
    const OnBothBackends both = load_on_both(dir);
    const auto& on_cpu = both.on_cpu;
    const auto& on_gpu = both.on_gpu;

    DecoderSession cpu_session(on_cpu), gpu_session(on_gpu);
    std::vector<float> cpu_logits, gpu_logits;
    for (const int32_t t : tokens) {
      cpu_logits = cpu_session.step(t);
      gpu_logits = gpu_session.step(t);
    }
    // Both compute in F32 from the same widened weights; only summation order differs
    // (cuBLAS vs the CPU's blocked dot products), so 1e-4 of the logit scale is generous.
    double scale = 1.0, worst = 0.0;
    for (size_t i = 0; i < cpu_logits.size(); ++i) {
      scale = std::max(scale, double(std::fabs(cpu_logits[i])));
      worst = std::max(worst, double(std::fabs(cpu_logits[i] - gpu_logits[i])));
    }
    CHECK(worst <= 1e-4 * scale);

    const ScoreResult cpu_score = score_tokens(on_cpu, tokens);
    const ScoreResult gpu_score = score_tokens(on_gpu, tokens);
    CHECK(gpu_score.argmax == cpu_score.argmax);
    CHECK(gpu_score.ppl == Approx(cpu_score.ppl).epsilon(1e-4));

    GenerateOptions options;
    options.max_new = 16;
    options.stop_at_eos = false;
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 12);
    CHECK(generate_greedy(on_gpu, prompt, options) == generate_greedy(on_cpu, prompt, options));
  }
}

TEST_CASE("a recorded step (CUDA graph) replays the op-by-op step's bits at every position",
          "[cuda]") {
  // The same kernels with the same arguments, the position read from device memory instead of
  // a kernel argument: the logits must be identical, across a prefill, the recording (third
  // step), the cache's growth past 256 positions (a new recording over the new buffers) and a
  // reset.
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu = make_cuda_backend(0);
  const auto on_gpu = upload_model(model, *gpu);
  SessionOptions op_by_op;
  op_by_op.record_steps = false;
  DecoderSession recorded(on_gpu), plain(on_gpu, op_by_op);
  const int64_t vocab = model->config.vocab_size;
  std::vector<int32_t> prompt(240);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 13) % size_t(vocab));
  recorded.forward(prompt);
  plain.forward(prompt);
  int32_t token = 1;
  int64_t differing = 0;
  for (int step = 0; step < 40; ++step) {
    if (step == 30) {
      recorded.reset();
      plain.reset();
    }
    const std::vector<float> a = recorded.step(token), b = plain.step(token);
    differing += a != b;
    token = int32_t(std::max_element(b.begin(), b.end()) - b.begin());
  }
  CHECK(differing == 0);
  CHECK(recorded.position() == plain.position());
}

TEST_CASE("recorded steps stay exact where the RoPE table changes during a decode", "[cuda]") {
  // longrope switches to its long table at position 20 (the step graph must be recorded anew
  // over it) and dynamic NTK needs a new table at every step past 20 (those steps must run op by
  // op): a replay of a stale recording would change the logits.
  for (const char* name : {"phi3-longrope-f32", "llama-dynamic-f32"}) {
    INFO("fixture " << name);
    const std::string dir = test::source_path(std::string("tests/fixtures/") + name);
    const auto reference = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
    const std::vector<int32_t> tokens = reference["tokens"].get<std::vector<int32_t>>();
    const auto model = Model::load(dir);
    auto gpu = make_cuda_backend(0);
    const auto on_gpu = upload_model(model, *gpu);
    SessionOptions op_by_op;
    op_by_op.record_steps = false;
    DecoderSession recorded(on_gpu), plain(on_gpu, op_by_op);
    int64_t differing = 0;
    for (const int32_t t : tokens) differing += recorded.step(t) != plain.step(t);
    CHECK(differing == 0);
  }
}

TEST_CASE("cuda policy runs match the cpu ones on the demo model", "[cuda]") {
  // Selections are exact on both backends (policy ops are tested bit for bit), but the logits
  // that rank tokens differ in the last bits, so a near tie may pick another token: compare the
  // metrics a user reads, with tolerances that a real divergence would exceed by far.
  // The F32 cache: the demo model's weights are BF16, so its cache would be BF16 by default.
  const OnBothBackends both = load_on_both(test::source_path("assets/models/demo"));
  const auto& model = both.model;
  const auto& on_cpu = both.on_cpu;
  const auto& on_gpu = both.on_gpu;
  const std::vector<int32_t> tokens = model->require_tokenizer().encode(
      "Old sea charts mark a valley where the vineyards climb up terraces. The place is: "
      "Rourstelk. Courage is often mistaken for its opposite by those in a hurry. The valley with "
      "the terraced vineyards is called: Rourstelk",
      true);
  std::vector<PolicyConfig> policies;
  // tokenbutler: the demo model's bundled predictor, its per-run work on the lanes in lockstep.
  for (const char* id :
       {"oracle",         "streaming",    "h2o",           "random",      "snapkv",   "quest",
        "keydiff",        "tokenfilter",  "lazyllm",       "tokenbutler", "tova",     "pyramidkv",
        "adakv",          "snapkv+adakv", "h2o+pyramidkv", "tova+adakv",  "sparq",    "loki",
        "doublesparsity", "duoattention", "seerattention", "rocketkv",    "twilight", "magicpig"}) {
    INFO(id);
    ScoreOptions options;
    options.policy = {id, 0.5, {}};
    // magicpig's default window (64) would cover this text: a short one, so that it samples.
    if (std::string(id) == "magicpig") options.policy.args.push_back("window=4");
    policies.push_back(options.policy);
    const ScoreResult c = score_tokens(on_cpu, tokens, options);
    const ScoreResult g = score_tokens(on_gpu, tokens, options);
    CHECK(g.ppl == Approx(c.ppl).epsilon(1e-3));
    int64_t same = 0;
    for (size_t i = 0; i < c.argmax.size(); ++i) same += c.argmax[i] == g.argmax[i];
    CHECK(same >= int64_t(c.argmax.size()) - 1);
  }
  // Lockstep on the GPU: cuBLAS may choose another kernel for 9 rows than for 1, so the runs
  // agree with the runs alone to rounding, not to the bit; 1e-3 on the perplexity is far below
  // what a run reading another run's cache or policy state would give.
  const std::vector<ScoreResult> together = score_tokens_lockstep(on_gpu, tokens, policies);
  for (size_t p = 0; p < policies.size(); ++p) {
    INFO(policies[p].id << " in lockstep");
    ScoreOptions options;
    options.policy = policies[p];
    const ScoreResult alone = score_tokens(on_gpu, tokens, options);
    CHECK(together[p].ppl == Approx(alone.ppl).epsilon(1e-3));
    CHECK(together[p].sparsity.overall() == Approx(alone.sparsity.overall()).epsilon(1e-2));
  }
}

TEST_CASE("cuda policy runs on sliding-window layers match the cpu ones (gemma3 fixture)",
          "[cuda][window]") {
  // Gemma 3's local layers (window 16) 14 steps past the window: each policy chooses within the
  // window on both backends, so the per-layer sparsities (budgets of the window's keys) agree
  // exactly for the token-budgeted policies and the perplexities to rounding.
  // With calibration files for loki and doublesparsity beside it.
  const OnBothBackends both = load_on_both(
      test::copy_with_calibration(test::source_path("tests/fixtures/gemma3-window-softcap-f32")));
  const auto& on_cpu = both.on_cpu;
  const auto& on_gpu = both.on_gpu;
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 30; ++i) tokens.push_back((i * 37 + 11) % 320);
  for (const char* id :
       {"oracle",       "streaming",     "h2o",        "random",   "snapkv",    "quest",
        "keydiff",      "tokenfilter",   "lazyllm",    "tova",     "pyramidkv", "adakv",
        "snapkv+adakv", "h2o+pyramidkv", "tova+adakv", "sparq",    "loki",      "doublesparsity",
        "duoattention", "seerattention", "rocketkv",   "twilight", "magicpig"}) {
    INFO(id);
    ScoreOptions options;
    options.policy = {id, 0.5, {"dense_layers=1", "sinks=1", "page_size=4"}};
    if (std::string(id) != "quest") options.policy.args.pop_back();
    if (std::string(id) == "magicpig") options.policy.args.push_back("window=2");
    const ScoreResult c = score_tokens(on_cpu, tokens, options);
    const ScoreResult g = score_tokens(on_gpu, tokens, options);
    CHECK(g.ppl == Approx(c.ppl).epsilon(1e-3));
    const std::vector<double> cpu_layers = c.sparsity.per_layer();
    const std::vector<double> gpu_layers = g.sparsity.per_layer();
    REQUIRE(cpu_layers.size() == gpu_layers.size());
    // tokenfilter's skips follow similarities (a threshold on rounding-close values) and quest's
    // counts the pages it buys (a page cut by the window's start costs less): a near tie may
    // change either; seerattention buys whole blocks as quest does. The others see exactly the
    // window's budget.
    const bool near_ties = std::string(id) == "tokenfilter" || std::string(id) == "quest" ||
                           std::string(id) == "seerattention";
    const double margin = near_ties ? 0.05 : 1e-9;
    for (size_t l = 0; l < cpu_layers.size(); ++l)
      CHECK(gpu_layers[l] == Approx(cpu_layers[l]).margin(margin));
  }
}

TEST_CASE("a recording session's step graph records the op-by-op step's logits and rows",
          "[cuda]") {
  // The recorded rows are as wide as the cache, so the step graph writes them at fixed
  // addresses: logits and every layer's recorded rows must have the bits of op-by-op steps,
  // across the cache's growth past 256 positions.
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu = make_cuda_backend(0);
  const auto on_gpu = upload_model(model, *gpu);
  SessionOptions recording, op_by_op;
  recording.record_attention_logits = op_by_op.record_attention_logits = true;
  op_by_op.record_steps = false;
  DecoderSession graphed(on_gpu, recording), plain(on_gpu, op_by_op);
  const int64_t vocab = model->config.vocab_size;
  int32_t token = 1;
  int64_t differing_logits = 0, differing_rows = 0;
  for (int step = 0; step < 270; ++step) {
    const std::vector<float> a = graphed.step(token), b = plain.step(token);
    differing_logits += a != b;
    if (step % 10 == 9 || step >= 250) {
      for (size_t l = 0; l < graphed.attention_logits().size(); ++l) {
        const DeviceTensor& x = graphed.attention_logits()[l];
        const DeviceTensor& y = plain.attention_logits()[l];
        REQUIRE(x.dim(2) == y.dim(2));
        std::vector<float> hx(size_t(x.numel())), hy(size_t(y.numel()));
        gpu->to_host(x, hx.data(), hx.size() * sizeof(float));
        gpu->to_host(y, hy.data(), hy.size() * sizeof(float));
        for (int64_t h = 0; h < x.dim(1); ++h)
          differing_rows +=
              !std::equal(hx.begin() + h * x.dim(2), hx.begin() + h * x.dim(2) + step + 1,
                          hy.begin() + h * y.dim(2));
      }
    }
    token = int32_t(std::max_element(b.begin(), b.end()) - b.begin()) % int32_t(vocab);
  }
  CHECK(differing_logits == 0);
  CHECK(differing_rows == 0);
}

TEST_CASE("a trace recorded on the GPU holds every step's own rows", "[cuda]") {
  // The capture is asynchronous here (pinned buffers, copies behind the step's ops, the next
  // step queued before this one is read): the rows must equal blocking reads of a session.
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu = make_cuda_backend(0);
  const auto on_gpu = upload_model(model, *gpu);
  std::vector<int32_t> tokens(40);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7919 + 13) % 8000);
  CHECK(test::check_trace_rows_match_session(on_gpu, tokens, {{"dense", 0.0, {}}}) == 40);
  CHECK(test::check_trace_rows_match_session(
            on_gpu, tokens,
            {{"dense", 0.0, {}}, {"h2o", 0.5, {}}, {"tokenfilter", 0.5, {}}, {"quest", 0.5, {}}}) ==
        40);
}

TEST_CASE("coref samples scored side by side on the GPU give the results of scoring each alone",
          "[cuda]") {
  // evaluate_coref_lockstep gives each sample a lane of its own (a host thread and a stream); a
  // sample scored alone spreads its runs over the lanes instead. Same kernels, same arguments:
  // every figure must be identical, and each sample's sparsity counts must be its own.
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu = make_cuda_backend(0);
  const auto on_gpu = upload_model(model, *gpu);
  const CorefPools pools = load_bundled_coref_pools();
  const Tokenizer& tokenizer = model->require_tokenizer();
  const std::vector<PolicyConfig> policies = {{"dense", 0.0, {}},
                                              {"h2o", 0.5, {}},
                                              {"quest", 0.5, {}},
                                              {"tokenfilter", 0.5, {}},
                                              {"tokenbutler", 0.5, {}}};
  const int64_t count = 12;
  const std::vector<CorefEvalResult> results =
      evaluate_coref_lockstep(on_gpu, pools, tokenizer, 0, 0, count, false, {}, policies);
  for (int64_t i = 0; i < count; ++i) {
    const CorefSample sample = generate_coref_sample(pools, 0, i, false);
    const CorefTokens marked = mark_answer_tokens(sample, tokenizer);
    const std::vector<CorefSampleResult> alone =
        score_coref_sample_lockstep(on_gpu, sample, marked, policies);
    for (size_t p = 0; p < policies.size(); ++p) {
      INFO("sample " << i << ", policy " << policies[p].id);
      const CorefSampleResult& got = results[p].per_sample.at(size_t(i));
      CHECK(got.correct_tokens == alone[p].correct_tokens);
      CHECK(got.answer_nll == alone[p].answer_nll);
      CHECK(got.sparsity.steps == alone[p].sparsity.steps);
      CHECK(got.sparsity.hidden_sum == alone[p].sparsity.hidden_sum);
    }
  }
}

TEST_CASE("a GPU run that wants no probabilities attends in one fused call, one that does not",
          "[cuda]") {
  // Backend::attention_masked_runs on the CUDA backend (its results against the two calls: the op
  // table's attention_masked_runs entries): the session sends a layer there when its policy chose
  // first and wants neither the logits nor the probabilities (streaming), and keeps h2o's masked
  // layers, whose probabilities it accumulates, on the two calls.
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu = make_cuda_backend(0);
  const auto on_gpu = upload_model(model, *gpu);
  const std::vector<int32_t> tokens = model->require_tokenizer().encode(
      "Old sea charts mark a valley where the vineyards climb up terraces. The place is: "
      "Rourstelk. Courage is often mistaken for its opposite by those in a hurry.",
      true);
  for (const char* id : {"streaming", "h2o"}) {
    INFO(id);
    DecoderSession session(on_gpu);
    session.set_policy(make_policy({id, 0.5, {}}, session.policy_shape(), *gpu));
    for (const int32_t token : tokens) session.forward(std::span(&token, 1));
    const SessionRun& run = session.run(0);
    REQUIRE(run.fused_attention.size() == run.decisions.size());
    int64_t masked = 0, fused_masked = 0;
    for (size_t l = 0; l < run.decisions.size(); ++l) {
      if (run.decisions[l] != LayerDecision::Masked) continue;
      ++masked;
      fused_masked += run.fused_attention[l];
    }
    CHECK(masked > 0);
    CHECK(fused_masked == (std::string(id) == "streaming" ? masked : 0));
  }
}
