// render_dashboard (headless.h): the recording runs on this thread, then the views are exported.
#include "app/gui/headless.h"

#include <QDir>
#include <chrono>
#include <cstdio>

#include "app/gui/bundled_paths.h"
#include "app/gui/policy_defaults.h"
#include "app/session/policy_runs.h"
#include "app/session/recording.h"
#include "engine/model/model.h"
#include "viz/qt/painter_renderer.h"
#include "viz/views.h"

namespace kvlens::app {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int render_dashboard(const LaunchOptions& options, const QString& out_dir) {
  try {
    const auto open_start = std::chrono::steady_clock::now();
    session::CommonOptions common;
    common.backend = options.backend == "cuda" ? "cuda" : "cpu";
    common.gpus = options.gpus;
    common.devices = options.devices.toStdString();
    session::RecordingSource source;
    if (options.prompt.isEmpty()) {
      source.coref_index = options.coref_sample;
    } else {
      source.prompt = options.prompt.toStdString();
    }
    const QString model_dir = options.model_dir.isEmpty() ? bundled_model_dir() : options.model_dir;
    const std::shared_ptr<const Model> model =
        Model::load(model_dir.toStdString(), options.predictor_file.toStdString());
    const PolicyChoice choice =
        choose_policies(options.policies.toStdString(), options.policies_asked, *model);
    if (!choice.note.empty()) std::printf("kvlens: note: %s\n", choice.note.c_str());
    std::printf("kvlens: predictor: %s\n", predictor_summary(*model).c_str());
    session::Recording recording = session::open_recording(
        common, model, source,
        session::resolve_policy_runs(choice.policies, options.sparsity.toStdString(), {}),
        TraceOptions{}, "--prompt");
    if (recording.backends.size() > 1)
      std::printf("kvlens: model on %s\n", session::placement_text(recording).c_str());
    TraceRecorder& recorder = *recording.recorder;
    // Up to the step that predicts the answer's last token (a sample), else the whole text.
    const Trace& trace = recorder.trace();
    const int64_t last =
        trace.coref.present ? trace.coref.answer_token_end - 2 : recorder.steps_total() - 1;
    const double open_seconds = seconds_since(open_start);
    const int64_t first_step = trace.step_count();
    const auto record_start = std::chrono::steady_clock::now();
    while (trace.step_count() <= last && recorder.step()) {
    }
    const double record_seconds = seconds_since(record_start);
    const int64_t recorded = trace.step_count() - first_step;
    if (!QDir().mkpath(out_dir)) {
      std::fprintf(stderr, "kvlens: error: %s: cannot create the folder\n",
                   out_dir.toLocal8Bit().constData());
      return 1;
    }
    viz::ViewOptions view_options;
    view_options.runs = viz::default_runs(trace);
    view_options.dark = options.dark;
    const HeadChoice head = typical_predicted_head(trace, trace.step_count() - 1);
    view_options.layer = head.found ? head.layer : std::min<int64_t>(2, trace.model.layers - 1);
    view_options.head = head.head;
    if (head.found) std::printf("kvlens: selected %s\n", head.why.c_str());
    std::string shown;
    for (const int64_t run : view_options.runs)
      shown += (shown.empty() ? "" : ", ") + viz::run_title(trace, run);
    std::printf("kvlens: no display; the dashboard of %s (step %lld; %s) is in %s:\n",
                model_dir.toLocal8Bit().constData(), (long long)(trace.step_count() - 1),
                shown.c_str(), QDir(out_dir).absolutePath().toLocal8Bit().constData());
    std::string drawn;  // "<view> <ms> ms" per view, for the timing line
    double draw_seconds = 0;
    int views = 0;
    for (const viz::ViewKind kind :
         {viz::ViewKind::Heads, viz::ViewKind::Predicted, viz::ViewKind::Retention,
          viz::ViewKind::Consensus, viz::ViewKind::Logits}) {
      const auto draw_start = std::chrono::steady_clock::now();
      const viz::View view = viz::build_view(trace, kind, view_options);
      const QString path =
          QDir(out_dir).filePath(QString("kvlens-%1.png").arg(viz::view_name(kind)));
      viz::export_figure(view.figure, path.toStdString());
      const double seconds = seconds_since(draw_start);
      draw_seconds += seconds;
      ++views;
      drawn += (drawn.empty() ? "" : ", ") + std::string(viz::view_name(kind)) + " " +
               std::to_string(int64_t(seconds * 1000 + 0.5)) + " ms";
      std::printf("  %s\n", QDir(path).absolutePath().toLocal8Bit().constData());
    }
    // Wall-clock times on this thread: the recording (every run in lockstep, rows copied to the
    // host into the trace) and each view built from the trace and painted into its PNG.
    const auto per_second = [&](double seconds) { return seconds > 0 ? recorded / seconds : 0.0; };
    std::printf("kvlens: %s backend; model loaded and recording opened in %.2f s\n",
                common.backend.c_str(), open_seconds);
    std::printf(
        "kvlens: recorded %lld decode steps (%zu runs in lockstep) in %.2f s: %.2f steps/s\n",
        (long long)recorded, trace.runs.size(), record_seconds, per_second(record_seconds));
    std::printf("kvlens: drew %d views (%s) in %.2f s: %.2f steps/s recording plus drawing them\n",
                views, drawn.c_str(), draw_seconds, per_second(record_seconds + draw_seconds));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvlens: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace kvlens::app
