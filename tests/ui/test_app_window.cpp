// The desktop app as a user drives it: the real window under Xvfb (Mesa), steered by --script
// through loading, stepping, switching views, comparing, exporting and quitting; bad model folders
// and traces give an error dialog and leave the session; without a display the dashboard is
// rendered to PNG files. Needs xvfb-run (Debian's xvfb), which bootstrap.sh installs.
#ifdef KVLENS_APP_PATH
#include <QImage>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>

#include "engine/policy/registry.h"
#include "engine/trace/trace.h"
#include "tests/support/small_trace.h"
#include "tests/support/test_paths.h"
#include "tests/ui/app_runner.h"

using namespace kvlens;
using namespace kvlens::test::app;
namespace fs = std::filesystem;

TEST_CASE("the window loads, steps, switches views, compares, exports and quits", "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("app");
  const test::CommandResult result = run_app(dir, script({"goto 29",
                                                          "view heads",
                                                          "screenshot $DIR/heads.png",
                                                          "export $DIR/heads.svg",
                                                          "view retention",
                                                          "compare h2o,quest",
                                                          "screenshot $DIR/retention.png",
                                                          "export $DIR/retention.png",
                                                          "view consensus",
                                                          "export $DIR/consensus.pdf",
                                                          "view logits",
                                                          "back 10",
                                                          "export $DIR/logits.json",
                                                          "compare dense",
                                                          "export $DIR/logits-dense.png",
                                                          "compare quest",
                                                          "export $DIR/logits-quest.png",
                                                          "save-trace $DIR/run.kvtrace",
                                                          "step 20",
                                                          "view heads",
                                                          "compare dense,h2o,quest",
                                                          "zoom 100",
                                                          "export $DIR/heads-100.png",
                                                          "zoom 25",
                                                          "export $DIR/heads-25.png",
                                                          "quit"},
                                                         dir));
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  // The screenshots show the dashboard, not a blank window.
  CHECK(distinct_colors(dir + "/heads.png") > 200);
  CHECK(distinct_colors(dir + "/retention.png") > 50);
  CHECK(read_file(dir + "/heads.svg").find("Attention of every head at step 29") !=
        std::string::npos);
  CHECK(read_file(dir + "/retention.png").substr(1, 3) == "PNG");
  CHECK(read_file(dir + "/consensus.pdf").substr(0, 5) == "%PDF-");
  // Step back moved the view to step 19; the data behind the logits view says so.
  CHECK(read_file(dir + "/logits.json").find("\"step\": 19.0") != std::string::npos);
  CHECK(read_file(dir + "/logits-dense.png") != read_file(dir + "/logits-quest.png"));
  // The recording saved from the window loads without the model, with every step of the text
  // (recorded in the background from the start, without a key press).
  const Trace saved = load_trace(dir + "/run.kvtrace");
  CHECK(saved.step_count() == 111);
  CHECK(saved.runs.size() == (default_runs_tokenbutler() ? 4 : 3));
  CHECK(saved.coref.present);
  // An export has the figure's full detail whatever the zoom on screen (at 25% the window pools
  // the 40 steps' maps to 20 rows, an export keeps all 40).
  CHECK(read_file(dir + "/heads-25.png") == read_file(dir + "/heads-100.png"));
}

TEST_CASE("bad model folders and traces show an error dialog and keep the session", "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("app");
  fs::create_directories(dir + "/not-a-model");
  std::ofstream(dir + "/not-a-model/config.json") << "{\"model_type\": \"llama\"";
  std::ofstream(dir + "/bad.kvtrace") << "KVTRACE1 truncated";
  save_trace(test::make_small_trace(4), dir + "/good.kvtrace");
  const test::CommandResult result = run_app(
      dir,
      script({"goto 4", "open-model $DIR/not-a-model", "expect-error config.json",
              "screenshot $DIR/dialog.png", "close-dialogs", "open-trace $DIR/bad.kvtrace",
              "expect-error bad.kvtrace", "close-dialogs", "view logits", "export $DIR/kept.json",
              "open-trace $DIR/good.kvtrace", "export $DIR/small.json", "quit"},
             dir));
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(distinct_colors(dir + "/dialog.png") > 50);
  // After both failures the demo recording was still there (step 4 of the default runs)...
  const std::string kept = read_file(dir + "/kept.json");
  CHECK(kept.find("\"step\": 4.0") != std::string::npos);
  CHECK(kept.find("h2o") != std::string::npos);
  // ... and a good trace then replaced it.
  CHECK(read_file(dir + "/small.json").find("\"step\": 3.0") != std::string::npos);
}

