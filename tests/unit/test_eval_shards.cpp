// Sweeps split into shards and workers (issue 44 items 3 and 4): the shard arithmetic, the partial
// result format and merge's checks, and on the demo model an unsharded eval against 3 shards +
// merge and against --workers (byte-identical files); the job scripts of docs/multi_host.md.
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <regex>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/eval/eval_shards.h"
#include "engine/eval/eval_workers.h"
#include "tests/support/cpu_model.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;
using Json = nlohmann::ordered_json;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

SparsityStats some_sparsity(double base) {
  SparsityStats stats;
  stats.reset(2, 2);
  stats.hidden_sum = {base, 0.1, 1.0 / 3.0, std::nextafter(base, 2.0)};
  stats.steps = 7;
  return stats;
}

// A two-run coref partial of `total_items` samples, shard `index` of `count`.
EvalPartial coref_partial(int64_t index, int64_t count, int64_t total_items = 3) {
  EvalPartial partial;
  partial.parameters = {{"task", "coref"}, {"model", "m"}, {"seed", 1}};
  partial.rows = Json::array({Json{{"policy", "dense"}}, Json{{"policy", "h2o"}}});
  partial.shard = {index, count};
  partial.units_total = total_items * 2;
  partial.range = shard_units(partial.units_total, partial.shard);
  for (int64_t u = partial.range.begin; u < partial.range.end; ++u) {
    CorefSampleResult s;
    s.index = u / 2;
    s.answer = "Paris";
    s.tokens = 40;
    s.answer_token_begin = 30;
    s.answer_token_end = 32;
    s.correct_tokens = u % 2 ? 1 : 2;
    s.all_correct = u % 2 == 0;
    s.answer_nll = 0.1 * double(u) + 1e-17;
    if (u % 2) s.sparsity = some_sparsity(0.2 + double(u) / 7.0);
    s.hit_rate = {0.3 * double(u), u};
    partial.coref.push_back(s);
  }
  return partial;
}

Json roundtrip(const EvalPartial& partial) {
  return Json::parse(partial_to_json(partial).dump());
}

std::string cli() {
  return test::cli_path();
}

std::string demo() {
  return test::source_path("assets/models/demo");
}

test::CommandResult run_ok(const std::string& args) {
  const test::CommandResult result = test::run_command(cli() + " " + args);
  INFO(args << "\n" << result.err);
  REQUIRE(result.exit_code == 0);
  return result;
}

void require_failure(const std::string& args, const std::vector<std::string>& parts) {
  const test::CommandResult result = test::run_command(cli() + " " + args);
  INFO("args: " << args << "\nstderr: " << result.err);
  REQUIRE(result.exit_code != 0);
  REQUIRE(result.exit_code < 128);
  CHECK(contains(result.err, "kvlens-cli: error:"));
  for (const std::string& part : parts) CHECK(contains(result.err, part));
}

std::string file(const std::string& path) {
  return read_text_file(path);
}

}  // namespace

TEST_CASE("eval shards I/N are 0-based and validated", "[eval][shards]") {
  CHECK(parse_shard("0/1").count == 1);
  const ShardSpec s = parse_shard("2/3");
  CHECK(s.index == 2);
  CHECK(s.count == 3);
  for (const char* bad : {"3/3", "-1/3", "1", "a/b", "0/0", "1/2x", "/2", "1/", " 1/2"}) {
    const std::string message = error_of([&] { parse_shard(bad); });
    INFO(bad);
    CHECK(contains(message, "--shard"));
    CHECK(contains(message, "0-based"));
    CHECK(contains(message, std::string("'") + bad + "'"));
  }
}

TEST_CASE("shards are contiguous, cover every unit once and differ by at most one", "[shards]") {
  for (const int64_t units : {0, 1, 7, 30, 101, 4000}) {
    for (const int64_t count : {1, 2, 3, 7, 40}) {
      int64_t next = 0, smallest = units, largest = 0;
      for (int64_t i = 0; i < count; ++i) {
        const UnitRange range = shard_units(units, {i, count});
        INFO(units << " units, shard " << i << "/" << count);
        REQUIRE(range.begin == next);
        next = range.end;
        smallest = std::min(smallest, range.size());
        largest = std::max(largest, range.size());
      }
      CHECK(next == units);
      CHECK(largest - smallest <= 1);
    }
  }
  // Large sweeps do not overflow the bound's arithmetic.
  const int64_t huge = int64_t(1) << 61;
  CHECK(shard_units(huge, {3, 4}).end == huge);
  CHECK(shard_units(huge, {1, 4}).begin == huge / 4);
}

