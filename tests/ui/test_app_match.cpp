// The app's comparison at matched effective sparsity: the Runs section's box makes each run's
// sparsity its target, the recording runs at the nominal sparsities found on its own text, and a
// nominal budget that is not a share of tokens (tokenfilter) is said in the status bar.
#ifdef KVLENS_APP_PATH
#include <catch2/catch.hpp>
#include <cmath>

#include "engine/trace/trace.h"
#include "tests/ui/app_runner.h"

using namespace kvlens;
using namespace kvlens::test::app;

TEST_CASE("match effective records each run at the nominal sparsity that meets its target",
          "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = kvlens::test::make_temp_dir("app-match");
  const auto result = run_app(
      dir, script({"policies dense,h2o,tokenfilter", "sparsity 0.5", "match effective", "restart",
                   "wait-idle", "expect-match h2o@0.5: nominal 0.5",
                   "expect-match tokenfilter@0.5: nominal", "expect-note not of tokens",
                   "expect-note tokenfilter@0.5: cannot reach", "expect-pending no",
                   "save-trace $DIR/matched.kvtrace", "match none", "expect-pending yes", "quit"},
                  dir));
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  const Trace trace = load_trace(dir + "/matched.kvtrace");
  REQUIRE(trace.runs.size() == 3);
  // h2o records above its target, and its effective sparsity over the text meets the target.
  CHECK(trace.runs[1].sparsity > 0.55);
  double hidden = 0.0;
  for (int64_t t = 0; t < trace.step_count(); ++t) {
    hidden += trace.steps()[size_t(t)][1].metrics.effective_sparsity;
  }
  CHECK(std::abs(hidden / double(trace.step_count()) - 0.5) <= 0.005);
}

TEST_CASE("the match command takes effective or none", "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = kvlens::test::make_temp_dir("app-match-bad");
  const auto result = run_app(dir, script({"match exact", "quit"}, dir),
                              "--policies dense --prompt 'A short text'");
  INFO(result.out << result.err);
  CHECK(result.exit_code == 1);
  CHECK(result.err.find("'match' needs effective or none, not 'exact'") != std::string::npos);
}
#endif
