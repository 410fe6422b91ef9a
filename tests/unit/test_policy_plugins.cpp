// Policy plug-ins (include/kvlens/policy_plugin.h, engine/policy/plugin_policy.h): the example C
// plug-ins (examples/policies) give the built-ins' visible sets bit for bit in lockstep with
// them over co-reference samples on the demo model, and every bad plug-in is one clear error
// naming it: another ABI version, a missing symbol or function, a bad name or knob, a set of the
// wrong size, NaN scores, a failure on one step.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/common/error.h"
#include "engine/eval/coref_benchmark.h"
#include "engine/eval/coref_pools.h"
#include "engine/model/model.h"
#include "engine/policy/plugin_policy.h"
#include "engine/policy/registry.h"
#include "engine/session/decoder_session.h"
#include "engine/session/scoring.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;

namespace {

std::string example_plugin(const std::string& name) {
  return std::string(KVLENS_EXAMPLE_PLUGIN_DIR) + "/libkvlens_" + name + "_c.so";
}

struct Demo {
  std::unique_ptr<Backend> backend;
  std::shared_ptr<const Model> model;
  std::shared_ptr<const BackendModel> resident;
};

Demo load_demo() {
  Demo demo;
  CpuBackendOptions options;
  options.threads = 2;
  demo.backend = make_cpu_backend(options);
  demo.model = Model::load(test::source_path("assets/models/demo"));
  demo.resident = upload_model(demo.model, *demo.backend);
  return demo;
}

// Runs `policies` in lockstep over the tokens and checks, after every step, that each pair
// (built-in, plug-in) made the same decisions, saw the same visible sets and recorded the same
// scores, and that the step's output logits are the same.
void check_pairs_identical(const Demo& demo, const std::vector<int32_t>& tokens,
                           const std::vector<PolicyConfig>& policies) {
  DecoderSession session(demo.resident, {}, int64_t(policies.size()));
  for (size_t r = 0; r < policies.size(); ++r) {
    if (auto policy = make_run_policy(policies[r], session.policy_shape(), *demo.backend))
      session.set_policy(int64_t(r), std::move(policy));
  }
  const ModelConfig& c = demo.resident->config();
  int64_t masked = 0;
  for (const int32_t token : tokens) {
    const DeviceTensor& logits = session.forward(std::span<const int32_t>(&token, 1));
    const int64_t cols = session.position(), vocab = c.vocab_size;
    for (size_t r = 0; r + 1 < policies.size(); r += 2) {
      INFO("pair " << policies[r].id << " / " << policies[r + 1].id << " at step " << cols - 1);
      const SessionRun& builtin = session.run(int64_t(r));
      const SessionRun& plugin = session.run(int64_t(r + 1));
      REQUIRE(builtin.decisions == plugin.decisions);
      for (int64_t l = 0; l < c.num_layers; ++l) {
        if (builtin.decisions[size_t(l)] != LayerDecision::Masked) continue;
        ++masked;
        const int64_t stride = builtin.visible[size_t(l)].dim(1);
        for (int64_t h = 0; h < c.num_heads; ++h) {
          const uint8_t* a = builtin.visible[size_t(l)].as<uint8_t>() + h * stride;
          const uint8_t* b = plugin.visible[size_t(l)].as<uint8_t>() + h * stride;
          INFO("layer " << l << " head " << h);
          REQUIRE(std::memcmp(a, b, size_t(cols)) == 0);
          const float* sa = builtin.scores[size_t(l)].as<float>() + h * stride;
          const float* sb = plugin.scores[size_t(l)].as<float>() + h * stride;
          REQUIRE(std::memcmp(sa, sb, size_t(cols) * sizeof(float)) == 0);
        }
      }
      const float* row = logits.as<float>();
      REQUIRE(std::memcmp(row + int64_t(r) * vocab, row + int64_t(r + 1) * vocab,
                          size_t(vocab) * sizeof(float)) == 0);
    }
  }
  CHECK(masked > 0);  // the comparison saw selections, not only dense layers
}

// A plug-in table made in the test, its functions plain C-compatible lambdas.
kvlens_policy_plugin test_table(const char* name) {
  kvlens_policy_plugin table{};
  table.abi_version = KVLENS_POLICY_ABI_VERSION;
  table.struct_size = sizeof table;
  table.name = name;
  table.family = "test";
  table.rule = "A test plug-in.";
  table.memories = KVLENS_ACCEPTS_HOST;
  table.create = [](const kvlens_model_shape*, const double*, char*, size_t) -> void* {
    static int state;
    return &state;
  };
  table.destroy = [](void*) {};
  table.select = [](void*, const kvlens_step*, kvlens_answer*, char*, size_t) -> int32_t {
    return KVLENS_SCORES;
  };
  return table;
}

// Steps a tiny model with `id` at sparsity 0.5 over 12 tokens; returns the error's message or "".
std::string run_tiny(const std::string& id) {
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("plugin-" + id), {});
  auto backend = make_cpu_backend(1);
  const auto resident = upload_model(Model::load(dir), *backend);
  ScoreOptions options;
  options.policy = {id, 0.5, {"dense_layers=0", "sinks=1"}};
  const std::vector<int32_t> tokens = {1, 5, 9, 2, 33, 7, 7, 12, 40, 3, 8, 61};
  try {
    score_tokens(resident, tokens, options);
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the C plug-ins h2o, quest and tokenbutler give the built-ins' visible sets",
          "[plugin]") {
  for (const char* name : {"h2o", "quest", "tokenbutler"}) load_policy_plugin(example_plugin(name));
  const Demo demo = load_demo();
  REQUIRE(demo.resident->predictor);
  const CorefPools pools = load_bundled_coref_pools();
  // Query-head selection at two sparsities, then KV-head selection with other knobs.
  const std::vector<std::vector<std::string>> knob_sets = {{}, {"granularity=kv_head", "window=3"}};
  for (size_t k = 0; k < knob_sets.size(); ++k) {
    for (const double sparsity : {0.5, 0.8}) {
      std::vector<PolicyConfig> policies;
      for (const char* id : {"h2o", "quest", "tokenbutler"}) {
        policies.push_back({id, sparsity, knob_sets[k]});
        policies.push_back({std::string(id) + "_c", sparsity, knob_sets[k]});
      }
      for (int64_t index = 0; index < 2; ++index) {
        const CorefSample sample = generate_coref_sample(pools, 7, index + 3 * int64_t(k), false);
        const CorefTokens marked = mark_answer_tokens(sample, *demo.model->tokenizer);
        INFO("sample " << index << " sparsity " << sparsity << " knobs " << k);
        check_pairs_identical(demo, marked.tokens, policies);
      }
    }
  }
}

TEST_CASE("a plug-in is listed with its rule, family, knobs and file", "[plugin]") {
  // Loaded before anything read the list (as kvlens-cli does): listed once.
  const PolicyInfo& info = load_policy_plugin(example_plugin("quest"));
  CHECK(std::count_if(policy_infos().begin(), policy_infos().end(),
                      [](const PolicyInfo& listed) { return listed.id == "quest_c"; }) == 1);
  CHECK(info.id == "quest_c");
  CHECK(info.description.find("upper bound") != std::string::npos);
  CHECK(policy_source("quest_c") == example_plugin("quest"));
  CHECK(policy_source("quest").empty());
  bool page_size = false, dense_layers_two = false;
  for (const ParamSpec& spec : info.params) {
    page_size = page_size || (spec.name == "page_size" && spec.default_value == "16");
    dense_layers_two =
        dense_layers_two || (spec.name == "dense_layers" && spec.default_value == "2");
  }
  CHECK(page_size);
  CHECK(dense_layers_two);  // a common knob's default set by the plug-in
  // Loading the same file again registers nothing new.
  const size_t count = policy_infos().size();
  load_policy_plugin(example_plugin("quest"));
  CHECK(policy_infos().size() == count);
  CHECK(find_policy_info("no_such_policy") == nullptr);
  CHECK(load_policy_plugin(example_plugin("tokenbutler")).predicts_logits);
}

TEST_CASE("loading a bad plug-in file is one error naming the file", "[plugin]") {
  CHECK_THROWS_WITH(load_policy_plugin("/nonexistent/plugin.so"),
                    Catch::Contains("/nonexistent/plugin.so") && Catch::Contains("no such file"));
  const std::string text = test::make_temp_dir("plugin-text") + "/not_a_library.so";
  std::ofstream(text) << "not an ELF file\n";
  CHECK_THROWS_WITH(load_policy_plugin(text), Catch::Contains(text) && Catch::Contains("load"));
  // A real library without the entry point.
  std::string libm;
  for (const char* candidate :
       {"/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib64/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6"}) {
    if (std::ifstream(candidate).good()) libm = candidate;
  }
  if (!libm.empty()) {
    CHECK_THROWS_WITH(load_policy_plugin(libm), Catch::Contains(libm) &&
                                                    Catch::Contains(KVLENS_POLICY_ENTRY) &&
                                                    Catch::Contains("missing"));
  }
}

TEST_CASE("a plug-in description is checked before it is registered", "[plugin]") {
  kvlens_policy_plugin table = test_table("checked_plugin");
  table.abi_version = 99;
  CHECK_THROWS_WITH(
      register_plugin_policy(&table, "test.so", nullptr),
      Catch::Contains("test.so") && Catch::Contains("abi_version") && Catch::Contains("99"));
  table = test_table("checked_plugin");
  table.select = nullptr;
  CHECK_THROWS_WITH(register_plugin_policy(&table, "test.so", nullptr), Catch::Contains("select"));
  table = test_table("Bad Name");
  CHECK_THROWS_WITH(register_plugin_policy(&table, "test.so", nullptr), Catch::Contains("name"));
  table = test_table("h2o");
  CHECK_THROWS_WITH(register_plugin_policy(&table, "test.so", nullptr),
                    Catch::Contains("built-in"));
  table = test_table("checked_plugin");
  table.needs = KVLENS_NEEDS_PROBABILITIES;  // without observe
  CHECK_THROWS_WITH(register_plugin_policy(&table, "test.so", nullptr), Catch::Contains("observe"));
  static const kvlens_param bad_range[] = {
      {"alpha", KVLENS_PARAM_FLOAT, "a knob", 2.0, 0.0, 1.0, nullptr, 0}};
  table = test_table("checked_plugin");
  table.params = bad_range;
  table.param_count = 1;
  CHECK_THROWS_WITH(register_plugin_policy(&table, "test.so", nullptr),
                    Catch::Contains("params[alpha].default_value"));
  static const kvlens_param wrong_type[] = {
      {"sinks", KVLENS_PARAM_FLOAT, "sinks", 1.0, 0.0, 8.0, nullptr, 0}};
  table.params = wrong_type;
  CHECK_THROWS_WITH(register_plugin_policy(&table, "test.so", nullptr), Catch::Contains("sinks"));
}

TEST_CASE("NaN or infinite scores end the run with an error naming the plug-in and the step",
          "[plugin]") {
  static kvlens_policy_plugin table = test_table("nan_scores");
  table.select = [](void*, const kvlens_step* step, kvlens_answer* answer, char*,
                    size_t) -> int32_t {
    if (step->step == 6) answer->scores[step->cols - 1] = std::nanf("");
    return KVLENS_SCORES;
  };
  register_plugin_policy(&table, "nan.so", nullptr);
  const std::string message = run_tiny("nan_scores");
  CHECK(message.find("nan_scores (nan.so)") != std::string::npos);
  CHECK(message.find("step 6") != std::string::npos);
  CHECK(message.find("finite") != std::string::npos);
}

TEST_CASE("a visible set too large or without the current token is an error", "[plugin]") {
  static kvlens_policy_plugin everything = test_table("too_many");
  everything.needs = KVLENS_ANSWERS_VISIBLE;
  everything.select = [](void*, const kvlens_step* step, kvlens_answer* answer, char*,
                         size_t) -> int32_t {
    std::memset(answer->visible, 1, size_t(step->cols));  // head 0 sees every column
    return KVLENS_VISIBLE;
  };
  register_plugin_policy(&everything, "big.so", nullptr);
  std::string message = run_tiny("too_many");
  CHECK(message.find("too_many (big.so)") != std::string::npos);
  CHECK(message.find("at most") != std::string::npos);

  static kvlens_policy_plugin empty = test_table("no_current");
  empty.needs = KVLENS_ANSWERS_VISIBLE;
  empty.select = [](void*, const kvlens_step*, kvlens_answer*, char*, size_t) -> int32_t {
    return KVLENS_VISIBLE;  // nothing marked
  };
  register_plugin_policy(&empty, "empty.so", nullptr);
  message = run_tiny("no_current");
  CHECK(message.find("without the current token") != std::string::npos);

  // A visible set from a plug-in that did not say it answers with one.
  static kvlens_policy_plugin undeclared = test_table("undeclared_visible");
  undeclared.select = [](void*, const kvlens_step*, kvlens_answer* answer, char*,
                         size_t) -> int32_t {
    return answer->visible == nullptr ? KVLENS_VISIBLE : KVLENS_FAILED;
  };
  register_plugin_policy(&undeclared, "undeclared.so", nullptr);
  CHECK(run_tiny("undeclared_visible").find("KVLENS_ANSWERS_VISIBLE") != std::string::npos);
}

TEST_CASE("a plug-in that fails on one step stops its run with its message, and kvlens goes on",
          "[plugin]") {
  static kvlens_policy_plugin table = test_table("fails_once");
  table.select = [](void*, const kvlens_step* step, kvlens_answer*, char* error,
                    size_t size) -> int32_t {
    if (step->step != 5) return KVLENS_SCORES;
    std::snprintf(error, size, "out of ideas at %lld", static_cast<long long>(step->step));
    return KVLENS_FAILED;
  };
  register_plugin_policy(&table, "fails.so", nullptr);
  const std::string message = run_tiny("fails_once");
  CHECK(message.find("fails_once (fails.so)") != std::string::npos);
  CHECK(message.find("out of ideas at 5") != std::string::npos);
  // The registry and other runs are unharmed.
  CHECK(run_tiny("h2o").empty());

  static kvlens_policy_plugin refuses = test_table("refuses");
  refuses.create = [](const kvlens_model_shape*, const double*, char* error, size_t size) -> void* {
    std::snprintf(error, size, "this model is too small");
    return nullptr;
  };
  register_plugin_policy(&refuses, "refuses.so", nullptr);
  CHECK(run_tiny("refuses").find("this model is too small") != std::string::npos);
}

TEST_CASE("kvlens-cli --plugin runs a plug-in and reports a bad one in one line", "[plugin][cli]") {
  const std::string cli = test::cli_path();
  const std::string out = test::make_temp_dir("plugin-cli") + "/out.txt";
  const std::string model = test::source_path("assets/models/demo");
  const std::string ok = cli + " eval --model " + model +
                         " --task coref --samples 2 --policies h2o,h2o_c --sparsity 0.5 --plugin " +
                         example_plugin("h2o") + " --json " + out + ".json > " + out + " 2>&1";
  REQUIRE(std::system(ok.c_str()) == 0);
  std::ifstream in(out);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(text.find("h2o_c") != std::string::npos);
  // The JSON names the file a plug-in's results came from.
  std::ifstream json_in(out + ".json");
  const std::string json((std::istreambuf_iterator<char>(json_in)),
                         std::istreambuf_iterator<char>());
  CHECK(json.find("\"plugin\": \"" + example_plugin("h2o") + "\"") != std::string::npos);
  const std::string bad = cli + " policies --plugin /nonexistent/x.so > " + out + " 2>&1";
  CHECK(std::system(bad.c_str()) != 0);
  std::ifstream again(out);
  const std::string error((std::istreambuf_iterator<char>(again)),
                          std::istreambuf_iterator<char>());
  CHECK(error.find("/nonexistent/x.so") != std::string::npos);
  CHECK(std::count(error.begin(), error.end(), '\n') == 1);
  // A bad file in a plug-in folder is a warning; the command still runs.
  const std::string folder = test::make_temp_dir("plugin-folder");
  std::ofstream(folder + "/broken.so") << "not a library";
  const std::string listed =
      "KVLENS_PLUGIN_PATH=" + folder + " " + cli + " policies > " + out + " 2>&1";
  CHECK(std::system(listed.c_str()) == 0);
  std::ifstream listing(out);
  const std::string all((std::istreambuf_iterator<char>(listing)),
                        std::istreambuf_iterator<char>());
  CHECK(all.find("warning") != std::string::npos);
  CHECK(all.find("broken.so") != std::string::npos);
}

TEST_CASE("the keynorm example keeps the smallest-norm keys beyond the forced tokens", "[plugin]") {
  load_policy_plugin(example_plugin("keynorm"));
  const Demo demo = load_demo();
  const ModelConfig& c = demo.resident->config();
  DecoderSession session(demo.resident);
  // No sinks, no window: every visible column but the current one was chosen by its key's norm.
  session.set_policy(
      make_run_policy({"keynorm", 0.5, {"sinks=0"}}, session.policy_shape(), *demo.backend));
  const std::vector<int32_t> tokens = {1, 40, 312, 77, 9, 1024, 55, 18, 600, 7, 31, 2048, 5, 88};
  for (const int32_t token : tokens) session.forward(std::span<const int32_t>(&token, 1));
  const SessionRun& run = session.run(0);
  const int64_t cols = session.position(), t = cols - 1, group = c.num_heads / c.num_kv_heads;
  int64_t checked = 0;
  for (int64_t l = 1; l < c.num_layers; ++l) {
    REQUIRE(run.decisions[size_t(l)] == LayerDecision::Masked);
    const int64_t stride = run.visible[size_t(l)].dim(1);
    const float* keys = run.k_cache[size_t(l)].as<float>();
    for (int64_t h = 0; h < c.num_heads; ++h) {
      const uint8_t* visible = run.visible[size_t(l)].as<uint8_t>() + h * stride;
      auto norm = [&](int64_t j) {
        double sum = 0;
        for (int64_t d = 0; d < c.head_dim; ++d) {
          const double x = keys[((h / group) * stride + j) * c.head_dim + d];
          sum += x * x;
        }
        return sum;
      };
      double largest_kept = 0, smallest_hidden = 1e300;
      for (int64_t j = 0; j < t; ++j) {
        if (visible[j])
          largest_kept = std::max(largest_kept, norm(j));
        else
          smallest_hidden = std::min(smallest_hidden, norm(j));
      }
      CHECK(visible[t] == 1);
      CHECK(largest_kept <= smallest_hidden);
      ++checked;
    }
  }
  CHECK(checked == (c.num_layers - 1) * c.num_heads);
}

TEST_CASE("a shared answer gives every head of a layer one set, by the scores summed over heads",
          "[plugin]") {
  // Head h scores column j by (j * (h + 1)) % 7: no head alone ranks as the sum does.
  static kvlens_policy_plugin table = test_table("shared_sum");
  table.select = [](void*, const kvlens_step* step, kvlens_answer* answer, char*,
                    size_t) -> int32_t {
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t j = 0; j < step->cols; ++j)
        answer->scores[h * step->stride + j] = float((j * (h + 1)) % 7);
    answer->shared = 1;
    return KVLENS_SCORES;
  };
  register_plugin_policy(&table, "shared.so", nullptr);
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("plugin-shared"), {});
  auto backend = make_cpu_backend(1);
  const auto resident = upload_model(Model::load(dir), *backend);
  const ModelConfig& c = resident->config();
  REQUIRE(c.num_heads == 4);
  DecoderSession session(resident);
  session.set_policy(
      make_run_policy({"shared_sum", 0.5, {"sinks=0"}}, session.policy_shape(), *backend));
  for (const int32_t token : {1, 5, 9, 2, 33, 7, 7, 12, 40, 3, 8, 61})
    session.forward(std::span<const int32_t>(&token, 1));
  const SessionRun& run = session.run(0);
  const int64_t cols = session.position(), t = cols - 1;
  const int64_t stride = run.visible[1].dim(1);
  const uint8_t* visible = run.visible[1].as<uint8_t>();
  for (int64_t h = 1; h < 4; ++h)
    CHECK(std::memcmp(visible, visible + h * stride, size_t(cols)) == 0);
  // Beyond the current token, every kept column sums at least as high as every hidden one.
  auto sum = [](int64_t j) { return (j % 7) + (2 * j % 7) + (3 * j % 7) + (4 * j % 7); };
  int64_t lowest_kept = 1 << 30, highest_hidden = -1;
  for (int64_t j = 0; j < t; ++j) {
    if (visible[j])
      lowest_kept = std::min<int64_t>(lowest_kept, sum(j));
    else
      highest_hidden = std::max<int64_t>(highest_hidden, sum(j));
  }
  CHECK(visible[t] == 1);
  CHECK(lowest_kept >= highest_hidden);
}
