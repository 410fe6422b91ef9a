// kvlens-cli with --gpus / --devices on the CPU backend (CPU ranks over a host all-reduce): the
// commands that split a model print what one backend prints, say where the heads are, and refuse
// a split or a policy they cannot run with a message naming the field.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/trace/trace.h"
#include "tests/support/test_paths.h"

using namespace kvlens;
using test::run_command;

namespace {

const std::string kDemo = " --model " + test::source_path("assets/models/demo");

test::CommandResult cli(const std::string& args) {
  return run_command(test::cli_path() + " " + args);
}

// The policy table of `trace` (every line after the header line), without the timing line.
std::string trace_table(const std::string& out) {
  return out.substr(out.find("\npolicy"));
}

}  // namespace

TEST_CASE("kvlens-cli generate --gpus 2 continues as one backend does", "[cli][tensor_parallel]") {
  const std::string args =
      "generate" + kDemo + " --prompt \"Once upon a time\" --max-new 12 --ids --policy h2o";
  const auto one = cli(args);
  REQUIRE(one.exit_code == 0);
  for (const char* split : {" --gpus 2", " --devices 0,1", " --gpus 4"}) {
    INFO(split);
    const auto got = cli(args + split);
    INFO(got.err);
    REQUIRE(got.exit_code == 0);
    CHECK(got.out == one.out);
  }
}

TEST_CASE("kvlens-cli trace --gpus 2 records every head and says where they are",
          "[cli][tensor_parallel]") {
  const std::string dir = test::make_temp_dir("cli-tp-trace");
  const std::string args = "trace" + kDemo +
                           " --prompt \"Once upon a time there was a town\" --policies "
                           "dense,h2o,tokenbutler,tova --out ";
  const auto one = cli(args + dir + "/one.kvtrace");
  REQUIRE(one.exit_code == 0);
  // tova sums its heads through collectives: one run a session, which a trace of 4 runs is not.
  const auto refused = cli(args + dir + "/two.kvtrace --gpus 2");
  CHECK(refused.exit_code != 0);
  CHECK(refused.err.find("one run in the session") != std::string::npos);
  const std::string per_head = "trace" + kDemo +
                               " --prompt \"Once upon a time there was a town\" --policies "
                               "dense,h2o,tokenbutler --out ";
  const auto alone = cli(per_head + dir + "/alone.kvtrace");
  const auto split = cli(per_head + dir + "/split.kvtrace --gpus 2");
  INFO(split.err);
  REQUIRE(alone.exit_code == 0);
  REQUIRE(split.exit_code == 0);
  CHECK(split.out.find("on cpu ranks 0,1: 4 of 8 heads, 2 of 4 KV heads each") !=
        std::string::npos);
  CHECK(trace_table(split.out) == trace_table(alone.out));
  const Trace loaded = load_trace(dir + "/split.kvtrace");
  CHECK(loaded.model.heads == 8);
  CHECK(loaded.model.kv_heads == 4);
}

TEST_CASE("kvlens-cli bench --gpus 2 reports each rank's share of the weights",
          "[cli][tensor_parallel]") {
  const std::string args = "bench" + kDemo + " --context 16 --steps 4 --warmup 1 --json";
  const auto one = cli(args);
  const auto two = cli(args + " --gpus 2");
  INFO(two.err);
  REQUIRE(one.exit_code == 0);
  REQUIRE(two.exit_code == 0);
  const auto whole = nlohmann::json::parse(one.out);
  const auto split = nlohmann::json::parse(two.out);
  CHECK(split["tensor_parallel"] == 2);
  CHECK(split["devices"] == "0,1");
  // Each rank reads half the layers' matrices plus the whole lm_head, norms and an embedding row.
  const int64_t shard = split["shard_weight_bytes_per_step"].get<int64_t>();
  const int64_t all = whole["weight_bytes_per_step"].get<int64_t>();
  CHECK(shard < all);
  CHECK(shard > all / 2);
  CHECK(split["step_seconds_median"].get<double>() > 0.0);
  CHECK(split["step_over_shard_weight_read"].get<double>() > 0.0);
  CHECK(split["dense_op_by_op"] == false);
  const auto eager = cli(args + " --gpus 2 --op-by-op");
  INFO(eager.err);
  REQUIRE(eager.exit_code == 0);
  CHECK(nlohmann::json::parse(eager.out)["dense_op_by_op"] == true);
}

