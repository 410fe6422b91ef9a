// ScriptRunner: one command per tick once the window has settled (engine idle, two frames drawn).
#include "app/gui/script_runner.h"

#include <unistd.h>
#include <QApplication>
#include <QDateTime>
#include <QFile>
#include <QKeyEvent>
#include <QKeySequence>
#include <QMouseEvent>
#include <QScreen>
#include <QTextStream>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "app/gui/help_overlay.h"
#include "app/gui/main_window.h"

namespace kvlens::app {
namespace {

constexpr int kTickMs = 20;  // how often the script looks whether its next line can run

qint64 now_ms() {
  return QDateTime::currentMSecsSinceEpoch();
}

// CPU seconds this process has used, all threads, user and system (/proc/self/stat).
double process_cpu_seconds() {
  std::ifstream in("/proc/self/stat");
  const std::string stat{std::istreambuf_iterator<char>(in), {}};
  const size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos) throw std::runtime_error("cannot read /proc/self/stat");
  std::istringstream fields(stat.substr(name_end + 2));  // from field 3 (state) on
  std::string field;
  unsigned long long user = 0, system = 0;
  for (int index = 3; index <= 15 && fields >> field; ++index) {
    if (index == 14) user = std::stoull(field);
    if (index == 15) system = std::stoull(field);
  }
  return double(user + system) / double(sysconf(_SC_CLK_TCK));
}

// "Shift+Right", "F1", "?", "Esc": one key and its modifiers, as QKeySequence reads them.
QKeyCombination parse_key(const QString& spec) {
  const QKeySequence sequence = QKeySequence::fromString(spec);
  if (sequence.count() != 1 || sequence[0].key() == Qt::Key_unknown)
    throw std::runtime_error(
        ("keys: '" + spec + "' is not a key (expected e.g. Right, Shift+Right, F1, ?, Esc)")
            .toStdString());
  return sequence[0];
}

// The text a key types (what ImGui's text fields receive): printable keys only.
QString key_text(QKeyCombination key) {
  const int code = int(key.key());
  if (code < 0x20 || code > 0x7e) return {};
  const QChar c(code);
  return (key.keyboardModifiers() & Qt::ShiftModifier) ? QString(c) : QString(c).toLower();
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
  timer_.start(kTickMs);
}

void ScriptRunner::fail(const QString& message) {
  std::fprintf(stderr, "script: line %d: %s\n", line_ + 1, message.toLocal8Bit().constData());
  timer_.stop();
  QApplication::exit(1);
}

bool ScriptRunner::settled() const {
  return !window_.engine().busy() && !window_.engine().generating() &&
         !window_.canvas().input_pending();
}

void ScriptRunner::tick() {
  if (!load_error_.isEmpty()) return fail(load_error_);
  if (now_ms() < wait_until_ms_) return;
  // A line starting with '!' runs while the engine still records (it waits only for a first
  // recorded step): input that arrives as the recording goes on.
  const bool immediate = line_ < lines_.size() && lines_[line_].trimmed().startsWith('!');
  if (immediate) {
    const Trace* trace = window_.engine().trace();
    if (!trace || trace->step_count() == 0) return;
  }
  // Settled: the engine idle, then two more frames drawn, so the screen shows the result.
  if (!immediate && !settled()) {
    settle_frames_ = -1;
    return;
  }
  if (settle_frames_ < 0) {
    settle_frames_ = window_.canvas().frames();
    window_.canvas().request_frames(2);  // the canvas draws on demand only
  }
  if (!immediate && window_.canvas().frames() < settle_frames_ + 2) return;
  if (line_ >= lines_.size()) {
    timer_.stop();
    QApplication::exit(0);
    return;
  }
  QString text = lines_[line_].trimmed();
  if (immediate) text = text.mid(1).trimmed();
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
  } else if (command == "match") {
    // The Runs section's "match effective sparsity" box.
    if (joined != "effective" && joined != "none") {
      throw std::runtime_error(
          ("'match' needs effective or none, not '" + joined + "'").toStdString());
    }
    dashboard.pending_config().match_effective = joined == "effective";
  } else if (command == "expect-match") {
    // The sidebar's matched report has TEXT (e.g. "h2o@0.5: nominal").
    const QString report = window_.engine().match_report();
    if (!report.contains(joined)) {
      throw std::runtime_error(
          ("expect-match: '" + joined + "' not in '" + report + "'").toStdString());
    }
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
  } else if (command == "expect-model") {
    // The recording on screen runs on a model whose path contains TEXT.
    const QString shown = QString::fromStdString(window_.engine().config().model_dir);
    if (!shown.contains(joined))
      throw std::runtime_error(
          ("expect-model: the recording runs on '" + shown + "', not '" + joined + "'")
              .toStdString());
  } else if (command == "expect-backend") {
    const QString shown = window_.engine().backend_name();
    if (!shown.contains(joined))
      throw std::runtime_error(
          ("expect-backend: the status bar says '" + shown + "', not '" + joined + "'")
              .toStdString());
  } else if (command == "sidebar") {
    if (joined != "on" && joined != "off") throw std::runtime_error("sidebar: on or off");
    dashboard.set_sidebar_shown(joined == "on");
  } else if (command == "report-figure") {
    // The figure on screen against the view area it was laid out for (canvas units).
    const std::shared_ptr<const viz::View> view = dashboard.current_view();
    if (!view) throw std::runtime_error("report-figure: no figure on screen");
    std::printf("figure: %.0f x %.0f in an area of %.0f x %.0f\n", double(view->figure.width),
                double(view->figure.height), double(dashboard.area_width()),
                double(dashboard.area_height()));
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
    window_.canvas().set_help_open(joined == "on");
  } else if (command == "close-dialogs") {
    window_.close_dialogs();
  } else if (const std::optional<bool> done = run_input_command(command, args); done) {
    if (!*done) return false;  // input injection and measurements (run_input_command)
  } else if (command == "quit") {
    timer_.stop();
    window_.close();
    QApplication::exit(0);
  } else {
    throw std::runtime_error(("unknown command '" + command + "'").toStdString());
  }
  return true;
}

