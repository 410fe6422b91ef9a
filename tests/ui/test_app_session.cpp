// The app's session as a researcher works it: the text records in the background from the start;
// other runs (each with its own budget) re-record without losing the step, the compare picks or
// the selected head, and an unrecorded change is marked; a token search, a token's history, the
// A-B diff of any two runs, a window size that is never restored unusable.
#ifdef KVLENS_APP_PATH
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "engine/trace/trace.h"
#include "tests/ui/app_runner.h"

using namespace kvlens;
using namespace kvlens::test::app;

TEST_CASE("the app records the whole text in the background without a key press", "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = kvlens::test::make_temp_dir("app");
  // No step command: the view follows the recording to the text's last step.
  const auto result =
      run_app(dir, script({"report", "view logits", "export $DIR/last.json",
                           "save-trace $DIR/all.kvtrace", "screenshot $DIR/opened.png", "quit"},
                          dir));
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.out.find("steps 111 ") != std::string::npos);
  CHECK(read_file(dir + "/last.json").find("\"step\": 110.0") != std::string::npos);
  CHECK(load_trace(dir + "/all.kvtrace").step_count() == 111);
  CHECK(distinct_colors(dir + "/opened.png") > 200);
}

TEST_CASE("re-recording keeps the step, the compare picks and the head, and marks a pending change",
          "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = kvlens::test::make_temp_dir("app");
  const std::string second = default_runs_tokenbutler() ? "tokenbutler" : "quest";
  const auto result = run_app(
      dir, script({"goto 20", "compare " + second + ",h2o", "head 3 5",
                   // h2o at two budgets and the picks' runs again (the budgets they had)
                   "runs dense," + second + "@0.5,h2o@0.5,h2o@0.3,h2o@0.7", "expect-pending yes",
                   "screenshot $DIR/pending.png", "restart", "expect-pending no",
                   "expect-compare " + second + " s=0.5,h2o s=0.5", "expect-head 3 5",
                   "view logits", "export $DIR/kept.json",
                   // per-run budgets compared: h2o at 0.3 against h2o at 0.7, A - B in Retention
                   "compare h2o@0.3,h2o@0.7", "view retention", "export $DIR/budgets.json",
                   "screenshot $DIR/budgets.png", "save-trace $DIR/budgets.kvtrace", "quit"},
                  dir));
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(read_file(dir + "/kept.json").find("\"step\": 20.0") != std::string::npos);
  const Trace saved = load_trace(dir + "/budgets.kvtrace");
  REQUIRE(saved.runs.size() == 5);
  CHECK(saved.runs[3].policy == "h2o");
  CHECK(saved.runs[3].sparsity == Approx(0.3));
  CHECK(saved.runs[4].sparsity == Approx(0.7));
  const std::string budgets = read_file(dir + "/budgets.json");
  CHECK(budgets.find("fraction A - B") != std::string::npos);
  CHECK(distinct_colors(dir + "/pending.png") > 200);
}

TEST_CASE(
    "a token search highlights the token in every view and a click on a token opens its history",
    "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = kvlens::test::make_temp_dir("app");
  const auto result =
      run_app(dir, script({"goto 60", "find the", "view heads", "detail on",
                           "screenshot $DIR/found.png", "save-trace $DIR/run.kvtrace",
                           "view retention", "click-token 1 30", "expect-tab history",
                           "screenshot $DIR/history.png", "export $DIR/history.json", "quit"},
                          dir));
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  // As many highlighted as tokens of the text hold "the" (any case, spaces trimmed).
  const Trace trace = load_trace(dir + "/run.kvtrace");
  size_t expected = 0;
  for (const TraceToken& token : trace.tokens) {
    std::string text = token.text;
    for (char& c : text) c = char(std::tolower(static_cast<unsigned char>(c)));
    expected += text.find("the") != std::string::npos;
  }
  REQUIRE(expected > 0);
  CHECK(result.out.find("find: " + std::to_string(expected) + " tokens highlighted") !=
        std::string::npos);
  CHECK(distinct_colors(dir + "/history.png") > 20);
  CHECK(read_file(dir + "/history.json").find("30") != std::string::npos);
}

