// kvlens: the desktop app. With a display it opens the window on the bundled demo model, a
// co-reference sample and four policies ready to step (or on --model / --trace); --script drives
// the window from a file (tests); without a display (or with --headless) it renders the default
// dashboard to PNG files and prints where.
#include <CLI/CLI.hpp>
#include <QApplication>
#include <QGuiApplication>
#include <QSurfaceFormat>
#include <cstdio>
#include <string>
#include <vector>

#include "app/gui/headless.h"
#include "app/gui/main_window.h"
#include "app/gui/script_runner.h"
#include "app/session/common_options.h"
#include "app/session/python_policies.h"
#include "engine/common/error.h"
#include "engine/eval/eval_workers.h"
#include "engine/policy/plugin_policy.h"
#include "viz/qt/qt_messages.h"

namespace {

bool has_display() {
  return !qEnvironmentVariableIsEmpty("DISPLAY") || !qEnvironmentVariableIsEmpty("WAYLAND_DISPLAY");
}

// The canvas draws only on input or request: what changes the picture without input reaching
// the canvas asks it for frames (a step recorded, a recording opened or failed, a menu action or
// shortcut), and playback animates it. (A stand-in until MainWindow and Dashboard make these
// calls themselves: the animation follows only the play state's changes, so that a
// set_animating made elsewhere, say while recording, is not undone at the next frame.)

}  // namespace

int main(int argc, char** argv) {
  using kvlens::app::LaunchOptions;
  // Before anything could start NCCL or torch: NVLink multicast off unless the user set it.
  kvlens::set_multicast_off_defaults();
  CLI::App cli{"kvlens: step a decode under KV-cache policies and see what every head saw"};
  std::string model, trace, prompt, policies = kvlens::app::default_policies(), predictor,
                                    sparsity = "0.5", backend = "auto", script,
                                    out_dir = "kvlens-dashboard";
  int64_t sample = 0;
  bool headless = false, dark = false;
  cli.add_option("--model", model, "Hugging Face checkpoint folder (default: the bundled demo)");
  cli.add_option("--trace", trace, "Open a saved .kvtrace instead of recording");
  cli.add_option("--coref-sample", sample, "Co-reference sample to record")->capture_default_str();
  cli.add_option("--prompt", prompt, "Record this text instead of a sample");
  cli.add_option("--policies", policies,
                 "Comma-separated policy ids (by default a policy that needs a predictor is left "
                 "out when the model has none)")
      ->capture_default_str();
  cli.add_option("--predictor", predictor,
                 "TokenButler predictor.safetensors to load with the model (default: the model "
                 "folder's own)");
  cli.add_option("--sparsity", sparsity, "Sparsity of the policies")->capture_default_str();
  cli.add_option("--backend", backend, "auto, cpu or cuda")->capture_default_str();
  int64_t gpus = 0;
  std::string devices;
  auto* gpus_option =
      cli.add_option("--gpus", gpus,
                     "Split the model over GPUs 0..N-1 (tensor parallelism: each holds its "
                     "heads, their KV cache and MLP columns; the status bar says which)");
  gpus_option->check(CLI::PositiveNumber);
  cli.add_option("--devices", devices, "Split the model over these GPUs, e.g. 0,1")
      ->excludes(gpus_option);
  std::vector<std::string> plugins;
  cli.add_option("--plugin", plugins,
                 "A policy plug-in (shared library against include/kvlens/policy_plugin.h) to "
                 "load at start (repeatable); the folders in $KVLENS_PLUGIN_PATH and "
                 "~/.local/share/kvlens/plugins are loaded too");
  std::vector<std::string> policy_files;
  cli.add_option("--policy-file", policy_files,
                 "A Python file whose kvlens.Policy classes join the policy list, each with its "
                 "docstring (repeatable; embedded CPython)");
  cli.add_option("--script", script, "Drive the window from a script file (see script_runner.h)");
  cli.add_flag("--headless", headless, "Render the dashboard to PNG files instead of a window");
  cli.add_option("--out", out_dir, "Headless: the folder for the PNG files")->capture_default_str();
  cli.add_flag("--dark", dark, "Dark theme");
  cli.allow_extras();  // Qt's own options (-platform, ...)
  try {
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return cli.exit(error);
  }
  // Plug-ins before anything reads the policy list. The app opens anyway: a policy that did not
  // load fails as an unknown one would, in a dialog.
  {
    kvlens::session::CommonOptions plugin_options;
    std::vector<std::string> warnings;
    for (const std::string& file : plugins) {
      try {
        kvlens::load_policy_plugin(file);
      } catch (const kvlens::Error& error) {
        warnings.push_back(error.what());
      }
    }
    kvlens::session::load_plugins(plugin_options, warnings);
    for (const std::string& file : policy_files) {
      try {
        kvlens::session::load_policy_files({file});
      } catch (const kvlens::Error& error) {
        warnings.push_back(error.what());
      }
    }
    for (const std::string& warning : warnings)
      std::fprintf(stderr, "kvlens: warning: %s\n", warning.c_str());
  }
  LaunchOptions options;
  options.model_dir = QString::fromStdString(model);
  options.trace_path = QString::fromStdString(trace);
  options.coref_sample = sample;
  options.prompt = QString::fromStdString(prompt);
  options.policies = QString::fromStdString(policies);
  options.policies_asked = cli.count("--policies") > 0;
  options.predictor_file = QString::fromStdString(predictor);
  options.sparsity = QString::fromStdString(sparsity);
  options.backend = QString::fromStdString(backend);
  options.gpus = gpus;
  options.devices = QString::fromStdString(devices);
  options.script_path = QString::fromStdString(script);
  options.dark = dark;

  QCoreApplication::setOrganizationName("kvlens");
  QCoreApplication::setApplicationName("kvlens");
  // The offscreen platform has no OpenGL for the window: it renders the dashboard like a
  // machine without a display.
  const QString platform = qEnvironmentVariable("QT_QPA_PLATFORM");
  if (headless || platform == "offscreen" || (!has_display() && platform.isEmpty())) {
    qputenv("QT_QPA_PLATFORM", "offscreen");
    kvlens::viz::install_headless_message_filter();
    QGuiApplication application(argc, argv);
    return kvlens::app::render_dashboard(options, QString::fromStdString(out_dir));
  }
  QSurfaceFormat format;
  format.setVersion(3, 3);
  format.setProfile(QSurfaceFormat::CoreProfile);
  QSurfaceFormat::setDefaultFormat(format);
  QApplication application(argc, argv);
  kvlens::app::MainWindow window(options);
  window.show();
  if (!options.script_path.isEmpty()) new kvlens::app::ScriptRunner(window, options.script_path);
  return application.exec();
}
