// MainWindow: menus, status bar, settings, file operations and error dialogs.
#include "app/gui/main_window.h"

#include <QAction>
#include <QActionGroup>
#include <QApplication>
#include <QCloseEvent>
#include <QDialog>
#include <QDialogButtonBox>
#include <QDir>
#include <QFileDialog>
#include <QFileInfo>
#include <QKeyEvent>
#include <QMenuBar>
#include <QMessageBox>
#include <QPalette>
#include <QPlainTextEdit>
#include <QScreen>
#include <QSettings>
#include <QStatusBar>
#include <QTimer>
#include <QVBoxLayout>
#include <cmath>

#include "app/gui/bundled_paths.h"
#include "app/session/output_file.h"
#include "app/session/python_policies.h"
#include "engine/common/error.h"
#include "engine/policy/plugin_policy.h"
#include "viz/qt/painter_renderer.h"

namespace kvlens::app {

MainWindow::MainWindow(const LaunchOptions& options) {
  setWindowTitle("kvlens");
  canvas_ = new ImGuiCanvas(this);
  setCentralWidget(canvas_);
  dashboard_ = std::make_unique<Dashboard>(*canvas_, engine_);
  canvas_->set_frame([this] { dashboard_->frame(); });
  dashboard_->on_error = [this](const std::string& message) {
    show_error("kvlens", QString::fromStdString(message));
  };
  connect(canvas_, &ImGuiCanvas::unhandled_key, this, &MainWindow::on_key);
  dashboard_->on_edit_prompt = [this] { edit_prompt(); };
  dashboard_->on_open_model = [this](const std::string& path) {
    open_model(QString::fromStdString(path));
  };
  for (const QString& path : fetched_models())
    dashboard_->fetched_models.push_back(path.toStdString());
  connect(&engine_, &EngineController::opened, this, [this] {
    dashboard_->on_opened();
    canvas_->request_frames();
    update_status();
    show_notes();
  });
  connect(&engine_, &EngineController::replaced, this, [this] {
    dashboard_->on_replaced();
    canvas_->request_frames();
    update_status();
    show_notes();  // other runs on the same text: their budget warnings
  });
  connect(&engine_, &EngineController::stepped, this, [this](qint64 step) {
    dashboard_->on_stepped(step);
    canvas_->request_frames();
  });
  connect(&engine_, &EngineController::idle, this, [this] {
    if (engine_.done()) {
      const QString why = QString::fromStdString(dashboard_->on_recorded());
      if (!why.isEmpty()) {
        notes_shown_ << why;
        statusBar()->showMessage(why, 15000);
      }
    }
    canvas_->request_frames();
    update_status();
  });
  connect(&engine_, &EngineController::failed, this, [this](const QString& message) {
    canvas_->request_frames();
    show_error("kvlens: could not run", message);
  });
  connect(&engine_, &EngineController::generated_step, this, [this] { canvas_->request_frames(); });

  build_menus();
  // The canvas draws only on input, on request or while animating: what a menu changes is
  // drawn at once.
  for (QAction* action : findChildren<QAction*>())
    connect(action, &QAction::triggered, canvas_, [this] { canvas_->request_frames(); });
  step_label_ = new QLabel(this);
  sparsity_label_ = new QLabel(this);
  backend_label_ = new QLabel(this);
  memory_label_ = new QLabel(this);
  fps_label_ = new QLabel(this);
  for (QLabel* label : {step_label_, sparsity_label_, memory_label_}) statusBar()->addWidget(label);
  // Permanent (never hidden by a note): under --gpus it says which GPUs hold what.
  statusBar()->addPermanentWidget(backend_label_);
  statusBar()->addPermanentWidget(fps_label_);
  auto* status_timer = new QTimer(this);
  connect(status_timer, &QTimer::timeout, this, &MainWindow::update_status);
  status_timer->start(250);

  QSettings settings;
  // A geometry too small to use (a window closed while minimised, or by a window manager that
  // never mapped it) is not restored.
  if (!restoreGeometry(settings.value("window/geometry").toByteArray()) ||
      width() < kMinimumWidth || height() < kMinimumHeight) {
    // 1480 x 920, or what fits the screen (a laptop, or a high-DPI scale that leaves fewer
    // logical pixels).
    const QSize room = screen() ? screen()->availableGeometry().size() * 0.95 : QSize(1480, 920);
    resize(std::min(1480, room.width()), std::min(920, room.height()));
  }
  // A script starts from the defaults, whatever the last session left in the settings.
  const bool restore = options.script_path.isEmpty();
  set_dark(options.dark || (restore && settings.value("view/dark", false).toBool()));
  if (restore)
    dashboard_->set_tab(Tab(std::clamp(settings.value("view/tab", 0).toInt(), 0, kTabCount - 1)));

  SessionConfig& config = dashboard_->pending_config();
  QString no_model;  // why there is no model to open (the bundled one missing)
  try {
    model_dir_ = options.model_dir.isEmpty() ? bundled_model_dir() : options.model_dir;
  } catch (const std::exception& e) {
    no_model = QString::fromUtf8(e.what());
  }
  config.model_dir = model_dir_.toStdString();
  config.policies = options.policies.toStdString();
  config.policies_asked = options.policies_asked;
  config.predictor_file = options.predictor_file.toStdString();
  config.sparsities = options.sparsity.toStdString();
  config.backend = options.backend.toStdString();
  config.gpus = options.gpus;
  config.devices = options.devices.toStdString();
  if (options.prompt.isEmpty()) {
    config.source.coref_index = options.coref_sample;
  } else {
    config.source.coref_index = -1;
    config.source.prompt = options.prompt.toStdString();
  }
  if (!options.trace_path.isEmpty()) {
    QTimer::singleShot(0, this, [this, path = options.trace_path] { open_trace(path); });
  } else if (!no_model.isEmpty()) {
    QTimer::singleShot(0, this, [this, no_model] { show_error("kvlens: no model", no_model); });
  } else {
    QTimer::singleShot(0, this, [this] { engine_.open(dashboard_->pending_config()); });
  }
}

MainWindow::~MainWindow() = default;

void MainWindow::build_menus() {
  QMenu* file = menuBar()->addMenu("&File");
  file->addAction("Open &model folder...", QKeySequence::Open, this, [this] {
    const QString dir =
        QFileDialog::getExistingDirectory(this, "Open a Hugging Face model folder", model_dir_);
    if (!dir.isEmpty()) open_model(dir);
  });
  file->addAction("Open a &GGUF file...", QKeySequence("Ctrl+G"), this, [this] {
    const QString path =
        QFileDialog::getOpenFileName(this, "Open a GGUF model file (llama.cpp, Ollama, LM Studio)",
                                     model_dir_, "GGUF models (*.gguf);;all files (*)");
    if (!path.isEmpty()) open_model(path);
  });
  file->addAction("Open &trace...", QKeySequence("Ctrl+Shift+O"), this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, "Open a recording", QString(),
                                                      "kvlens traces (*.kvtrace)");
    if (!path.isEmpty()) open_trace(path);
  });
  file->addAction("Load policy &plug-in...", this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, "Load a policy plug-in", QString(),
                                                      "policy plug-ins (*.so *.py);;all files (*)");
    if (!path.isEmpty()) load_plugin(path);
  });
  QMenu* fetched = file->addMenu("Open a &fetched model");
  connect(fetched, &QMenu::aboutToShow, this, [this, fetched] {
    fetched->clear();
    const QStringList models = fetched_models();
    for (const QString& path : models)
      fetched->addAction(QFileInfo(path).fileName(), this, [this, path] { open_model(path); });
    if (models.isEmpty())
      fetched->addAction("(none yet: tools/get_model.sh smollm2 fetches SmolLM2-135M)")
          ->setEnabled(false);
  });
  recent_menu_ = file->addMenu("Open &recent");
  rebuild_recent_menu();
  file->addAction("&Save trace as...", QKeySequence::Save, this, [this] {
    const QString path = QFileDialog::getSaveFileName(this, "Save the recording", "run.kvtrace",
                                                      "kvlens traces (*.kvtrace)");
    if (!path.isEmpty()) save_trace(path);
  });
  file->addAction("&Export view...", QKeySequence("Ctrl+E"), this, [this] {
    const QString path = QFileDialog::getSaveFileName(
        this, "Export the view", QString("kvlens-%1.png").arg(viz::view_name(dashboard_->view())),
        "PNG image (*.png);;SVG vector (*.svg);;PDF vector (*.pdf);;CSV data (*.csv);;"
        "JSON data (*.json)");
    if (!path.isEmpty()) export_view(path);
  });
  file->addSeparator();
  file->addAction("&Quit", QKeySequence::Quit, this, &QWidget::close);

  QMenu* view = menuBar()->addMenu("&View");
  auto* views = new QActionGroup(this);
  for (int t = 0; t < kTabCount; ++t) {
    QAction* action = view->addAction(QString("&") + tab_title(Tab(t)),
                                      QKeySequence(QString("Ctrl+%1").arg(t + 1)), this,
                                      [this, t] { dashboard_->set_tab(Tab(t)); });
    action->setCheckable(true);
    views->addAction(action);
  }
  view->addSeparator();
  view->addAction("Show / hide the &sidebar", QKeySequence("Ctrl+B"), this,
                  [this] { dashboard_->set_sidebar_shown(!dashboard_->sidebar_shown()); });
  QAction* dark = view->addAction("&Dark theme");
  dark->setCheckable(true);
  connect(dark, &QAction::toggled, this, &MainWindow::set_dark);
  connect(view, &QMenu::aboutToShow, this, [this, views, dark] {
    views->actions()[int(dashboard_->tab())]->setChecked(true);
    dark->setChecked(dashboard_->options().dark);
  });

  QMenu* run = menuBar()->addMenu("&Run");
  run->addAction("&Record with the sidebar's runs", QKeySequence("Ctrl+R"), this,
                 [this] { dashboard_->restart(); });
  run->addAction("&Step  (Right)", this, [this] { dashboard_->step_forward(1); });
  run->addAction("Step &x10  (Shift+Right)", this, [this] { dashboard_->step_forward(10); });
  run->addAction("Step &back  (Left)", this, [this] { dashboard_->step_back(1); });
  run->addAction("&Play / pause  (Space)", this,
                 [this] { dashboard_->set_playing(!dashboard_->playing()); });

  QMenu* help = menuBar()->addMenu("&Help");
  help->addAction("&Keys and gestures", QKeySequence(Qt::Key_F1), this,
                  [this] { canvas_->set_help_open(!canvas_->help_open()); });
  help->addAction("&About kvlens", this, [this] {
    QMessageBox::about(
        this, "About kvlens",
        "kvlens: which cached tokens does an LLM really need?\n\nStep a decode under "
        "KV-cache token-selection policies and see what every head saw.\n\nKeys: "
        "Right/Left step, Shift+Right steps 10, Space plays, Home/End go to the "
        "first/last step, Ctrl+E exports the view, Ctrl+1..7 switch views; F1 lists every key "
        "and gesture.");
  });
}

