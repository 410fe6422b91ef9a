// The kvlens Python module (_kvlens, wrapped by the kvlens package in python/kvlens/): models,
// lockstep sessions stepped from Python, traces and their rows as NumPy arrays, .kvtrace files,
// the evaluations of `kvlens-cli eval` and the figures of `kvlens-cli figure`, over the same
// engine, app/session and viz code as kvlens-cli.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "app/session/common_options.h"
#include "app/session/model_input.h"
#include "app/session/output_file.h"
#include "app/session/policy_runs.h"
#include "engine/common/error.h"
#include "engine/common/mapped_file.h"
#include "engine/eval/coref_benchmark.h"
#include "engine/eval/coref_eval.h"
#include "engine/eval/perplexity.h"
#include "engine/eval/sparsity_match.h"
#include "engine/policy/registry.h"
#if KVLENS_PY_POLICIES
#include "engine/policy/plugin_policy.h"
#endif
#include "engine/session/decoder_session.h"
#include "engine/session/trace_recorder.h"
#include "engine/trace/trace.h"
#include "python/src/py_arrays.h"
#include "python/src/py_policy.h"

#if KVLENS_HAVE_QT
#include <QGuiApplication>

#include "viz/qt/painter_renderer.h"
#include "viz/qt/qt_messages.h"
#include "viz/views.h"
#endif

namespace py = pybind11;

