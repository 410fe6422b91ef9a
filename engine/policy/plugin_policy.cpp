// The plug-in adapter: a policy that forwards each (step, layer) to a kvlens_policy_plugin table
// (include/kvlens/policy_plugin.h) and turns its answer into the run's visible set with the same
// ops a built-in uses (BudgetedPolicy), so a plug-in that ranks as a built-in does gets the
// built-in's bits. Rows the plug-in reads and writes: F32 / U8 [rows, stride]; on a backend
// whose memory is not host memory, a host-only plug-in gets host copies of them (timed apart).
#include "engine/policy/plugin_policy.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "engine/backend/tensor_views.h"
#include "engine/common/error.h"
#include "engine/policy/budgeted_policy.h"
#include "engine/policy/predictor_runtime.h"
#include "engine/policy/registry.h"

namespace kvlens {
namespace {

constexpr size_t kErrorSize = 1024;

// A registered plug-in: its table, where it came from, and what keeps the table's memory alive.
struct PluginDefinition {
  const kvlens_policy_plugin* table = nullptr;
  std::string id, source;
  std::shared_ptr<void> keep_alive;
  std::vector<kvlens_param> params;  // the table's own knobs, in order
  std::string owner() const { return "policy plug-in " + id + " (" + source + ")"; }
};

bool well_formed_name(const std::string& name, const char* extra) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [&](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           std::strchr(extra, c) != nullptr;
  });
}

std::string text_of(double value, int32_t type) {
  char buffer[64];
  if (type == KVLENS_PARAM_INT) {
    std::snprintf(buffer, sizeof buffer, "%lld", static_cast<long long>(value));
  } else if (type == KVLENS_PARAM_BOOL) {
    return value != 0.0 ? "true" : "false";
  } else {
    std::snprintf(buffer, sizeof buffer, "%.17g", value);
  }
  return buffer;
}

// The table's knob as the registry describes parameters (the common knobs are kvlens's own).
ParamSpec param_spec(const kvlens_param& param, const std::string& source) {
  const std::string name = param.name ? param.name : "";
  const std::string field = "params[" + name + "]";
  if (!well_formed_name(name, ""))
    throw Error(source, "params: name", "[a-z0-9_]+", "'" + name + "'");
  ParamSpec spec;
  spec.name = name;
  spec.description = param.description ? param.description : "";
  switch (param.type) {
    case KVLENS_PARAM_INT:
    case KVLENS_PARAM_FLOAT: {
      spec.type = param.type == KVLENS_PARAM_INT ? ParamType::Int : ParamType::Float;
      spec.min = param.min_value;
      spec.max = param.max_value;
      if (!(param.min_value <= param.default_value && param.default_value <= param.max_value)) {
        throw Error(source, field + ".default_value",
                    "a value in [" + text_of(param.min_value, KVLENS_PARAM_FLOAT) + ", " +
                        text_of(param.max_value, KVLENS_PARAM_FLOAT) + "]",
                    text_of(param.default_value, KVLENS_PARAM_FLOAT));
      }
      if (param.type == KVLENS_PARAM_INT && param.default_value != std::floor(param.default_value))
        throw Error(source, field + ".default_value", "an integer",
                    text_of(param.default_value, 1));
      spec.default_value = text_of(param.default_value, param.type);
      break;
    }
    case KVLENS_PARAM_BOOL:
      spec.type = ParamType::Bool;
      spec.default_value = text_of(param.default_value, KVLENS_PARAM_BOOL);
      break;
    case KVLENS_PARAM_CHOICE: {
      spec.type = ParamType::Choice;
      if (param.choice_count < 1 || param.choices == nullptr)
        throw Error(source, field + ".choices", "at least one choice", "none");
      for (int32_t i = 0; i < param.choice_count; ++i) {
        const char* choice = param.choices[i];
        if (!choice || !*choice)
          throw Error(source, field + ".choices", "non-empty strings", "an empty one");
        spec.choices.push_back(choice);
      }
      const double index = param.default_value;
      if (!(index >= 0 && index < param.choice_count && index == std::floor(index))) {
        throw Error(source, field + ".default_value",
                    "an index in [0, " + std::to_string(param.choice_count) + ")",
                    text_of(index, KVLENS_PARAM_FLOAT));
      }
      spec.default_value = spec.choices[size_t(index)];
      break;
    }
    default:
      throw Error(source, field + ".type", "KVLENS_PARAM_INT, _FLOAT, _BOOL or _CHOICE",
                  std::to_string(param.type));
  }
  return spec;
}

