// Run specs of --policies (app/session/policy_runs.h): ID[@SPARSITY][:KEY=VALUE...] mixed with
// plain ids, their precedence over --policy-arg, their errors, and run_spec's canonical text.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "app/session/policy_runs.h"
#include "engine/common/error.h"
#include "engine/policy/registry.h"
#include "engine/trace/trace.h"
#include "viz/views.h"

using namespace kvlens;
using session::resolve_policy_runs;
using session::run_spec;

namespace {

std::vector<std::string> specs_of(const std::vector<PolicyConfig>& runs) {
  std::vector<std::string> out;
  for (const PolicyConfig& run : runs) out.push_back(run_spec(run));
  return out;
}

// resolve_policy_runs fails with one message naming each of `parts`.
void require_error(const std::string& policies, const std::string& sparsities,
                   const std::vector<std::string>& policy_args,
                   const std::vector<std::string>& parts) {
  try {
    resolve_policy_runs(policies, sparsities, policy_args);
    FAIL("no error for --policies " << policies);
  } catch (const Error& error) {
    const std::string message = error.what();
    INFO(message);
    for (const std::string& part : parts) CHECK(message.find(part) != std::string::npos);
  }
}

// A trace run as the recorder writes it: every parameter, `changed` instead of its default.
TraceRun trace_run(const std::string& id, double sparsity,
                   const std::vector<std::string>& changed = {}) {
  TraceRun run{id, sparsity, {}, 0};
  for (const ParamSpec& spec : policy_info(id).params) {
    std::string param = spec.name + "=" + spec.default_value;
    for (const std::string& knob : changed) {
      if (knob.compare(0, spec.name.size() + 1, spec.name + "=") == 0) param = knob;
    }
    run.params.push_back(param);
  }
  return run;
}

}  // namespace

TEST_CASE("plain ids keep the cross product with --sparsity, dense once", "[policy_specs]") {
  const auto runs = resolve_policy_runs("dense,h2o", "0.3,0.7", {});
  CHECK(specs_of(runs) == std::vector<std::string>{"dense", "h2o@0.3", "h2o@0.7"});
  CHECK(runs[1].sparsity == 0.3);
  CHECK(runs[2].sparsity == 0.7);
}

TEST_CASE("a run spec takes exactly its own sparsity and knobs", "[policy_specs]") {
  const auto runs = resolve_policy_runs(
      "dense, h2o@0.3, h2o@0.7:window=16:sinks=2, quest@0.9:page_size=8, streaming", "0.5", {});
  CHECK(specs_of(runs) == std::vector<std::string>{"dense", "h2o@0.3", "h2o@0.7:sinks=2:window=16",
                                                   "quest@0.9:page_size=8", "streaming@0.5"});
  // The knobs of one item reach that run only.
  CHECK(runs[1].args.empty());
  CHECK(runs[2].args == std::vector<std::string>{"window=16", "sinks=2"});
  CHECK(runs[3].args == std::vector<std::string>{"page_size=8"});
  CHECK(runs[4].args.empty());
  // A spec's sparsity ignores the list, whatever it holds.
  CHECK(specs_of(resolve_policy_runs("h2o@0.3", "0.1,0.2", {})) ==
        std::vector<std::string>{"h2o@0.3"});
  CHECK(specs_of(resolve_policy_runs("dense@0", "0.5", {})) == std::vector<std::string>{"dense"});
}

TEST_CASE("a spec's own knob wins over --policy-arg of the same key", "[policy_specs]") {
  const auto runs = resolve_policy_runs("h2o@0.3,h2o@0.7:window=16,quest@0.5", "0.5",
                                        {"window=8", "h2o.sinks=2"});
  CHECK(runs[0].args == std::vector<std::string>{"window=8", "sinks=2"});
  CHECK(runs[1].args == std::vector<std::string>{"sinks=2", "window=16"});
  CHECK(runs[2].args == std::vector<std::string>{"window=8"});
  CHECK(specs_of(runs) == std::vector<std::string>{"h2o@0.3:sinks=2:window=8",
                                                   "h2o@0.7:sinks=2:window=16",
                                                   "quest@0.5:window=8"});
  // Also against a policy-scoped --policy-arg.
  const auto scoped = resolve_policy_runs("h2o@0.3:sinks=0", "0.5", {"h2o.sinks=2"});
  CHECK(scoped[0].args == std::vector<std::string>{"sinks=0"});
}

TEST_CASE("run specs: each bad item is named with what was expected", "[policy_specs][errors]") {
  require_error("h2o@abc", "0.5", {}, {"--policies", "sparsity", "[0, 1)", "h2o@abc"});
  require_error("h2o@1", "0.5", {}, {"--policies", "[0, 1)", "'1' in 'h2o@1'"});
  require_error("h2o@", "0.5", {}, {"--policies", "sparsity", "h2o@"});
  require_error("h2o@-0.1", "0.5", {}, {"--policies", "[0, 1)"});
  require_error("@0.3", "0.5", {}, {"--policies", "ID[@SPARSITY][:KEY=VALUE...]", "'@0.3'"});
  require_error("h2o@0.3:window", "0.5", {}, {"--policies", "KEY=VALUE", "'window' in"});
  require_error("h2o@0.3:", "0.5", {}, {"--policies", "KEY=VALUE"});
  require_error("h2o@0.3:bogus=1", "0.5", {},
                {"--policies", "bogus", "a parameter of this policy", "window", "h2o@0.3:bogus=1"});
  require_error("h2o@0.3:window=abc", "0.5", {},
                {"--policies", "window", "'abc'", "h2o@0.3:window=abc"});
  require_error("h2o@0.3:window=4:window=8", "0.5", {}, {"--policies", "window", "given twice"});
  require_error("nosuch@0.3", "0.5", {}, {"--policies", "id", "h2o", "nosuch@0.3"});
  require_error("dense@0.5", "0.5", {}, {"--policies", "0 for policy dense", "dense@0.5"});
  // A bad --policy-arg is still blamed on --policy-arg, not on the item it reaches.
  require_error("h2o@0.3", "0.5", {"window=abc"}, {"--policy-arg", "window", "'abc'"});
}