// Input as a user gives it, posted to the canvas back to back (no frame drawn between events),
// and measurements of how the window responds.
std::optional<bool> ScriptRunner::run_input_command(const QString& command,
                                                    const QStringList& args) {
  ImGuiCanvas& canvas = window_.canvas();
  auto count_at = [&](int index) {
    if (index >= args.size()) return 1;
    bool ok = false;
    const int value = args[index].toInt(&ok);
    if (!ok || value < 1 || value > 1000)
      throw std::runtime_error(
          (command + ": the count '" + args[index] + "' is not a number from 1 to 1000")
              .toStdString());
    return value;
  };
  auto post_clicks = [&](QPointF at, int count) {
    const QPointF global = canvas.mapToGlobal(at);
    QCoreApplication::postEvent(
        &canvas,
        new QMouseEvent(QEvent::MouseMove, at, global, Qt::NoButton, Qt::NoButton, Qt::NoModifier));
    for (int i = 0; i < count; ++i) {
      QCoreApplication::postEvent(
          &canvas, new QMouseEvent(QEvent::MouseButtonPress, at, global, Qt::LeftButton,
                                   Qt::LeftButton, Qt::NoModifier));
      QCoreApplication::postEvent(
          &canvas, new QMouseEvent(QEvent::MouseButtonRelease, at, global, Qt::LeftButton,
                                   Qt::NoButton, Qt::NoModifier));
    }
  };
  if (command == "click-at") {
    // click-at X Y [COUNT]: canvas coordinates (logical pixels).
    bool ok_x = false, ok_y = false;
    const double x = args.value(0).toDouble(&ok_x), y = args.value(1).toDouble(&ok_y);
    if (!ok_x || !ok_y) throw std::runtime_error("click-at: needs X Y [COUNT] in canvas pixels");
    post_clicks({x, y}, count_at(2));
  } else if (command == "click" || command == "click-n") {
    // click TEXT | click-n COUNT TEXT: on the control the last frame labelled TEXT.
    const int count = command == "click-n" ? count_at(0) : 1;
    const QString text = (command == "click-n" ? args.mid(1) : args).join(' ');
    if (text.isEmpty()) throw std::runtime_error((command + ": which text?").toStdString());
    const std::optional<QPointF> at = canvas.find_text(text);
    if (!at) {
      if (now_ms() - line_start_ms_ < 3000) {
        canvas.request_frames();
        return false;  // (retried: the next frames may show it)
      }
      throw std::runtime_error((command + ": no text '" + text + "' on the screen").toStdString());
    }
    post_clicks(*at, count);
  } else if (command == "locate") {
    // locate TEXT: prints where the screen shows TEXT, in the pixels of a screenshot.
    const QString text = args.join(' ');
    const std::optional<QPointF> at = canvas.find_text(text);
    if (!at)
      throw std::runtime_error(("locate: no text '" + text + "' on the screen").toStdString());
    const QPointF in_shot = QPointF(canvas.mapToGlobal(*at) - window_.frameGeometry().topLeft()) *
                            canvas.devicePixelRatioF();
    std::printf("locate: %s at %.0f %.0f\n", text.toUtf8().constData(), in_shot.x(), in_shot.y());
    std::fflush(stdout);
  } else if (command == "keys") {
    // keys KEY [COUNT] [held]: COUNT presses and releases of KEY; held: one press held down for
    // COUNT - 1 auto-repeats (release and press again, as X11 repeats), then the release.
    if (args.isEmpty())
      throw std::runtime_error("keys: needs KEY [COUNT] [held], e.g. keys Shift+Right 11");
    if (args.size() > 2 && args[2] != "held")
      throw std::runtime_error(("keys: '" + args[2] + "' is not 'held'").toStdString());
    const QKeyCombination key = parse_key(args[0]);
    const int count = count_at(1);
    const bool held = args.size() > 2;
    auto post = [&](QEvent::Type type, bool repeat) {
      QCoreApplication::postEvent(
          &canvas,
          new QKeyEvent(type, int(key.key()), key.keyboardModifiers(), key_text(key), repeat));
    };
    for (int i = 0; i < count; ++i) {
      post(QEvent::KeyPress, held && i > 0);
      if (!held || i == count - 1)
        post(QEvent::KeyRelease, false);
      else
        post(QEvent::KeyRelease, true);
    }
  } else if (command == "expect-step") {
    // expect-step N | last: the step the view shows.
    const Trace* trace = window_.engine().trace();
    const int64_t last = trace ? trace->step_count() - 1 : -1;
    bool ok = false;
    const int64_t wanted = args.value(0) == "last" ? last : args.value(0).toLongLong(&ok);
    if (args.value(0) != "last" && !ok)
      throw std::runtime_error("expect-step: needs a step number or 'last'");
    const int64_t shown = window_.dashboard().cursor();
    if (shown != wanted)
      throw std::runtime_error(("expect-step: the view shows step " + std::to_string(shown) +
                                ", not " + std::to_string(wanted) + " (" +
                                std::to_string(last + 1) + " recorded)"));
  } else if (command == "expect-help") {
    // expect-help open | closed: whether the last frame drew the keys-and-gestures overlay.
    if (args.value(0) != "open" && args.value(0) != "closed")
      throw std::runtime_error("expect-help: open or closed");
    const bool wanted = args.value(0) == "open";
    if (help_overlay_shown() != wanted || canvas.help_open() != wanted)
      throw std::runtime_error(std::string("expect-help: the help overlay is ") +
                               (help_overlay_shown() ? "open" : "closed"));
  } else if (command == "expect-idle-cpu") {
    // expect-idle-cpu SECONDS MAX_PERCENT: the process's CPU (all threads) over SECONDS of no
    // input, as a percentage of one core.
    bool ok_s = false, ok_p = false;
    const double seconds = args.value(0).toDouble(&ok_s),
                 max_percent = args.value(1).toDouble(&ok_p);
    if (!ok_s || !ok_p || seconds <= 0)
      throw std::runtime_error("expect-idle-cpu: needs SECONDS MAX_PERCENT, e.g. 5 2");
    // The interval starts 1 s after the command, once the frames the script drew to settle
    // before it have been composited (on a software renderer that is CPU time too). Meanwhile
    // the script's own timer wakes only to end each part: its 50 ticks a second were counted as
    // the window's (under ASan 2.2% of a core with no frame drawn).
    if (cpu_quiet_until_ms_ < 0) {
      cpu_quiet_until_ms_ = now_ms() + 1000;
      timer_.setInterval(1000);
      return false;
    }
    if (now_ms() < cpu_quiet_until_ms_) return false;
    if (cpu_start_ms_ < 0) {
      cpu_start_ms_ = now_ms();
      cpu_start_seconds_ = process_cpu_seconds();
      cpu_start_frames_ = canvas.frames();
      timer_.setInterval(int(seconds * 1000));
      return false;
    }
    const qint64 elapsed_ms = now_ms() - cpu_start_ms_;
    if (elapsed_ms < qint64(seconds * 1000)) return false;
    const double percent =
        100.0 * (process_cpu_seconds() - cpu_start_seconds_) / (elapsed_ms * 1e-3);
    const int64_t frames = canvas.frames() - cpu_start_frames_;
    cpu_start_ms_ = cpu_quiet_until_ms_ = -1;
    timer_.setInterval(kTickMs);
    std::printf("idle-cpu: %.2f%% of a core over %.1f s, %lld frames drawn\n", percent,
                elapsed_ms * 1e-3, (long long)frames);
    std::fflush(stdout);
    if (percent > max_percent)
      throw std::runtime_error(("expect-idle-cpu: " + QString::number(percent, 'f', 2) +
                                "% of a core over " + QString::number(elapsed_ms * 1e-3, 'f', 1) +
                                " s (" + QString::number(frames) + " frames drawn), above " +
                                args[1] + "%")
                                   .toStdString());
  } else {
    return std::nullopt;
  }
  return true;
}

}  // namespace kvlens::app
