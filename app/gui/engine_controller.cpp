// EngineController and its worker (the recording lives on the worker thread only).
#include "app/gui/engine_controller.h"

#include <QMetaObject>

#include "app/session/policy_runs.h"
#include "engine/common/error.h"
#include "engine/model/model.h"
#if KVLENS_HAVE_CUDA
#include "kernels/cuda_backend.h"
#endif

namespace kvlens::app {

class EngineController::Worker : public QObject {
 public:
  std::unique_ptr<session::Recording> recording;
};

namespace {

session::CommonOptions backend_options(const SessionConfig& config, QString& name) {
  session::CommonOptions common;
  common.threads = config.threads;
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

}  // namespace

EngineController::EngineController(QObject* parent) : QObject(parent) {
  worker_ = new Worker;
  worker_->moveToThread(&thread_);
  connect(&thread_, &QThread::finished, worker_, &QObject::deleteLater);
  thread_.setObjectName("kvlens-engine");
  thread_.start();
}

EngineController::~EngineController() {
  cancel_ = true;
  thread_.quit();
  thread_.wait();
}

void EngineController::open(const SessionConfig& config) {
  if (busy_) cancel_ = true;
  busy_ = true;
  const uint64_t generation = ++generation_;
  QMetaObject::invokeMethod(worker_, [this, config, generation] {
    QString backend, predictor, note;
    std::unique_ptr<session::Recording> recording;
    std::shared_ptr<Trace> header;
    int64_t total = 0;
    QString error;
    try {
      const session::CommonOptions common = backend_options(config, backend);
      const std::shared_ptr<const Model> model =
          Model::load(config.model_dir, config.predictor_file);
      const PolicyChoice choice = choose_policies(config.policies, config.policies_asked, *model);
      const std::vector<PolicyConfig> runs =
          session::resolve_policy_runs(choice.policies, config.sparsities, config.policy_args);
      TraceOptions options;
      options.memory_budget = config.memory_budget;
      recording = std::make_unique<session::Recording>(
          session::open_recording(common, model, config.source, runs, options, "prompt"));
      predictor = QString::fromStdString(predictor_summary(*model));
      note = QString::fromStdString(choice.note);
      header = std::make_shared<Trace>(recording->recorder->trace());
      total = recording->recorder->steps_total();
    } catch (const std::exception& e) {
      error = QString::fromUtf8(e.what());
    }
    if (error.isEmpty()) worker_->recording = std::move(recording);
    QMetaObject::invokeMethod(
        this, [this, config, header, total, backend, predictor, note, error, generation] {
          if (generation != generation_) return;  // a later open or saved trace replaced it
          busy_ = false;
          cancel_ = false;
          if (!error.isEmpty()) {
            emit failed(error);
            return;
          }
          trace_ = header;
          config_ = config;
          steps_total_ = total;
          backend_name_ = backend;
          predictor_ = predictor;
          note_ = note;
          emit opened();
        });
  });
}

void EngineController::show_trace(std::shared_ptr<Trace> trace) {
  cancel_ = true;
  ++generation_;  // steps of the recording still on their way are dropped
  busy_ = false;  // (their end is dropped too: nothing is left to step)
  QMetaObject::invokeMethod(worker_, [this] { worker_->recording.reset(); });
  trace_ = std::move(trace);
  steps_total_ = trace_->step_count();
  backend_name_ = "saved trace";
  predictor_.clear();
  note_.clear();
  config_ = SessionConfig{};
  emit opened();
}

void EngineController::step(int count) {
  if (busy_ || !trace_ || done() || count <= 0) return;
  busy_ = true;
  cancel_ = false;
  const uint64_t generation = generation_;
  QMetaObject::invokeMethod(worker_, [this, count, generation] {
    QString error;
    for (int i = 0; i < count && !cancel_; ++i) {
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
        try {
          trace_->add_step(std::move(*records));
        } catch (const std::exception& e) {
          emit failed(QString::fromUtf8(e.what()));
          return;
        }
        emit stepped(trace_->step_count() - 1);
      });
    }
    QMetaObject::invokeMethod(this, [this, error, generation] {
      if (generation != generation_) return;  // an open now in progress keeps busy_
      busy_ = false;
      if (!error.isEmpty()) emit failed(error);
      emit idle();
    });
  });
}

}  // namespace kvlens::app