TEST_CASE("a shard's units group by item with their runs ascending", "[shards]") {
  const std::vector<EvalTask> tasks = group_units({7, 15}, 5);
  REQUIRE(tasks.size() == 2);
  CHECK(tasks[0].item == 1);
  CHECK(tasks[0].runs == std::vector<size_t>{2, 3, 4});
  CHECK(tasks[1].item == 2);
  CHECK(tasks[1].runs == std::vector<size_t>{0, 1, 2, 3, 4});
  CHECK(group_units({4, 4}, 5).empty());
}

TEST_CASE("a partial result reads back to the same bits", "[shards]") {
  EvalPartial partial = coref_partial(1, 2);
  partial.coref[0].answer_nll = std::numeric_limits<double>::infinity();
  partial.coref[1].hit_rate.sum = std::numeric_limits<double>::quiet_NaN();
  const EvalPartial back = partial_from_json(roundtrip(partial), "p.json");
  CHECK(back.parameters == partial.parameters);
  CHECK(back.rows == partial.rows);
  CHECK(back.shard.index == 1);
  CHECK(back.range.begin == partial.range.begin);
  REQUIRE(back.coref.size() == partial.coref.size());
  CHECK(std::isinf(back.coref[0].answer_nll));
  CHECK(std::isnan(back.coref[1].hit_rate.sum));
  for (size_t i = 1; i < back.coref.size(); ++i) {
    CHECK(back.coref[i].answer_nll == partial.coref[i].answer_nll);  // exact, not approximate
    CHECK(back.coref[i].sparsity.hidden_sum == partial.coref[i].sparsity.hidden_sum);
    CHECK(back.coref[i].sparsity.steps == partial.coref[i].sparsity.steps);
    CHECK(back.coref[i].all_correct == partial.coref[i].all_correct);
  }

  EvalPartial ppl;
  ppl.parameters = {{"task", "ppl"}, {"window", 16}};
  ppl.rows = Json::array({Json{{"policy", "dense"}}});
  ppl.units_total = 2;
  ppl.range = {0, 2};
  ppl.perplexity = {{1.0 / 3.0, 15, some_sparsity(0.5), {}}, {2.5, 4, {}, {0.25, 2}}};
  const EvalPartial ppl_back = partial_from_json(roundtrip(ppl), "w.json");
  REQUIRE(ppl_back.perplexity.size() == 2);
  CHECK(ppl_back.perplexity[0].nll_sum == 1.0 / 3.0);
  CHECK(ppl_back.perplexity[1].hit_rate.rows == 2);
}

TEST_CASE("a malformed partial is an error naming the file and the field", "[shards][errors]") {
  const Json good = roundtrip(coref_partial(0, 2));
  const auto error_for = [](Json json) {
    return error_of([&] { partial_from_json(json, "part-0.json"); });
  };
  CHECK(contains(error_for(Json{{"task", "coref"}}), "kvlens_eval_partial"));
  Json no_seed_units = good;
  no_seed_units["units"].erase("total");
  CHECK(contains(error_for(no_seed_units), "part-0.json: units.total"));
  Json wrong_range = good;
  wrong_range["units"]["end"] = 1;
  CHECK(contains(error_for(wrong_range), "part-0.json: units"));
  Json short_results = good;
  short_results["unit_results"].erase(0);
  CHECK(contains(error_for(short_results), "unit_results"));
  Json bad_number = good;
  bad_number["unit_results"][1]["answer_nll"] = "many";
  CHECK(contains(error_for(bad_number), "unit_results[1].answer_nll"));
  Json bad_shard = good;
  bad_shard["shard"]["index"] = 2;
  CHECK(contains(error_for(bad_shard), "shard"));
}

