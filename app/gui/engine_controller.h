// The engine off the UI thread: an EngineController (UI thread) owns a QThread on which a
// recording is opened and recorded to its end in the background; each recorded step comes back as
// a copy of its records, which the controller appends to the UI's own Trace, so views read a
// trace no other thread touches and the window never waits on a step. A new open (other policies
// or budgets, another text) records beside the trace on screen and replaces it only once it has
// reached the step the user is looking at, so the view is never blanked.
#pragma once

#include <QObject>
#include <QThread>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "app/gui/policy_defaults.h"
#include "app/session/generation.h"
#include "app/session/recording.h"
#include "engine/trace/trace.h"

namespace kvlens::app {

struct SessionConfig {
  std::string model_dir;
  session::RecordingSource source;
  // Run specs (ID[@SPARSITY][:KEY=VALUE...], session/policy_runs.h); plain ids take `sparsities`.
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

  // Opens a new recording and records it to its end in the background; failed() if it cannot
  // open. The trace on screen stays until the new one has recorded `show_from_steps` steps (or
  // all it has, or at once when nothing is on screen); then replaced() (same text) or opened()
  // (another text or the first recording) follows, and stepped() for each later step.
  void open(const SessionConfig& config, int64_t show_from_steps = 1);
  // Stops recording (what was recorded stays); idle() follows.
  void cancel();
  // Generates `max_new` tokens after the recording's text under each of its runs, every run
  // decoding freely (session/generation.h), once the recording is done; generated() after each
  // token and at the end. A saved trace has no model to generate with (failed()).
  void generate(int64_t max_new);
  void stop_generating() { stop_generating_ = true; }
  bool generating() const { return generating_; }
  // Each run's continuation so far (the recording's runs, in order), and the titles they go by.
  const std::vector<session::GeneratedText>& generated() const { return generated_; }
  int64_t generated_max_new() const { return generated_max_new_; }
  // Shows a saved trace instead of a recording (nothing more to record); opened() follows.
  void show_trace(std::shared_ptr<Trace> trace);

  // Recording (or opening) in the background.
  bool busy() const { return busy_; }
  bool done() const { return steps_total_ > 0 && trace_ && trace_->step_count() >= steps_total_; }
  // The UI thread's copy of the recording on screen (null before the first open).
  const Trace* trace() const { return trace_.get(); }
  std::shared_ptr<const Trace> shared_trace() const { return trace_; }
  int64_t steps_total() const { return steps_total_; }
  // A recording that will replace the one on screen: steps recorded so far (-1: none pending).
  int64_t pending_steps() const { return incoming_ ? incoming_->step_count() : -1; }
  int64_t pending_total() const { return incoming_total_; }
  const QString& backend_name() const { return backend_name_; }
  // The open recording's predictor (predictor_summary), and why a default policy was left out
  // (empty when none was); a saved trace has neither.
  const QString& predictor() const { return predictor_; }
  const QString& note() const { return note_; }
  // The configuration of the recording on screen.
  const SessionConfig& config() const { return config_; }

 signals:
  void opened();
  // A recording of the same text replaced the one on screen (other policies or budgets).
  void replaced();
  void stepped(qint64 step);
  void generated_step();
  void idle();
  void failed(const QString& message);

 private:
  class Worker;
  void record_rest(uint64_t generation);
  void take_incoming();

  QThread thread_;
  Worker* worker_ = nullptr;
  std::shared_ptr<Trace> trace_;
  // The recording that replaces trace_ once it reaches show_from_steps_.
  std::shared_ptr<Trace> incoming_;
  SessionConfig incoming_config_;
  int64_t incoming_total_ = 0, show_from_steps_ = 1;
  QString incoming_backend_, incoming_predictor_, incoming_note_;
  SessionConfig config_;
  int64_t steps_total_ = 0;
  QString backend_name_;
  QString predictor_, note_;
  bool busy_ = false;
  bool generating_ = false;
  std::atomic<bool> stop_generating_{false};
  std::vector<session::GeneratedText> generated_;
  int64_t generated_max_new_ = 0;
  // The newest open or saved trace: work for an older one stops (worker) or is dropped (UI).
  std::atomic<uint64_t> generation_{0};
};

}  // namespace kvlens::app