namespace kvlens::python {
namespace {

// A model opened on a backend: what every session and evaluation of it runs on.
struct PyModel {
  session::CommonOptions common;
  std::string dir;
  std::shared_ptr<const Model> model;
  std::unique_ptr<Backend> backend;  // before resident: destroyed after it
  std::shared_ptr<const BackendModel> resident;
};

// One run's step of a trace, its rows as arrays over the record (no copies; the arrays keep the
// trace's owner alive).
struct PyStepRows {
  const Trace* trace = nullptr;
  int64_t step = 0, run = 0, layers = 0, heads = 0;
  const StepRecord& record() const { return trace->steps()[size_t(step)][size_t(run)]; }
};

// A stepping lockstep session: a TraceRecorder over a model's resident weights.
struct PySession {
  std::shared_ptr<PyModel> model;
  std::vector<PolicyConfig> runs;
  std::unique_ptr<TraceRecorder> recorder;
  double last_step_seconds = 0.0;
  // The recorder waits for the steps still in flight, whose Python policies take the GIL.
  ~PySession() {
    if (recorder && Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release release;
      recorder.reset();
    }
  }
};

// A trace loaded from a file (a session's trace is its recorder's).
struct PyTrace {
  std::shared_ptr<void> owner;  // keeps `trace` alive (the loaded trace, or the session)
  Trace* trace = nullptr;
};

std::string join_list(const py::handle& value) {
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (!py::isinstance<py::iterable>(value)) return py::str(value).cast<std::string>();
  std::string out;
  for (const py::handle item : value) {
    if (!out.empty()) out += ',';
    out += py::isinstance<py::str>(item) ? item.cast<std::string>()
                                         : py::str(item).cast<std::string>();
  }
  return out;
}

std::vector<std::string> string_list(const py::handle& value) {
  if (value.is_none()) return {};
  if (py::isinstance<py::str>(value)) return {value.cast<std::string>()};
  if (py::isinstance<py::dict>(value)) {
    std::vector<std::string> out;
    for (const auto item : value.cast<py::dict>())
      out.push_back(py::str(item.first).cast<std::string>() + "=" +
                    py::str(item.second).cast<std::string>());
    return out;
  }
  return value.cast<std::vector<std::string>>();
}

py::dict config_dict(const ModelConfig& c) {
  py::dict d;
  d["model_type"] = c.model_type;
  d["layers"] = c.num_layers;
  d["heads"] = c.num_heads;
  d["kv_heads"] = c.num_kv_heads;
  d["head_dim"] = c.head_dim;
  d["hidden_size"] = c.hidden_size;
  d["vocab_size"] = c.vocab_size;
  d["max_position_embeddings"] = c.max_position_embeddings;
  return d;
}

py::dict policy_dict(const PolicyInfo& info, bool composed) {
  py::dict d;
  d["id"] = info.id;
  d["family"] = info.family;
  d["description"] = info.description;
  d["reference"] = info.reference;
  d["needs_predictor"] = info.needs_predictor;
  d["predicts_logits"] = info.predicts_logits;
  d["composed"] = composed;
  py::list params;
  for (const ParamSpec& spec : info.params) {
    py::dict p;
    p["name"] = spec.name;
    p["type"] = spec.type == ParamType::Int     ? "int"
                : spec.type == ParamType::Float ? "float"
                : spec.type == ParamType::Bool  ? "bool"
                                                : "choice";
    p["description"] = spec.description;
    p["default"] = spec.default_value;
    p["min"] = spec.min;
    p["max"] = spec.max;
    p["choices"] = spec.choices;
    params.append(p);
  }
  d["params"] = params;
  d["source"] = policy_source_of(info.id);
  return d;
}

py::list policy_list() {
  py::list out;
  for (const PolicyInfo& info : policy_infos()) out.append(policy_dict(info, false));
  // SCORER+ALLOCATOR ids (snapkv+adakv, ...) run wherever an id does: listed, marked composed.
  for (const std::string& id : composed_policy_ids())
    out.append(policy_dict(*find_policy_info(id), true));
  return out;
}

std::shared_ptr<PyModel> open_model(const std::string& dir, const std::string& backend, int threads,
                                    const std::string& predictor, const std::string& dtype,
                                    const std::string& kv_dtype, const std::string& cpu_kernels) {
  auto m = std::make_shared<PyModel>();
  m->common.backend = backend;
  m->common.threads = threads;
  m->common.predictor = predictor;
  m->common.dtype = dtype;
  m->common.kv_dtype = kv_dtype;
  m->common.cpu_kernels = cpu_kernels;
  m->dir = dir;
  py::gil_scoped_release release;
  m->model = session::load_model(m->common, dir);
  m->backend = session::make_backend(m->common);
  m->resident = upload_model(m->model, *m->backend, session::upload_options(m->common));
  return m;
}

std::unique_ptr<PySession> open_session(
    std::shared_ptr<PyModel> model, const py::object& policies, const py::object& sparsity,
    const py::object& policy_args, const std::optional<std::string>& text,
    const std::optional<std::vector<int32_t>>& tokens, std::optional<int64_t> coref_sample,
    uint64_t seed, bool hard, const std::string& pools, int64_t top_k, double memory_budget_mb,
    int64_t prefill, const std::vector<int32_t>& select_heads, int64_t max_tokens) {
  auto s = std::make_unique<PySession>();
  s->model = std::move(model);
  s->runs = session::resolve_policy_runs(join_list(policies), join_list(sparsity),
                                         string_list(policy_args));
  const Model& m = *s->model->model;
  std::vector<int32_t> ids;
  std::optional<CorefSample> sample;
  std::optional<CorefTokens> marked;
  if (int(text.has_value()) + int(tokens.has_value()) + int(coref_sample.has_value()) != 1)
    throw Error("Session", "text", "exactly one of text=, tokens= or coref_sample=");
  if (coref_sample) {
    const CorefPools loaded = session::load_coref_pools_option(pools);
    sample = generate_coref_sample(loaded, seed, *coref_sample, hard);
    marked = mark_answer_tokens(*sample, m.require_tokenizer());
    ids = marked->tokens;
    session::check_input_tokens(m, ids, "coref_sample");
  } else if (tokens) {
    ids = *tokens;
    if (max_tokens > 0 && int64_t(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
    session::check_input_tokens(m, ids, "tokens");
  } else {
    ids = session::resolve_input_tokens(m, *text, "", "text", max_tokens);
  }
  TraceOptions options;
  options.top_k = top_k;
  options.memory_budget = uint64_t(memory_budget_mb * 1024.0 * 1024.0);
  options.prefill = prefill;
  options.selected_heads = select_heads;
  {
    py::gil_scoped_release release;
    s->recorder = std::make_unique<TraceRecorder>(s->model->resident, m.tokenizer.get(), ids,
                                                  s->runs, options);
  }
  s->recorder->trace().model.name = s->model->dir;
  if (sample) {
    s->recorder->trace().coref = {true,
                                  sample->index,
                                  sample->seed,
                                  sample->answer,
                                  marked->answer_token_begin,
                                  marked->answer_token_end};
  }
  return s;
}

bool session_step(PySession& s) {
  const auto start = std::chrono::steady_clock::now();
  bool stepped;
  {
    py::gil_scoped_release release;
    stepped = s.recorder->step();
  }
  s.last_step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stepped;
}

const char* decision_name(LayerDecision d) {
  switch (d) {
    case LayerDecision::Dense:
      return "dense";
    case LayerDecision::Masked:
      return "masked";
    case LayerDecision::Skipped:
      return "skipped";
    case LayerDecision::Gated:
      return "gated";
  }
  return "?";
}

PyStepRows step_rows(const Trace& trace, int64_t step, int64_t run) {
  const int64_t n = trace.step_count();
  if (step < 0) step += n;
  if (step < 0 || step >= n)
    throw Error("trace", "step", "a recorded step in [0, " + std::to_string(n) + ")",
                std::to_string(step));
  const auto& records = trace.steps()[size_t(step)];
  if (run < 0) run += int64_t(records.size());
  if (run < 0 || run >= int64_t(records.size()))
    throw Error("trace", "run", "a run in [0, " + std::to_string(records.size()) + ")",
                std::to_string(run));
  return {&trace, step, run, trace.model.layers, trace.model.heads};
}

// A run by index, or by policy id (the first run of that policy).
int64_t run_index(const Trace& trace, const py::object& run) {
  if (!py::isinstance<py::str>(run)) return run.cast<int64_t>();
  const std::string id = run.cast<std::string>();
  std::string ids;
  for (size_t r = 0; r < trace.runs.size(); ++r) {
    if (trace.runs[r].policy == id) return int64_t(r);
    ids += (ids.empty() ? "" : ", ") + trace.runs[r].policy;
  }
  throw Error("trace", "run", "a run index or one of " + ids, "'" + id + "'");
}

// The rows' shape: [layers, heads, columns] when every head was kept, else [kept, columns].
std::vector<py::ssize_t> rows_shape(const PyStepRows& r) {
  const auto kept = py::ssize_t(r.record().kept_heads.size());
  if (kept == r.layers * r.heads && kept > 0)
    return {py::ssize_t(r.layers), py::ssize_t(r.heads), py::ssize_t(r.record().columns)};
  return {kept, py::ssize_t(r.record().columns)};
}

// Softmax of the true logits over the visible set (what the attention computed): per kept row,
// dense layers over every column, skipped layers all zero. A computed array (float32).
py::array_t<float> probabilities_of(const PyStepRows& r) {
  const StepRecord& rec = r.record();
  const auto shape = rows_shape(r);
  py::array_t<float> out(shape);
  float* o = out.mutable_data();
  const int64_t cols = rec.columns;
  for (size_t k = 0; k < rec.kept_heads.size(); ++k) {
    const int64_t layer = rec.kept_heads[k] / r.heads;
    const LayerDecision d = rec.decisions[size_t(layer)];
    const float* z = rec.logits.data() + k * size_t(cols);
    const uint8_t* v = rec.visible.data() + k * size_t(cols);
    float* p = o + k * size_t(cols);
    const bool masked = d == LayerDecision::Masked;
    if (d == LayerDecision::Skipped) {
      std::fill(p, p + cols, 0.0f);
      continue;
    }
    float m = -INFINITY;
    for (int64_t j = 0; j < cols; ++j)
      if (!masked || v[j]) m = std::max(m, z[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const float e = (!masked || v[j]) && std::isfinite(z[j]) ? std::exp(z[j] - m) : 0.0f;
      p[j] = e;
      sum += e;
    }
    const float inv = sum > 0 ? float(1.0 / sum) : 0.0f;
    for (int64_t j = 0; j < cols; ++j) p[j] *= inv;
  }
  return out;
}

py::dict metrics_dict(const StepMetrics& m) {
  py::dict d;
  d["nll"] = m.nll;
  d["true_rank"] = m.true_rank;
  d["dense_true_rank"] = m.dense_true_rank;
  d["kl_vs_dense"] = m.kl_vs_dense;
  d["recall_vs_oracle"] = m.recall_vs_oracle;
  d["classification_accuracy"] = m.classification_accuracy;
  d["consensus"] = m.consensus;
  d["effective_sparsity"] = m.effective_sparsity;
  return d;
}

// kvlens-cli eval's hit_rate field: the mean over the scored rows, None when none was scored (or
// the hit rate was not asked for).
void set_hit_rate(py::dict& row, const HitRateStats& stats) {
  const double mean = stats.mean();
  row["hit_rate"] = std::isfinite(mean) ? py::object(py::float_(mean)) : py::object(py::none());
}

// One result row of `kvlens-cli eval --json` (cmd_eval.cpp's result_row + set_sparsity).
py::dict result_row(const PolicyConfig& run, const SparsityStats& stats) {
  py::dict row;
  row["policy"] = run.id;
  // The canonical run spec (two runs of one policy and sparsity differ by their knobs).
  row["run"] = session::run_spec(run);
  row["sparsity"] = run.sparsity;
  row["effective_sparsity"] = stats.steps > 0 ? stats.overall() : 0.0;
  row["accuracy"] = py::none();
  row["coverage"] = py::none();
  row["ppl"] = py::none();
  row["samples"] = py::none();
  row["hit_rate"] = py::none();
  // A plug-in's results say which file ran (as kvlens-cli eval --json's do).
  const std::string source = policy_source_of(run.id);
  if (!source.empty()) row["plugin"] = source;
  if (stats.steps > 0) {
    row["effective_sparsity_per_layer"] = stats.per_layer();
    row["effective_sparsity_per_head"] = stats.per_head();
  }
  return row;
}

// kvlens-cli eval's --match and its warnings: each nominal budget that is capped or not a token
// share is a Python warning (UserWarning), before any compute; with match="effective" the runs
// come back at the nominal sparsity found for them (and their outcomes), with a warning for each
// run that missed its target. The GIL is released around `evaluate` only.
template <class Result>
std::vector<Result> evaluate_runs(
    const PyModel& model, std::vector<PolicyConfig>& runs, const std::string& match,
    double tolerance,
    const std::function<std::vector<Result>(std::span<const PolicyConfig>)>& evaluate,
    std::vector<MatchOutcome>& outcomes) {
  const SparsityMatch mode = parse_sparsity_match(match, "match");
  MatchOptions options;
  options.tolerance = tolerance;
  validate_match_options(options, "match_tolerance");
  const py::object warn = py::module_::import("warnings").attr("warn");
  for (const PolicyConfig& run : runs) {
    for (const std::string& line : nominal_budget_warnings(run, model.model->config.num_layers)) {
      warn(line);
    }
  }
  if (mode == SparsityMatch::None) {
    py::gil_scoped_release release;
    return evaluate(runs);
  }
  std::vector<Result> chosen;
  {
    py::gil_scoped_release release;
    chosen = evaluate_matched<Result>(runs, evaluate, options, outcomes);
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    if (!outcomes[i].warning.empty()) warn(session::run_spec(runs[i]) + ": " + outcomes[i].warning);
    runs[i] = matched_config(runs[i], outcomes[i]);
  }
  return chosen;
}

// The matched figures of kvlens-cli eval --match effective's rows.
void set_match(py::dict& row, const std::vector<MatchOutcome>& outcomes, size_t i) {
  if (outcomes.empty()) return;
  row["target_sparsity"] = outcomes[i].target;
  row["matched"] = outcomes[i].matched;
  row["match_evaluations"] = outcomes[i].evaluations;
}

py::list eval_coref(const std::shared_ptr<PyModel>& model, const py::object& policies,
                    const py::object& sparsity, const py::object& policy_args, int64_t samples,
                    uint64_t seed, int64_t first_index, bool hard, const std::string& pools,
                    bool per_sample, bool hit_rate, const std::string& match,
                    double match_tolerance) {
  auto runs = session::resolve_policy_runs(join_list(policies), join_list(sparsity),
                                           string_list(policy_args));
  const Tokenizer& tokenizer = model->model->require_tokenizer();
  const CorefPools loaded = session::load_coref_pools_option(pools);
  std::vector<MatchOutcome> outcomes;
  const std::vector<CorefEvalResult> results = evaluate_runs<CorefEvalResult>(
      *model, runs, match, match_tolerance,
      [&](std::span<const PolicyConfig> configs) {
        return evaluate_coref_lockstep(model->resident, loaded, tokenizer, seed, first_index,
                                       samples, hard, ProgressFn(), configs, hit_rate);
      },
      outcomes);
  py::list out;
  for (size_t i = 0; i < runs.size(); ++i) {
    const CorefEvalResult& r = results[i];
    py::dict row = result_row(runs[i], r.sparsity);
    set_match(row, outcomes, i);
    row["accuracy"] = r.accuracy;
    row["coverage"] = r.coverage;
    row["samples"] = r.samples;
    row["answer_tokens"] = r.answer_tokens;
    set_hit_rate(row, r.hit_rate);
    if (per_sample) {
      py::list lines;
      for (const CorefSampleResult& s : r.per_sample) {
        py::dict line;
        line["index"] = s.index;
        line["answer"] = s.answer;
        line["tokens"] = s.tokens;
        line["answer_token_begin"] = s.answer_token_begin;
        line["answer_token_end"] = s.answer_token_end;
        line["correct_tokens"] = s.correct_tokens;
        line["all_correct"] = s.all_correct;
        line["canonical"] = s.canonical;
        line["answer_nll"] = s.answer_nll;
        if (hit_rate) set_hit_rate(line, s.hit_rate);
        lines.append(line);
      }
      row["per_sample"] = lines;
    }
    out.append(row);
  }
  return out;
}

// kvlens-cli eval's chunk inside a perplexity window (cmd_eval.cpp's kPerplexityChunk).
constexpr int64_t kPerplexityChunk = 512;

py::list eval_ppl(const std::shared_ptr<PyModel>& model, std::optional<std::string> text,
                  const py::object& policies, const py::object& sparsity,
                  const py::object& policy_args, int64_t window, int64_t max_tokens,
                  const std::string& text_file, bool hit_rate, const std::string& match,
                  double match_tolerance) {
  if (text.has_value() == !text_file.empty())
    throw Error("eval_ppl", "text", "one of text= or text_file=");
  if (!text) text = read_text_file(text_file);  // as kvlens-cli eval --text-file reads it
  auto runs = session::resolve_policy_runs(join_list(policies), join_list(sparsity),
                                           string_list(policy_args));
  std::vector<int32_t> tokens = model->model->require_tokenizer().encode(*text, true);
  if (max_tokens > 0 && int64_t(tokens.size()) > max_tokens) tokens.resize(size_t(max_tokens));
  if (window <= 0) window = model->model->config.max_position_embeddings;
  std::vector<MatchOutcome> outcomes;
  const std::vector<PerplexityResult> results = evaluate_runs<PerplexityResult>(
      *model, runs, match, match_tolerance,
      [&](std::span<const PolicyConfig> configs) {
        return evaluate_perplexity_lockstep(model->resident, tokens, window, kPerplexityChunk,
                                            ProgressFn(), configs, hit_rate);
      },
      outcomes);
  py::list out;
  for (size_t i = 0; i < runs.size(); ++i) {
    const PerplexityResult& r = results[i];
    py::dict row = result_row(runs[i], r.sparsity);
    set_match(row, outcomes, i);
    row["ppl"] = std::isfinite(r.ppl) ? py::object(py::float_(r.ppl)) : py::object(py::none());
    row["samples"] = r.windows;
    row["tokens_scored"] = r.tokens_scored;
    row["window"] = r.window;
    set_hit_rate(row, r.hit_rate);
    out.append(row);
  }
  return out;
}

#if KVLENS_HAVE_QT
// Exports need fonts and painting, not a display: one offscreen QGuiApplication per process
// (kept when the process already has one).
void ensure_gui_application() {
  if (QGuiApplication::instance()) return;
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  viz::install_headless_message_filter();
  static int argc = 1;
  static char name[] = "kvlens";
  static char* argv[] = {name, nullptr};
  static QGuiApplication* application = new QGuiApplication(argc, argv);
  (void)application;
}
#endif

// `kvlens-cli figure` on a trace in memory (cmd_figure.cpp, the same options and code).
py::dict figure_of_trace(const PyTrace& pytrace, const std::string& out,
                         const std::string& view_name, const py::object& runs, int64_t step,
                         int64_t layer, int64_t head, bool detail, const std::string& quantity,
                         bool linear, const std::string& consensus, int64_t retention_layer,
                         int64_t retention_head, const std::string& theme, double width,
                         double scale, const std::string& data) {
  const Trace& trace = *pytrace.trace;
#if KVLENS_HAVE_QT
  ensure_gui_application();
  viz::export_format_of(out);
  if (!data.empty() && !data.ends_with(".csv") && !data.ends_with(".json"))
    throw Error("data", "extension", ".csv or .json", "'" + data + "'");
  if (theme != "light" && theme != "dark")
    throw Error("theme", "theme", "light or dark", "'" + theme + "'");
  viz::ViewOptions options;
  const viz::ViewKind kind = viz::parse_view(view_name);
  options.step = step;
  options.layer = layer;
  options.head = head;
  options.head_detail = detail;
  options.quantity = viz::parse_quantity(quantity, "quantity");
  options.log_scale = !linear;
  options.consensus = viz::parse_consensus(consensus, "consensus");
  options.retention_layer = retention_layer;
  options.retention_head = retention_head;
  options.dark = theme == "dark";
  options.width = float(width);
  options.with_data = !data.empty();
  options.runs = viz::parse_runs(trace, join_list(runs), "runs");
  const viz::View view = viz::build_view(trace, kind, options);
  viz::export_figure(view.figure, out, scale);
  if (!data.empty()) {
    session::AtomicOutputFile file(data, "data");
    file.stream() << (data.ends_with(".csv") ? view.data.to_csv() : view.data.to_json());
    file.commit();
  }
  py::dict d;
  d["out"] = out;
  d["width"] = view.figure.width;
  d["height"] = view.figure.height;
  d["step"] = viz::resolved_step(trace, options);
  return d;
#else
  (void)trace, (void)view_name, (void)out, (void)runs, (void)step, (void)layer, (void)head;
  (void)detail, (void)quantity, (void)linear, (void)consensus, (void)retention_layer;
  (void)retention_head, (void)theme, (void)width, (void)scale, (void)data;
  throw Error("figure", "build", "a kvlens module built with Qt 6 (QtGui, QtSvg)",
              "one built without it");
#endif
}

}  // namespace
}  // namespace kvlens::python

PYBIND11_MODULE(_kvlens, m) {
  using namespace kvlens;
  using namespace kvlens::python;
  m.doc() = "kvlens: KV-cache token-selection policies, stepped, recorded and evaluated";

  static py::exception<Error> error_type(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      // (PyErr_SetString: pybind11 3 deprecates calling the exception, 2.10 lacks set_error)
      PyErr_SetString(error_type.ptr(), e.what());
    }
  });