TEST_CASE("merge joins every shard once, in any order, and refuses anything else",
          "[shards][errors]") {
  const std::vector<std::string> names = {"a.json", "b.json", "c.json"};
  // Shards given out of order come back in unit order.
  const EvalPartial whole =
      merge_partials({coref_partial(2, 3), coref_partial(0, 3), coref_partial(1, 3)}, names);
  REQUIRE(whole.coref.size() == 6);
  for (size_t u = 0; u < 6; ++u) CHECK(whole.coref[u].answer_nll == 0.1 * double(u) + 1e-17);
  CHECK(whole.range.end == 6);

  const auto message = [&](std::vector<EvalPartial> parts) {
    return error_of([&] { merge_partials(std::move(parts), names); });
  };
  EvalPartial other_seed = coref_partial(1, 3);
  other_seed.parameters["seed"] = 2;
  const std::string seed = message({coref_partial(0, 3), other_seed, coref_partial(2, 3)});
  CHECK(contains(seed, "b.json: parameters.seed"));
  CHECK(contains(seed, "a.json"));
  const std::string twice =
      message({coref_partial(0, 3), coref_partial(0, 3), coref_partial(2, 3)});
  CHECK(contains(twice, "b.json: shard.index"));
  CHECK(contains(twice, "a.json"));
  const std::string missing = error_of([&] {
    merge_partials({coref_partial(0, 3), coref_partial(2, 3)}, {"a.json", "c.json"});
  });
  CHECK(contains(missing, "missing shard 1"));
  const std::string count =
      message({coref_partial(0, 3), coref_partial(1, 2), coref_partial(2, 3)});
  CHECK(contains(count, "b.json: shard.count"));
  EvalPartial other_runs = coref_partial(2, 3);
  other_runs.rows[1]["policy"] = "snapkv";
  CHECK(contains(message({coref_partial(0, 3), coref_partial(1, 3), other_runs}), "c.json: rows"));
}

TEST_CASE("gathered units summarize to the lockstep eval's numbers", "[shards]") {
  const EvalPartial whole = merge_partials({coref_partial(0, 1)}, {"a.json"});
  const std::vector<CorefEvalResult> runs = summarize_coref_units(whole.coref, 2);
  REQUIRE(runs.size() == 2);
  CHECK(runs[0].samples == 3);
  CHECK(runs[0].accuracy == 1.0);  // even units: all correct
  CHECK(runs[1].accuracy == 0.0);
  CHECK(runs[1].coverage == 0.5);
  CHECK(runs[1].per_sample[2].index == 2);
  CHECK(runs[1].sparsity.steps == 21);

  const std::vector<PerplexityWindow> windows = {
      {2.0, 4, {}, {}}, {4.0, 4, {}, {}}, {1.0, 2, {}, {}}, {3.0, 2, {}, {}}};
  const std::vector<PerplexityResult> ppl = summarize_perplexity_units(windows, 2, 5);
  CHECK(ppl[0].tokens_scored == 6);
  CHECK(ppl[0].mean_nll == 0.5);
  CHECK(ppl[1].mean_nll == 7.0 / 6.0);
  CHECK(ppl[1].windows == 2);
  CHECK(ppl[1].window == 5);
}

TEST_CASE("engines take every task once and pass the first error on", "[shards][workers]") {
  test::CpuModel loaded = test::load_on_cpu(test::write_tiny_llama(test::make_temp_dir("w"), {}));
  const std::vector<std::shared_ptr<const BackendModel>> engines = {loaded.resident,
                                                                    loaded.resident};
  for (const bool concurrent : {false, true}) {
    std::vector<std::atomic<int>> seen(50);
    run_on_engines(engines, 50, concurrent, [&](size_t, int64_t i) { ++seen[size_t(i)]; });
    for (const auto& count : seen) CHECK(count.load() == 1);
  }
  CHECK_THROWS_WITH(run_on_engines(engines, 20, false,
                                   [](size_t, int64_t i) {
                                     if (i == 3) throw Error("task", "3", "no failure");
                                   }),
                    Catch::Contains("task: 3"));
  CHECK_THROWS_WITH(run_on_engines({}, 1, false, [](size_t, int64_t) {}),
                    Catch::Contains("engines"));
}