void MainWindow::on_key(int key, Qt::KeyboardModifiers modifiers) {
  const int count = modifiers & Qt::ShiftModifier ? 10 : 1;
  switch (key) {
    case Qt::Key_Right:
      dashboard_->step_forward(count);
      break;
    case Qt::Key_Left:
      dashboard_->step_back(count);
      break;
    case Qt::Key_Space:
      dashboard_->set_playing(!dashboard_->playing());
      break;
    case Qt::Key_Home:
      dashboard_->go_to_step(0);
      break;
    case Qt::Key_End:
      if (engine_.trace()) dashboard_->go_to_step(engine_.trace()->step_count() - 1);
      break;
    default:
      break;
  }
}

void MainWindow::set_dark(bool dark) {
  dashboard_->options().dark = dark;
  // The Qt chrome (menus, status bar, dialogs) follows the canvas's theme.
  static const QPalette light_palette = QApplication::palette();
  if (dark) {
    QPalette palette;
    const QColor window(37, 37, 38), base(24, 24, 26), text(230, 230, 232), muted(140, 140, 146);
    palette.setColor(QPalette::Window, window);
    palette.setColor(QPalette::WindowText, text);
    palette.setColor(QPalette::Base, base);
    palette.setColor(QPalette::AlternateBase, window);
    palette.setColor(QPalette::Text, text);
    palette.setColor(QPalette::Button, window);
    palette.setColor(QPalette::ButtonText, text);
    palette.setColor(QPalette::ToolTipBase, window);
    palette.setColor(QPalette::ToolTipText, text);
    palette.setColor(QPalette::Highlight, QColor(66, 120, 200));
    palette.setColor(QPalette::HighlightedText, Qt::white);
    palette.setColor(QPalette::Disabled, QPalette::Text, muted);
    palette.setColor(QPalette::Disabled, QPalette::WindowText, muted);
    palette.setColor(QPalette::Disabled, QPalette::ButtonText, muted);
    QApplication::setPalette(palette);
  } else {
    QApplication::setPalette(light_palette);
  }
  QSettings().setValue("view/dark", dark);
}

