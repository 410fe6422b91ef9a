// Python policies behind the C plug-in contract (py_policy.h). The step a policy's select() gets
// is one _Step object per instance, reused from call to call: its arrays are views over the
// step's buffers (NumPy on the host; torch tensors when the class asks for torch, through DLPack
// on CUDA), made only when read, valid during the call.
#include "python/src/py_policy.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/common/error.h"
#include "include/kvlens/policy_plugin.h"
#include "python/src/py_arrays.h"

#if KVLENS_PY_POLICIES
#include "engine/policy/plugin_policy.h"
#include "engine/policy/registry.h"
#endif
#if KVLENS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace py = pybind11;

namespace kvlens::python {
namespace {

// ---- DLPack (the stable C ABI torch.from_dlpack reads), for device memory -------------------
struct DLDevice {
  int32_t device_type;  // 1 CPU, 2 CUDA
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct ManagedView {
  DLManagedTensor managed;
  std::array<int64_t, 3> shape, strides;
};

void delete_managed(DLManagedTensor* tensor) {
  delete static_cast<ManagedView*>(tensor->manager_ctx);
}

// A capsule over device memory (strides in elements), consumed by torch.from_dlpack.
py::capsule dlpack_capsule(const void* data, DLDataType dtype, std::vector<int64_t> shape,
                           std::vector<int64_t> strides) {
  auto* view = new ManagedView{};
  int32_t device = 0;
#if KVLENS_HAVE_CUDA
  cudaGetDevice(&device);
#endif
  for (size_t i = 0; i < shape.size(); ++i) {
    view->shape[i] = shape[i];
    view->strides[i] = strides[i];
  }
  view->managed.dl_tensor = {const_cast<void*>(data),
                             {2, device},
                             int32_t(shape.size()),
                             dtype,
                             view->shape.data(),
                             view->strides.data(),
                             0};
  view->managed.manager_ctx = view;
  view->managed.deleter = delete_managed;
  return py::capsule(&view->managed, "dltensor", [](PyObject* capsule) {
    // Consumed capsules are renamed "used_dltensor" and owned by the consumer.
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      if (managed && managed->deleter) managed->deleter(managed);
    }
  });
}

// The Python helpers of kvlens.policy (answer conversion, torch stream), looked up once.
struct Helpers {
  py::object answer, call_on_stream, from_numpy, from_dlpack, model_shape;
};
Helpers& helpers() {
  static Helpers* h = [] {
    auto* out = new Helpers;
    const py::module_ policy = py::module_::import("kvlens.policy");
    out->answer = policy.attr("_answer");
    out->call_on_stream = policy.attr("_call_on_stream");
    out->model_shape = policy.attr("ModelShape");
    return out;
  }();
  return *h;
}
void load_torch(Helpers& h) {
  if (h.from_numpy) return;
  const py::module_ torch = py::module_::import("torch");
  h.from_numpy = torch.attr("from_numpy");
  h.from_dlpack = py::module_::import("torch.utils.dlpack").attr("from_dlpack");
}

struct Instance;

// What one select() call sees (reused per instance; pointers valid during the call).
struct StepView {
  Instance* instance = nullptr;
  const kvlens_step* step = nullptr;
  kvlens_answer* answer = nullptr;
  bool active = false;
  // The answer buffers the policy was given this call (kvlens does not clear them between
  // steps: what a policy leaves alone is filled with the contract's defaults after the call).
  bool scores_given = false, eligible_given = false;
};
struct ObservationView {
  Instance* instance = nullptr;
  const kvlens_observation* obs = nullptr;
  bool active = false;
};

struct Instance {
  kvlens_model_shape shape{};
  bool torch = false;
  PyObject* object = nullptr;  // the policy instance (owned)
  PyObject* select = nullptr;  // its bound methods (owned)
  PyObject* observe = nullptr;
  StepView step;
  ObservationView observation;
  PyObject* step_object = nullptr;  // Python wrappers of the two views (owned)
  PyObject* observation_object = nullptr;
};

[[noreturn]] void not_active() {
  throw py::value_error(
      "a kvlens step is only valid during the select()/observe() call it was given to");
}

// A [rows, cols] view of a row buffer of `stride` columns.
template <typename T>
py::object rows(const Instance& in, py::handle base, const T* data, int64_t rows_n, int64_t cols,
                int64_t stride, bool writable, bool as_bool = false) {
  if (!data) return py::none();
  const bool cuda = in.shape.memory == KVLENS_MEMORY_CUDA;
  if (cuda) {
    Helpers& h = helpers();
    load_torch(h);
    DLDataType dtype = as_bool ? DLDataType{6, 8, 1}
                               : (sizeof(T) == 4 ? DLDataType{2, 32, 1} : DLDataType{1, 8, 1});
    return h.from_dlpack(dlpack_capsule(data, dtype, {rows_n, cols}, {stride, 1}));
  }
  py::array array(
      as_bool ? py::dtype("?") : py::dtype::of<T>(),
      std::vector<py::ssize_t>{py::ssize_t(rows_n), py::ssize_t(cols)},
      std::vector<py::ssize_t>{py::ssize_t(stride * int64_t(sizeof(T))), py::ssize_t(sizeof(T))},
      data, base);
  if (!writable)
    py::detail::array_proxy(array.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  if (in.torch) {
    Helpers& h = helpers();
    load_torch(h);
    return h.from_numpy(array);
  }
  return array;
}

// The cache [G, cols, D] of a step (F32 as float32; BF16 / F16 as their 16-bit patterns on the
// host, as torch.bfloat16 / float16 on CUDA).
py::object cache(const Instance& in, py::handle base, const void* data, const kvlens_step& s) {
  if (!data) return py::none();
  const int64_t G = in.shape.kv_heads, D = in.shape.head_dim;
  const bool cuda = in.shape.memory == KVLENS_MEMORY_CUDA;
  const int64_t item = s.cache_dtype == KVLENS_F32 ? 4 : 2;
  if (cuda) {
    Helpers& h = helpers();
    load_torch(h);
    const DLDataType dtype = s.cache_dtype == KVLENS_F32    ? DLDataType{2, 32, 1}
                             : s.cache_dtype == KVLENS_BF16 ? DLDataType{4, 16, 1}
                                                            : DLDataType{2, 16, 1};
    return h.from_dlpack(dlpack_capsule(data, dtype, {G, s.cols, D}, {s.stride * D, D, 1}));
  }
  py::array array(item == 4 ? py::dtype::of<float>() : py::dtype::of<uint16_t>(),
                  std::vector<py::ssize_t>{py::ssize_t(G), py::ssize_t(s.cols), py::ssize_t(D)},
                  std::vector<py::ssize_t>{py::ssize_t(s.stride * D * item), py::ssize_t(D * item),
                                           py::ssize_t(item)},
                  data, base);
  py::detail::array_proxy(array.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
  if (in.torch) {
    Helpers& h = helpers();
    load_torch(h);
    return h.from_numpy(array);
  }
  return array;
}

const kvlens_step& active_step(const StepView& v) {
  if (!v.active) not_active();
  return *v.step;
}
const kvlens_observation& active_obs(const ObservationView& v) {
  if (!v.active) not_active();
  return *v.obs;
}

void write_error(const std::string& message, char* error, size_t error_size) {
  if (!error || error_size == 0) return;
  std::snprintf(error, error_size, "%s", message.c_str());
}

// ---- The registered classes: one slot (its own create function) per class ------------------
struct PolicyClass {
  kvlens_policy_plugin table{};
  std::string name, family, rule, source;
  std::vector<std::string> param_names, param_descriptions, param_types;
  std::vector<std::vector<std::string>> choices;
  std::vector<std::vector<const char*>> choice_pointers;
  std::vector<kvlens_param> params;
  // The params create() receives values for (in order): those not named like a common knob,
  // whose value kvlens applies itself.
  std::vector<size_t> own;
  PyObject* cls = nullptr;  // the class new instances are made of (a reference held for good)
  bool torch = false;
};
constexpr int kSlots = 64;

// Time spent in the Python policies' select() and observe() calls, the GIL's taking included
// (updated under the GIL): what Python costs a step, for kvlens._core._python_policy_stats().
struct CallStats {
  int64_t selects = 0, observes = 0;
  double seconds = 0.0;
};
CallStats call_stats;
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::shared_ptr<PolicyClass> slots[kSlots];  // used under the GIL

void* create_in_slot(int slot, const kvlens_model_shape* shape, const double* values, char* error,
                     size_t error_size) {
  py::gil_scoped_acquire gil;
  try {
    const PolicyClass& k = *slots[slot];
    auto instance = std::make_unique<Instance>();
    std::memcpy(&instance->shape, shape,
                std::min<size_t>(sizeof(instance->shape), shape->struct_size));
    instance->torch = k.torch;
    py::dict kwargs;
    for (size_t j = 0; j < k.own.size(); ++j) {
      const size_t i = k.own[j];
      const std::string& type = k.param_types[i];
      const py::str key(k.param_names[i]);
      if (type == "int") {
        kwargs[key] = int64_t(values[j]);
      } else if (type == "bool") {
        kwargs[key] = values[j] != 0.0;
      } else if (type == "choice") {
        kwargs[key] = k.choices[i].at(size_t(values[j]));
      } else {
        kwargs[key] = values[j];
      }
    }
    const py::object shape_object =
        helpers().model_shape(shape->layers, shape->heads, shape->kv_heads, shape->head_dim,
                              shape->hidden_size, shape->max_positions, bool(shape->has_predictor),
                              shape->memory == KVLENS_MEMORY_CUDA ? "cuda" : "host");
    py::object object = py::reinterpret_borrow<py::object>(k.cls)(shape_object, **kwargs);
    instance->select = py::object(object.attr("select")).release().ptr();
    if (k.table.observe) instance->observe = py::object(object.attr("observe")).release().ptr();
    instance->step.instance = instance.get();
    instance->observation.instance = instance.get();
    instance->step_object =
        py::cast(&instance->step, py::return_value_policy::reference).release().ptr();
    instance->observation_object =
        py::cast(&instance->observation, py::return_value_policy::reference).release().ptr();
    instance->object = object.release().ptr();
    return instance.release();
  } catch (const std::exception& e) {
    write_error(e.what(), error, error_size);
    return nullptr;
  }
}

template <size_t... I>
constexpr auto make_creates(std::index_sequence<I...>) {
  using Create = void* (*)(const kvlens_model_shape*, const double*, char*, size_t);
  return std::array<Create, sizeof...(I)>{
      +[](const kvlens_model_shape* shape, const double* values, char* error, size_t size) {
        return create_in_slot(int(I), shape, values, error, size);
      }...};
}
constexpr auto kCreates = make_creates(std::make_index_sequence<kSlots>());

[[maybe_unused]] void destroy_instance(void* state) {
  auto* instance = static_cast<Instance*>(state);
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    Py_XDECREF(instance->step_object);
    Py_XDECREF(instance->observation_object);
    Py_XDECREF(instance->select);
    Py_XDECREF(instance->observe);
    Py_XDECREF(instance->object);
  }
  delete instance;
}

// The buffers the policy did not ask for this call, set to the contract's defaults: scores 0
// (every candidate of every head), eligible 1. A policy that reads a buffer writes all of it.
void fill_rows(void* data, size_t item, int64_t rows_n, int64_t cols, int64_t stride, int value,
               const kvlens_step& s) {
  if (!data) return;
  if (s.memory == KVLENS_MEMORY_CUDA) {
#if KVLENS_HAVE_CUDA
    cudaMemset2DAsync(data, size_t(stride) * item, value, size_t(cols) * item, size_t(rows_n),
                      static_cast<cudaStream_t>(s.stream));
#endif
    return;
  }
  for (int64_t r = 0; r < rows_n; ++r)
    std::memset(static_cast<char*>(data) + size_t(r * stride) * item, value, size_t(cols) * item);
}

void fill_untouched(const StepView& v) {
  const kvlens_step& s = *v.step;
  if (!v.scores_given)
    fill_rows(v.answer->scores, sizeof(float), v.instance->shape.heads, s.cols, s.stride, 0, s);
  if (!v.eligible_given) fill_rows(v.answer->eligible, 1, s.selection_rows, s.cols, s.stride, 1, s);
}

[[maybe_unused]] int32_t select_step(void* state, const kvlens_step* step, kvlens_answer* answer,
                                     char* error, size_t error_size) {
  auto* instance = static_cast<Instance*>(state);
  const double start = now_seconds();
  py::gil_scoped_acquire gil;
  instance->step.step = step;
  instance->step.answer = answer;
  instance->step.active = true;
  instance->step.scores_given = instance->step.eligible_given = false;
  int32_t decision = KVLENS_FAILED;
  try {
    const py::handle view(instance->step_object);
    py::object result;
    if (step->memory == KVLENS_MEMORY_CUDA) {
      // The answer is made on the session's stream too (_call_on_stream).
      result =
          helpers().call_on_stream(py::handle(instance->select), view,
                                   reinterpret_cast<uintptr_t>(step->stream), helpers().answer);
    } else {
      result = py::reinterpret_steal<py::object>(
          PyObject_CallOneArg(instance->select, instance->step_object));
      if (!result) throw py::error_already_set();
    }
    if (PyLong_CheckExact(result.ptr())) {
      decision = int32_t(PyLong_AsLong(result.ptr()));
    } else {
      decision = helpers().answer(view, result).cast<int32_t>();
    }
    if (decision != KVLENS_DENSE && decision != KVLENS_SCORES && decision != KVLENS_VISIBLE)
      throw py::value_error("select() answered " + std::to_string(decision) +
                            ": kvlens.DENSE, kvlens.SCORES or kvlens.VISIBLE");
    if (decision != KVLENS_DENSE) fill_untouched(instance->step);
  } catch (const std::exception& e) {
    write_error(e.what(), error, error_size);
    decision = KVLENS_FAILED;
  }
  instance->step.active = false;
  call_stats.selects += 1;
  call_stats.seconds += now_seconds() - start;
  return decision;
}

[[maybe_unused]] int32_t observe_step(void* state, const kvlens_observation* observation,
                                      char* error, size_t error_size) {
  auto* instance = static_cast<Instance*>(state);
  if (!instance->observe) return 0;
  const double start = now_seconds();
  py::gil_scoped_acquire gil;
  instance->observation.obs = observation;
  instance->observation.active = true;
  int32_t status = 0;
  try {
    py::object result;
    if (observation->memory == KVLENS_MEMORY_CUDA) {
      result = helpers().call_on_stream(py::handle(instance->observe),
                                        py::handle(instance->observation_object),
                                        reinterpret_cast<uintptr_t>(observation->stream));
    } else {
      result = py::reinterpret_steal<py::object>(
          PyObject_CallOneArg(instance->observe, instance->observation_object));
      if (!result) throw py::error_already_set();
    }
  } catch (const std::exception& e) {
    write_error(e.what(), error, error_size);
    status = 1;
  }
  instance->observation.active = false;
  call_stats.observes += 1;
  call_stats.seconds += now_seconds() - start;
  return status;
}

[[maybe_unused]] uint32_t needs_bits(const py::handle& needs, const std::string& cls) {
  static const std::pair<const char*, uint32_t> kNames[] = {
      {"logits", KVLENS_NEEDS_LOGITS},
      {"probabilities", KVLENS_NEEDS_PROBABILITIES},
      {"predictor", KVLENS_NEEDS_PREDICTOR},
      {"cache", KVLENS_NEEDS_CACHE},
      {"previous_visible", KVLENS_NEEDS_PREVIOUS_VISIBLE},
      {"eligible", KVLENS_NEEDS_ELIGIBLE},
      {"visible", KVLENS_ANSWERS_VISIBLE}};
  uint32_t bits = 0;
  for (const py::handle item : needs) {
    const std::string name = py::str(item);
    bool known = false;
    for (const auto& [key, bit] : kNames) {
      if (name == key) {
        bits |= bit;
        known = true;
      }
    }
    if (!known)
      throw Error(cls, "needs",
                  "logits, probabilities, predictor, cache, previous_visible, eligible or visible",
                  "'" + name + "'");
  }
  return bits;
}

}  // namespace

std::string policy_source_of(const std::string& id) {
#if KVLENS_PY_POLICIES
  return policy_source(id);
#else
  (void)id;
  return "";
#endif
}

std::string register_python_policy(py::handle cls) {
#if KVLENS_PY_POLICIES
  // What the calls use, made now on this thread under the GIL: made first inside a call, on one
  // of the engine's threads, a function-local static that imports (NumPy's C API, the helpers)
  // would deadlock with another thread waiting for it while holding the GIL.
  py::detail::npy_api::get();
  helpers();
  const py::module_ policy_module = py::module_::import("kvlens.policy");
  // The class's description, normalised by kvlens.policy (name, family, rule, params, needs).
  const py::dict d = policy_module.attr("_describe")(cls);
  auto k = std::make_shared<PolicyClass>();
  k->name = d["name"].cast<std::string>();
  k->family = d["family"].cast<std::string>();
  k->rule = d["rule"].cast<std::string>();
  k->source = d["source"].cast<std::string>();
  const std::string label = "Python policy " + k->source;
  for (const py::handle p : d["params"]) {
    const py::tuple spec = py::reinterpret_borrow<py::tuple>(p);
    k->param_names.push_back(spec[0].cast<std::string>());
    k->param_types.push_back(spec[1].cast<std::string>());
    k->param_descriptions.push_back(spec[2].cast<std::string>());
    k->choices.push_back(spec[6].cast<std::vector<std::string>>());
  }
  for (size_t i = 0; i < k->param_names.size(); ++i) {
    const py::tuple spec = py::reinterpret_borrow<py::tuple>(py::list(d["params"])[i]);
    std::vector<const char*> pointers;
    for (const std::string& c : k->choices[i]) pointers.push_back(c.c_str());
    k->choice_pointers.push_back(std::move(pointers));
    const std::string& type = k->param_types[i];
    kvlens_param param{};
    param.name = k->param_names[i].c_str();
    param.type = type == "int"     ? KVLENS_PARAM_INT
                 : type == "float" ? KVLENS_PARAM_FLOAT
                 : type == "bool"  ? KVLENS_PARAM_BOOL
                                   : KVLENS_PARAM_CHOICE;
    param.description = k->param_descriptions[i].c_str();
    param.default_value = spec[3].cast<double>();
    param.min_value = spec[4].cast<double>();
    param.max_value = spec[5].cast<double>();
    param.choices = k->choice_pointers[i].empty() ? nullptr : k->choice_pointers[i].data();
    param.choice_count = int32_t(k->choice_pointers[i].size());
    k->params.push_back(param);
    bool common = false;
    for (const ParamSpec& knob : common_param_specs()) common |= knob.name == k->param_names[i];
    if (!common) k->own.push_back(i);
  }
  k->torch = d["torch"].cast<bool>();
  kvlens_policy_plugin& t = k->table;
  t.abi_version = KVLENS_POLICY_ABI_VERSION;
  t.struct_size = sizeof(kvlens_policy_plugin);
  t.name = k->name.c_str();
  t.family = k->family.c_str();
  t.rule = k->rule.c_str();
  t.params = k->params.empty() ? nullptr : k->params.data();
  t.param_count = int32_t(k->params.size());
  // A Python policy may always answer with a set (kvlens.visible(mask)): the zeroing this asks
  // for is small beside a call into Python.
  t.needs = needs_bits(d["needs"], label) | KVLENS_ANSWERS_VISIBLE;
  t.memories = KVLENS_ACCEPTS_HOST;
  if (k->torch) {
    // torch tensors on the device through DLPack; without torch the adapter's host copies.
    try {
      load_torch(helpers());
      t.memories |= KVLENS_ACCEPTS_CUDA;
    } catch (const py::error_already_set&) {
      throw Error(label, "tensors", "torch importable (tensors = \"torch\")",
                  "no module named torch");
    }
  }
  t.predicts_logits = d["predicts_logits"].cast<bool>() ? 1 : 0;
  t.select = select_step;
  t.destroy = destroy_instance;
  t.observe = d["has_observe"].cast<bool>() ? observe_step : nullptr;

  // A class of a registered name from the same source takes over its slot (a cell run again).
  int slot = -1;
  for (int i = 0; i < kSlots && slot < 0; ++i) {
    if (slots[i] && slots[i]->name == k->name && slots[i]->source == k->source) slot = i;
  }
  if (slot >= 0) {
    PyObject* old = slots[slot]->cls;
    slots[slot]->cls = cls.inc_ref().ptr();
    Py_XDECREF(old);
    return k->name;
  }
  for (int i = 0; i < kSlots && slot < 0; ++i) {
    if (!slots[i]) slot = i;
  }
  if (slot < 0)
    throw Error(label, "registration", "at most " + std::to_string(kSlots) + " Python policies",
                "one more");
  t.create = kCreates[size_t(slot)];
  k->cls = cls.inc_ref().ptr();
  slots[slot] = k;
  try {
    // keep_alive: the table's strings live in the slot, held for the process's lifetime.
    register_plugin_policy(&k->table, k->source, std::shared_ptr<void>(k, k.get()));
  } catch (...) {
    slots[slot].reset();
    Py_XDECREF(k->cls);
    k->cls = nullptr;
    throw;
  }
  return k->name;
#else
  (void)cls;
  throw Error("kvlens.register_policy", "build",
              "a kvlens built with the plug-in adapter (engine/policy/plugin_policy.cpp)",
              "one built without it");
#endif
}

void bind_policy_types(py::module_& m) {
  m.attr("DENSE") = int(KVLENS_DENSE);
  m.attr("SCORES") = int(KVLENS_SCORES);
  m.attr("VISIBLE") = int(KVLENS_VISIBLE);
  m.attr("has_plugin_adapter") = bool(KVLENS_PY_POLICIES);

  py::class_<StepView>(m, "_Step",
                       "One (step, layer) as select() sees it: the step's buffers as arrays "
                       "(valid during the call) and the answer buffers to write")
      .def_property_readonly("step", [](const StepView& v) { return active_step(v).step; })
      .def_property_readonly("layer", [](const StepView& v) { return active_step(v).layer; })
      .def_property_readonly("cols", [](const StepView& v) { return active_step(v).cols; })
      .def_property_readonly("stride", [](const StepView& v) { return active_step(v).stride; })
      .def_property_readonly("budget", [](const StepView& v) { return active_step(v).budget; })
      .def_property_readonly("sinks", [](const StepView& v) { return active_step(v).sinks; })
      .def_property_readonly("window", [](const StepView& v) { return active_step(v).window; })
      .def_property_readonly("first_candidate",
                             [](const StepView& v) { return active_step(v).first_candidate; })
      .def_property_readonly(
          "kv_head_granularity",
          [](const StepView& v) { return bool(active_step(v).kv_head_granularity); })
      .def_property_readonly("selection_rows",
                             [](const StepView& v) { return active_step(v).selection_rows; })
      .def_property_readonly("memory",
                             [](const StepView& v) {
                               return active_step(v).memory == KVLENS_MEMORY_CUDA ? "cuda" : "host";
                             })
      .def_property_readonly(
          "shape",
          [](const StepView& v) {
            return py::reinterpret_borrow<py::object>(v.instance->object).attr("shape");
          })
      .def_property_readonly("query",
                             [](py::handle self) {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               const auto& sh = v.instance->shape;
                               return rows(*v.instance, self, s.query, sh.heads, sh.head_dim,
                                           sh.head_dim, false);
                             })
      .def_property_readonly("layer_input",
                             [](py::handle self) -> py::object {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               const auto& sh = v.instance->shape;
                               py::object r = rows(*v.instance, self, s.layer_input, 1,
                                                   sh.hidden_size, sh.hidden_size, false);
                               return r.is_none() ? r : r[py::int_(0)];
                             })
      .def_property_readonly("logits",
                             [](py::handle self) {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               return rows(*v.instance, self, s.logits, v.instance->shape.heads,
                                           s.cols, s.stride, false);
                             })
      .def_property_readonly("predictor_scores",
                             [](py::handle self) {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               return rows(*v.instance, self, s.predictor_scores,
                                           v.instance->shape.heads, s.cols, s.stride, false);
                             })
      .def_property_readonly("previous_visible",
                             [](py::handle self) {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               return rows(*v.instance, self, s.previous_visible,
                                           v.instance->shape.heads, s.cols, s.stride, false, true);
                             })
      .def_property_readonly("keys",
                             [](py::handle self) {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               return cache(*v.instance, self, s.keys, s);
                             })
      .def_property_readonly("values",
                             [](py::handle self) {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               return cache(*v.instance, self, s.values, s);
                             })
      .def_property_readonly("scores",
                             [](py::handle self) {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               const_cast<StepView&>(v).scores_given = true;
                               return rows(*v.instance, self, v.answer->scores,
                                           v.instance->shape.heads, s.cols, s.stride, true);
                             })
      .def_property_readonly("eligible",
                             [](py::handle self) {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               const_cast<StepView&>(v).eligible_given = true;
                               return rows(*v.instance, self, v.answer->eligible, s.selection_rows,
                                           s.cols, s.stride, true, true);
                             })
      .def_property_readonly("visible",
                             [](py::handle self) {
                               const auto& v = self.cast<const StepView&>();
                               const kvlens_step& s = active_step(v);
                               return rows(*v.instance, self, v.answer->visible,
                                           v.instance->shape.heads, s.cols, s.stride, true, true);
                             })
      .def_property(
          "recent",
          [](const StepView& v) {
            active_step(v);
            return v.answer->recent;
          },
          [](StepView& v, int64_t recent) {
            active_step(v);
            v.answer->recent = recent;
          })
      .def_property(
          "page_size",
          [](const StepView& v) {
            active_step(v);
            return v.answer->page_size;
          },
          [](StepView& v, int64_t page_size) {
            active_step(v);
            v.answer->page_size = page_size;
          })
      .def_property(
          "shared",
          [](const StepView& v) {
            active_step(v);
            return v.answer->shared != 0;
          },
          [](StepView& v, bool shared) {
            active_step(v);
            v.answer->shared = shared ? 1 : 0;
          },
          "True: one set for every head of the layer, ranked by the scores summed over the heads "
          "(kvlens.SCORES answers)");

  py::class_<ObservationView>(m, "_Observation",
                              "What observe() gets after a (step, layer)'s attention: the "
                              "probabilities under the chosen set and that set")
      .def_property_readonly("step", [](const ObservationView& v) { return active_obs(v).step; })
      .def_property_readonly("layer", [](const ObservationView& v) { return active_obs(v).layer; })
      .def_property_readonly("cols", [](const ObservationView& v) { return active_obs(v).cols; })
      .def_property_readonly("stride",
                             [](const ObservationView& v) { return active_obs(v).stride; })
      .def_property_readonly("probabilities",
                             [](py::handle self) {
                               const auto& v = self.cast<const ObservationView&>();
                               const kvlens_observation& o = active_obs(v);
                               return rows(*v.instance, self, o.probabilities,
                                           v.instance->shape.heads, o.cols, o.stride, false);
                             })
      .def_property_readonly("visible", [](py::handle self) {
        const auto& v = self.cast<const ObservationView&>();
        const kvlens_observation& o = active_obs(v);
        return rows(*v.instance, self, o.visible, v.instance->shape.heads, o.cols, o.stride, false,
                    true);
      });

  m.def("_register_policy", &register_python_policy, py::arg("cls"));
  m.def(
      "_python_policy_stats",
      [](bool reset) {
        py::dict d;
        d["selects"] = call_stats.selects;
        d["observes"] = call_stats.observes;
        d["seconds"] = call_stats.seconds;
        if (reset) call_stats = {};
        return d;
      },
      py::arg("reset") = false,
      "Calls of Python policies' select() / observe() and the seconds they took, GIL included");
  m.def("_policy_source", &policy_source_of, py::arg("id"));
}

}  // namespace kvlens::python
