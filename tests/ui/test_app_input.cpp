// Input that is never lost and a window that idles: the real app under Xvfb, driven by scripts
// that post mouse and key events to the canvas back to back (as fast input arrives between two
// frames), count what they did, measure the app's CPU while nothing happens, and open the F1
// keys-and-gestures overlay.
#ifdef KVLENS_APP_PATH
#include <QImage>
#include <catch2/catch.hpp>
#include <fstream>
#include <regex>

#include "tests/support/test_paths.h"
#include "tests/ui/app_runner.h"

using namespace kvlens;
using namespace kvlens::test::app;

namespace {

// The app on a script (its lines, "$DIR" standing for the test's folder): app_runner.h's run_app.
test::CommandResult run_script(const std::string& dir, std::initializer_list<std::string> lines,
                               const std::string& args = "") {
  return run_app(dir, script(lines, dir), args);
}

// A prompt of a few steps, for tests about the window rather than the recording.
const std::string kShortText = "Tom had a red ball and a blue kite at the park";

}  // namespace

TEST_CASE("short clicks on a button count one step each", "[ui][app][input]") {
  // Each press and its release are posted with no frame between them: ImGui 1.86 reads the
  // button once a frame, so unless the canvas feeds them on successive frames none registers.
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("input");
  const test::CommandResult result =
      run_script(dir, {"step 40", "goto 0", "click-n 12 >", "expect-step 12", "click-n 5 <",
                       "expect-step 7", "click >", "expect-step 8", "quit"});
  INFO(result.out << result.err);
  CHECK(result.exit_code == 0);
}

TEST_CASE("keys pressed back to back each reach the window", "[ui][app][input]") {
  // Replaying recorded steps (no engine work between keys): 25 x Right, then 2 x Shift+Left.
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("input");
  const test::CommandResult result = run_script(
      dir, {"goto 0", "keys Right 25", "expect-step 25", "keys Shift+Left 2", "expect-step 5",
            "keys End", "expect-step 110", "keys Home", "expect-step 0", "quit"});
  INFO(result.out << result.err);
  CHECK(result.exit_code == 0);
}

TEST_CASE("a held key's repeats do not pile up behind slow frames", "[ui][app][input]") {
  // 30 presses of Right, then Right held for 30 auto-repeats, all posted before a frame: the
  // presses each step, the repeats that come while the key's press still waits are dropped.
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("input");
  const test::CommandResult result =
      run_script(dir, {"step 80", "goto 0", "keys Right 30", "expect-step 30", "keys Right 30 held",
                       "expect-step 31", "keys Right 3", "expect-step 34", "quit"});
  INFO(result.out << result.err);
  CHECK(result.exit_code == 0);
}

// Pressed while the text still records (the '!' lines do not wait for the recording): the
// presses add up and the view goes on to the step they asked for once it is recorded.
TEST_CASE("11 x Shift+Right reaches the last step of the 111-token sample", "[ui][app][input]") {
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("input");
  const test::CommandResult result = run_script(
      dir, {"!goto 0", "!keys Shift+Right 11", "!report", "wait-idle", "expect-step 110", "quit"});
  INFO(result.out << result.err);
  CHECK(result.exit_code == 0);
  // (the report line, printed before the recording ended, shows it was still going)
  const size_t report = result.out.find("report: frames");
  REQUIRE(report != std::string::npos);
  CHECK(result.out.find("steps 111 ", report) == std::string::npos);
}

TEST_CASE("idle, the window uses under 2% of a core, and playing it draws", "[ui][app][input]") {
  // After the whole sample is recorded nothing changes: no frame should be drawn, and the
  // process (all its threads) should sleep. Playback then animates the canvas again.
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("input");
  const test::CommandResult result =
      run_script(dir, {"step 110", "wait-idle", "expect-idle-cpu 5 2", "report", "goto 0",
                       "speed 30", "play", "wait 1500", "report", "quit"});
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  const std::regex idle(R"(idle-cpu: ([0-9.]+)% of a core over [0-9.]+ s, (\d+) frames drawn)");
  std::smatch match;
  REQUIRE(std::regex_search(result.out, match, idle));
  CHECK(std::stod(match[1]) < 2.0);
  CHECK(std::stoll(match[2]) <= 1);  // none: nothing asked for one
  // While playing the canvas animates: frames keep coming for the 1.5 s (an idle window draws
  // none; counted, not timed, so that a loaded or sanitized build passes as well).
  const std::regex report(R"(report: frames (\d+) fps)");
  std::vector<long long> frames;
  for (auto it = std::sregex_iterator(result.out.begin(), result.out.end(), report);
       it != std::sregex_iterator(); ++it)
    frames.push_back(std::stoll((*it)[1]));
  REQUIRE(frames.size() == 2);
  CHECK(frames[1] - frames[0] >= 5);
}