  m.attr("assets_dir_source") = KVLENS_SOURCE_ASSETS_DIR;
  m.attr("assets_dir_installed") = KVLENS_INSTALLED_ASSETS_DIR;
  m.attr("has_figures") = bool(KVLENS_HAVE_QT);
  m.attr("has_cuda") = bool(KVLENS_HAVE_CUDA);

  m.def("policies", &policy_list, "Every registered policy: id, family, description, params");

  py::class_<PyModel, std::shared_ptr<PyModel>>(m, "Model",
                                                "A checkpoint folder opened on a backend")
      .def(py::init(&open_model), py::arg("path"), py::arg("backend") = "cpu",
           py::arg("threads") = 0, py::arg("predictor") = "", py::arg("dtype") = "auto",
           py::arg("kv_dtype") = "auto", py::arg("cpu_kernels") = "auto")
      .def_property_readonly("path", [](const PyModel& mm) { return mm.dir; })
      .def_property_readonly("backend", [](const PyModel& mm) { return mm.backend->name(); })
      .def_property_readonly("config",
                             [](const PyModel& mm) { return config_dict(mm.model->config); })
      .def_property_readonly("has_predictor",
                             [](const PyModel& mm) { return mm.resident->predictor != nullptr; })
      .def(
          "tokenize",
          [](const PyModel& mm, const std::string& text, bool special) {
            return mm.model->require_tokenizer().encode(text, special);
          },
          py::arg("text"), py::arg("special") = true)
      .def(
          "decode",
          [](const PyModel& mm, const std::vector<int32_t>& ids, bool skip_special) {
            return mm.model->require_tokenizer().decode(ids, skip_special);
          },
          py::arg("ids"), py::arg("skip_special") = false)
      .def("__repr__", [](const PyModel& mm) {
        return "<kvlens.Model " + mm.dir + " on " + mm.backend->name() + ">";
      });