TEST_CASE("a window closed too small is not restored at that size", "[ui][app]") {
  // Xvfb without a window manager once left a 200 x 100 geometry in the settings, and every
  // later launch with those settings opened that small.
  REQUIRE(have_xvfb());
  const std::string dir = kvlens::test::make_temp_dir("app");
  const auto first = run_app(dir, "resize 200 100\nquit\n");
  INFO(first.out << first.err);
  REQUIRE(first.exit_code == 0);
  // (run_app writes the script to the same folder: the settings folder is kept)
  const auto second = run_app(dir, script({"screenshot $DIR/next.png", "quit"}, dir));
  INFO(second.out << second.err);
  REQUIRE(second.exit_code == 0);
  const auto [width, height] = png_size(dir + "/next.png");
  CHECK(width >= 640);
  CHECK(height >= 400);
}
#endif  // KVLENS_APP_PATH

#ifdef KVLENS_APP_PATH
TEST_CASE("a typed prompt is continued under each run with the first departure from dense marked",
          "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = kvlens::test::make_temp_dir("app");
  const std::string prompt = "Tom had a red ball. Tom";
  const auto result = run_app(
      dir,
      script({"runs dense,h2o@0.0,streaming@0.9", "restart", "generate 12", "expect-tab generate",
              "report-generated", "screenshot $DIR/generate.png", "quit"},
             dir),
      "--prompt '" + prompt + "'");
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  // Dense's continuation is kvlens-cli generate's (greedy, the same prompt).
  const auto cli = kvlens::test::run_command(kvlens::test::cli_path() + " generate --model " +
                                             kvlens::test::source_path("assets/models/demo") +
                                             " --prompt '" + prompt + "' --max-new 12 --ids");
  REQUIRE(cli.exit_code == 0);
  std::string cli_ids = cli.out;  // (with --ids: the new ids only, space-separated)
  while (!cli_ids.empty() && cli_ids.back() == '\n') cli_ids.pop_back();
  for (char& c : cli_ids) c = c == ' ' ? ',' : c;
  CHECK(result.out.find("generated: dense | departs -1 | ids " + cli_ids + " |") !=
        std::string::npos);
  // h2o hiding nothing says what dense says; a run that sees 10% of the text may not.
  CHECK(result.out.find("generated: h2o s=0 | departs -1 | ids " + cli_ids + " |") !=
        std::string::npos);
  CHECK(result.out.find("generated: streaming s=0.9 | departs ") != std::string::npos);
  CHECK(distinct_colors(dir + "/generate.png") > 20);
}
#endif  // KVLENS_APP_PATH

#ifdef KVLENS_APP_PATH
#include <regex>

TEST_CASE("the heads grid fills the view area and the zoom buttons stay put", "[ui][app]") {
  // Fit lays the figure out at the view area's size in both directions: the maps grow until the
  // width or the height is used up (at 1280 x 720 and at 1920 x 1080, one and four runs).
  REQUIRE(have_xvfb());
  for (const char* screen : {"1280x720", "1920x1080"}) {
    const std::string dir = kvlens::test::make_temp_dir("app");
    const auto result =
        run_app(dir,
                script({"report-figure", "compare dense", "report-figure",
                        "compare dense,tokenbutler,h2o,quest", "report-figure", "sidebar off",
                        "report-figure", "sidebar on", "locate Fit", "zoom 125", "locate Fit",
                        "zoom 80", "locate Fit", "zoom fit", "quit"},
                       dir),
                "", screen);
    INFO(screen << "\n" << result.out << result.err);
    REQUIRE(result.exit_code == 0);
    const std::regex figure(R"(figure: (\d+) x (\d+) in an area of (\d+) x (\d+))");
    int figures = 0;
    for (auto it = std::sregex_iterator(result.out.begin(), result.out.end(), figure);
         it != std::sregex_iterator(); ++it, ++figures) {
      const double w = std::stod((*it)[1]), h = std::stod((*it)[2]);
      const double area_w = std::stod((*it)[3]), area_h = std::stod((*it)[4]);
      CHECK(w <= area_w);
      CHECK(h <= area_h);
      // (one direction is used up, less the scroll bar's room and the grid's margins)
      CHECK((w >= 0.9 * area_w || h >= 0.85 * area_h));
    }
    CHECK(figures == 4);
    // Without the sidebar the view area has the sidebar's 330 units more.
    std::vector<double> areas;
    for (auto it = std::sregex_iterator(result.out.begin(), result.out.end(), figure);
         it != std::sregex_iterator(); ++it)
      areas.push_back(std::stod((*it)[3]));
    REQUIRE(areas.size() == 4);
    CHECK(areas[3] > areas[2] + 300);
    // The Fit button is where it was at every zoom (its neighbours' labels change width).
    const std::regex fit(R"(locate: Fit at (\d+ \d+))");
    std::vector<std::string> places;
    for (auto it = std::sregex_iterator(result.out.begin(), result.out.end(), fit);
         it != std::sregex_iterator(); ++it)
      places.push_back((*it)[1]);
    REQUIRE(places.size() == 3);
    CHECK(places[0] == places[1]);
    CHECK(places[1] == places[2]);
  }
}
#endif  // KVLENS_APP_PATH

