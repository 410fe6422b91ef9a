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
// A command that fails prints "script: line N: ..." on stderr and ends the app with exit code 1.
#pragma once

#include <QObject>
#include <QString>
#include <QStringList>
#include <QTimer>

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
  int64_t settle_frames_ = -1;  // frames drawn when the engine was last seen idle
};

}  // namespace kvlens::app