  py::class_<PyStepRows>(m, "StepRows",
                         "One run at one step of a trace: rows [layers, heads, columns] as NumPy "
                         "views over the trace (read-only; kept alive by this object)")
      .def_readonly("step", &PyStepRows::step)
      .def_readonly("run", &PyStepRows::run)
      .def_property_readonly("columns", [](const PyStepRows& r) { return r.record().columns; })
      .def_property_readonly(
          "logits",
          [](py::object self) {
            const auto& r = self.cast<const PyStepRows&>();
            return readonly_array(r.record().logits.data(), rows_shape(r), self);
          },
          "True pre-softmax attention logits")
      .def_property_readonly(
          "scores",
          [](py::object self) {
            const auto& r = self.cast<const PyStepRows&>();
            return readonly_array(r.record().scores.data(), rows_shape(r), self);
          },
          "The policy's scores (a tokenbutler run's: its predictor's logits)")
      .def_property_readonly(
          "visible",
          [](py::object self) {
            const auto& r = self.cast<const PyStepRows&>();
            return readonly_bool_array(r.record().visible.data(), rows_shape(r), self);
          },
          "Visible sets (bool)")
      .def_property_readonly(
          "probabilities", [](const PyStepRows& r) { return probabilities_of(r); },
          "Softmax of the logits over each visible set (computed; a new array)")
      .def_property_readonly("kept_heads",
                             [](const PyStepRows& r) { return r.record().kept_heads; })
      .def_property_readonly("visible_counts",
                             [](py::object self) {
                               const auto& r = self.cast<const PyStepRows&>();
                               return readonly_array(r.record().visible_counts.data(),
                                                     {py::ssize_t(r.layers), py::ssize_t(r.heads)},
                                                     self);
                             })
      .def_property_readonly("decisions",
                             [](const PyStepRows& r) {
                               std::vector<std::string> out;
                               for (LayerDecision d : r.record().decisions)
                                 out.push_back(decision_name(d));
                               return out;
                             })
      .def_property_readonly("top_ids", [](const PyStepRows& r) { return r.record().top.ids; })
      .def_property_readonly("top_log_probs",
                             [](const PyStepRows& r) { return r.record().top.log_probs; })
      .def_property_readonly("top_texts", [](const PyStepRows& r) { return r.record().top.texts; })
      .def_property_readonly("argmax", [](const PyStepRows& r) { return r.record().argmax; })
      .def_property_readonly("metrics",
                             [](const PyStepRows& r) { return metrics_dict(r.record().metrics); });