TEST_CASE("F1 and ? toggle the keys-and-gestures overlay, and Esc or a click outside closes it",
          "[ui][app][input]") {
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("input");
  const test::CommandResult result = run_script(dir, {"goto 4",
                                                      "screenshot $DIR/without.png",
                                                      "keys F1",
                                                      "expect-help open",
                                                      "screenshot $DIR/help.png",
                                                      "keys Esc",
                                                      "expect-help closed",
                                                      "keys ?",
                                                      "expect-help open",
                                                      "keys Right",
                                                      "expect-step 5",
                                                      "click Close",
                                                      "expect-help closed",
                                                      "keys F1",
                                                      "expect-help open",
                                                      "click-at 40 300",
                                                      "expect-help closed",
                                                      "keys F1",
                                                      "keys F1",
                                                      "expect-help closed",
                                                      "quit"});
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  // The overlay is drawn: the middle of the window changed.
  const QImage without(QString::fromStdString(dir + "/without.png"));
  const QImage help(QString::fromStdString(dir + "/help.png"));
  REQUIRE(without.size() == help.size());
  int changed = 0;
  for (int y = help.height() / 3; y < 2 * help.height() / 3; y += 4)
    for (int x = help.width() / 3; x < 2 * help.width() / 3; x += 4)
      changed += without.pixel(x, y) != help.pixel(x, y);
  CHECK(changed > 1000);
}
TEST_CASE("a ? typed into a text field is text, not the help", "[ui][app][input]") {
  // A click in a run's knobs field puts the cursor there; '?' then types (the run rows change, so
  // a change is pending) instead of opening the overlay; once Esc leaves the field, '?' opens it.
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("input");
  const test::CommandResult result =
      run_script(dir, {"expect-pending no", "click knobs:", "keys ?", "expect-help closed",
                       "expect-pending yes", "keys Esc", "keys ?", "expect-help open", "quit"});
  INFO(result.out << result.err);
  CHECK(result.exit_code == 0);
}

TEST_CASE("the minus sign of a small legend is drawn", "[ui][app][input]") {
  // The retention view's A - B legend is 11 px text from the 26 px figure font, whose minus is a
  // stroke 2 texels tall: unless the glyph quads are padded it covers no pixel centre and
  // vanishes ("A   B").
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("input");
  const test::CommandResult result =
      run_script(dir, {"step 20", "view retention", "compare h2o,quest", "locate \u2212",
                       "screenshot $DIR/retention.png", "quit"});
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  std::smatch match;
  REQUIRE(std::regex_search(result.out, match, std::regex(R"(locate: \S+ at (\d+) (\d+))")));
  const int x = std::stoi(match[1]), y = std::stoi(match[2]);
  const QImage shot(QString::fromStdString(dir + "/retention.png"));
  int darkest = 255;
  for (int dy = -2; dy <= 2; ++dy)
    for (int dx = -3; dx <= 3; ++dx) darkest = std::min(darkest, qGray(shot.pixel(x + dx, y + dy)));
  CHECK(darkest < 160);  // ink, not the white of the figure
}
TEST_CASE("bad input commands name the command and what they expect", "[ui][app][input]") {
  REQUIRE(have_xvfb());
  const std::pair<const char*, const char*> cases[] = {
      {"keys Shift+Nope", "keys: 'Shift+Nope' is not a key (expected e.g. Right, Shift+Right"},
      {"keys Right 0", "keys: the count '0' is not a number from 1 to 1000"},
      {"click-at 10", "click-at: needs X Y [COUNT] in canvas pixels"},
      {"click No such button", "click: no text 'No such button' on the screen"},
      {"expect-idle-cpu soon 2", "expect-idle-cpu: needs SECONDS MAX_PERCENT"},
      {"expect-step 3", "expect-step: the view shows step 13, not 3 (14 recorded)"},
  };
  for (const auto& [line, message] : cases) {
    const std::string dir = test::make_temp_dir("input");
    // (one run over a short prompt: these check messages, not recordings, and are quick under a
    // sanitizer)
    const test::CommandResult result =
        run_script(dir, {"step 2", line, "quit"}, "--policies dense --prompt '" + kShortText + "'");
    INFO(line << ": " << result.out << result.err);
    CHECK(result.exit_code == 1);
    CHECK(result.err.find(std::string("script: line 2: ") + message) != std::string::npos);
  }
}
#endif
