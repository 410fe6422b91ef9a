// kvlens-cli figure: one of the app's views, built from a .kvtrace by the same figure code the
// app draws, exported to PNG, SVG or PDF (viz/qt/painter_renderer), with the data behind it as CSV
// or JSON. Without Qt 6 in the build the command exists and says so.
#include <cstdio>
#include <string>
#include <vector>

#include "app/cli/cli_common.h"
#include "engine/common/error.h"

#if KVLENS_HAVE_QT
#include <QGuiApplication>

#include "engine/trace/trace.h"
#include "viz/qt/painter_renderer.h"
#include "viz/qt/qt_messages.h"
#include "viz/views.h"
#endif

namespace kvlens::cli {
namespace {

struct FigureFlags {
  std::string trace_path, view = "heads", out_path, data_path, runs = "0",
                          quantity = "probabilities", consensus = "pearson", theme = "light";
  int64_t step = -1, layer = 0, head = 0, retention_layer = -1, retention_head = -1;
  bool detail = false, linear = false;
  double width = 1280, height = 0, scale = 2.0;
  std::vector<int64_t> highlight;
};
FigureFlags flags;

#if KVLENS_HAVE_QT
int run_figure() {
  // Exports need fonts and painting, not a display.
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  viz::install_headless_message_filter();
  int argc = 1;
  char name[] = "kvlens-cli";
  char* argv[] = {name, nullptr};
  QGuiApplication application(argc, argv);
  viz::export_format_of(flags.out_path);  // a bad extension fails before the trace is read
  if (!flags.data_path.empty() && !flags.data_path.ends_with(".csv") &&
      !flags.data_path.ends_with(".json")) {
    throw Error("--data", "extension", ".csv or .json", "'" + flags.data_path + "'");
  }
  if (flags.theme != "light" && flags.theme != "dark")
    throw Error("--theme", "theme", "light or dark", "'" + flags.theme + "'");
  // Every flag is checked before the trace (possibly gigabytes) is read.
  const viz::ViewKind kind = viz::parse_view(flags.view);
  viz::ViewOptions options;
  options.step = flags.step;
  options.layer = flags.layer;
  options.head = flags.head;
  options.head_detail = flags.detail;
  options.quantity = viz::parse_quantity(flags.quantity, "--quantity");
  options.log_scale = !flags.linear;
  options.consensus = viz::parse_consensus(flags.consensus, "--consensus");
  options.retention_layer = flags.retention_layer;
  options.retention_head = flags.retention_head;
  options.dark = flags.theme == "dark";
  options.width = float(flags.width);
  options.height = float(flags.height);
  options.highlight_tokens = flags.highlight;
  options.with_data = !flags.data_path.empty();
  const Trace trace = load_trace(flags.trace_path);
  options.runs = viz::parse_runs(trace, flags.runs, "--runs");
  const viz::View view = viz::build_view(trace, kind, options);
  viz::export_figure(view.figure, flags.out_path, flags.scale);
  if (!flags.data_path.empty()) {
    AtomicOutputFile data(flags.data_path, "--data");
    data.stream() << (flags.data_path.ends_with(".csv") ? view.data.to_csv() : view.data.to_json());
    data.commit();
  }
  std::printf("figure %s: %s view, %.0fx%.0f, step %lld of %s", flags.out_path.c_str(),
              flags.view.c_str(), view.figure.width, view.figure.height,
              (long long)viz::resolved_step(trace, options), flags.trace_path.c_str());
  if (!flags.data_path.empty()) std::printf("; data %s", flags.data_path.c_str());
  std::printf("\n");
  return 0;
}
#else
int run_figure() {
  throw Error("figure", "build", "a kvlens-cli built with Qt 6 (QtGui, QtSvg)",
              "one built without it");
}
#endif

}  // namespace

void add_figure_command(CLI::App& app, CommonOptions&, CommandFn& run) {
  auto* command = app.add_subcommand(
      "figure", "Export one of the app's views of a .kvtrace as PNG, SVG or PDF");
  command->add_option("--trace", flags.trace_path, "The .kvtrace file")->required();
  command->add_option("--view", flags.view, "heads, predicted, retention, consensus or logits")
      ->capture_default_str();
  command->add_option("--out", flags.out_path, "Output .png, .svg or .pdf")->required();
  command->add_option("--data", flags.data_path, "Also write the data behind it (.csv or .json)");
  command
      ->add_option("--runs", flags.runs,
                   "Runs to show, by index or policy id; 2-4 runs compare side by side")
      ->capture_default_str();
  command->add_option("--step", flags.step, "Step to show (default: the last)");
  command->add_option("--layer", flags.layer, "Selected layer (heads --detail, predicted)")
      ->capture_default_str();
  command->add_option("--head", flags.head, "Selected head (heads --detail, predicted)")
      ->capture_default_str();
  command->add_flag("--detail", flags.detail, "heads: the selected head alone, with token labels");
  command->add_option("--quantity", flags.quantity, "heads: logits, probabilities or scores")
      ->capture_default_str();
  command->add_flag("--linear", flags.linear, "heads: probabilities on a linear scale");
  command->add_option("--consensus", flags.consensus, "consensus: pearson or jaccard")
      ->capture_default_str();
  command->add_option("--retention-layer", flags.retention_layer,
                      "retention: count the heads of this layer only");
  command->add_option("--retention-head", flags.retention_head,
                      "retention: count this head of each layer in scope only");
  command->add_option("--theme", flags.theme, "light or dark")->capture_default_str();
  command->add_option("--width", flags.width, "Canvas width in figure units (CSS pixels)")
      ->capture_default_str()
      ->check(CLI::Range(320.0, 8000.0));
  command
      ->add_option("--height", flags.height,
                   "Height to fill in figure units (the app's view area; 0: the content decides)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 8000.0));
  command->add_option("--highlight", flags.highlight, "Token positions to highlight (a search)")
      ->delimiter(',');
  command->add_option("--scale", flags.scale, "PNG pixels per unit")
      ->capture_default_str()
      ->check(CLI::Range(0.25, 8.0));
  command->callback([&run] { run = [] { return run_figure(); }; });
}

}  // namespace kvlens::cli
