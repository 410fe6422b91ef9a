// The engine off the UI thread: an EngineController (UI thread) owns a QThread on which a
// recording is opened and stepped; each recorded step comes back as a copy of its records, which
// the controller appends to the UI's own Trace, so views read a trace no other thread touches and
// the window never waits on a step. One request runs at a time; play is a stream of requests.
#pragma once

#include <QObject>
#include <QThread>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "app/gui/policy_defaults.h"
#include "app/session/recording.h"
#include "engine/trace/trace.h"

namespace kvlens::app {

struct SessionConfig {
  std::string model_dir;
  session::RecordingSource source;
  std::string policies = default_policies();
  // The user named the policies (--policies, the sidebar, a script): tokenbutler is then kept
  // without a predictor (and fails); the default list leaves it out (policy_defaults.h).
  bool policies_asked = false;
  std::string predictor_file;  // --predictor: overrides the model folder's own (empty: none)
  std::string sparsities = "0.5";
  std::vector<std::string> policy_args;
  std::string backend = "auto";  // auto (CUDA when a GPU is present), cpu or cuda
  int threads = 0;
  uint64_t memory_budget = Trace::kDefaultMemoryBudget;
};

class EngineController : public QObject {
  Q_OBJECT

 public:
  explicit EngineController(QObject* parent = nullptr);
  ~EngineController() override;

  // Opens a new recording (the current one is dropped when the new one is ready); opened() or
  // failed() follows.
  void open(const SessionConfig& config);
  // Records up to `count` more steps (fewer at the end of the text); stepped() per step, then
  // idle(). Ignored while another request runs or before a recording is open.
  void step(int count);
  void cancel() { cancel_ = true; }
  // Shows a saved trace instead of a recording (nothing more to step); opened() follows.
  void show_trace(std::shared_ptr<Trace> trace);

  bool busy() const { return busy_; }
  bool done() const { return steps_total_ > 0 && trace_ && trace_->step_count() >= steps_total_; }
  // The UI thread's copy of the recording (null before the first open).
  const Trace* trace() const { return trace_.get(); }
  std::shared_ptr<const Trace> shared_trace() const { return trace_; }
  int64_t steps_total() const { return steps_total_; }
  const QString& backend_name() const { return backend_name_; }
  // The open recording's predictor (predictor_summary), and why a default policy was left out
  // (empty when none was); a saved trace has neither.
  const QString& predictor() const { return predictor_; }
  const QString& note() const { return note_; }
  const SessionConfig& config() const { return config_; }

 signals:
  void opened();
  void stepped(qint64 step);
  void idle();
  void failed(const QString& message);

 private:
  class Worker;
  QThread thread_;
  Worker* worker_ = nullptr;
  std::shared_ptr<Trace> trace_;
  SessionConfig config_;
  int64_t steps_total_ = 0;
  QString backend_name_;
  QString predictor_, note_;
  bool busy_ = false;
  std::atomic<bool> cancel_{false};
  // Counts opens and saved traces shown (UI thread only): results posted back for an earlier
  // one are dropped instead of landing in the trace that replaced it.
  uint64_t generation_ = 0;
};

}  // namespace kvlens::app
