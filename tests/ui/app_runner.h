// Running the real app in tests: under its own X server (xvfb-run) with a fresh settings folder,
// driven by a --script (app/gui/script_runner.h); plus checks on the PNGs it writes. Included by
// the ui tests of the window (the helpers are inline: each test file is its own translation unit).
#pragma once

#ifdef KVLENS_APP_PATH
#include <QImage>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <string>
#include <utility>

#include "engine/policy/registry.h"
#include "tests/support/test_paths.h"

namespace kvlens::test::app {
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Distinct colours on a grid of samples: a blank or black window has a handful.
inline size_t distinct_colors(const std::string& path) {
  QImage image;
  if (!image.load(QString::fromStdString(path))) return 0;
  std::set<QRgb> colors;
  for (int y = 0; y < image.height(); y += 3)
    for (int x = 0; x < image.width(); x += 3) colors.insert(image.pixel(x, y));
  return colors.size();
}

inline std::pair<int, int> png_size(const std::string& path) {
  const QImage image(QString::fromStdString(path));
  return {image.width(), image.height()};
}

// "xvfb-run" with an X authority file in the test's folder. Without -f, xvfb-run makes a temporary
// folder for it and exits 5 (not the app's status) when it cannot remove that folder on the way
// out, which happened in CI with several windows starting in parallel.
inline std::string xvfb_run(const std::string& dir, const std::string& screen) {
  return "xvfb-run -a -f " + dir + "/Xauthority -s '-screen 0 " + screen + "x24' ";
}

// Runs the app on a script in a fresh settings folder, under its own X server.
inline kvlens::test::CommandResult run_app(const std::string& dir, const std::string& script,
                                           const std::string& args = "",
                                           const std::string& screen = "1600x1000",
                                           const std::string& env = "") {
  std::ofstream(dir + "/script.txt") << script;
  // (this suite's own QT_QPA_PLATFORM=offscreen must not reach the app: it draws with OpenGL)
  return kvlens::test::run_command("env -u QT_QPA_PLATFORM XDG_CONFIG_HOME=" + dir + "/config " +
                                   env + " timeout 300 " + xvfb_run(dir, screen) +
                                   KVLENS_APP_PATH " --script " + dir + "/script.txt " + args);
}

// Script lines, "$DIR" standing for the test's folder.
inline std::string script(std::initializer_list<std::string> lines, const std::string& dir) {
  std::string text;
  for (std::string line : lines) {
    for (size_t at; (at = line.find("$DIR")) != std::string::npos;) line.replace(at, 4, dir);
    text += line + "\n";
  }
  return text;
}

inline bool have_xvfb() {
  return kvlens::test::run_command("command -v xvfb-run").exit_code == 0;
}

// The default session runs tokenbutler when this build has the policy and the bundled demo model
// has a predictor beside it; otherwise it leaves it out with a note (dense, h2o, quest).
inline bool demo_has_predictor() {
  return std::filesystem::exists(test::source_path("assets/models/demo/predictor.safetensors"));
}
inline bool default_runs_tokenbutler() {
  bool registered = false;
  for (const PolicyInfo& info : policy_infos()) registered = registered || info.id == "tokenbutler";
  return registered && demo_has_predictor();
}

// The app without a display (it renders the dashboard to PNGs in `out`), with extra arguments.
inline kvlens::test::CommandResult run_headless(const std::string& out, const std::string& args) {
  return kvlens::test::run_command(
      "env -u DISPLAY -u WAYLAND_DISPLAY -u QT_QPA_PLATFORM " KVLENS_APP_PATH " --out " + out +
      " " + args);
}

}  // namespace kvlens::test::app
#endif  // KVLENS_APP_PATH
