// kvlens-cli as scripts use it: JSON shapes of info/score, generate's ids, and one clear
// stderr message with a non-zero exit for each kind of bad input.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/session/scoring.h"
#include "engine/trace/trace.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using test::run_command;

namespace {

std::string cli() {
  return test::cli_path();
}

std::string tiny_model(test::TinyLlamaSpec spec = {}) {
  return test::write_tiny_llama(test::make_temp_dir("cli"), spec);
}

// Runs the CLI and checks it failed with one message naming each of `parts`.
void require_failure(const std::string& args, const std::vector<std::string>& parts) {
  const test::CommandResult result = run_command(cli() + " " + args);
  INFO("args: " << args << "\nstderr: " << result.err);
  REQUIRE(result.exit_code != 0);
  REQUIRE(result.exit_code < 128);  // an error exit, not a signal
  REQUIRE(result.err.find("kvlens-cli: error:") != std::string::npos);
  for (const std::string& part : parts) CHECK(result.err.find(part) != std::string::npos);
}

}  // namespace

TEST_CASE("info prints the validated config as JSON", "[cli]") {
  test::TinyLlamaSpec spec;
  spec.head_dim = 12;
  const std::string dir = tiny_model(spec);
  const auto result = run_command(cli() + " info --model " + dir);
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto info = nlohmann::json::parse(result.out);
  CHECK(info["model_type"] == "llama");
  CHECK(info["num_hidden_layers"] == spec.layers);
  CHECK(info["num_key_value_heads"] == spec.kv_heads);
  CHECK(info["head_dim"] == 12);
  CHECK(info["tokenizer"].is_null());
  CHECK(info["parameters"].get<int64_t>() > 0);
}

TEST_CASE("score --json has the documented shape", "[cli]") {
  const std::string dir = tiny_model();
  const auto result = run_command(cli() + " score --model " + dir + " --tokens 1,5,9,3,3,7 --json");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto out = nlohmann::json::parse(result.out);
  REQUIRE(out["tokens"] == nlohmann::json({1, 5, 9, 3, 3, 7}));
  REQUIRE(out["nll"].size() == 5);
  REQUIRE(out["argmax"].size() == 6);
  double total = 0;
  for (const auto& v : out["nll"]) total += v.get<double>();
  CHECK(out["ppl"].get<double>() == Approx(std::exp(total / 5)).epsilon(1e-9));

  // Prefill in chunks reports the same numbers within float noise.
  const auto chunked =
      run_command(cli() + " score --model " + dir + " --tokens 1,5,9,3,3,7 --json --chunk 4");
  REQUIRE(chunked.exit_code == 0);
  const auto out2 = nlohmann::json::parse(chunked.out);
  CHECK(out2["argmax"] == out["argmax"]);
  CHECK(out2["ppl"].get<double>() == Approx(out["ppl"].get<double>()).epsilon(1e-5));
}

TEST_CASE("generate --ids prints the engine's greedy continuation", "[cli]") {
  const std::string dir = tiny_model();
  const auto result =
      run_command(cli() + " generate --model " + dir + " --tokens 1,2,3 --max-new 7 --ids");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  std::istringstream in(result.out);
  std::vector<int32_t> printed;
  for (int32_t id; in >> id;) printed.push_back(id);

  const auto backend = make_cpu_backend(1);
  const auto model = upload_model(Model::load(dir), *backend);
  GenerateOptions options;
  options.max_new = 7;  // stop_at_eos stays on, as in the CLI (eos is id 2 in tiny models)
  CHECK(printed == generate_greedy(model, std::vector<int32_t>{1, 2, 3}, options));
}