#ifdef KVLENS_APP_PATH
TEST_CASE("a fetched real model is offered in the sidebar and opens with its own tokenizer",
          "[ui][app]") {
  // tools/get_model.sh's cache holds SmolLM2's .gguf (packaging/bootstrap.sh --test fetches it
  // and sets KVLENS_REAL_MODEL): the sidebar's "Open" beside it records the same prompt on it,
  // tokenbutler included (the bundled predictor for that file, assets/predictors).
  REQUIRE(have_xvfb());
  const char* real = std::getenv("KVLENS_REAL_MODEL");
  if (!real || !std::filesystem::exists(real)) {
    std::printf("skipped: no real model fetched (KVLENS_REAL_MODEL unset; tools/get_model.sh)\n");
    std::fflush(stdout);
    std::_Exit(4);
  }
  const std::string dir = kvlens::test::make_temp_dir("app");
  const std::string cache = dir + "/cache";
  std::filesystem::create_directories(cache + "/smollm2");
  std::filesystem::create_symlink(real, cache + "/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
  const auto result =
      run_app(dir,
              script({"click Open", "wait-idle", "expect-model SmolLM2-135M-Instruct.Q4_1.gguf",
                      "expect-compare dense,h2o s=0.5,tokenbutler s=0.5", "view heads",
                      "screenshot $DIR/real.png", "save-trace $DIR/real.kvtrace", "quit"},
                     dir),
              "--prompt 'The capital of France is' --policies dense,h2o,tokenbutler", "1600x1000",
              "KVLENS_MODEL_CACHE=" + cache);
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  const Trace trace = load_trace(dir + "/real.kvtrace");
  CHECK(trace.model.layers == 30);
  CHECK(trace.model.vocab_size == 49152);
  REQUIRE(trace.runs.size() == 3);
  CHECK(trace.runs[2].policy == "tokenbutler");
  // SmolLM2's own tokenizer (the file says: no BOS): "The" is its first token.
  REQUIRE(!trace.tokens.empty());
  CHECK(trace.tokens.front().text == "The");
  CHECK(distinct_colors(dir + "/real.png") > 100);
}

TEST_CASE("the app splits the model over ranks with --gpus and says which holds what",
          "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = kvlens::test::make_temp_dir("app");
  // On the CPU backend --gpus 2 makes two CPU ranks, the split's check where there is no GPU.
  const auto result = run_app(
      dir,
      script({"expect-backend cpu ranks 0,1: 4 of 8 heads, 2 of 4 KV heads each", "view heads",
              "screenshot $DIR/split.png", "save-trace $DIR/split.kvtrace", "quit"},
             dir),
      "--backend cpu --gpus 2");
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(load_trace(dir + "/split.kvtrace").model.heads == 8);
  CHECK(distinct_colors(dir + "/split.png") > 200);
}
#endif  // KVLENS_APP_PATH
