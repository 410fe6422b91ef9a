// The Qt main window: menus (File: open a model folder or a .kvtrace, save the recording, export
// the view, recent files; View; Run), a status bar (step, effective sparsity, backend, trace
// memory, frame rate), settings kept with QSettings, error dialogs that leave the session as it
// was, and the ImGui canvas in the middle. Script mode (script_runner) drives the same methods.
#pragma once

#include <QLabel>
#include <QMainWindow>
#include <QMenu>
#include <QStringList>
#include <memory>

#include "app/gui/dashboard.h"
#include "app/gui/engine_controller.h"
#include "app/gui/imgui_canvas.h"
#include "app/gui/policy_defaults.h"

namespace kvlens::app {

struct LaunchOptions {
  QString model_dir;  // empty: the bundled demo model
  QString trace_path;
  int64_t coref_sample = 0;
  QString prompt;  // used instead of the sample when set
  QString policies = QString::fromStdString(default_policies());
  bool policies_asked = false;  // --policies was given (policy_defaults.h)
  QString predictor_file;       // --predictor: the TokenButler predictor to load with the model
  QString sparsity = "0.5";
  QString backend = "auto";
  // --gpus N / --devices LIST: the model split over those GPUs (tensor parallelism).
  int64_t gpus = 0;
  QString devices;
  QString script_path;
  bool dark = false;
};

class MainWindow : public QMainWindow {
  Q_OBJECT

 public:
  explicit MainWindow(const LaunchOptions& options);
  ~MainWindow() override;

  Dashboard& dashboard() { return *dashboard_; }
  EngineController& engine() { return engine_; }
  ImGuiCanvas& canvas() { return *canvas_; }

  // Each shows an error dialog and returns false when it fails; the open session stays.
  bool open_model(const QString& dir);
  bool open_trace(const QString& path);
  bool save_trace(const QString& path);
  // Registers a policy plug-in (a shared library against include/kvlens/policy_plugin.h): its
  // policy joins the sidebar's list; a bad file gets an error dialog.
  bool load_plugin(const QString& path);
  // .png / .svg / .pdf: the current view's figure; .csv / .json: the data behind it.
  bool export_view(const QString& path);

  // Script mode: dialogs open without blocking and are recorded (and closed by the script).
  void set_script_mode(bool on) { script_mode_ = on; }
  const QStringList& errors_shown() const { return errors_shown_; }
  // The notes shown in the status bar (a default policy left out), oldest first.
  const QStringList& notes_shown() const { return notes_shown_; }
  void close_dialogs();
  void set_dark(bool dark);
  void update_status();
  // The open recording's notes (a default policy left out, nominal budgets that are capped or not
  // token shares) into the status bar and notes_shown().
  void show_notes();
  // The smallest window size kept in the settings and restored (smaller ones are not usable).
  static constexpr int kMinimumWidth = 640, kMinimumHeight = 400;

 protected:
  void closeEvent(QCloseEvent* event) override;

 private:
  void build_menus();
  void add_recent(const QString& path);
  void rebuild_recent_menu();
  void show_error(const QString& title, const QString& message);
  void edit_prompt();
  void on_key(int key, Qt::KeyboardModifiers modifiers);

  EngineController engine_;
  ImGuiCanvas* canvas_ = nullptr;
  std::unique_ptr<Dashboard> dashboard_;
  QMenu* recent_menu_ = nullptr;
  QLabel* step_label_ = nullptr;
  QLabel* sparsity_label_ = nullptr;
  QLabel* backend_label_ = nullptr;
  QLabel* memory_label_ = nullptr;
  QLabel* fps_label_ = nullptr;
  QString model_dir_;
  bool script_mode_ = false;
  QStringList errors_shown_;
  QStringList notes_shown_;
};

}  // namespace kvlens::app