TEST_CASE("tokenize matches Hugging Face ids for the real vocabularies", "[cli][tokenizer]") {
  for (const char* name : {"llama2", "gpt2"}) {
    INFO("vocabulary " << name);
    const std::string tokenizer =
        test::shared_path(std::string("data/tokenizers/") + name + "-tokenizer.json");
    const auto cases = nlohmann::json::parse(std::ifstream(
        test::shared_path(std::string("data/tokenizers/cases-") + name + ".json")))["cases"];
    const auto& sample = cases.at(3);  // "  leading spaces": whitespace handling differs by kind
    const std::string text = sample["text"].get<std::string>();
    const std::string file = test::make_temp_dir("tok") + "/text.txt";
    test::write_file(file, text);
    const auto result = run_command(cli() + " tokenize --tokenizer " + tokenizer + " --file " +
                                    file + " --special");
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    std::istringstream in(result.out);
    std::vector<int> ids;
    for (int id; in >> id;) ids.push_back(id);
    CHECK(ids == sample["ids_with_special"].get<std::vector<int>>());
  }
}

TEST_CASE("bench --policies times both sessions in blocks and reports the lockstep ratio",
          "[cli]") {
  const std::string dir = tiny_model();
  const auto result = run_command(cli() + " bench --model " + dir +
                                  " --context 8 --steps 6 --block 3 --copy-mb 1 --threads 2"
                                  " --policies dense,h2o,streaming --json");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto out = nlohmann::json::parse(result.out);
  CHECK(out["steps"] == 6);
  CHECK(out["step_seconds_median"].get<double>() > 0.0);
  CHECK(out["dense_op_by_op"] == false);
  // The yardstick: the backend's copy rate (host memory here), the memory moving twice that, and
  // the step against the time to read the weights once at that rate.
  CHECK(out["memcpy_memory"] == "host");
  CHECK(out["memory_gbps"].get<double>() == Approx(2.0 * out["memcpy_gbps"].get<double>()));
  CHECK(out["weight_read_seconds"].get<double>() ==
        Approx(out["weight_bytes_per_step"].get<double>() /
               (out["memory_gbps"].get<double>() * 1e9)));
  CHECK(
      out["step_over_weight_read"].get<double>() ==
      Approx(out["step_seconds_median"].get<double>() / out["weight_read_seconds"].get<double>()));
  const auto& lockstep = out["lockstep"];
  CHECK(lockstep["runs"] == 3);
  CHECK(lockstep["block"] == 3);
  CHECK(lockstep["step_seconds_median"].get<double>() > 0.0);
  CHECK(lockstep["ratio_to_dense"].get<double>() ==
        Approx(lockstep["step_seconds_median"].get<double>() /
               out["step_seconds_median"].get<double>()));
  REQUIRE(lockstep["run_tasks"].size() == 3);
  CHECK(lockstep["run_tasks"][1]["policy"] == "h2o");

  // --op-by-op: the dense steps are not replayed from a recording (the CPU records none, so only
  // the report says so here; on a GPU it is what the CUDA graph saves).
  const auto op_by_op =
      run_command(cli() + " bench --model " + dir +
                  " --context 8 --steps 2 --copy-mb 1 --threads 2 --op-by-op --json");
  REQUIRE(op_by_op.exit_code == 0);
  CHECK(nlohmann::json::parse(op_by_op.out)["dense_op_by_op"] == true);

  // Each block's first step is untimed, so it counts against the positions too: 8 + 2 + 6 + 3
  // blocks of 3 (2 timed each) passes 18 positions.
  test::TinyLlamaSpec short_spec;
  short_spec.max_positions = 18;
  require_failure("bench --model " + tiny_model(short_spec) +
                      " --context 8 --steps 6 --block 3 --copy-mb 1 --policies dense,h2o",
                  {"--block", "at most max_position_embeddings = 18", "19"});
}

