// EngineController and its worker (the recording lives on the worker thread only).
#include "app/gui/engine_controller.h"

#include <QMetaObject>
#include <cstdio>

#include "app/session/policy_runs.h"
#include "engine/common/error.h"
#include "engine/eval/sparsity_match.h"
#include "engine/model/model.h"
#include "engine/policy/registry.h"
#if KVLENS_HAVE_CUDA
#include "kernels/cuda_backend.h"
#endif

namespace kvlens::app {

class EngineController::Worker : public QObject {
 public:
  std::unique_ptr<session::Recording> recording;
  // The generation whose recording was asked to stop (cancel); read on the worker thread.
  std::atomic<uint64_t> stopped{0};
};

namespace {

session::CommonOptions backend_options(const SessionConfig& config, QString& name) {
  session::CommonOptions common;
  common.threads = config.threads;
  common.gpus = config.gpus;
  common.devices = config.devices;
  common.backend = config.backend == "auto" ? "cpu" : config.backend;
#if KVLENS_HAVE_CUDA
  if (config.backend == "auto" && cuda_device_available()) common.backend = "cuda";
#endif
  name = QString::fromStdString(common.backend);
  if (common.backend == "cpu") {
    const int threads = config.threads > 0 ? config.threads : QThread::idealThreadCount();
    name += QString(", %1 threads").arg(threads);
  }
  return common;
}

// The note's lines for nominal budgets that are capped or not token shares.
std::string budget_warnings(const std::vector<PolicyConfig>& runs, int64_t layers) {
  std::string text;
  for (const PolicyConfig& run : runs) {
    for (const std::string& line : nominal_budget_warnings(run, layers)) {
      text += (text.empty() ? "" : "\n") + line;
    }
  }
  return text;
}

// Matches the recording's runs on its own text and records them again at the nominal sparsities
// found: the calibration is the recording's steps (its prefill included), so the effective
// sparsity on screen is the one matched. Returns the report; missed targets go to `warnings`.
std::string match_recording(session::Recording& recording, const std::vector<PolicyConfig>& runs,
                            const TraceOptions& options, std::string& warnings) {
  const Trace& opened = recording.recorder->trace();
  std::vector<int32_t> tokens;
  for (const TraceToken& token : opened.tokens) tokens.push_back(token.id);
  const std::vector<MatchOutcome> outcomes =
      match_on_tokens(recording.resident, tokens, runs, options.prefill);
  std::vector<PolicyConfig> matched;
  std::string report;
  char line[160];
  for (size_t i = 0; i < runs.size(); ++i) {
    matched.push_back(matched_config(runs[i], outcomes[i]));
    if (is_reference_policy(runs[i].id)) continue;  // (the reference is dense at 0 anyway)
    std::snprintf(line, sizeof line, "%s: nominal %.3f, effective %.3f%s",
                  session::run_spec(runs[i]).c_str(), outcomes[i].nominal, outcomes[i].effective,
                  outcomes[i].matched ? "" : " (missed)");
    report += (report.empty() ? "" : "\n") + std::string(line);
    if (!outcomes[i].warning.empty()) {
      warnings +=
          (warnings.empty() ? "" : "\n") + session::run_spec(runs[i]) + ": " + outcomes[i].warning;
    }
  }
  const auto coref = opened.coref;
  recording.recorder.reset();
  recording.recorder = std::make_unique<TraceRecorder>(
      recording.resident, &recording.model->require_tokenizer(), tokens, matched, options);
  recording.recorder->trace().coref = coref;
  return report;
}

bool same_tokens(const Trace& a, const Trace& b) {
  if (a.tokens.size() != b.tokens.size()) return false;
  for (size_t i = 0; i < a.tokens.size(); ++i)
    if (a.tokens[i].id != b.tokens[i].id) return false;
  return true;
}

}  // namespace

EngineController::EngineController(QObject* parent) : QObject(parent) {
  worker_ = new Worker;
  worker_->moveToThread(&thread_);
  connect(&thread_, &QThread::finished, worker_, &QObject::deleteLater);
  thread_.setObjectName("kvlens-engine");
  thread_.start();
}

EngineController::~EngineController() {
  ++generation_;            // the worker's loop stops at its next step
  stop_generating_ = true;  // (and a generation at its next token)
  thread_.quit();
  thread_.wait();
}

void EngineController::cancel() {
  worker_->stopped = generation_.load();
}

void EngineController::open(const SessionConfig& config, int64_t show_from_steps) {
  busy_ = true;
  stop_generating_ = true;  // (a generation of the old recording ends at its next token)
  const uint64_t generation = ++generation_;
  QMetaObject::invokeMethod(worker_, [this, config, generation, show_from_steps] {
    if (generation != generation_) return;  // a later open is queued behind this one
    QString backend, predictor, note, match_report, budget_note;
    std::unique_ptr<session::Recording> recording;
    std::shared_ptr<Trace> header;
    int64_t total = 0;
    QString error;
    try {
      worker_->recording.reset();  // the previous model's memory goes before the next loads
      const session::CommonOptions common = backend_options(config, backend);
      const std::shared_ptr<const Model> model =
          Model::load(config.model_dir, config.predictor_file);
      const PolicyChoice choice = choose_policies(config.policies, config.policies_asked, *model);
      const std::vector<PolicyConfig> runs =
          session::resolve_policy_runs(choice.policies, config.sparsities, config.policy_args);
      TraceOptions options;
      options.memory_budget = config.memory_budget;
      if (common.tensor_parallel() && config.match_effective) {
        throw Error("match effective sparsity", "--gpus",
                    "one GPU (the match searches on one backend)", "a model split over GPUs");
      }
      recording = std::make_unique<session::Recording>(
          session::open_recording(common, model, config.source, runs, options, "prompt"));
      // The status bar says which GPUs hold what.
      if (recording->shards.size() > 1)
        backend = QString::fromStdString(session::placement_text(*recording));
      predictor = QString::fromStdString(predictor_summary(*model));
      std::string notes = budget_warnings(runs, model->config.num_layers);
      if (config.match_effective) {
        match_report = QString::fromStdString(match_recording(*recording, runs, options, notes));
      }
      note = QString::fromStdString(choice.note);
      budget_note = QString::fromStdString(notes);
      header = std::make_shared<Trace>(recording->recorder->trace());
      total = recording->recorder->steps_total();
    } catch (const std::exception& e) {
      error = QString::fromUtf8(e.what());
    }
    QMetaObject::invokeMethod(this, [this, config, header, total, backend, predictor, note,
                                     match_report, budget_note, error, generation,
                                     show_from_steps] {
      if (generation != generation_) return;  // a later open or saved trace replaced it
      if (!error.isEmpty()) {
        busy_ = false;
        emit failed(error);
        emit idle();
        return;
      }
      incoming_ = {header, config, total, backend, predictor, note, match_report, budget_note};
      show_from_steps_ = shown_.trace ? std::min(std::max<int64_t>(show_from_steps, 1), total) : 0;
      if (incoming_.trace->step_count() >= show_from_steps_) take_incoming();
    });
    if (!error.isEmpty()) return;
    worker_->recording = std::move(recording);
    record_rest(generation);
  });
}

void EngineController::record_rest(uint64_t generation) {
  // Worker thread: every step to the end of the text, each handed to the UI thread at once.
  QString error;
  while (generation == generation_ && worker_->stopped != generation) {
    TraceRecorder& recorder = *worker_->recording->recorder;
    bool more = false;
    try {
      more = recorder.step();
    } catch (const std::exception& e) {
      error = QString::fromUtf8(e.what());
      break;
    }
    if (!more) break;
    // The window's trace takes the rows; the recorder keeps the summaries (rows held once).
    auto records = std::make_shared<std::vector<StepRecord>>(
        recorder.trace().hand_over_step(recorder.trace().step_count() - 1));
    QMetaObject::invokeMethod(this, [this, records, generation] {
      if (generation != generation_) return;  // the trace was replaced meanwhile
      Trace& target = incoming_.trace ? *incoming_.trace : *shown_.trace;
      try {
        target.add_step(std::move(*records));
      } catch (const std::exception& e) {
        emit failed(QString::fromUtf8(e.what()));
        return;
      }
      if (incoming_.trace) {
        if (incoming_.trace->step_count() >= show_from_steps_) take_incoming();
      } else {
        emit stepped(shown_.trace->step_count() - 1);
      }
    });
  }
  QMetaObject::invokeMethod(this, [this, error, generation] {
    if (generation != generation_) return;  // a newer open keeps busy_
    if (incoming_.trace) take_incoming();   // (fewer steps than asked for: show what there is)
    busy_ = false;
    if (!error.isEmpty()) emit failed(error);
    emit idle();
  });
}

void EngineController::take_incoming() {
  const bool same_text = shown_.trace && same_tokens(*shown_.trace, *incoming_.trace);
  shown_ = std::move(incoming_);
  incoming_ = {};
  if (same_text) {
    emit replaced();
  } else {
    emit opened();
  }
}

void EngineController::generate(int64_t max_new) {
  if (generating_) return;
  if (!shown_.trace || shown_.config.model_dir.empty()) {
    emit failed("Generate: a saved trace has no model to generate with; open a model.");
    return;
  }
  generating_ = true;
  stop_generating_ = false;
  generated_.clear();
  generated_max_new_ = max_new;
  const uint64_t generation = generation_;
  // Queued behind the recording on the worker thread: it runs once the text is recorded.
  QMetaObject::invokeMethod(worker_, [this, max_new, generation] {
    QString error;
    std::vector<session::GeneratedText> result;
    try {
      if (generation != generation_ || !worker_->recording)
        throw Error("generate", "recording", "the recording the request was made for",
                    "another one");
      const session::Recording& recording = *worker_->recording;
      const Trace& trace = recording.recorder->trace();
      std::vector<int32_t> prompt;
      for (const TraceToken& token : trace.tokens) prompt.push_back(token.id);
      session::GenerationOptions options;
      options.max_new = max_new;
      options.cancel = &stop_generating_;
      options.on_step = [this](const std::vector<session::GeneratedText>& so_far) {
        auto copy = std::make_shared<std::vector<session::GeneratedText>>(so_far);
        QMetaObject::invokeMethod(this, [this, copy] {
          if (!generating_) return;
          generated_ = *copy;
          emit generated_step();
        });
      };
      if (!recording.resident) {
        throw Error("generate", "runs", "a model on one GPU (free generation of several runs)",
                    "a model split over GPUs (kvlens-cli generate --gpus runs one policy)");
      }
      result = session::generate_runs(recording.resident, prompt, recording.recorder->policies(),
                                      options);
    } catch (const std::exception& e) {
      error = QString::fromUtf8(e.what());
    }
    QMetaObject::invokeMethod(this, [this, result, error] {
      generating_ = false;
      if (!error.isEmpty()) {
        emit failed(error);
      } else {
        generated_ = result;
      }
      emit generated_step();
      emit idle();
    });
  });
}

void EngineController::show_trace(std::shared_ptr<Trace> trace) {
  ++generation_;  // a recording on its way stops, and its steps are dropped
  busy_ = false;
  incoming_ = {};
  stop_generating_ = true;
  generated_.clear();
  QMetaObject::invokeMethod(worker_, [this] { worker_->recording.reset(); });
  const int64_t steps = trace->step_count();
  shown_ = {std::move(trace), SessionConfig{}, steps, "saved trace", {}, {}, {}, {}};
  emit opened();
}

}  // namespace kvlens::app