TEST_CASE("kvlens-cli refuses a split it cannot make, naming the field", "[cli][tensor_parallel]") {
  const std::string generate = "generate" + kDemo + " --prompt Once --max-new 2";
  auto check = [](const test::CommandResult& result, const std::string& part) {
    INFO(result.err);
    CHECK(result.exit_code != 0);
    CHECK(result.exit_code < 128);
    CHECK(result.err.find(part) != std::string::npos);
  };
  check(cli(generate + " --gpus 3"), "config.json: num_attention_heads");
  check(cli(generate + " --gpus 8 --policy h2o --policy-arg granularity=kv_head"),
        "policy h2o: granularity: expected query_head when 8 GPUs share 4 KV heads");
  check(cli(generate + " --gpus 2 --policies dense,h2o"), "one --policy with --gpus");
  check(cli(generate + " --devices 0,0"), "--devices: expected each GPU once");
  check(cli(generate + " --devices 0,x"), "--devices: expected comma-separated GPU indices");
  check(cli(generate + " --gpus 2 --devices 0,1"), "excludes");
  check(cli("bench" + kDemo + " --gpus 2 --policies h2o,quest"), "one policy with --gpus");
}

TEST_CASE("kvlens-cli eval --tensor-parallel splits each engine and gives one engine's results",
          "[cli][tensor_parallel]") {
  const std::string dir = test::make_temp_dir("cli-tp-eval");
  const std::string args = "eval --backend cpu --task coref --samples 6 --hit-rate" + kDemo +
                           " --policies dense,h2o,streaming,tova --sparsity 0.5 --json ";
  const auto one = cli(args + dir + "/one.json");
  INFO(one.err);
  REQUIRE(one.exit_code == 0);
  const auto read = [&](const std::string& name) {
    std::ifstream in(dir + "/" + name);
    return nlohmann::json::parse(in);
  };
  const nlohmann::json want = read("one.json");
  for (const char* split : {" --tensor-parallel 2", " --tensor-parallel 4 --workers 2"}) {
    INFO(split);
    const auto got_run = cli(args + dir + "/split.json" + split);
    INFO(got_run.err);
    REQUIRE(got_run.exit_code == 0);
    CHECK(got_run.out.find("split over") != std::string::npos);
    const nlohmann::json got = read("split.json");
    REQUIRE(got["results"].size() == want["results"].size());
    for (size_t i = 0; i < want["results"].size(); ++i) {
      const nlohmann::json& w = want["results"][i];
      const nlohmann::json& g = got["results"][i];
      INFO(w["policy"]);
      // Accuracy counts argmax hits, which the split's rounding (1e-4 of the logits) leaves as
      // they are on this model; the sparsity and hit rate are sums over the same visible sets.
      CHECK(g["accuracy"] == w["accuracy"]);
      CHECK(g["effective_sparsity"].get<double>() ==
            Approx(w["effective_sparsity"].get<double>()).margin(1e-12));
      if (w["hit_rate"].is_number())
        CHECK(g["hit_rate"].get<double>() == Approx(w["hit_rate"].get<double>()).margin(1e-9));
    }
  }
  // A split the model cannot divide names the config field.
  const auto odd = cli(args + dir + "/odd.json --tensor-parallel 3");
  CHECK(odd.exit_code != 0);
  CHECK(odd.err.find("num_attention_heads") != std::string::npos);
}