TEST_CASE("at a high-DPI scale the window fits the screen and draws sharp", "[ui][app]") {
  // Device pixel ratio 2 on a 2200 x 1600 screen (1100 x 800 logical): the window's first size
  // fits the screen, and the screenshot has the device pixels of a whole dashboard.
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("app");
  const test::CommandResult result =
      run_app(dir,
              script({"goto 4", "view heads", "screenshot $DIR/dpi.png", "zoom 300",
                      "screenshot $DIR/zoomed.png", "quit"},
                     dir),
              "", "2200x1600", "QT_SCALE_FACTOR=2");
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  const auto [width, height] = png_size(dir + "/dpi.png");
  CHECK(width <= 2200);
  CHECK(height <= 1600);
  CHECK(width > 1600);  // device pixels, not logical ones
  CHECK(distinct_colors(dir + "/dpi.png") > 200);
  // Zoomed in 3x the maps are drawn from finer maps and larger: another picture, still a full one.
  CHECK(read_file(dir + "/zoomed.png") != read_file(dir + "/dpi.png"));
  CHECK(distinct_colors(dir + "/zoomed.png") > 200);
}

TEST_CASE("a policy plug-in loads in the app, runs beside the built-ins and exports", "[ui][app]") {
  // File > Load policy plug-in (the script's load-plugin), then a run of it next to h2o; a bad
  // file is an error dialog that keeps the session.
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("app");
  std::ofstream(dir + "/broken.so") << "not a library";
  const std::string plugin = std::string(KVLENS_EXAMPLE_PLUGIN_DIR) + "/libkvlens_h2o_c.so";
  const test::CommandResult result = run_app(
      dir,
      script({"load-plugin $DIR/broken.so", "expect-error broken.so", "close-dialogs",
              "load-plugin " + plugin, "expect-note h2o_c", "policies dense,h2o,h2o_c", "restart",
              "wait-idle", "goto 11", "wait-idle", "compare h2o,h2o_c", "view retention",
              "export $DIR/retention.json", "screenshot $DIR/plugin.png", "quit"},
             dir));
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  const std::string exported = read_file(dir + "/retention.json");
  CHECK(exported.find("h2o_c") != std::string::npos);
  CHECK(distinct_colors(dir + "/plugin.png") > 50);
}

TEST_CASE("a policy list with spaces keeps every policy across a restart", "[ui][app]") {
  // The sidebar's check boxes come from --policies; a restart records what they say.
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("app");
  const test::CommandResult result =
      run_app(dir, "restart\ngoto 1\ncompare dense,h2o\nquit\n", "--policies 'dense, h2o'");
  INFO(result.out << result.err);
  CHECK(result.exit_code == 0);
}

TEST_CASE("without its bundled model the window says where it looked", "[ui][app]") {
  // The app copied out of the build tree finds no assets/ above it: an error dialog, no crash.
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("app");
  fs::copy_file(KVLENS_APP_PATH, dir + "/kvlens");
  std::ofstream(dir + "/script.txt") << "expect-error assets/models/demo/config.json\nquit\n";
  const test::CommandResult result =
      test::run_command("env -u QT_QPA_PLATFORM -u KVLENS_ASSETS_DIR XDG_CONFIG_HOME=" + dir +
                        "/config timeout 120 " + xvfb_run(dir, "1600x1000") + dir +
                        "/kvlens --script " + dir + "/script.txt");
  INFO(result.out << result.err);
  CHECK(result.exit_code == 0);
}

TEST_CASE("a failing script command ends the app with an error", "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("app");
  const test::CommandResult result = run_app(dir, "step 2\nview nowhere\nquit\n");
  INFO(result.out << result.err);
  CHECK(result.exit_code == 1);
  CHECK(result.err.find("script: line 2") != std::string::npos);
  CHECK(result.err.find("nowhere") != std::string::npos);
  // Stepping with nothing open fails instead of going on to check an empty window.
  const test::CommandResult none =
      run_app(dir, "close-dialogs\nstep 1\nquit\n", "--model " + dir + "/missing");
  INFO(none.out << none.err);
  CHECK(none.exit_code == 1);
  CHECK(none.err.find("script: line 2: 'step': no recording or trace is open") !=
        std::string::npos);
}

TEST_CASE("the default session runs tokenbutler when the model has a predictor", "[ui][app]") {
  // dense, tokenbutler, h2o, quest; without a predictor (or the policy) tokenbutler is left out
  // with a status bar note, and the sidebar says "no predictor".
  REQUIRE(have_xvfb());
  const bool butler = default_runs_tokenbutler();
  const std::string dir = test::make_temp_dir("app");
  const std::string checks =
      butler ? "expect-predictor predictor.safetensors (variant\n"
             : "expect-predictor no predictor\nexpect-note tokenbutler left out\n";
  const test::CommandResult result =
      run_app(dir, script({"goto 2", checks, "view predicted", "export $DIR/predicted.json",
                           "save-trace $DIR/run.kvtrace", "quit"},
                          dir));
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  const Trace saved = load_trace(dir + "/run.kvtrace");
  std::vector<std::string> policies;
  for (const TraceRun& run : saved.runs) policies.push_back(run.policy);
  CHECK(policies == (butler ? std::vector<std::string>{"dense", "tokenbutler", "h2o", "quest"}
                            : std::vector<std::string>{"dense", "h2o", "quest"}));
  CHECK(read_file(dir + "/predicted.json").find(butler ? "tokenbutler" : "h2o") !=
        std::string::npos);
}