void MainWindow::show_notes() {
  QStringList notes;
  if (!engine_.note().isEmpty()) notes << engine_.note();
  if (!engine_.budget_note().isEmpty()) notes << engine_.budget_note().split('\n');
  if (notes.isEmpty()) return;
  notes_shown_ << notes;
  statusBar()->showMessage(notes.join("; "), 15000);
}

void MainWindow::update_status() {
  const Trace* trace = engine_.trace();
  fps_label_->setText(QString("%1 fps").arg(canvas_->frames_per_second(), 0, 'f', 0));
  if (!trace) {
    step_label_->setText(engine_.busy() ? "opening..." : "no recording");
    return;
  }
  const int64_t cursor = dashboard_->cursor();
  QString recording;
  if (engine_.pending_steps() >= 0) {
    recording = QString(" (re-recording %1 of %2)")
                    .arg(engine_.pending_steps())
                    .arg(engine_.pending_total());
  } else if (engine_.busy()) {
    recording =
        QString(" (recording %1 of %2)").arg(trace->step_count()).arg(engine_.steps_total());
  }
  step_label_->setText(QString("step %1 of %2%3")
                           .arg(cursor < 0 ? QString("-") : QString::number(cursor))
                           .arg(engine_.steps_total())
                           .arg(recording));
  QString sparsity;
  if (cursor >= 0 && cursor < trace->step_count()) {
    for (const int64_t r : dashboard_->options().runs) {
      const double s = trace->steps()[size_t(cursor)][size_t(r)].metrics.effective_sparsity;
      sparsity += QString("%1%2 %3")
                      .arg(sparsity.isEmpty() ? "effective sparsity: " : ", ")
                      .arg(QString::fromStdString(trace->runs[size_t(r)].policy))
                      .arg(std::isnan(s) ? QString("-") : QString::number(s, 'f', 2));
    }
  }
  sparsity_label_->setText(sparsity);
  backend_label_->setText("backend: " + engine_.backend_name());
  QString memory = QString("trace rows %1 of %2 MiB")
                       .arg(double(trace->row_bytes()) / double(1 << 20), 0, 'f', 1)
                       .arg(double(trace->memory_budget) / double(1 << 20), 0, 'f', 0);
  if (trace->degraded_from_step() >= 0)
    memory += QString(" (budget reached at step %1: selected heads only)")
                  .arg(trace->degraded_from_step());
  memory_label_->setText(memory);
}