  py::class_<PyTrace>(m, "Trace", "A recording: tokens, runs and per step and run their rows")
      .def_property_readonly("step_count", [](const PyTrace& t) { return t.trace->step_count(); })
      .def_property_readonly("token_ids",
                             [](const PyTrace& t) {
                               std::vector<int32_t> ids;
                               for (const TraceToken& tok : t.trace->tokens) ids.push_back(tok.id);
                               return py::array_t<int32_t>(py::ssize_t(ids.size()), ids.data());
                             })
      .def_property_readonly("token_texts",
                             [](const PyTrace& t) {
                               std::vector<std::string> texts;
                               for (const TraceToken& tok : t.trace->tokens)
                                 texts.push_back(tok.text);
                               return texts;
                             })
      .def_property_readonly("runs",
                             [](const PyTrace& t) {
                               py::list out;
                               for (const TraceRun& r : t.trace->runs) {
                                 py::dict d;
                                 d["policy"] = r.policy;
                                 d["sparsity"] = r.sparsity;
                                 d["params"] = r.params;
                                 d["first_step"] = r.first_step;
                                 out.append(d);
                               }
                               return out;
                             })
      .def_property_readonly("model",
                             [](const PyTrace& t) {
                               const TraceModelInfo& i = t.trace->model;
                               py::dict d;
                               d["name"] = i.name;
                               d["layers"] = i.layers;
                               d["heads"] = i.heads;
                               d["kv_heads"] = i.kv_heads;
                               d["head_dim"] = i.head_dim;
                               d["vocab_size"] = i.vocab_size;
                               return d;
                             })
      .def_property_readonly("coref",
                             [](const PyTrace& t) -> py::object {
                               const TraceCorefInfo& c = t.trace->coref;
                               if (!c.present) return py::none();
                               py::dict d;
                               d["sample_index"] = c.sample_index;
                               d["seed"] = c.seed;
                               d["answer"] = c.answer;
                               d["answer_token_begin"] = c.answer_token_begin;
                               d["answer_token_end"] = c.answer_token_end;
                               return d;
                             })
      .def_property_readonly("degraded_from_step",
                             [](const PyTrace& t) { return t.trace->degraded_from_step(); })
      .def(
          "rows",
          [](const PyTrace& t, int64_t step, const py::object& run) {
            return step_rows(*t.trace, step, run_index(*t.trace, run));
          },
          py::arg("step") = -1, py::arg("run") = 0, py::keep_alive<0, 1>(),
          "Run `run`'s rows (an index or a policy id) at `step` (negative: from the end)")
      .def(
          "save",
          [](const PyTrace& t, const std::string& path) {
            py::gil_scoped_release release;
            save_trace(*t.trace, path);
          },
          py::arg("path"), "Writes a .kvtrace file")
      .def("figure", &figure_of_trace, py::arg("out"), py::arg("view") = "heads",
           py::arg("runs") = "0", py::arg("step") = -1, py::arg("layer") = 0, py::arg("head") = 0,
           py::arg("detail") = false, py::arg("quantity") = "probabilities",
           py::arg("linear") = false, py::arg("consensus") = "pearson",
           py::arg("retention_layer") = -1, py::arg("retention_head") = -1,
           py::arg("theme") = "light", py::arg("width") = 1280.0, py::arg("scale") = 2.0,
           py::arg("data") = "",
           "Writes one of the app's views as PNG, SVG or PDF (kvlens-cli figure)");