TEST_CASE("bench --attention-cost times each run's attention over its kept keys", "[cli]") {
  const std::string dir = tiny_model();
  // One run a session: runs whose caches are alike share run 0's logits (attend_alike) instead
  // of attending on their own.
  for (const std::string policy : {"streaming", "h2o"}) {
    const auto result = run_command(cli() + " bench --model " + dir +
                                    " --context 24 --steps 4 --block 3 --copy-mb 1 --threads 1"
                                    " --policies " +
                                    policy + " --sparsity 0.5 --attention-cost 3 --json");
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    const auto out = nlohmann::json::parse(result.out);
    const auto& costs = out["attention_cost"];
    REQUIRE(costs.size() == 1);
    const auto& cost = costs[0];
    INFO(cost.dump());
    CHECK(cost["run"] == policy + "@0.5");
    // Half the keys of every masked layer (streaming keeps the sink and the window, h2o its
    // budget): about half the pairs, never all of them.
    CHECK(cost["kept_share"].get<double>() > 0.3);
    CHECK(cost["kept_share"].get<double>() < 0.8);
    // The keys some head of a KV group sees: at least any one head's share, so at least the mean
    // over heads; StreamingLLM keeps the same keys in every head, so the two agree.
    const double read_share = cost["read_share"].get<double>();
    CHECK(read_share >= cost["kept_share"].get<double>() - 1e-12);
    CHECK(read_share <= 1.0);
    if (policy == "streaming") CHECK(read_share == Approx(cost["kept_share"].get<double>()));
    CHECK(cost["masked_layers"].get<int64_t>() > 0);
    CHECK(cost["attention_seconds"].get<double>() > 0.0);
    CHECK(cost["dense_attention_seconds"].get<double>() > 0.0);
    CHECK(cost["repeats"] == 3);
    // The CPU backend has no fused masked attention (Backend::fuses_masked_attention): every
    // layer goes through the logits and softmax calls (the CUDA routing: test_cuda_session).
    CHECK(cost["fused_layers"] == 0);
  }
  require_failure("bench --model " + dir + " --context 8 --steps 2 --attention-cost 3",
                  {"--attention-cost", "--policies"});
}

TEST_CASE("the TokenButler predictor through the CLI: info, score, bench and their errors",
          "[cli][predictor]") {
  const std::string dir = tiny_model();  // a random predictor beside the model
  auto result = run_command(cli() + " info --model " + dir);
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  auto info = nlohmann::json::parse(result.out);
  CHECK(info["predictor"]["path"] == dir + "/predictor.safetensors");
  CHECK(info["predictor"]["variant"] == "hf");
  CHECK(info["predictor"]["parameters"].get<int64_t>() > 0);

  result =
      run_command(cli() + " bench --model " + dir +
                  " --context 8 --steps 4 --block 3 --copy-mb 1 --policies tokenbutler --json");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  const auto bench = nlohmann::json::parse(result.out);
  CHECK(bench["predictor"]["step_seconds_median"].get<double>() > 0.0);
  CHECK(bench["predictor"]["share_of_dense_step"].get<double>() > 0.0);

  // No predictor: tokenbutler fails naming where kvlens looked; --predictor brings one.
  test::TinyLlamaSpec bare;
  bare.predictor = false;
  const std::string bare_dir = tiny_model(bare);
  require_failure(
      "score --model " + bare_dir + " --tokens 1,2,3 --policy tokenbutler --sparsity 0.5",
      {"policy tokenbutler", bare_dir + "/predictor.safetensors (none)", "--predictor"});
  result = run_command(cli() + " score --model " + bare_dir + " --predictor " + dir +
                       "/predictor.safetensors --tokens 1,2,3,4 --policy tokenbutler --sparsity 0.5"
                       " --json");
  INFO(result.err);
  CHECK(result.exit_code == 0);
  require_failure("info --model " + bare_dir + " --predictor " + bare_dir + "/none.safetensors",
                  {bare_dir + "/none.safetensors", "no such file"});
}