void MainWindow::edit_prompt() {
  // A Qt editor: it wraps, scrolls and has the platform's text editing (ImGui 1.86's does not
  // wrap). In script mode it is never shown: scripts set the prompt with open-prompt.
  if (script_mode_) return;
  QDialog dialog(this);
  dialog.setWindowTitle("kvlens: the prompt");
  auto* editor = new QPlainTextEdit(&dialog);
  editor->setPlainText(QString::fromStdString(dashboard_->pending_config().source.prompt));
  editor->setLineWrapMode(QPlainTextEdit::WidgetWidth);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, &dialog);
  connect(buttons, &QDialogButtonBox::accepted, &dialog, &QDialog::accept);
  connect(buttons, &QDialogButtonBox::rejected, &dialog, &QDialog::reject);
  auto* layout = new QVBoxLayout(&dialog);
  layout->addWidget(
      new QLabel("Every token of this text is stepped; Run > Record records it.", &dialog));
  layout->addWidget(editor);
  layout->addWidget(buttons);
  dialog.resize(640, 360);
  if (dialog.exec() != QDialog::Accepted) return;
  dashboard_->pending_config().source.coref_index = -1;
  dashboard_->pending_config().source.prompt = editor->toPlainText().toStdString();
  canvas_->request_frames();
}

bool MainWindow::load_plugin(const QString& path) {
  try {
    // A Python file (kvlens.Policy classes, embedded CPython) or a C plug-in.
    std::vector<std::string> ids;
    if (path.endsWith(".py"))
      ids = session::load_policy_files({path.toStdString()});
    else
      ids.push_back(load_policy_plugin(path.toStdString()).id);
    QString names;
    for (const std::string& id : ids)
      names += (names.isEmpty() ? "" : ", ") + QString::fromStdString(id);
    const QString note = "policy " + names + " loaded from " + path;
    notes_shown_ << note;
    statusBar()->showMessage(note, 15000);
    return true;
  } catch (const Error& error) {
    show_error("kvlens: could not load the plug-in", QString::fromStdString(error.what()));
    return false;
  }
}