  m.def(
      "load_trace",
      [](const std::string& path) {
        auto trace = std::make_shared<Trace>();
        {
          py::gil_scoped_release release;
          *trace = load_trace(path);
        }
        return PyTrace{trace, trace.get()};
      },
      py::arg("path"), "Reads a .kvtrace file");

  py::class_<PySession>(m, "Session",
                        "Policies stepped in lockstep over one text, each step recorded")
      .def(py::init(&open_session), py::arg("model"), py::arg("policies") = "dense",
           py::arg("sparsity") = "0", py::arg("policy_args") = py::none(),
           py::arg("text") = py::none(), py::arg("tokens") = py::none(),
           py::arg("coref_sample") = py::none(), py::arg("seed") = 0, py::arg("hard") = false,
           py::arg("pools") = "", py::arg("top_k") = 10, py::arg("memory_budget_mb") = 2048.0,
           py::arg("prefill") = 0, py::arg("select_heads") = std::vector<int32_t>(),
           py::arg("max_tokens") = 0)
      .def("step", &session_step, "Feeds the next token to every run; False when the text is done")
      .def_property_readonly("done", [](const PySession& s) { return s.recorder->done(); })
      .def_property_readonly("steps_total",
                             [](const PySession& s) { return s.recorder->steps_total(); })
      .def_property_readonly("step_count",
                             [](const PySession& s) { return s.recorder->trace().step_count(); })
      .def_property_readonly("last_step_seconds",
                             [](const PySession& s) { return s.last_step_seconds; })
      .def_property_readonly("runs",
                             [](const PySession& s) {
                               py::list out;
                               for (const PolicyConfig& c : s.runs) {
                                 py::dict d;
                                 d["policy"] = c.id;
                                 d["sparsity"] = c.sparsity;
                                 d["args"] = c.args;
                                 out.append(d);
                               }
                               return out;
                             })
      // (a cpp_function: pybind11 3's def_property takes no keep_alive of its own)
      .def_property_readonly("trace", py::cpp_function(
                                          [](PySession& s) {
                                            return PyTrace{nullptr, &s.recorder->trace()};
                                          },
                                          py::keep_alive<0, 1>()))
      .def(
          "rows",
          [](PySession& s, const py::object& run, int64_t step) {
            const Trace& trace = s.recorder->trace();
            return step_rows(trace, step, run_index(trace, run));
          },
          py::arg("run") = 0, py::arg("step") = -1, py::keep_alive<0, 1>(),
          "Run `run`'s rows (an index or a policy id) at `step` (default: the last recorded)")
      .def(
          "output_logits",
          [](PySession& s, int64_t run) {
            const auto row = s.recorder->output_logits(run);
            return py::array_t<float>(py::ssize_t(row.size()), row.data());
          },
          py::arg("run") = 0, "The next-token logits [vocab] of the last step (a copy)")
      .def(
          "save",
          [](PySession& s, const std::string& path) {
            py::gil_scoped_release release;
            save_trace(s.recorder->trace(), path);
          },
          py::arg("path"), "Writes the recording so far as a .kvtrace file");