TEST_CASE("the same policy twice is fine, the same run twice is an error", "[policy_specs]") {
  CHECK(resolve_policy_runs("h2o@0.3,h2o@0.7,h2o@0.7:window=16", "0.5", {}).size() == 3);
  require_error("h2o@0.3,h2o@0.3", "0.5", {}, {"--policies", "each run listed once", "h2o@0.3"});
  // Identical once resolved: a plain id at the list's sparsity, or a knob at its default.
  require_error("h2o,h2o@0.5", "0.5", {}, {"--policies", "'h2o@0.5' runs h2o@0.5 again", "'h2o'"});
  require_error("h2o@0.3:sinks=4,h2o@0.3", "0.5", {}, {"each run listed once"});
  require_error("dense,dense@0", "0.5", {}, {"each run listed once"});
}

TEST_CASE("run_spec keeps only non-default knobs and reads back as the same run",
          "[policy_specs]") {
  CHECK(run_spec(PolicyConfig{"dense", 0.0, {}}) == "dense");
  CHECK(run_spec(PolicyConfig{"h2o", 0.3, {"sinks=4", "window=0"}}) == "h2o@0.3");
  CHECK(run_spec(PolicyConfig{"h2o", 0.3, {"window=016", "heavy_frac=0.25"}}) ==
        "h2o@0.3:window=16:heavy_frac=0.25");
  // The shortest sparsity text that reads back as the same double.
  CHECK(run_spec(PolicyConfig{"h2o", 0.1 + 0.2, {}}) == "h2o@0.30000000000000004");
  // A trace run's full parameter list gives the same spec as the config it was recorded from.
  const PolicyConfig config{"quest", 0.9, {"page_size=8"}};
  std::vector<std::string> every_param;
  for (const ParamSpec& spec : policy_info("quest").params) {
    every_param.push_back(spec.name + "=" + (spec.name == "page_size" ? "8" : spec.default_value));
  }
  CHECK(run_spec(PolicyConfig{"quest", 0.9, every_param}) == run_spec(config));
  // A policy not registered now (a plug-in not loaded) keeps its arguments as given.
  CHECK(run_spec(PolicyConfig{"not_loaded", 0.5, {"k=1"}}) == "not_loaded@0.5:k=1");

  const auto runs = resolve_policy_runs(
      "dense,h2o@0.3:heavy_frac=0.3,h2o@0.7:window=16:sinks=2,quest@0.9:page_size=8,random", "0.25",
      {"granularity=kv_head"});
  for (const PolicyConfig& run : runs) {
    INFO(run_spec(run));
    const auto again = resolve_policy_runs(run_spec(run), "0.6", {});
    REQUIRE(again.size() == 1);
    CHECK(again[0].id == run.id);
    CHECK(again[0].sparsity == run.sparsity);
    CHECK(run_spec(again[0]) == run_spec(run));
  }
}

TEST_CASE("viz::parse_runs names a run by its spec, the same policy at two budgets apart",
          "[policy_specs][viz]") {
  Trace trace;
  trace.runs = {trace_run("dense", 0.0), trace_run("h2o", 0.3),
                trace_run("h2o", 0.7, {"window=16"}), trace_run("h2o", 0.7),
                trace_run("quest", 0.9, {"page_size=8"})};
  using Runs = std::vector<int64_t>;
  CHECK(viz::parse_runs(trace, "h2o", "--runs") == Runs{1});  // a plain id: its first run
  CHECK(viz::parse_runs(trace, "h2o@0.3, 0", "--runs") == Runs{1, 0});
  // The run this spec recorded, not the first one that has these values among others.
  CHECK(viz::parse_runs(trace, "h2o@0.7", "--runs") == Runs{3});
  CHECK(viz::parse_runs(trace, "h2o@0.7:window=16", "--runs") == Runs{2});
  CHECK(viz::parse_runs(trace, "h2o@0.70:window=16:sinks=4", "--runs") == Runs{2});
  CHECK(viz::parse_runs(trace, "h2o:window=16", "--runs") == Runs{2});
  CHECK(viz::parse_runs(trace, "quest@0.9:page_size=8", "--runs") == Runs{4});
  // run_spec of each trace run names that run.
  for (size_t r = 0; r < trace.runs.size(); ++r) {
    const TraceRun& run = trace.runs[r];
    const std::string spec = run_spec(PolicyConfig{run.policy, run.sparsity, run.params});
    INFO(spec);
    CHECK(viz::parse_runs(trace, spec, "--runs") == Runs{int64_t(r)});
  }
  for (const std::string bad : {"h2o@0.5", "h2o@0.7:window=8", "h2o@x", "quest@0.9:nope=1"}) {
    INFO(bad);
    CHECK_THROWS_WITH(viz::parse_runs(trace, bad, "--runs"), Catch::Contains("--runs") &&
                                                                 Catch::Contains("h2o@0.7") &&
                                                                 Catch::Contains("'" + bad + "'"));
  }
}