void MainWindow::show_error(const QString& title, const QString& message) {
  errors_shown_ << message;
  auto* box = new QMessageBox(QMessageBox::Critical, title, message, QMessageBox::Ok, this);
  box->setAttribute(Qt::WA_DeleteOnClose);
  if (script_mode_) {
    box->setObjectName("kvlens-error");
    box->open();  // not modal for the event loop: the script goes on and closes it
  } else {
    box->exec();
  }
}

void MainWindow::close_dialogs() {
  for (QMessageBox* box : findChildren<QMessageBox*>()) box->close();
}

bool MainWindow::open_model(const QString& dir) {
  // Checked here first so that a bad folder reports at once and the session stays; a GGUF file's
  // weights are dequantized once, by the engine, not here too. (A --predictor file belongs to the
  // model it came with: another folder uses its own.)
  try {
    Model::check(dir.toStdString());
  } catch (const std::exception& e) {
    show_error("kvlens: cannot open the model", QString::fromUtf8(e.what()));
    return false;
  }
  model_dir_ = dir;
  dashboard_->pending_config().model_dir = dir.toStdString();
  dashboard_->pending_config().predictor_file.clear();
  dashboard_->restart();
  add_recent(dir);
  return true;
}

bool MainWindow::open_trace(const QString& path) {
  try {
    auto trace = std::make_shared<Trace>(load_trace(path.toStdString()));
    engine_.show_trace(std::move(trace));
  } catch (const std::exception& e) {
    show_error("kvlens: cannot open the trace", QString::fromUtf8(e.what()));
    return false;
  }
  add_recent(path);
  return true;
}

bool MainWindow::save_trace(const QString& path) {
  if (!engine_.trace()) {
    show_error("kvlens", "Nothing recorded yet to save.");
    return false;
  }
  try {
    kvlens::save_trace(*engine_.trace(), path.toStdString());
  } catch (const std::exception& e) {
    show_error("kvlens: cannot save the trace", QString::fromUtf8(e.what()));
    return false;
  }
  add_recent(path);
  return true;
}

bool MainWindow::export_view(const QString& path) {
  const QString suffix = QFileInfo(path).suffix().toLower();
  const bool wants_data = suffix == "csv" || suffix == "json";
  std::shared_ptr<const viz::View> view;
  try {
    view = dashboard_->view_for_export(wants_data);
  } catch (const std::exception& e) {
    show_error("kvlens: cannot export", QString::fromUtf8(e.what()));
    return false;
  }
  if (!view) {
    show_error("kvlens", "No view to export yet: record a step first.");
    return false;
  }
  try {
    if (wants_data) {
      session::AtomicOutputFile file(path.toStdString(), "export");
      file.stream() << (suffix == "csv" ? view->data.to_csv() : view->data.to_json());
      file.commit();
    } else {
      viz::export_figure(view->figure, path.toStdString());
    }
  } catch (const std::exception& e) {
    show_error("kvlens: cannot export", QString::fromUtf8(e.what()));
    return false;
  }
  statusBar()->showMessage("exported " + path, 4000);
  return true;
}

void MainWindow::add_recent(const QString& path) {
  QSettings settings;
  QStringList recent = settings.value("files/recent").toStringList();
  recent.removeAll(path);
  recent.prepend(path);
  while (recent.size() > 8) recent.removeLast();
  settings.setValue("files/recent", recent);
  rebuild_recent_menu();
}

void MainWindow::rebuild_recent_menu() {
  recent_menu_->clear();
  const QStringList recent = QSettings().value("files/recent").toStringList();
  for (const QString& path : recent) {
    recent_menu_->addAction(path, this, [this, path] {
      if (path.endsWith(".kvtrace")) {
        open_trace(path);
      } else {
        open_model(path);
      }
    });
  }
  recent_menu_->setEnabled(!recent.isEmpty());
}

void MainWindow::closeEvent(QCloseEvent* event) {
  QSettings settings;
  if (!isMinimized() && width() >= kMinimumWidth && height() >= kMinimumHeight)
    settings.setValue("window/geometry", saveGeometry());
  settings.setValue("view/tab", int(dashboard_->tab()));
  engine_.cancel();
  QMainWindow::closeEvent(event);
}

}  // namespace kvlens::app