  m.def("eval_coref", &eval_coref, py::arg("model"), py::arg("policies") = "dense",
        py::arg("sparsity") = "0", py::arg("policy_args") = py::none(), py::arg("samples") = 200,
        py::arg("seed") = 0, py::arg("first_index") = 0, py::arg("hard") = false,
        py::arg("pools") = "", py::arg("per_sample") = false, py::arg("hit_rate") = false,
        py::arg("match") = "none", py::arg("match_tolerance") = MatchOptions{}.tolerance,
        "kvlens-cli eval --task coref: one row per (policy, sparsity); hit_rate=True: "
        "--hit-rate; match='effective': --match effective (rows add target_sparsity, matched, "
        "match_evaluations); nominal budgets that are capped or not token shares warn");
  m.def("eval_ppl", &eval_ppl, py::arg("model"), py::arg("text") = py::none(),
        py::arg("policies") = "dense", py::arg("sparsity") = "0",
        py::arg("policy_args") = py::none(), py::arg("window") = 0, py::arg("max_tokens") = 0,
        py::arg("text_file") = "", py::arg("hit_rate") = false, py::arg("match") = "none",
        py::arg("match_tolerance") = MatchOptions{}.tolerance,
        "kvlens-cli eval --task ppl over a text (or text_file, read as --text-file is); "
        "hit_rate=True: --hit-rate; match='effective': --match effective");

  m.def(
      "load_plugin",
      [](const std::string& path) {
#if KVLENS_PY_POLICIES
        return load_policy_plugin(path).id;
#else
        throw Error(path, "plug-in", "a kvlens built with the plug-in adapter",
                    "one built without it");
        return std::string();
#endif
      },
      py::arg("path"), "Loads a C policy plug-in (FILE.so, kvlens-cli's --plugin); returns its id");

  bind_policy_types(m);
}
