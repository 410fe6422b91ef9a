// Script mode: drives the real window from a text file, one command per line ('#' comments), so
// tests can load, step, switch views, compare, export and quit as a user would:
//   open-sample I | open-prompt TEXT | policies ID,... | sparsity X | restart
//   open-model DIR | open-trace FILE | save-trace FILE | load-plugin FILE.so
//   step N | back N | goto T | play | pause | wait-idle | wait MS
//   view heads|predicted|retention|consensus|logits | compare ID|I,... | head L H
//   detail on|off | quantity logits|probabilities|scores | consensus pearson|jaccard
//   zoom fit|PERCENT
//   theme dark|light | export FILE | screenshot FILE | expect-error TEXT | close-dialogs | quit
//   expect-note TEXT (a status bar note said it) | expect-predictor TEXT (the sidebar's predictor)
//   speed STEPS_PER_SECOND | report (frames drawn, frame rate, steps recorded, on stdout)
//   runs SPEC,... (the sidebar's runs; `restart` records them) | expect-pending yes|no
//   expect-compare TITLE,... | expect-head L H | find TEXT | expect-highlighted N
//   click-token RUN TOKEN | expect-tab NAME | help on|off | view generate | resize W H
//   generate N | report-generated (one line per run: departure, ids, text)
//   report-figure (the figure's size and the view area's, on stdout) | sidebar on|off
//   expect-model TEXT (the model the recording runs on)
//   expect-backend TEXT (the status bar's backend: which GPUs hold what under --gpus)
//   match effective|none (the Runs section's matched-sparsity box; `restart` records with it)
//   expect-match TEXT (the sidebar's matched report, "RUN: nominal X, effective Y", has TEXT)
// Input, posted to the canvas back to back as fast input would come (no frame between events):
//   keys KEY [COUNT] [held] (KEY as in Shift+Right, F1, ?, Esc; held: auto-repeats of one press)
//   click TEXT | click-n COUNT TEXT
//   (on the text the screen shows, e.g. a button's label) | click-at X Y [COUNT] (canvas pixels)
//   locate TEXT (prints where TEXT is drawn, in screenshot pixels)
//   expect-step N|last (the step the view shows) | expect-help open|closed (the F1 overlay)
//   expect-idle-cpu SECONDS MAX_PERCENT (the app's CPU over SECONDS from 1 s on, in % of a core)
// A line starting with '!' does not wait for the engine to finish recording (only for its first
// step): `!keys Shift+Right 11` presses keys while the text records.
// A command that fails prints "script: line N: ..." on stderr and ends the app with exit code 1.
#pragma once

#include <QObject>
#include <QString>
#include <QStringList>
#include <QTimer>
#include <optional>

namespace kvlens::app {

class MainWindow;

class ScriptRunner : public QObject {
  Q_OBJECT

 public:
  // Throws nothing: an unreadable script fails at the first tick.
  ScriptRunner(MainWindow& window, const QString& path);

 private:
  void tick();
  bool run(const QString& command, const QStringList& args);  // false: wait and retry
  // The input and measurement commands: nullopt when `command` is not one of them.
  std::optional<bool> run_input_command(const QString& command, const QStringList& args);
  void fail(const QString& message);
  bool settled() const;

  MainWindow& window_;
  QStringList lines_;
  QString load_error_;
  int line_ = 0;
  QTimer timer_;
  qint64 wait_until_ms_ = 0;
  int errors_seen_ = 0;
  int started_line_ = -1;  // the line whose command began at line_start_ms_
  qint64 line_start_ms_ = 0;
  int64_t settle_frames_ = -1;      // frames drawn when the engine was last seen idle
  qint64 cpu_quiet_until_ms_ = -1;  // expect-idle-cpu: when its interval may begin
  qint64 cpu_start_ms_ = -1;        // expect-idle-cpu: when its interval began (-1: not begun)
  double cpu_start_seconds_ = 0.0;
  int64_t cpu_start_frames_ = 0;
};

}  // namespace kvlens::app