TEST_CASE("trace with a tokenizer smaller than the model's vocabulary labels ids as <id N>",
          "[cli][tokenizer]") {
  // 64 model ids, 4 tokenizer ids: the random model's top-k holds ids the tokenizer lacks (this
  // used to abort the trace).
  const std::string dir = tiny_model();
  test::write_file(dir + "/tokenizer.json",
                   R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3},)"
                   R"( "merges": ["a b"]}})");
  const auto result =
      run_command(cli() + " trace --model " + dir +
                  " --prompt abcab --policies dense --top-k 8 --out " + dir + "/run.kvtrace");
  INFO(result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.err.find("the tokenizer has 4 ids, the model 64") != std::string::npos);
  CHECK(result.err.find("<id N>") != std::string::npos);
  const Trace trace = load_trace(dir + "/run.kvtrace");
  bool labelled = false;
  for (const std::vector<StepRecord>& step : trace.steps()) {
    const StepRecord& record = step[0];
    for (size_t k = 0; k < record.top.ids.size(); ++k) {
      if (record.top.ids[k] >= 4) {
        CHECK(record.top.texts[k] == "<id " + std::to_string(record.top.ids[k]) + ">");
        labelled = true;
      }
    }
  }
  CHECK(labelled);
}

TEST_CASE("bad input: one clear message and a non-zero exit", "[cli][errors]") {
  SECTION("missing folder") {
    require_failure("info --model /nonexistent/model", {"/nonexistent/model", "config.json"});
  }
  SECTION("truncated safetensors") {
    const std::string dir = tiny_model();
    const std::string file = dir + "/model.safetensors";
    std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
    require_failure("info --model " + dir, {"model.safetensors", "expected"});
  }
  SECTION("header length past the end") {
    const std::string dir = tiny_model();
    test::write_file(dir + "/model.safetensors",
                     std::string("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10));
    require_failure("info --model " + dir, {"model.safetensors", "header"});
  }
  SECTION("unsupported model_type") {
    test::TinyLlamaSpec spec;
    spec.extra_config = R"({"model_type": "gpt2"})";
    require_failure("info --model " + tiny_model(spec), {"config.json", "model_type", "llama"});
  }
  SECTION("wrong tensor shape") {
    test::TinyLlamaSpec spec;
    const std::string dir = test::make_temp_dir("cli");
    auto tensors = test::tiny_llama_tensors(spec);
    for (auto& t : tensors) {
      if (t.name == "model.layers.1.self_attn.k_proj.weight") {
        t = test::make_tensor(t.name, "F32", {spec.hidden, spec.hidden},
                              std::vector<float>(size_t(spec.hidden * spec.hidden), 0.f));
      }
    }
    test::write_checkpoint(dir, test::tiny_llama_config(spec), tensors, false);
    require_failure("info --model " + dir, {"model.layers.1.self_attn.k_proj.weight", "shape"});
  }
  SECTION("token id out of range") {
    require_failure("score --model " + tiny_model() + " --tokens 1,2,64", {"token id", "64"});
  }
  SECTION("malformed token list") {
    require_failure("score --model " + tiny_model() + " --tokens 1,x,3", {"--tokens", "'x'"});
  }
  SECTION("input longer than max_position_embeddings") {
    test::TinyLlamaSpec spec;
    spec.max_positions = 4;
    require_failure("score --model " + tiny_model(spec) + " --tokens 1,2,3,4,5",
                    {"config.json", "max_position_embeddings", "at most 4"});
  }
  SECTION("text input without a tokenizer") {
    require_failure("generate --model " + tiny_model() + " --prompt hello --max-new 2",
                    {"tokenizer.json"});
  }
  SECTION("malformed tokenizer.json") {
    const std::string dir = tiny_model();
    test::write_file(dir + "/tokenizer.json", "{\"model\": [1, 2");
    require_failure("info --model " + dir, {"tokenizer.json"});
  }
  SECTION("dense with a non-zero sparsity (was accepted and reported as dense)") {
    require_failure("score --model " + tiny_model() + " --tokens 1,2 --sparsity 0.5",
                    {"--sparsity", "dense"});
  }
  SECTION("unknown policy") {
    require_failure("score --model " + tiny_model() + " --tokens 1,2 --policy nosuch",
                    {"--policy", "nosuch", "h2o"});
  }
  SECTION("bad policy parameter") {
    require_failure("score --model " + tiny_model() +
                        " --tokens 1,2 --policy h2o --sparsity 0.5 --policy-arg sinks=x",
                    {"--policy-arg", "sinks", "integer"});
  }
  SECTION("unknown backend") {
    require_failure("score --model " + tiny_model() + " --tokens 1,2 --backend tpu",
                    {"--backend", "tpu"});
  }
}

TEST_CASE("run specs through the CLI: generate --policies, eval's run labels, their errors",
          "[cli][policy_specs]") {
  const std::string dir = tiny_model();
  const std::string prompt = " --tokens 1,5,9,13,17,21,25,29 --max-new 12 --ids";
  SECTION("generate --policies: one line per run, SPEC, DEPARTURE, ids; dense's are generate's") {
    const auto alone = run_command(cli() + " generate --model " + dir + prompt);
    REQUIRE(alone.exit_code == 0);
    const auto result = run_command(cli() + " generate --model " + dir + prompt +
                                    " --policies dense,h2o@0,random@0.8:sinks=1 --sparsity 0.5");
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    std::istringstream lines(result.out);
    std::vector<std::vector<std::string>> rows;
    for (std::string line; std::getline(lines, line);) {
      std::vector<std::string> fields;
      std::istringstream split(line);
      for (std::string field; std::getline(split, field, '\t');) fields.push_back(field);
      rows.push_back(fields);
    }
    REQUIRE(rows.size() == 3);
    std::string dense_ids = alone.out.substr(0, alone.out.find('\n'));
    CHECK(rows[0] == std::vector<std::string>{"dense", "-", dense_ids});
    CHECK(rows[1] == std::vector<std::string>{"h2o@0", "-", dense_ids});
    REQUIRE(rows[2].size() == 3);
    CHECK(rows[2][0] == "random@0.8:sinks=1");
    // Random selection at 80% leaves dense's path on this tiny model; the departure index points
    // at the ▶-marked id, the first one unlike dense's.
    REQUIRE(rows[2][1] != "-");
    {
      std::istringstream ids(rows[2][2]), reference(dense_ids);
      std::vector<std::string> run_ids, dense;
      for (std::string id; ids >> id;) run_ids.push_back(id);
      for (std::string id; reference >> id;) dense.push_back(id);
      const size_t departure = std::stoul(rows[2][1]);
      REQUIRE(departure < run_ids.size());
      CHECK(run_ids[departure].rfind("▶", 0) == 0);
      for (size_t i = 0; i < departure; ++i) CHECK(run_ids[i] == dense[i]);
    }
  }
  SECTION("eval: a run spec's knobs label its row and its JSON") {
    const std::string json = test::make_temp_dir("cli") + "/eval.json";
    const auto result = run_command(
        cli() + " eval --model " + test::source_path("assets/models/demo") +
        " --task coref --samples 2 --policies dense,h2o@0.7,h2o@0.7:window=16 --json " + json);
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    CHECK(result.out.find("h2o:window=16 ") != std::string::npos);
    std::ifstream in(json);
    const auto parsed = nlohmann::json::parse(in);
    std::vector<std::string> specs;
    for (const auto& row : parsed["results"]) specs.push_back(row["run"]);
    CHECK(specs == std::vector<std::string>{"dense", "h2o@0.7", "h2o@0.7:window=16"});
  }
  SECTION("errors name --policies and the item") {
    require_failure("generate --model " + dir + prompt + " --policies dense,h2o@1.5",
                    {"--policies", "[0, 1)", "h2o@1.5"});
    require_failure("generate --model " + dir + prompt + " --policies h2o@0.5:nope=1",
                    {"--policies", "nope", "h2o@0.5:nope=1"});
    // A CLI11 usage error (no "kvlens-cli: error:" prefix): one of the two, not both.
    const auto both = run_command(cli() + " generate --model " + dir + prompt +
                                  " --policies h2o@0.5 --policy h2o");
    CHECK(both.exit_code != 0);
    CHECK(both.err.find("--policy excludes --policies") != std::string::npos);
    require_failure("eval --model " + dir + " --task coref --policies h2o,h2o@0.5 --sparsity 0.5",
                    {"--policies", "each run listed once", "h2o@0.5"});
  }
}
