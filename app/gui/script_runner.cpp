// ScriptRunner: one command per tick once the window has settled (engine idle, two frames drawn).
#include "app/gui/script_runner.h"

#include <QApplication>
#include <QDateTime>
#include <QFile>
#include <QScreen>
#include <QTextStream>
#include <cstdio>

#include "app/gui/main_window.h"

namespace kvlens::app {
namespace {

qint64 now_ms() {
  return QDateTime::currentMSecsSinceEpoch();
}

}  // namespace

ScriptRunner::ScriptRunner(MainWindow& window, const QString& path)
    : QObject(&window), window_(window) {
  QFile file(path);
  if (!file.open(QIODevice::ReadOnly | QIODevice::Text)) {
    load_error_ = path + ": cannot read the script: " + file.errorString();
  } else {
    QTextStream in(&file);
    while (!in.atEnd()) lines_ << in.readLine();
  }
  window_.set_script_mode(true);
  connect(&timer_, &QTimer::timeout, this, &ScriptRunner::tick);
  timer_.start(20);
}

void ScriptRunner::fail(const QString& message) {
  std::fprintf(stderr, "script: line %d: %s\n", line_ + 1, message.toLocal8Bit().constData());
  timer_.stop();
  QApplication::exit(1);
}

bool ScriptRunner::settled() const {
  return !window_.engine().busy() && !window_.engine().generating();
}

void ScriptRunner::tick() {
  if (!load_error_.isEmpty()) return fail(load_error_);
  if (now_ms() < wait_until_ms_) return;
  // Settled: the engine idle, then two more frames drawn, so the screen shows the result.
  if (!settled()) {
    settle_frames_ = -1;
    return;
  }
  if (settle_frames_ < 0) settle_frames_ = window_.canvas().frames();
  if (window_.canvas().frames() < settle_frames_ + 2) return;
  if (line_ >= lines_.size()) {
    timer_.stop();
    QApplication::exit(0);
    return;
  }
  const QString text = lines_[line_].trimmed();
  if (text.isEmpty() || text.startsWith('#')) {
    ++line_;
    return;
  }
  const int space = text.indexOf(' ');
  const QString command = space < 0 ? text : text.left(space);
  const QString rest = space < 0 ? QString() : text.mid(space + 1).trimmed();
  if (started_line_ != line_) {
    started_line_ = line_;
    line_start_ms_ = now_ms();
    std::printf("script: %s\n", text.toLocal8Bit().constData());
    std::fflush(stdout);
  }
  try {
    if (!run(command, rest.isEmpty() ? QStringList() : rest.split(' ', Qt::SkipEmptyParts)))
      return;  // retry at the next tick
  } catch (const std::exception& e) {
    return fail(QString::fromUtf8(e.what()));
  }
  ++line_;
  settle_frames_ = -1;
}

bool ScriptRunner::run(const QString& command, const QStringList& args) {
  Dashboard& dashboard = window_.dashboard();
  const QString joined = args.join(' ');
  auto number = [&](int index) {
    bool ok = false;
    const long long value = index < args.size() ? args[index].toLongLong(&ok) : 0;
    if (!ok) throw std::runtime_error(("'" + command + "' needs a number").toStdString());
    return value;
  };
  if (command == "open-sample") {
    dashboard.pending_config().source.coref_index = number(0);
    dashboard.restart();
  } else if (command == "open-prompt") {
    dashboard.pending_config().source.coref_index = -1;
    dashboard.pending_config().source.prompt = joined.toStdString();
    dashboard.restart();
  } else if (command == "policies") {
    dashboard.set_policies(joined.toStdString());
  } else if (command == "sparsity") {
    dashboard.pending_config().sparsities = joined.toStdString();
  } else if (command == "restart") {
    dashboard.restart();
  } else if (command == "open-model") {
    window_.open_model(joined);
  } else if (command == "load-plugin") {
    window_.load_plugin(joined);
  } else if (command == "open-trace") {
    window_.open_trace(joined);
  } else if (command == "save-trace") {
    if (!window_.save_trace(joined)) throw std::runtime_error("save-trace failed");
  } else if ((command == "step" || command == "back" || command == "goto" || command == "play") &&
             !window_.engine().trace()) {
    // (a test stepping nothing would go on to check an empty window)
    throw std::runtime_error(("'" + command + "': no recording or trace is open").toStdString());
  } else if (command == "step") {
    dashboard.step_forward(int(number(0)));
  } else if (command == "back") {
    dashboard.step_back(int(number(0)));
  } else if (command == "goto") {
    dashboard.go_to_step(number(0));
  } else if (command == "play") {
    dashboard.set_playing(true);
  } else if (command == "pause") {
    dashboard.set_playing(false);
  } else if (command == "wait") {
    wait_until_ms_ = now_ms() + number(0);
  } else if (command == "wait-idle") {
    // settled() already holds when a command runs
  } else if (command == "view") {
    if (joined == "generate") {
      dashboard.set_tab(Tab::Generate);
    } else {
      dashboard.set_view(viz::parse_view(joined.toStdString()));
    }
  } else if (command == "compare") {
    const Trace* trace = window_.engine().trace();
    if (!trace) throw std::runtime_error("compare: nothing recorded");
    const std::vector<int64_t> runs = viz::parse_runs(*trace, joined.toStdString(), "compare");
    if (runs.size() > 4) throw std::runtime_error("compare: 1 to 4 runs");
    dashboard.options().runs = runs;
  } else if (command == "head") {
    dashboard.select_head(number(0), number(1));
  } else if (command == "detail") {
    if (joined != "on" && joined != "off") throw std::runtime_error("detail: on or off");
    dashboard.options().head_detail = joined == "on";
  } else if (command == "quantity") {
    dashboard.options().quantity = viz::parse_quantity(joined.toStdString(), "quantity");
  } else if (command == "consensus") {
    dashboard.options().consensus = viz::parse_consensus(joined.toStdString(), "consensus");
  } else if (command == "zoom") {
    dashboard.set_zoom(joined == "fit" ? 0.0f : float(number(0)) / 100.0f);
  } else if (command == "theme") {
    if (joined != "dark" && joined != "light") throw std::runtime_error("theme: dark or light");
    window_.set_dark(joined == "dark");
  } else if (command == "export") {
    if (!window_.export_view(joined)) throw std::runtime_error("export failed");
  } else if (command == "screenshot") {
    // The screen under the window, so that open dialogs are in the picture too.
    window_.update_status();
    const QRect frame = window_.frameGeometry();
    QScreen* screen = window_.screen();
    if (!screen->grabWindow(0, frame.x(), frame.y(), frame.width(), frame.height()).save(joined))
      throw std::runtime_error(("screenshot: cannot write " + joined).toStdString());
  } else if (command == "expect-error") {
    const QStringList& errors = window_.errors_shown();
    for (int i = errors_seen_; i < errors.size(); ++i) {
      if (errors[i].contains(joined)) {
        errors_seen_ = i + 1;
        return true;
      }
    }
    if (now_ms() - line_start_ms_ < 10000) return false;  // errors arrive from the engine
    throw std::runtime_error(("expect-error: no error dialog saying '" + joined +
                              "' (shown: " + errors.mid(errors_seen_).join(" | ") + ")")
                                 .toStdString());
  } else if (command == "expect-note") {
    const QStringList& notes = window_.notes_shown();
    for (const QString& note : notes)
      if (note.contains(joined)) return true;
    throw std::runtime_error(("expect-note: no status bar note saying '" + joined +
                              "' (shown: " + notes.join(" | ") + ")")
                                 .toStdString());
  } else if (command == "expect-predictor") {
    // The sidebar's predictor line for the open recording ("no predictor" or the file).
    const QString shown = window_.engine().predictor();
    if (!shown.contains(joined))
      throw std::runtime_error(
          ("expect-predictor: the sidebar says '" + shown + "', not '" + joined + "'")
              .toStdString());
  } else if (command == "report") {
    // For benchmarks (tools/bench_app.sh): frames drawn so far, the frame rate over the last
    // second, the steps recorded and how long the last figure took to build.
    const Trace* trace = window_.engine().trace();
    std::printf("report: frames %lld fps %.1f steps %lld build %.1f ms\n",
                (long long)window_.canvas().frames(), window_.canvas().frames_per_second(),
                (long long)(trace ? trace->step_count() : 0), dashboard.last_build_seconds() * 1e3);
    std::fflush(stdout);
  } else if (command == "speed") {
    dashboard.set_play_rate(float(number(0)));
  } else if (command == "runs") {
    // The sidebar's run rows (run specs), not recorded until `restart`.
    dashboard.set_policies(joined.toStdString());
  } else if (command == "expect-pending") {
    if (joined != "yes" && joined != "no") throw std::runtime_error("expect-pending: yes or no");
    if (dashboard.changes_pending() != (joined == "yes"))
      throw std::runtime_error(("expect-pending: changes pending is " +
                                std::string(dashboard.changes_pending() ? "yes" : "no"))
                                   .c_str());
  } else if (command == "expect-compare") {
    // The runs compared, by title ("dense,h2o s=0.3"), in order.
    const Trace* trace = window_.engine().trace();
    QStringList shown;
    for (const int64_t r : dashboard.options().runs)
      shown << QString::fromStdString(viz::run_title(*trace, r));
    if (shown.join(',') != joined)
      throw std::runtime_error(
          ("expect-compare: comparing '" + shown.join(',') + "', not '" + joined + "'")
              .toStdString());
  } else if (command == "expect-head") {
    if (dashboard.options().layer != number(0) || dashboard.options().head != number(1))
      throw std::runtime_error("expect-head: the selected head is " +
                               std::to_string(dashboard.options().layer) + " " +
                               std::to_string(dashboard.options().head));
  } else if (command == "find") {
    std::printf("find: %zu tokens highlighted\n", dashboard.find_token(joined.toStdString()));
    std::fflush(stdout);
  } else if (command == "generate") {
    dashboard.generate(number(0));
  } else if (command == "report-generated") {
    // One line per run: its title, where it departs from dense (-1: never) and its text.
    const Trace* trace = window_.engine().trace();
    const auto& texts = window_.engine().generated();
    if (!trace || texts.size() != trace->runs.size())
      throw std::runtime_error("report-generated: nothing generated");
    for (size_t r = 0; r < texts.size(); ++r) {
      QString ids;
      for (const int32_t id : texts[r].ids) ids += (ids.isEmpty() ? "" : ",") + QString::number(id);
      std::printf("generated: %s | departs %lld | ids %s | %s\n",
                  viz::run_title(*trace, int64_t(r)).c_str(), (long long)texts[r].first_departure,
                  ids.toLocal8Bit().constData(), texts[r].text.c_str());
    }
    std::fflush(stdout);
  } else if (command == "resize") {
    window_.resize(int(number(0)), int(number(1)));
  } else if (command == "expect-highlighted") {
    if (int64_t(dashboard.options().highlight_tokens.size()) != number(0))
      throw std::runtime_error(
          "expect-highlighted: " + std::to_string(dashboard.options().highlight_tokens.size()) +
          " tokens highlighted");
  } else if (command == "click-token") {
    // What a click on a token of the retention view does (run, token).
    dashboard.act_on_hit(FigureHit{
        "token " + args.value(0).toStdString() + ":" + args.value(1).toStdString(), 0, 0});
  } else if (command == "expect-tab") {
    if (QString(tab_title(dashboard.tab())).toLower() != joined.toLower())
      throw std::runtime_error(
          ("expect-tab: the tab shown is " + QString(tab_title(dashboard.tab()))).toStdString());
  } else if (command == "help") {
    if (joined != "on" && joined != "off") throw std::runtime_error("help: on or off");
    dashboard.show_help(joined == "on");
  } else if (command == "close-dialogs") {
    window_.close_dialogs();
  } else if (command == "quit") {
    timer_.stop();
    window_.close();
    QApplication::exit(0);
  } else {
    throw std::runtime_error(("unknown command '" + command + "'").toStdString());
  }
  return true;
}

}  // namespace kvlens::app