TEST_CASE("gpus_needed counts whole GPUs with a tenth kept free", "[shards][workers]") {
  const int64_t gib = int64_t(1) << 30;
  CHECK(gpus_needed(gib, 0, 80 * gib) == 1);
  // 70B in BF16 (141 GB) on 80 GB GPUs: 72 GiB usable each.
  CHECK(gpus_needed(141'000'000'000, 0, 80 * gib) == 2);
  CHECK(gpus_needed(72 * gib, 1, 80 * gib) == 2);
  CHECK(gpus_needed(72 * gib, 0, 80 * gib) == 1);
  CHECK(gpus_needed(gib, 0, 0) == 1);  // unknown device size
}

TEST_CASE("NVLink multicast is off unless the user set it", "[shards][env]") {
  unsetenv("NCCL_NVLS_ENABLE");
  unsetenv("NVSHMEM_DISABLE_NVLS");
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "0", 1);  // the user's own choice
  set_multicast_off_defaults();
  CHECK(std::string(std::getenv("NCCL_NVLS_ENABLE")) == "0");
  CHECK(std::string(std::getenv("NVSHMEM_DISABLE_NVLS")) == "1");
  CHECK(std::string(std::getenv("TORCH_SYMM_MEM_DISABLE_MULTICAST")) == "0");
  unsetenv("TORCH_SYMM_MEM_DISABLE_MULTICAST");
}

TEST_CASE("coref: 3 shards + merge and --workers 2 equal one eval byte for byte",
          "[eval][shards][cli]") {
  const std::string dir = test::make_temp_dir("shards-coref");
  const std::string base = "eval --model " + demo() +
                           " --task coref --samples 5 --policies dense,h2o,quest,tova "
                           "--sparsity 0.5,0.7 --threads 2";
  const test::CommandResult full = run_ok(base + " --json " + dir + "/full.json --csv " + dir +
                                          "/full.csv --per-sample " + dir + "/full.jsonl");
  // 5 samples x 7 runs = 35 units: shards of 11, 12, 12 cut samples in the middle.
  for (int i = 0; i < 3; ++i) {
    const test::CommandResult part = run_ok(base + " --shard " + std::to_string(i) + "/3 --json " +
                                            dir + "/part-" + std::to_string(i) + ".json");
    CHECK(contains(part.out, "shard " + std::to_string(i) + "/3"));
  }
  const test::CommandResult merged = run_ok(
      "merge " + dir + "/part-2.json " + dir + "/part-0.json " + dir + "/part-1.json --out " + dir +
      "/merged.json --csv " + dir + "/merged.csv --per-sample " + dir + "/merged.jsonl");
  CHECK(file(dir + "/merged.json") == file(dir + "/full.json"));
  CHECK(file(dir + "/merged.csv") == file(dir + "/full.csv"));
  CHECK(file(dir + "/merged.jsonl") == file(dir + "/full.jsonl"));
  // The table too: everything but the first line (which names the command) and the eval's last
  // (its wall-clock time).
  const auto table = [](const std::string& out, bool timed) {
    std::string body = out.substr(out.find('\n') + 1);
    if (timed) body = body.substr(0, body.rfind('\n', body.size() - 2) + 1);
    return body;
  };
  CHECK(table(merged.out, false) == table(full.out, true));

  run_ok(base + " --workers 2 --json " + dir + "/workers.json --per-sample " + dir +
         "/workers.jsonl");
  CHECK(file(dir + "/workers.json") == file(dir + "/full.json"));
  CHECK(file(dir + "/workers.jsonl") == file(dir + "/full.jsonl"));
}

TEST_CASE("ppl: 3 shards + merge and --workers 3 equal one eval byte for byte",
          "[eval][shards][cli]") {
  const std::string dir = test::make_temp_dir("shards-ppl");
  const std::string base = "eval --model " + demo() + " --task ppl --text-file " +
                           test::source_path("docs/multi_host.md") +
                           " --window 96 --max-tokens 400 --policies dense,h2o,snapkv "
                           "--sparsity 0.5 --threads 2 --hit-rate";
  run_ok(base + " --json " + dir + "/full.json --csv " + dir + "/full.csv");
  // 5 windows x 3 runs in shards of 5 units: shard 1 ends with window 3's dense run alone.
  for (int i = 0; i < 3; ++i) {
    run_ok(base + " --shard " + std::to_string(i) + "/3 --json " + dir + "/part-" +
           std::to_string(i) + ".json");
  }
  run_ok("merge " + dir + "/part-1.json " + dir + "/part-0.json " + dir + "/part-2.json --out " +
         dir + "/merged.json --csv " + dir + "/merged.csv");
  const std::string full = file(dir + "/full.json");
  CHECK(file(dir + "/merged.json") == full);
  CHECK(file(dir + "/merged.csv") == file(dir + "/full.csv"));
  CHECK(Json::parse(full)["results"][1]["samples"] == 5);  // 400 tokens in windows of 96
  run_ok(base + " --workers 3 --json " + dir + "/workers.json");
  CHECK(file(dir + "/workers.json") == full);
}

TEST_CASE("shard, worker and merge flags: one message naming the flag or file",
          "[eval][shards][cli][errors]") {
  const std::string dir = test::make_temp_dir("shards-errors");
  const std::string base = "eval --model " + demo() + " --task coref --samples 2 ";
  require_failure(base + "--shard 2/2 --json " + dir + "/p.json", {"--shard", "0-based", "2/2"});
  require_failure(base + "--shard 0/2", {"--shard", "--json"});
  require_failure(base + "--shard 0/2 --json " + dir + "/p.json --csv " + dir + "/p.csv",
                  {"--shard", "--csv", "merge"});
  require_failure(base + "--gpus 2", {"--gpus", "--backend cuda", "--workers"});
  require_failure(base + "--devices 0,1", {"--devices", "--backend cuda"});

  // Parts of different runs, and a missing shard.
  run_ok(base + "--policies dense,h2o --shard 0/2 --json " + dir + "/a0.json");
  run_ok(base + "--policies dense,h2o --seed 5 --shard 1/2 --json " + dir + "/b1.json");
  require_failure("merge " + dir + "/a0.json " + dir + "/b1.json --out " + dir + "/m.json",
                  {dir + "/b1.json", "parameters.seed", "5"});
  require_failure("merge " + dir + "/a0.json --out " + dir + "/m.json", {"missing shard 1"});
  test::write_file(dir + "/not.json", "{\"task\": \"coref\"}");
  require_failure("merge " + dir + "/not.json", {dir + "/not.json", "kvlens_eval_partial"});
  test::write_file(dir + "/broken.json", "{");
  require_failure("merge " + dir + "/broken.json", {dir + "/broken.json", "JSON"});
}

// The page's bash blocks, in order.
std::vector<std::string> multi_host_scripts() {
  const std::string page = read_text_file(test::source_path("docs/multi_host.md"));
  std::vector<std::string> blocks;
  const std::regex fence("```bash\n([\\s\\S]*?)```");
  for (auto it = std::sregex_iterator(page.begin(), page.end(), fence);
       it != std::sregex_iterator(); ++it) {
    blocks.push_back((*it)[1].str());
  }
  return blocks;
}

TEST_CASE("docs/multi_host.md's job scripts parse and pass the right --shard", "[shards][docs]") {
  const std::vector<std::string> blocks = multi_host_scripts();
  REQUIRE(blocks.size() == 5);
  const std::string dir = test::make_temp_dir("multi-host");
  for (size_t i = 0; i < blocks.size(); ++i) {
    const std::string path = dir + "/block" + std::to_string(i) + ".sh";
    test::write_file(path, blocks[i]);
    const test::CommandResult syntax = test::run_command("bash -n " + path);
    INFO("block " << i << ":\n" << blocks[i] << syntax.err);
    CHECK(syntax.exit_code == 0);
  }
  // A stand-in kvlens-cli that records its arguments.
  const std::string fake = dir + "/fake-cli";
  test::write_file(fake, "#!/bin/sh\necho \"$@\" > \"$ARGS_FILE\"\n");
  REQUIRE(test::run_command("chmod +x " + fake).exit_code == 0);
  const auto run_script = [&](size_t block, const std::string& env) {
    const std::string path = dir + "/block" + std::to_string(block) + ".sh";
    const test::CommandResult result = test::run_command(
        "cd " + dir + " && env -u OMPI_COMM_WORLD_RANK -u PMI_RANK KVLENS_CLI=" + fake +
        " ARGS_FILE=" + dir + "/args OUT=" + dir + "/out " + env + " bash " + path);
    INFO(result.err);
    REQUIRE(result.exit_code == 0);
    return read_text_file(dir + "/args");
  };
  // Slurm array task 3 of 8.
  CHECK(contains(run_script(0, "SLURM_ARRAY_TASK_ID=3 SLURM_ARRAY_TASK_COUNT=8"),
                 "--shard 3/8 --json " + dir + "/out/part-3.json"));
  CHECK(contains(run_script(1, ""), "merge " + dir + "/out/part-*.json"));
  // mpirun: Open MPI's rank, then MPICH's.
  CHECK(contains(run_script(3, "OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4"),
                 "--shard 2/4 --json " + dir + "/out/part-2.json"));
  CHECK(contains(run_script(3, "PMI_RANK=1 PMI_SIZE=2"), "--shard 1/2"));
}