// The values create() receives: one double per knob (a choice as its index).
std::vector<double> param_values(const PluginDefinition& def, const ParamValues& values) {
  std::vector<double> out;
  for (const kvlens_param& param : def.params) {
    switch (param.type) {
      case KVLENS_PARAM_INT:
        out.push_back(double(values.get_int(param.name)));
        break;
      case KVLENS_PARAM_FLOAT:
        out.push_back(values.get_float(param.name));
        break;
      case KVLENS_PARAM_BOOL:
        out.push_back(values.get_bool(param.name) ? 1.0 : 0.0);
        break;
      default: {
        const std::string& chosen = values.get_choice(param.name);
        double index = 0;
        for (int32_t i = 0; i < param.choice_count; ++i)
          if (chosen == param.choices[i]) index = i;
        out.push_back(index);
      }
    }
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A [rows, stride] row buffer of the backend and, where the plug-in cannot read the backend's
// memory, its host mirror.
struct Rows {
  std::vector<std::byte> host;
};

// The (step, layer) of a select, spelled out only when an error names it (a select runs in every
// layer of every step: no string is made on the way).
struct SelectPlace {
  int64_t step = -1, layer = -1;
  bool known() const { return step >= 0; }
  std::string field(const std::string& what = "") const {
    return "select at step " + std::to_string(step) + ", layer " + std::to_string(layer) +
           (what.empty() ? "" : ": " + what);
  }
};

class PluginPolicy final : public BudgetedPolicy {
 public:
  PluginPolicy(std::shared_ptr<const PluginDefinition> def, const PolicyShape& shape,
               Backend& backend, CommonKnobs knobs, const std::vector<double>& values)
      : BudgetedPolicy(shape, backend, knobs), def_(std::move(def)), table_(*def_->table) {
    const bool device_ok = (table_.memories & KVLENS_ACCEPTS_CUDA) != 0;
    const bool host_ok = table_.memories == 0 || (table_.memories & KVLENS_ACCEPTS_HOST) != 0;
    if (backend.host_memory() && !host_ok) {
      throw Error(def_->owner(), "memories",
                  "a plug-in that works on host memory (this session runs on the " +
                      backend.name() + " backend)",
                  "device memory only");
    }
    copies_ = !backend.host_memory() && !device_ok;
    memory_ = backend.host_memory() || copies_ ? KVLENS_MEMORY_HOST : KVLENS_MEMORY_CUDA;
    if ((table_.needs & KVLENS_NEEDS_PREDICTOR) != 0) {
      if (!shape.predictor) {
        throw Error(def_->owner(), "predictor",
                    "a model with a TokenButler predictor (KVLENS_NEEDS_PREDICTOR)", "none");
      }
      predictor_.emplace(shape.predictor);
      predictor_scores_ = backend.alloc(DType::F32, {shape.heads, shape.stride});
    }
    if ((table_.needs & KVLENS_NEEDS_ELIGIBLE) != 0)
      eligible_ = backend.alloc(DType::U8, {selection_rows(), shape.stride});
    if ((table_.needs & KVLENS_NEEDS_PREVIOUS_VISIBLE) != 0) {
      for (int64_t l = 0; l < shape.layers; ++l)
        previous_visible_.push_back(backend.alloc(DType::U8, {shape.heads, shape.stride}));
    }
    has_previous_.assign(size_t(shape.layers), 0);
    last_visible_.resize(size_t(shape.layers));
    kvlens_model_shape model{sizeof(kvlens_model_shape),
                             shape.layers,
                             shape.heads,
                             shape.kv_heads,
                             shape.head_dim,
                             shape.hidden_size,
                             shape.max_positions,
                             shape.predictor ? 1 : 0,
                             memory_};
    char error[kErrorSize] = {};
    const auto start = std::chrono::steady_clock::now();
    state_ = table_.create(&model, values.data(), error, sizeof error);
    plugin_seconds_ += seconds_since(start);
    if (!state_) throw Error(def_->owner(), "create", "a policy instance", message(error));
  }

  ~PluginPolicy() override {
    if (state_) table_.destroy(state_);
  }

  bool reads_logits(const LayerStep& /*step*/) const override {
    return (table_.needs & KVLENS_NEEDS_LOGITS) != 0;
  }
  bool wants_probs(const LayerStep& step) const override {
    return table_.observe != nullptr && (table_.needs & KVLENS_NEEDS_PROBABILITIES) != 0 &&
           !dense_layer(step);
  }
  void observe_inputs(const DeviceTensor& layer_input, int64_t first_position) override {
    if (predictor_) feed(layer_input, first_position);
  }

  void grow(int64_t stride) override {
    if (stride <= shape_.stride) return;
    BudgetedPolicy::grow(stride);
    predictor_scores_ = widen_columns(backend_, predictor_scores_, stride);
    eligible_ = widen_columns(backend_, eligible_, stride);
    for (DeviceTensor& rows : previous_visible_) rows = widen_columns(backend_, rows, stride);
    shared_scores_ = widen_columns(backend_, shared_scores_, stride);
    shared_chosen_ = widen_columns(backend_, shared_chosen_, stride);
  }
  int64_t state_bytes() const override {
    std::vector<DeviceTensor> own = previous_visible_;
    own.insert(own.end(), {predictor_scores_, eligible_, shared_scores_, shared_chosen_});
    return BudgetedPolicy::state_bytes() + tensor_bytes(own);
  }
  ExternalSeconds external_seconds() const override { return {plugin_seconds_, copy_seconds_}; }

  LayerDecision select(const LayerStep& step, DeviceTensor& visible,
                       DeviceTensor& scores) override {
    check_deferred();
    const size_t l = size_t(step.layer);
    if (predictor_ && step.layer == 0) feed(*step.layer_input, step.step);
    // A predictor sits on layer 0's input, so that layer is never predicted (as tokenbutler).
    if (dense_layer(step) || (predictor_ && step.layer == 0)) {
      has_previous_[l] = 0;
      return LayerDecision::Dense;
    }
    const int64_t t = step.step, cols = step.cols(), stride = shape_.stride;
    const int64_t budget = knobs_.budget(step);  // a sliding window's: B of its keys
    if (predictor_) {
      if (predictor_->position() != t + 1) {
        throw Error(def_->owner(), "step",
                    "layer 0 of step " + std::to_string(t) + " before its later layers",
                    "the predictor at position " + std::to_string(predictor_->position()));
      }
      predictor_->predicted_logits(step.layer, predictor_scores_);
    }
    kvlens_step in{};
    in.struct_size = sizeof in;
    in.memory = memory_;
    in.stream = memory_ == KVLENS_MEMORY_CUDA ? backend_.native_stream() : nullptr;
    in.step = t;
    in.layer = step.layer;
    in.cols = cols;
    in.stride = stride;
    in.budget = budget;
    in.sinks = knobs_.sinks;
    in.window = knobs_.window;
    in.first_candidate = step.first_candidate;
    in.kv_head_granularity = knobs_.kv_head_granularity ? 1 : 0;
    in.selection_rows = selection_rows();
    in.cache_dtype = step.k_cache->dtype == DType::BF16  ? KVLENS_BF16
                     : step.k_cache->dtype == DType::F16 ? KVLENS_F16
                                                         : KVLENS_F32;
    in.keys_rotated = 1;
    const bool wants_cache = !copies_ || (table_.needs & KVLENS_NEEDS_CACHE) != 0;
    in.layer_input = static_cast<const float*>(readable(*step.layer_input, input_copy_));
    in.query = static_cast<const float*>(readable(*step.q, query_copy_));
    if (wants_cache) {
      in.keys = readable(*step.k_cache, keys_copy_);
      in.values = readable(*step.v_cache, values_copy_);
    }
    if ((table_.needs & KVLENS_NEEDS_LOGITS) != 0 && step.logits)
      in.logits = static_cast<const float*>(readable(*step.logits, logits_copy_));
    if (predictor_)
      in.predictor_scores = static_cast<const float*>(readable(predictor_scores_, predictor_copy_));
    if (!previous_visible_.empty() && has_previous_[l])
      in.previous_visible =
          static_cast<const uint8_t*>(readable(previous_visible_[l], previous_copy_));

    // The answer's buffers, set to their documented starting values over the candidates.
    kvlens_answer answer{};
    answer.struct_size = sizeof answer;
    answer.recent = knobs_.window;
    const bool answers_visible = (table_.needs & KVLENS_ANSWERS_VISIBLE) != 0;
    answer.scores = static_cast<float*>(writable(scores, scores_copy_));
    if (answers_visible) {
      answer.visible = static_cast<uint8_t*>(writable(visible, visible_copy_));
      fill_rows(visible, visible_copy_, cols, 0);
    }
    if (!eligible_.empty())
      answer.eligible = static_cast<uint8_t*>(writable(eligible_, eligible_copy_));

    char error[kErrorSize] = {};
    const auto start = std::chrono::steady_clock::now();
    const int32_t decision = table_.select(state_, &in, &answer, error, sizeof error);
    plugin_seconds_ += seconds_since(start);
    const SelectPlace where{t, step.layer};
    switch (decision) {
      case KVLENS_DENSE:
        has_previous_[l] = 0;
        return LayerDecision::Dense;
      case KVLENS_SCORES:
        break;
      case KVLENS_VISIBLE:
        if (answers_visible) break;
        throw Error(def_->owner(), where.field("decision"),
                    "KVLENS_SCORES or KVLENS_DENSE (KVLENS_VISIBLE needs KVLENS_ANSWERS_VISIBLE in "
                    "needs)",
                    "KVLENS_VISIBLE");
      case KVLENS_FAILED:
        throw Error(def_->owner(), where.field(), "a decision", "a failure: " + message(error));
      default:
        throw Error(def_->owner(), where.field("decision"),
                    "KVLENS_DENSE, KVLENS_SCORES, KVLENS_VISIBLE or KVLENS_FAILED",
                    std::to_string(decision));
    }
    // The answer goes back where the backend reads it, then is checked.
    upload(scores, scores_copy_);
    check_scores(scores, cols, where);
    if (decision == KVLENS_SCORES) {
      if (!eligible_.empty()) upload(eligible_, eligible_copy_);
      if (answer.recent < 0)
        throw Error(def_->owner(), where.field("recent"), "a count >= 0",
                    std::to_string(answer.recent));
      if (answer.page_size < 0) {
        throw Error(def_->owner(), where.field("page_size"), "0 (tokens) or a page size > 0",
                    std::to_string(answer.page_size));
      }
      if (answer.shared != 0) {
        select_shared(step, answer, scores, visible, budget);
      } else {
        select_budgeted(step, answer.recent, at_selection_rows(scores, cols),
                        eligible_.empty() ? nullptr : &eligible_, visible, budget,
                        answer.page_size);
      }
    } else {
      upload(visible, visible_copy_);
      check_visible(visible, step.first_candidate, cols, budget, where);
    }
    if (!previous_visible_.empty()) {
      backend_.copy_rows(visible, 0, previous_visible_[l], 0, 1, visible.numel());
      has_previous_[l] = 1;
    }
    last_visible_[l] = visible;
    return LayerDecision::Masked;
  }

  void observe(const LayerStep& step, const DeviceTensor& probs) override {
    if (!wants_probs(step)) return;
    const size_t l = size_t(step.layer);
    kvlens_observation observation{};
    observation.struct_size = sizeof observation;
    observation.memory = memory_;
    observation.stream = memory_ == KVLENS_MEMORY_CUDA ? backend_.native_stream() : nullptr;
    observation.step = step.step;
    observation.layer = step.layer;
    observation.cols = step.cols();
    observation.stride = shape_.stride;
    observation.probabilities = static_cast<const float*>(readable(probs, probs_copy_));
    observation.visible = static_cast<const uint8_t*>(readable(last_visible_[l], visible_copy_));
    char error[kErrorSize] = {};
    const auto start = std::chrono::steady_clock::now();
    const int32_t status = table_.observe(state_, &observation, error, sizeof error);
    plugin_seconds_ += seconds_since(start);
    if (status != 0) {
      throw Error(
          def_->owner(),
          "observe at step " + std::to_string(step.step) + ", layer " + std::to_string(step.layer),
          "success (0)", std::to_string(status) + ": " + message(error));
    }
  }

 private:
  static std::string message(const char* error) {
    const std::string text(error, strnlen(error, kErrorSize));
    return text.empty() ? "(no message)" : text;
  }

  // One set for every head: the scores summed over the heads ([1, stride]) ranked once, the
  // choice given to every head (as lazyllm's sets are).
  void select_shared(const LayerStep& step, const kvlens_answer& answer, const DeviceTensor& scores,
                     DeviceTensor& visible, int64_t budget) {
    const int64_t cols = step.cols(), H = shape_.heads;
    if (shared_scores_.empty()) {
      shared_scores_ = backend_.alloc(DType::F32, {1, shape_.stride});
      shared_chosen_ = backend_.alloc(DType::U8, {1, shape_.stride});
    }
    backend_.sum_row_groups(scores, cols, H, shared_scores_);
    DeviceTensor first_eligible;
    if (!eligible_.empty()) first_eligible = tensor::row_view(eligible_, 0);
    select_into(step, answer.recent, shared_scores_, eligible_.empty() ? nullptr : &first_eligible,
                shared_chosen_, budget, answer.page_size);
    backend_.expand_row_groups(shared_chosen_, cols, H, visible);
  }

  // Columns [0, cols) of every row of U8 rows set to `byte`, where the plug-in writes them: the
  // host (the rows themselves, or their host copy), or the device (the backend's op).
  void fill_rows(DeviceTensor& rows, Rows& copy, int64_t cols, uint8_t byte) {
    const int64_t count = rows.dim(0), stride = rows.dim(1);
    if (memory_ == KVLENS_MEMORY_CUDA) return backend_.fill_columns(rows, 0, cols, byte);
    auto* data = copies_ ? reinterpret_cast<uint8_t*>(copy.host.data()) : rows.as<uint8_t>();
    for (int64_t r = 0; r < count; ++r) std::memset(data + r * stride, byte, size_t(cols));
  }

  // The tensor's memory as the plug-in may read it: itself, or a host copy (made now).
  const void* readable(const DeviceTensor& tensor, Rows& copy) {
    if (!copies_) return tensor.data;
    const auto start = std::chrono::steady_clock::now();
    copy.host.resize(tensor.bytes());
    backend_.to_host(tensor, copy.host.data(), copy.host.size());
    copy_seconds_ += seconds_since(start);
    return copy.host.data();
  }
  // The same for a buffer it writes: a host buffer of the tensor's size (the plug-in writes
  // every column in use; upload() sends it back).
  void* writable(DeviceTensor& tensor, Rows& copy) {
    if (!copies_) return tensor.data;
    copy.host.resize(tensor.bytes());
    return copy.host.data();
  }
  void upload(DeviceTensor& tensor, Rows& copy) {
    if (!copies_) return;
    const auto start = std::chrono::steady_clock::now();
    backend_.from_host(tensor, copy.host.data(), copy.host.size());
    copy_seconds_ += seconds_since(start);
  }

  // NaN or infinite scores end the run with an error naming the step: at once where the rows
  // are host memory, else at the next select (counted on the backend without a wait).
  void check_scores(const DeviceTensor& scores, int64_t cols, const SelectPlace& where) {
    const int64_t H = shape_.heads;
    if (memory_ == KVLENS_MEMORY_HOST) {
      const float* rows = copies_ ? reinterpret_cast<const float*>(scores_copy_.host.data())
                                  : scores.as<const float>();
      for (int64_t h = 0; h < H; ++h) {
        // NaN and infinities have every exponent bit set: counted with integer ops the compiler
        // vectorises (this check runs on every plug-in answer), located only when one is there.
        const auto* bits = reinterpret_cast<const uint32_t*>(rows + h * shape_.stride);
        uint32_t bad = 0;
        for (int64_t j = 0; j < cols; ++j) bad |= uint32_t((bits[j] & 0x7f800000u) == 0x7f800000u);
        if (bad == 0) continue;
        for (int64_t j = 0; j < cols; ++j) {
          const float value = rows[h * shape_.stride + j];
          if (!std::isfinite(value)) {
            throw Error(def_->owner(),
                        where.field("scores[" + std::to_string(h) + ", " + std::to_string(j) + "]"),
                        "a finite number", std::to_string(value));
          }
        }
      }
      return;
    }
    deferred_counts_.assign(size_t(H), 0);
    deferred_place_ = where;
    backend_.count_nonfinite_rows_deferred(scores, cols, deferred_counts_);
  }
  void check_deferred() {
    if (!deferred_place_.known()) return;
    const SelectPlace where = deferred_place_;
    deferred_place_ = {};
    for (size_t h = 0; h < deferred_counts_.size(); ++h) {
      if (deferred_counts_[h] != 0) {
        throw Error(def_->owner(), where.field("scores of head " + std::to_string(h)),
                    "finite numbers", std::to_string(deferred_counts_[h]) + " NaN or infinite");
      }
    }
  }

  // A visible set must hold the current token and at most B(t) columns in every row.
  // A KVLENS_VISIBLE row: the current token, at most `budget` columns, none before `first`
  // (outside a sliding window: such a pick would be hidden, and the row would see fewer keys
  // than the budget without saying so).
  void check_visible(const DeviceTensor& visible, int64_t first, int64_t cols, int64_t budget,
                     const SelectPlace& where) {
    const int64_t H = shape_.heads, stride = shape_.stride;
    const uint8_t* rows = nullptr;
    if (memory_ == KVLENS_MEMORY_HOST) {
      rows = copies_ ? reinterpret_cast<const uint8_t*>(visible_copy_.host.data())
                     : visible.as<const uint8_t>();
    } else {
      visible_check_.resize(visible.bytes());
      backend_.to_host(visible, visible_check_.data(), visible_check_.size());
      rows = visible_check_.data();
    }
    for (int64_t h = 0; h < H; ++h) {
      const uint8_t* row = rows + h * stride;
      const int64_t count = cols - std::count(row, row + cols, uint8_t(0));
      const int64_t outside = first - std::count(row, row + first, uint8_t(0));
      if (outside > 0) {
        throw Error(def_->owner(), where.field("visible row of head " + std::to_string(h)),
                    "no column before " + std::to_string(first) +
                        " (first_candidate: the layer's sliding window starts there)",
                    std::to_string(outside) + " columns before it");
      }
      if (row[cols - 1] == 0 || count > budget) {
        throw Error(def_->owner(), where.field("visible row of head " + std::to_string(h)),
                    "the current token (column " + std::to_string(cols - 1) + ") and at most " +
                        std::to_string(budget) + " columns (the budget)",
                    std::to_string(count) + " columns" +
                        (row[cols - 1] == 0 ? ", without the current token" : ""));
      }
    }
  }

  void feed(const DeviceTensor& layer_input, int64_t first_position) {
    if (first_position == 0) predictor_->reset();
    if (first_position != predictor_->position()) {
      throw Error(def_->owner(), "position",
                  "the next token " + std::to_string(predictor_->position()) +
                      " (every token's layer-0 input, in order)",
                  std::to_string(first_position));
    }
    predictor_->append(layer_input);
  }

  std::shared_ptr<const PluginDefinition> def_;
  const kvlens_policy_plugin& table_;
  void* state_ = nullptr;
  bool copies_ = false;
  int32_t memory_ = KVLENS_MEMORY_HOST;
  std::optional<PredictorState> predictor_;
  DeviceTensor predictor_scores_, eligible_;
  DeviceTensor shared_scores_, shared_chosen_;  // [1, stride]: a shared answer's row and set
  std::vector<DeviceTensor> previous_visible_, last_visible_;
  std::vector<uint8_t> has_previous_;
  Rows input_copy_, query_copy_, keys_copy_, values_copy_, logits_copy_, predictor_copy_,
      previous_copy_, scores_copy_, visible_copy_, eligible_copy_, probs_copy_;
  std::vector<uint8_t> visible_check_;
  std::vector<int64_t> deferred_counts_;
  SelectPlace deferred_place_;  // scores counted on the device, checked at the next select
  double plugin_seconds_ = 0.0, copy_seconds_ = 0.0;
};

std::set<std::string> common_knob_names() {
  std::set<std::string> names;
  for (const ParamSpec& spec : common_param_specs()) names.insert(spec.name);
  return names;
}

}  // namespace

const PolicyInfo& register_plugin_policy(const kvlens_policy_plugin* plugin,
                                         const std::string& source,
                                         std::shared_ptr<void> keep_alive) {
  if (!plugin) throw Error(source, KVLENS_POLICY_ENTRY, "a plug-in description", "NULL");
  if (plugin->abi_version != KVLENS_POLICY_ABI_VERSION) {
    throw Error(source, "abi_version",
                std::to_string(KVLENS_POLICY_ABI_VERSION) +
                    " (this kvlens's policy_plugin.h; rebuild the plug-in against it)",
                std::to_string(plugin->abi_version));
  }
  if (plugin->struct_size < sizeof(kvlens_policy_plugin)) {
    throw Error(source, "struct_size", "at least " + std::to_string(sizeof(kvlens_policy_plugin)),
                std::to_string(plugin->struct_size));
  }
  const std::string name = plugin->name ? plugin->name : "";
  if (!well_formed_name(name, ".-")) throw Error(source, "name", "[a-z0-9_.-]+", "'" + name + "'");
  if (!plugin->rule || !*plugin->rule)
    throw Error(source, "rule", "a paragraph stating the rule", "none");
  if (!plugin->create || !plugin->destroy || !plugin->select) {
    throw Error(source,
                !plugin->create    ? "create"
                : !plugin->destroy ? "destroy"
                                   : "select",
                "a function", "NULL");
  }
  if (plugin->param_count < 0 || (plugin->param_count > 0 && !plugin->params))
    throw Error(source, "params", "param_count knobs", std::to_string(plugin->param_count));
  if ((plugin->needs & KVLENS_NEEDS_PROBABILITIES) && !plugin->observe)
    throw Error(source, "observe", "a function (needs has KVLENS_NEEDS_PROBABILITIES)", "NULL");

  auto def = std::make_shared<PluginDefinition>();
  def->table = plugin;
  def->id = name;
  def->source = source;
  def->keep_alive = std::move(keep_alive);
  def->params.assign(plugin->params, plugin->params + plugin->param_count);
  PolicyInfo info;
  info.id = name;
  info.family = plugin->family && *plugin->family ? plugin->family : "plug-in";
  info.description = plugin->rule;
  info.needs_predictor = (plugin->needs & KVLENS_NEEDS_PREDICTOR) != 0;
  info.predicts_logits = plugin->predicts_logits != 0;
  info.params = common_param_specs();
  const std::set<std::string> common = common_knob_names();
  std::set<std::string> seen;
  std::vector<kvlens_param> own;
  for (const kvlens_param& param : def->params) {
    ParamSpec spec = param_spec(param, source);
    if (!seen.insert(spec.name).second)
      throw Error(source, "params: " + spec.name, "a name given once", "given twice");
    if (common.count(spec.name)) {
      // A common knob named by the plug-in: its default (and range, description) for this
      // policy; kvlens applies it, create() does not receive it.
      for (ParamSpec& knob : info.params) {
        if (knob.name != spec.name) continue;
        if (knob.type != spec.type) {
          throw Error(source, "params: " + spec.name,
                      std::string("the common knob's type ") + param_type_name(knob.type),
                      param_type_name(spec.type));
        }
        knob = std::move(spec);
      }
      continue;
    }
    own.push_back(param);
    info.params.push_back(std::move(spec));
  }
  def->params = std::move(own);
  std::shared_ptr<const PluginDefinition> shared = def;
  return register_policy(
      std::move(info),
      [shared](const PolicyShape& shape, Backend& backend, const ParamValues& values,
               double sparsity) -> std::unique_ptr<Policy> {
        return std::make_unique<PluginPolicy>(shared, shape, backend,
                                              read_common_knobs(values, sparsity),
                                              param_values(*shared, values));
      },
      source);
}

const PolicyInfo& load_policy_plugin(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw Error(path, "plug-in", "a shared library (.so) file", "no such file");
  // RTLD_LOCAL: plug-ins do not see each other's symbols. The library stays loaded until exit:
  // instances, and the strings the registry copied from it, may outlive any one session.
  void* handle = dlopen(std::filesystem::absolute(path).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw Error(path, "plug-in", "a shared library kvlens can load", why ? why : "dlopen failed");
  }
  dlerror();
  void* symbol = dlsym(handle, KVLENS_POLICY_ENTRY);
  if (!symbol) {
    throw Error(path, KVLENS_POLICY_ENTRY,
                "the exported entry point of include/kvlens/policy_plugin.h "
                "(KVLENS_PLUGIN_EXPORT const kvlens_policy_plugin* kvlens_policy_plugin_v1(void))",
                "missing");
  }
  const auto entry = reinterpret_cast<kvlens_policy_plugin_entry>(symbol);
  return register_plugin_policy(entry(), path, std::shared_ptr<void>(handle, [](void*) {}));
}

std::vector<std::string> load_policy_plugin_folder(const std::string& folder,
                                                   std::vector<std::string>& errors) {
  std::vector<std::string> ids;
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) return ids;
  std::vector<std::string> files;
  for (const auto& item : std::filesystem::directory_iterator(folder, ec)) {
    if (item.path().extension() == ".so") files.push_back(item.path().string());
  }
  std::sort(files.begin(), files.end());
  for (const std::string& file : files) {
    try {
      ids.push_back(load_policy_plugin(file).id);
    } catch (const Error& error) {
      errors.push_back(error.what());
    }
  }
  return ids;
}

std::vector<std::string> default_plugin_folders() {
  std::vector<std::string> folders;
  if (const char* list = std::getenv("KVLENS_PLUGIN_PATH")) {
    std::string rest = list;
    for (size_t begin = 0; begin <= rest.size();) {
      const size_t end = std::min(rest.find(':', begin), rest.size());
      if (end > begin) folders.push_back(rest.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  if (const char* data = std::getenv("XDG_DATA_HOME"); data && *data) {
    folders.push_back(std::string(data) + "/kvlens/plugins");
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    folders.push_back(std::string(home) + "/.local/share/kvlens/plugins");
  }
  return folders;
}

}  // namespace kvlens