TEST_CASE("an asked-for tokenbutler without a predictor is an error that keeps the session",
          "[ui][app]") {
  REQUIRE(have_xvfb());
  const std::string dir = test::make_temp_dir("app");
  if (!demo_has_predictor()) {
    // Restarting with tokenbutler named: an error dialog, and the recording before it stays.
    const test::CommandResult result = run_app(
        dir, script({"goto 2", "policies dense,tokenbutler", "restart", "expect-error tokenbutler",
                     "close-dialogs", "view logits", "export $DIR/kept.json", "quit"},
                    dir));
    INFO(result.out << result.err);
    REQUIRE(result.exit_code == 0);
    const std::string kept = read_file(dir + "/kept.json");
    CHECK(kept.find("\"step\": 2.0") != std::string::npos);
    CHECK(kept.find("h2o") != std::string::npos);
  }
  // --predictor names the file to load with the model: a missing one is an error dialog.
  const test::CommandResult missing =
      run_app(dir, "expect-error " + dir + "/none/predictor.safetensors\nclose-dialogs\nquit\n",
              "--predictor " + dir + "/none/predictor.safetensors");
  INFO(missing.out << missing.err);
  CHECK(missing.exit_code == 0);
}

TEST_CASE("without a display the dashboard is rendered to PNG files", "[ui][app]") {
  const std::string dir = test::make_temp_dir("app");
  const test::CommandResult result =
      run_headless(dir + "/dashboard", "--policies dense,streaming,h2o,quest");
  INFO(result.out << result.err);
  REQUIRE(result.exit_code == 0);
  CHECK(result.out.find("no display") != std::string::npos);
  // The first three runs, each once (the default run list used to be kept in front of them).
  CHECK(result.out.find("; dense, streaming s=0.5, h2o s=0.5) is in") != std::string::npos);
  // The speed it recorded at, and with the drawing of the views.
  CHECK(result.out.find("decode steps (4 runs in lockstep) in ") != std::string::npos);
  CHECK(result.out.find(" steps/s recording plus drawing them") != std::string::npos);
  for (const char* view : {"heads", "predicted", "retention", "consensus", "logits"}) {
    const std::string path = dir + "/dashboard/kvlens-" + view + ".png";
    CHECK(result.out.find(path) != std::string::npos);
    CHECK(distinct_colors(path) > 20);
  }
}

TEST_CASE("the headless dashboard's default policies follow the model's predictor", "[ui][app]") {
  const std::string dir = test::make_temp_dir("app");
  // Recorded up to the answer's last token; the first three of the default runs shown.
  if (default_runs_tokenbutler()) {
    const test::CommandResult result = run_headless(dir + "/dashboard", "");
    INFO(result.out << result.err);
    REQUIRE(result.exit_code == 0);
    CHECK(result.out.find("kvlens: predictor: ") != std::string::npos);
    CHECK(result.out.find("predictor.safetensors (variant ") != std::string::npos);
    CHECK(result.out.find("; dense, tokenbutler s=0.5, h2o s=0.5) is in") != std::string::npos);
  }
  // The demo model without its predictor: the default list leaves tokenbutler out with a note,
  // while a list that names it is an error.
  const std::string bare = dir + "/bare-model";
  fs::create_directories(bare);
  for (const char* name :
       {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"})
    fs::create_symlink(test::source_path(std::string("assets/models/demo/") + name),
                       bare + "/" + name);
  const test::CommandResult left_out = run_headless(dir + "/bare", "--model " + bare);
  INFO(left_out.out << left_out.err);
  REQUIRE(left_out.exit_code == 0);
  CHECK(left_out.out.find("kvlens: note: tokenbutler left out") != std::string::npos);
  CHECK(left_out.out.find("kvlens: predictor: no predictor") != std::string::npos);
  CHECK(left_out.out.find("; dense, h2o s=0.5, quest s=0.5) is in") != std::string::npos);
  const test::CommandResult asked =
      run_headless(dir + "/asked", "--model " + bare + " --policies dense,tokenbutler");
  INFO(asked.out << asked.err);
  CHECK(asked.exit_code == 1);
  CHECK(asked.err.find("tokenbutler") != std::string::npos);
  CHECK(asked.err.find(bare + "/predictor.safetensors (none)") != std::string::npos);
}
#endif  // KVLENS_APP_PATH
