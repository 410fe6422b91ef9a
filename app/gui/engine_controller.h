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
  // Compare at matched effective sparsity: each run's sparsity is its target, and the nominal
  // sparsity that meets it on this text is searched before recording
  // (engine/eval/sparsity_match.h).
  bool match_effective = false;
  std::vector<std::string> policy_args;
  std::string backend = "auto";  // auto (CUDA when a GPU is present), cpu or cuda
  int threads = 0;
  // --gpus N / --devices LIST: the model split over those GPUs (tensor parallelism).
  int64_t gpus = 0;
  std::string devices;
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
  bool done() const {
    return shown_.total > 0 && shown_.trace && shown_.trace->step_count() >= shown_.total;
  }
  // The UI thread's copy of the recording on screen (null before the first open).
  const Trace* trace() const { return shown_.trace.get(); }
  std::shared_ptr<const Trace> shared_trace() const { return shown_.trace; }
  int64_t steps_total() const { return shown_.total; }
  // A recording that will replace the one on screen: steps recorded so far (-1: none pending).
  int64_t pending_steps() const { return incoming_.trace ? incoming_.trace->step_count() : -1; }
  int64_t pending_total() const { return incoming_.total; }
  const QString& backend_name() const { return shown_.backend; }
  // The open recording's predictor (predictor_summary), and why a default policy was left out
  // (empty when none was); a saved trace has neither.
  const QString& predictor() const { return shown_.predictor; }
  const QString& note() const { return shown_.note; }
  // Each nominal budget that is capped or not a share of tokens (tokenfilter), and each run the
  // match could not bring to its target, one a line (empty when none).
  const QString& budget_note() const { return shown_.budget_note; }
  // With match_effective: one line per run, "h2o@0.5: nominal 0.596, effective 0.499" (empty
  // otherwise).
  const QString& match_report() const { return shown_.match_report; }
  // The configuration of the recording on screen.
  const SessionConfig& config() const { return shown_.config; }

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
  // A recording and what the window says of it: the one on screen, and the one that replaces it
  // once it reaches show_from_steps_ (its trace null when none is coming).
  struct Recorded {
    std::shared_ptr<Trace> trace;
    SessionConfig config;
    int64_t total = 0;  // steps the text has
    QString backend, predictor, note, match_report, budget_note;
  };
  Recorded shown_, incoming_;
  int64_t show_from_steps_ = 1;
  bool busy_ = false;
  bool generating_ = false;
  std::atomic<bool> stop_generating_{false};
  std::vector<session::GeneratedText> generated_;
  int64_t generated_max_new_ = 0;
  // The newest open or saved trace: work for an older one stops (worker) or is dropped (UI).
  std::atomic<uint64_t> generation_{0};
};

}  // namespace kvlens::app
