// CPU reference backend: plain loops, a persistent thread pool for matmul (over output rows) and
// attention (over query rows x heads), and AVX2/FMA dot kernels chosen at run time. Shapes follow
// engine/backend/backend.h: x [n, in] * w[out, in]^T; caches [G, capacity, D]; q/out [n, H, D].
#include "engine/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend/bandwidth.h"
#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/cpu/cpu_dot_kernels.h"
#include "engine/backend/cpu/cpu_policy_ops.h"
#include "engine/backend/cpu/cpu_shared_pages.h"
#include "engine/backend/thread_pool.h"
#include "engine/common/error.h"

namespace kvlens {

int64_t DeviceTensor::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

namespace {

using namespace cpu_checks;  // require*, describe, cat, shape_string, kWhere

// silu_mul's tasks: at least this many 8-lane blocks each (a prefill chunk splits over the
// threads, a decode row of a small model stays on one).
constexpr int64_t kSiluBlocksPerTask = 256;

// torch's gelu(approximate="tanh"), 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in double
// rounded once (the CUDA kernel computes the same expression).
float gelu_tanh(float x) {
  const double v = double(x);
  return float(0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
}

bool is_weight_dtype(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
}

// `t` is F32 and holds rows [row, row + rows) of row_elems elements each.
// Rows of any dtype (copies move bytes); row_elems counts elements of t's dtype.
void require_rows(const DeviceTensor& t, int64_t row, int64_t rows, int64_t row_elems,
                  const Field& field) {
  KVLENS_REQUIRE(t.data != nullptr || t.numel() == 0, field, "an allocated tensor", describe(t));
  KVLENS_REQUIRE(row >= 0 && rows >= 0 && row_elems >= 0, field,
                 "non-negative row indices and counts", cat(row, ", ", rows, ", ", row_elems));
  KVLENS_REQUIRE((row + rows) * row_elems <= t.numel(), field,
                 cat("at least ", (row + rows) * row_elems, " elements"), describe(t));
}

// ---------------------------------------------------------------------------------------------

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : pool_(options.threads),
        kernels_(pick_dot_kernels(options.allow_simd, options.allow_avx512)),
        cache_bytes_(options.cache_bytes > 0 ? options.cache_bytes : last_level_cache_bytes()),
        reduce_group_(options.reduce_group),
        rank_(options.rank) {}

  std::string name() const override { return "cpu"; }
  void run_tasks(int64_t count, const std::function<void(int64_t)>& task) override {
    pool_.for_each(count, task);
  }
  bool runs_tasks_in_order() const override {
    return pool_.size() <= 1 || ThreadPool::inside_task();
  }
  // A step's counts, over the threads (they were counted in the runs' tasks before).
  void count_nonzero_rows_deferred_many(std::span<const RowCount> masks) override {
    pool_.for_each(int64_t(masks.size()), [&](int64_t i) {
      const RowCount& m = masks[size_t(i)];
      cpu_policy::count_nonzero_rows(*m.mask, m.cols, m.counts);
    });
  }
  int64_t lockstep_groups(int64_t runs, int64_t layer_weight_bytes, int64_t layers) const override {
    // A rank of a tensor-parallel group keeps one group: groups as concurrent tasks would enter
    // the all-reduces in an order that differs between ranks.
    if (reduce_group_) return 1;
    return cpu_lockstep_groups(runs, pool_.size(), layer_weight_bytes, layers, cache_bytes_);
  }
  int64_t tensor_parallel_ranks() const override {
    return reduce_group_ ? reduce_group_->ranks() : 1;
  }
  int64_t tensor_parallel_rank() const override { return rank_; }
  void all_reduce_sum(DeviceTensor& partial) override {
    if (!reduce_group_) return;
    KVLENS_REQUIRE(partial.dtype == DType::F32, "all_reduce_sum", "an F32 tensor",
                   std::string(dtype_name(partial.dtype)));
    reduce_group_->all_reduce_sum(rank_, partial.as<float>(), partial.numel());
  }
  void abort_collectives() override {
    if (reduce_group_) reduce_group_->abort();
  }
  const char* isa() const { return kernels_.isa; }
  int threads() const { return pool_.size(); }

  DeviceTensor upload_weight(const TensorView& view, std::shared_ptr<void> keep_alive) override {
    DeviceTensor t = place_weight(view, std::move(keep_alive));
    // Matrices are repacked once for matmul (about as much memory again as the weights).
    if (t.shape.size() == 2 && t.numel() > 0)
      t.backend_layout = std::make_shared<const WeightPanels>(pack_weight_panels(t, &panels_));
    return t;
  }

  // The weight in host memory as an F32 or BF16 row-major tensor.
  static DeviceTensor place_weight(const TensorView& view, std::shared_ptr<void> keep_alive) {
    KVLENS_REQUIRE(view.data != nullptr || view.bytes == 0, "upload_weight: " + view.name,
                   "tensor data", "a null pointer");
    const int64_t count = view.numel();
    KVLENS_REQUIRE(size_t(count) * dtype_size(view.dtype) == view.bytes,
                   "upload_weight: " + view.name, "bytes == numel * dtype size",
                   cat(int64_t(view.bytes), " bytes"));
    DeviceTensor t;
    t.shape = view.shape;
    if (view.dtype == DType::F16) {
      // Widened once here so the hot paths never see F16 (and results equal an F32 checkpoint).
      t.dtype = DType::F32;
      t.storage = allocate_host(size_t(count) * sizeof(float));
      t.data = t.storage.get();
      widen_to_f32(view.data, view.dtype, count, t.as<float>());
      return t;
    }
    t.dtype = view.dtype;
    if (reinterpret_cast<uintptr_t>(view.data) % dtype_size(view.dtype) != 0) {
      // Safetensors does not promise element alignment, and the loops below may be vectorised
      // with alignment assumptions, so a misaligned tensor gets an aligned private copy.
      t.storage = allocate_host(view.bytes);
      t.data = t.storage.get();
      std::memcpy(t.data, view.data, view.bytes);
      return t;
    }
    t.storage = std::move(keep_alive);
    t.data = const_cast<std::byte*>(view.data);  // read-only by contract: weights are never written
    return t;
  }

  DeviceTensor alloc(DType dtype, std::vector<int64_t> shape) override {
    DeviceTensor t;
    t.dtype = dtype;
    t.shape = std::move(shape);
    for (int64_t extent : t.shape) {
      KVLENS_REQUIRE(extent >= 0, "alloc", "non-negative extents", shape_string(t.shape));
    }
    t.storage = allocate_host(t.bytes());
    t.data = t.storage.get();
    return t;
  }

  bool same_bytes(const DeviceTensor& a, const DeviceTensor& b) override {
    return a.dtype == b.dtype && a.shape == b.shape &&
           (a.data == b.data || std::memcmp(a.data, b.data, a.bytes()) == 0);
  }

  void to_host(const DeviceTensor& src, void* host, size_t bytes) override {
    KVLENS_REQUIRE(bytes <= src.bytes(), "to_host: bytes", cat("at most ", int64_t(src.bytes())),
                   std::to_string(bytes));
    if (bytes) std::memcpy(host, src.data, bytes);
  }

  void from_host(DeviceTensor& dst, const void* host, size_t bytes) override {
    KVLENS_REQUIRE(bytes <= dst.bytes(), "from_host: bytes", cat("at most ", int64_t(dst.bytes())),
                   std::to_string(bytes));
    if (bytes) std::memcpy(dst.data, host, bytes);
  }

  void copy_rows(const DeviceTensor& src, int64_t src_row, DeviceTensor& dst, int64_t dst_row,
                 int64_t rows, int64_t row_elems) override {
    const OpName op{"copy_rows"};
    require_rows(src, src_row, rows, row_elems, op + ": src");
    require_rows(dst, dst_row, rows, row_elems, op + ": dst");
    KVLENS_REQUIRE(dst.dtype == src.dtype, op + ": dst",
                   cat("the dtype of src (", describe(src), ")"), describe(dst));
    if (rows * row_elems == 0) return;
    const size_t element = dtype_size(src.dtype);
    std::memmove(static_cast<std::byte*>(dst.data) + size_t(dst_row * row_elems) * element,
                 static_cast<const std::byte*>(src.data) + size_t(src_row * row_elems) * element,
                 size_t(rows * row_elems) * element);
  }

  void broadcast_rows(const DeviceTensor& src, int64_t src_row, std::span<DeviceTensor* const> dsts,
                      int64_t dst_row, int64_t rows, int64_t row_elems) override {
    const OpName op{"broadcast_rows"};
    require_rows(src, src_row, rows, row_elems, op + ": src");
    const size_t element = dtype_size(src.dtype);
    const size_t bytes = size_t(rows * row_elems) * element;
    const auto* from =
        static_cast<const std::byte*>(src.data) + size_t(src_row * row_elems) * element;
    std::vector<PageCopyTarget> targets;
    targets.reserve(dsts.size());
    for (DeviceTensor* dst : dsts) {
      require_rows(*dst, dst_row, rows, row_elems, op + ": dst");
      KVLENS_REQUIRE(dst->dtype == src.dtype, op + ": dst",
                     cat("the dtype of src (", describe(src), ")"), describe(*dst));
      auto* to = static_cast<std::byte*>(dst->data) + size_t(dst_row * row_elems) * element;
      KVLENS_REQUIRE(to == from || to + bytes <= from || from + bytes <= to, "broadcast_rows: dst",
                     "src's own rows or memory apart from them", "a partial overlap");
      targets.push_back({to, pages_remappable(dst->storage, to, bytes)});
    }
    if (bytes) copy_sharing_pages(from, bytes, targets);
  }

  void embed(const DeviceTensor& table, std::span<const int32_t> ids, DeviceTensor& out) override {
    KVLENS_REQUIRE(table.shape.size() == 2 && is_weight_dtype(table.dtype), "embed: table",
                   "an F32/BF16/F16 [vocab, E] tensor", describe(table));
    require_data(table, "embed: table");
    const int64_t vocab = table.dim(0), width = table.dim(1);
    const int64_t n = int64_t(ids.size());
    require_f32(out, "embed: out");
    KVLENS_REQUIRE(out.numel() == n * width, "embed: out", cat(n * width, " elements"),
                   describe(out));
    for (int64_t i = 0; i < n; ++i) {
      if (ids[i] < 0 || ids[i] >= vocab) {
        throw Error(kWhere, "embed: token id", cat("an id in [0, ", vocab, ")"),
                    std::to_string(ids[i]));
      }
    }
    for (int64_t i = 0; i < n; ++i)
      widen(table, ids[i] * width, width, out.as<float>() + i * width);
  }

  void matmul(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y) override {
    KVLENS_REQUIRE(w.shape.size() == 2 && is_weight_dtype(w.dtype), "matmul: w",
                   "an F32/BF16/F16 [out, in] tensor", describe(w));
    require_data(w, "matmul: w");
    require_f32(x, "matmul: x");
    require_f32(y, "matmul: y");
    const int64_t out = w.dim(0), in = w.dim(1);
    KVLENS_REQUIRE(in > 0 && x.numel() % in == 0, "matmul: x",
                   cat("[n, ", in, "] to match w ", describe(w)), describe(x));
    const int64_t n = x.numel() / in;
    KVLENS_REQUIRE(y.numel() == n * out, "matmul: y", shape_string({n, out}), describe(y));
    if (n == 0 || out == 0) return;

    if (n > 1 && n <= kMaxDedupRows && matmul_distinct_rows(x, w, y, n, in, out)) return;

    const WeightPanels& panels = panels_for(w);
    panel_matmul(pool_, panels.dtype == DType::BF16 ? kernels_.matmul_bf16 : kernels_.matmul_f32,
                 kernels_.matmul_limits, panels, x.as<const float>(), n, y.as<float>());
  }

  // Lockstep runs fed the same token have bit-identical rows until their policies first make
  // them differ (every layer below the first non-dense attention): such rows are multiplied once
  // and their result copied. Each output row depends only on its own x row (the kernels' fixed
  // summation order), so this gives the same bits. Rows that differ usually do so in their first
  // bytes, so the comparisons cost little. Returns false (nothing done) when every row differs.
  static constexpr int64_t kMaxDedupRows = 16;
  bool matmul_distinct_rows(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y,
                            int64_t n, int64_t in, int64_t out) {
    const float* xs = x.as<const float>();
    const size_t row_bytes = size_t(in) * sizeof(float);
    int64_t source[kMaxDedupRows];  // the first row equal to each row
    int64_t distinct = 0;
    for (int64_t i = 0; i < n; ++i) {
      source[i] = i;
      for (int64_t j = 0; j < i; ++j) {
        if (source[j] == j && std::memcmp(xs + i * in, xs + j * in, row_bytes) == 0) {
          source[i] = j;
          break;
        }
      }
      distinct += source[i] == i;
    }
    if (distinct == n) return false;
    // Per thread: tasks of run_tasks may issue matmuls of their own.
    thread_local std::vector<float> unique_x, unique_y;
    unique_x.resize(size_t(distinct * in));
    unique_y.resize(size_t(distinct * out));
    int64_t slot[kMaxDedupRows];
    for (int64_t i = 0, next = 0; i < n; ++i) {
      if (source[i] != i) continue;
      slot[i] = next;
      std::memcpy(unique_x.data() + next * in, xs + i * in, row_bytes);
      ++next;
    }
    DeviceTensor x_rows, y_rows;  // views of the scratch (no storage of their own)
    x_rows.data = unique_x.data();
    x_rows.shape = {distinct, in};
    y_rows.data = unique_y.data();
    y_rows.shape = {distinct, out};
    matmul(x_rows, w, y_rows);
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(y.as<float>() + i * out, unique_y.data() + slot[source[i]] * out,
                  size_t(out) * sizeof(float));
    }
    return true;
  }

  void rmsnorm(const DeviceTensor& x, const DeviceTensor& weight, float eps,
               DeviceTensor& y) override {
    require_f32(x, "rmsnorm: x");
    require_f32(y, "rmsnorm: y");
    KVLENS_REQUIRE(is_weight_dtype(weight.dtype), "rmsnorm: weight", "an F32/BF16/F16 [E] tensor",
                   describe(weight));
    require_data(weight, "rmsnorm: weight");
    const int64_t width = weight.numel();
    KVLENS_REQUIRE(width > 0 && x.numel() % width == 0, "rmsnorm: x", cat("[n, ", width, "]"),
                   describe(x));
    KVLENS_REQUIRE(y.numel() == x.numel(), "rmsnorm: y", describe(x), describe(y));
    std::vector<float> gain(static_cast<size_t>(width));
    widen(weight, 0, width, gain.data());
    const int64_t n = x.numel() / width;
    for (int64_t i = 0; i < n; ++i) {
      const float* row = x.as<const float>() + i * width;
      float* dst = y.as<float>() + i * width;
      double sum_squares = 0.0;
      for (int64_t e = 0; e < width; ++e) sum_squares += double(row[e]) * double(row[e]);
      // Same rounding points as transformers: float inverse rms, (x * inv) * weight.
      const float inv = float(1.0 / std::sqrt(sum_squares / double(width) + double(eps)));
      for (int64_t e = 0; e < width; ++e) dst[e] = (row[e] * inv) * gain[size_t(e)];
    }
  }

  using Backend::rope;
  void rope(DeviceTensor& x, std::span<const int64_t> positions, const DeviceTensor& inv_freq,
            float scale) override {
    require_f32(x, "rope: x");
    require_f32(inv_freq, "rope: inv_freq");
    const int64_t half = inv_freq.numel(), rotated = 2 * half;
    const int64_t head_dim = x.shape.size() == 3 ? x.shape[2] : rotated;
    const int64_t n = int64_t(positions.size());
    KVLENS_REQUIRE(half > 0 && n > 0 && rotated <= head_dim && x.numel() % (n * head_dim) == 0,
                   "rope: x", cat("[", n, ", heads, ", head_dim, "], D >= ", rotated), describe(x));
    const int64_t heads = x.numel() / (n * head_dim);
    const float* freq = inv_freq.as<const float>();
    std::vector<float> cos_table(static_cast<size_t>(half));
    std::vector<float> sin_table(static_cast<size_t>(half));
    for (int64_t i = 0; i < n; ++i) {
      // The angle is rounded to float first, as transformers computes it (inv_freq @ position in
      // F32); cos/sin of that float are then rounded once, and scaled in F32 (cos() * scale).
      // Lockstep rows share their position.
      for (int64_t f = 0; f < half && (i == 0 || positions[i] != positions[i - 1]); ++f) {
        const float angle = float(positions[i]) * freq[f];
        cos_table[size_t(f)] = float(std::cos(double(angle))) * scale;
        sin_table[size_t(f)] = float(std::sin(double(angle))) * scale;
      }
      // Rotate-half within the first `rotated` channels; the others pass through.
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.as<float>() + (i * heads + h) * head_dim;
        for (int64_t f = 0; f < half; ++f) {
          const float a = v[f], b = v[f + half];
          const float c = cos_table[size_t(f)], s = sin_table[size_t(f)];
          v[f] = a * c - b * s;
          v[f + half] = b * c + a * s;
        }
      }
    }
  }

  void silu_mul(const DeviceTensor& gate, const DeviceTensor& up, DeviceTensor& out) override {
    require_f32(gate, "silu_mul: gate");
    require_f32(up, "silu_mul: up");
    require_f32(out, "silu_mul: out");
    KVLENS_REQUIRE(up.numel() == gate.numel() && out.numel() == gate.numel(), "silu_mul: shapes",
                   "gate, up and out of equal size",
                   describe(gate) + ", " + describe(up) + ", " + describe(out));
    const float* g = gate.as<const float>();
    const float* u = up.as<const float>();
    float* o = out.as<float>();
    // Split over the threads in whole 8-lane blocks, so an element's lanes never depend on the
    // split (the AVX2 kernel runs its tail through the same lanes).
    pool_.parallel_for(
        0, (gate.numel() + 7) / 8,
        [&](int64_t begin, int64_t end) {
          const int64_t first = begin * 8, last = std::min(gate.numel(), end * 8);
          kernels_.silu_mul(g + first, u + first, o + first, last - first);
        },
        kSiluBlocksPerTask);
  }

  void gelu_tanh_mul(const DeviceTensor& gate, const DeviceTensor& up, DeviceTensor& out) override {
    require_f32(gate, "gelu_tanh_mul: gate");
    require_f32(up, "gelu_tanh_mul: up");
    require_f32(out, "gelu_tanh_mul: out");
    KVLENS_REQUIRE(up.numel() == gate.numel() && out.numel() == gate.numel(),
                   "gelu_tanh_mul: shapes", "gate, up and out of equal size",
                   describe(gate) + ", " + describe(up) + ", " + describe(out));
    const float* g = gate.as<const float>();
    const float* u = up.as<const float>();
    float* o = out.as<float>();
    pool_.parallel_for(
        0, gate.numel(),
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) o[i] = gelu_tanh(g[i]) * u[i];
        },
        kSiluBlocksPerTask * 8);
  }

  void soft_cap(DeviceTensor& x, float cap) override {
    require_f32(x, "soft_cap: x");
    KVLENS_REQUIRE(cap > 0.0f && std::isfinite(cap), "soft_cap: cap", "a finite number > 0",
                   cat(cap));
    float* v = x.as<float>();
    for (int64_t i = 0, count = x.numel(); i < count; ++i)
      if (!std::isinf(v[i])) v[i] = float(std::tanh(double(v[i] / cap))) * cap;
  }

  void layer_norm(const DeviceTensor& x, const DeviceTensor& weight, const DeviceTensor& bias,
                  float eps, DeviceTensor& y) override {
    require_f32(x, "layer_norm: x");
    require_f32(y, "layer_norm: y");
    for (const DeviceTensor* t : {&weight, &bias}) {
      KVLENS_REQUIRE(is_weight_dtype(t->dtype), "layer_norm: weight, bias",
                     "F32/BF16/F16 [E] tensors", describe(*t));
      require_data(*t, "layer_norm: weight, bias");
    }
    const int64_t width = weight.numel();
    KVLENS_REQUIRE(width > 0 && bias.numel() == width && x.numel() % width == 0, "layer_norm: x",
                   cat("[n, ", width, "] with a [", width, "] bias"),
                   describe(x) + ", bias " + describe(bias));
    KVLENS_REQUIRE(y.numel() == x.numel(), "layer_norm: y", describe(x), describe(y));
    std::vector<float> gain(static_cast<size_t>(width)), shift(static_cast<size_t>(width));
    widen(weight, 0, width, gain.data());
    widen(bias, 0, width, shift.data());
    for (int64_t i = 0, n = x.numel() / width; i < n; ++i) {
      const float* row = x.as<const float>() + i * width;
      float* dst = y.as<float>() + i * width;
      // Two passes in double: the mean first, then the variance around it (no cancellation),
      // rounded to float where torch keeps its statistics.
      double sum = 0.0;
      for (int64_t e = 0; e < width; ++e) sum += row[e];
      const double mean = sum / double(width);
      double squares = 0.0;
      for (int64_t e = 0; e < width; ++e) squares += (row[e] - mean) * (row[e] - mean);
      const float inv = float(1.0 / std::sqrt(squares / double(width) + double(eps)));
      const float mean_f = float(mean);
      for (int64_t e = 0; e < width; ++e)
        dst[e] = (row[e] - mean_f) * inv * gain[size_t(e)] + shift[size_t(e)];
    }
  }

  void bias_activation(DeviceTensor& x, const DeviceTensor* bias, Activation act) override {
    require_f32(x, "bias_activation: x");
    std::vector<float> shift;
    int64_t width = x.numel();
    if (bias != nullptr) {
      KVLENS_REQUIRE(is_weight_dtype(bias->dtype), "bias_activation: bias",
                     "an F32/BF16/F16 [F] tensor", describe(*bias));
      require_data(*bias, "bias_activation: bias");
      width = bias->numel();
      KVLENS_REQUIRE(width > 0 && x.numel() % width == 0, "bias_activation: x",
                     cat("[n, ", width, "]"), describe(x));
      shift.resize(size_t(width));
      widen(*bias, 0, width, shift.data());
    }
    float* v = x.as<float>();
    for (int64_t i = 0, count = x.numel(); i < count; ++i) {
      float value = v[i] + (bias != nullptr ? shift[size_t(i % width)] : 0.0f);
      if (act == Activation::Gelu) {
        value = float(0.5 * double(value) * (1.0 + std::erf(double(value) * M_SQRT1_2)));
      } else if (act == Activation::Silu) {
        value = float(double(value) / (1.0 + std::exp(-double(value))));
      }
      v[i] = value;
    }
  }

  void add_inplace(DeviceTensor& x, const DeviceTensor& y) override {
    require_f32(x, "add_inplace: x");
    require_f32(y, "add_inplace: y");
    KVLENS_REQUIRE(x.numel() == y.numel(), "add_inplace: y", describe(x), describe(y));
    float* a = x.as<float>();
    const float* b = y.as<const float>();
    for (int64_t i = 0, count = x.numel(); i < count; ++i) a[i] += b[i];
  }

  void kv_append(const DeviceTensor& k, const DeviceTensor& v, DeviceTensor& k_cache,
                 DeviceTensor& v_cache, int64_t first_position) override {
    const bool keys_only = v_cache.empty();
    require_f32(k, "kv_append: k");
    if (keys_only) {
      require_f32(k_cache, "kv_append: k_cache");
      KVLENS_REQUIRE(k_cache.shape.size() == 3, "kv_append: k_cache", "a [G, capacity, D] tensor",
                     describe(k_cache));
    } else {
      require_f32(v, "kv_append: v");
      require_kv_caches(k_cache, v_cache, "kv_append");
    }
    const int64_t groups = k_cache.dim(0), capacity = k_cache.dim(1), head_dim = k_cache.dim(2);
    const int64_t row = groups * head_dim;
    KVLENS_REQUIRE(row > 0 && k.numel() % row == 0 && (keys_only || v.numel() == k.numel()),
                   "kv_append: k, v", cat("[n, ", groups, ", ", head_dim, "] each"),
                   describe(k) + ", " + describe(v));
    const int64_t n = k.numel() / row;
    KVLENS_REQUIRE(first_position >= 0 && first_position + n <= capacity, "kv_append: positions",
                   cat("positions below the capacity ", capacity),
                   cat(first_position, "..", first_position + n - 1));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t g = 0; g < groups; ++g) {
        const size_t src = size_t((i * groups + g) * head_dim);
        const size_t dst = size_t((g * capacity + first_position + i) * head_dim);
        std::memcpy(k_cache.as<float>() + dst, k.as<const float>() + src,
                    size_t(head_dim) * sizeof(float));
        if (keys_only) continue;
        std::memcpy(v_cache.as<float>() + dst, v.as<const float>() + src,
                    size_t(head_dim) * sizeof(float));
      }
    }
  }

  void attention(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& v_cache,
                 int64_t first_position, int64_t window, Visibility visible, DeviceTensor& out,
                 DeviceTensor* logits_out) override {
    require_f32(q, "attention: q");
    require_kv_caches(k_cache, v_cache, "attention");
    require_f32(out, "attention: out");
    const int64_t groups = k_cache.dim(0), capacity = k_cache.dim(1), head_dim = k_cache.dim(2);
    KVLENS_REQUIRE(q.shape.size() == 3 && q.dim(2) == head_dim, "attention: q",
                   cat("[n, H, ", head_dim, "]"), describe(q));
    const int64_t n = q.dim(0), heads = q.dim(1);
    KVLENS_REQUIRE(groups > 0 && heads % groups == 0, "attention: q",
                   cat("a head count divisible by the ", groups, " KV heads"), describe(q));
    KVLENS_REQUIRE(out.numel() == q.numel(), "attention: out", describe(q), describe(out));
    const int64_t context = first_position + n;
    KVLENS_REQUIRE(first_position >= 0 && context <= capacity, "attention: positions",
                   cat("positions below the capacity ", capacity),
                   cat(first_position, "..", context - 1));
    const uint8_t* mask = nullptr;
    if (visible.mask) {
      const DeviceTensor& m = *visible.mask;
      KVLENS_REQUIRE(n == 1, "attention: visible", "a mask only when decoding one token",
                     cat(n, " query rows"));
      KVLENS_REQUIRE(m.dtype == DType::U8 && m.shape.size() == 2 && m.dim(0) == heads &&
                         m.dim(1) == context && !m.empty(),
                     "attention: visible", cat("a U8 [", heads, ", ", context, "] mask"),
                     describe(m));
      mask = m.as<const uint8_t>();
    }
    float* logits = nullptr;
    int64_t logits_stride = context;  // the scratch rows' when the logits are not kept
    if (logits_out && !logits_out->empty()) {
      require_f32(*logits_out, "attention: logits_out");
      const std::vector<int64_t>& shape = logits_out->shape;
      KVLENS_REQUIRE(shape.size() == 3 && shape[0] == n && shape[1] == heads && shape[2] >= context,
                     "attention: logits_out", cat("[", n, ", ", heads, ", S >= ", context, "]"),
                     describe(*logits_out));
      logits = logits_out->as<float>();
      logits_stride = shape[2];
    }
    if (n == 0) return;

    const int64_t heads_per_group = heads / groups;
    const float scale = attention_scale(head_dim);
    const float* qs = q.as<const float>();
    const float* ks = k_cache.as<const float>();
    const float* vs = v_cache.as<const float>();
    float* os = out.as<float>();
    const DotKernels& kernels = kernels_;
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();

    // One unit = one (query row, KV head): the heads_per_group query heads that read one KV head
    // go through the kernels together, so each key and value row is loaded once for all of them.
    // A chunk of units shares its scratch rows.
    auto run_units = [&](int64_t unit_begin, int64_t unit_end) {
      const size_t rows_size = size_t(heads_per_group * context);
      std::vector<float> scratch(logits ? 0 : rows_size);
      std::vector<float> weights(rows_size);
      std::vector<float> inv_totals(static_cast<size_t>(heads_per_group));
      for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
        const int64_t i = unit / groups, kv = unit % groups;
        const int64_t h0 = kv * heads_per_group;
        const int64_t position = first_position + i;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
        const float* k_rows = ks + kv * capacity * head_dim;
        const float* v_rows = vs + kv * capacity * head_dim;
        float* rows = logits ? logits + (i * heads + h0) * logits_stride : scratch.data();

        // Logits of the whole causal window (the attention_logits op runs the same kernel), then
        // the mask as -inf; a hidden key costs one wasted dot, which keeps this loop simple.
        kernels.attention_logits(qs + (i * heads + h0) * head_dim, head_dim, int(heads_per_group),
                                 k_rows, head_dim, lo, position, scale, rows, logits_stride);
        for (int64_t e = 0; e < heads_per_group; ++e) {
          float* row = rows + e * logits_stride;
          std::fill(row + position + 1, row + context, kNegInf);
          if (mask) {
            const uint8_t* head_mask = mask + (h0 + e) * context;
            for (int64_t j = lo; j <= position; ++j)
              if (head_mask[j] == 0) row[j] = kNegInf;
          }
          // attention_visible's softmax through the same kernel: its sums depend only on the
          // column indices of the nonzero weights, so starting at lo (where attention_visible
          // starts at 0 and sees -inf below lo) changes no bit.
          const float total =
              kernels.softmax_weights(row, nullptr, lo, position + 1, weights.data() + e * context);
          // A head that sees nothing (or only -inf) has all weights 0: scale 0 gives zeros.
          inv_totals[size_t(e)] = total == 0.0f ? 0.0f : 1.0f / total;
        }
        kernels.weighted_values(weights.data(), context, int(heads_per_group), v_rows, head_dim, lo,
                                position + 1, inv_totals.data(), os + (i * heads + h0) * head_dim,
                                head_dim);
      }
    };
    // Roughly 64K multiply-adds per chunk so short contexts do not drown in scheduling.
    const int64_t grain =
        std::max<int64_t>(1, 65536 / std::max<int64_t>(1, heads_per_group * context * head_dim));
    pool_.parallel_for(0, n * groups, run_units, grain);
  }

  void argmax_rows(const DeviceTensor& x, std::span<int32_t> out) override {
    const int64_t rows = int64_t(out.size());
    const int64_t width = check_rows(x, rows, OpName{"argmax_rows"});
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = x.as<const float>() + i * width;
      // torch.argmax semantics: NaN counts as the maximum, the first maximum wins.
      int64_t best = 0;
      for (int64_t j = 0; j < width; ++j) {
        if (std::isnan(row[j])) {
          best = j;
          break;
        }
        if (row[j] > row[best]) best = j;
      }
      out[size_t(i)] = int32_t(best);
    }
  }

  void log_prob_rows(const DeviceTensor& x, std::span<const int32_t> targets,
                     std::span<double> out) override {
    KVLENS_REQUIRE(targets.size() == out.size(), "log_prob_rows: targets",
                   cat(int64_t(out.size()), " targets"), std::to_string(targets.size()));
    const int64_t rows = int64_t(out.size());
    const int64_t width = check_rows(x, rows, OpName{"log_prob_rows"});
    for (int64_t i = 0; i < rows; ++i) {
      const int32_t target = targets[size_t(i)];
      if (target < 0 || target >= width) {
        throw Error(kWhere, "log_prob_rows: target", cat("an id in [0, ", width, ")"),
                    std::to_string(target));
      }
      const float* row = x.as<const float>() + i * width;
      double max_value = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < width; ++j) max_value = std::max(max_value, double(row[j]));
      double sum = 0.0;
      for (int64_t j = 0; j < width; ++j) sum += std::exp(double(row[j]) - max_value);
      out[size_t(i)] = double(row[target]) - max_value - std::log(sum);
    }
  }

  // --- token-selection (policy) ops: cpu_policy_ops.cpp ---

  void attention_logits(const DeviceTensor& q, const DeviceTensor& k_cache, int64_t position,
                        int64_t window, DeviceTensor& logits) override {
    cpu_policy::attention_logits(policy_context(), q, k_cache, position, window, logits);
  }
  void attention_visible(const DeviceTensor& logits, int64_t cols, const DeviceTensor* visible,
                         const DeviceTensor& v_cache, DeviceTensor& out,
                         DeviceTensor* probs) override {
    cpu_policy::attention_visible(policy_context(), logits, cols, visible, v_cache, out, probs);
  }
  void attention_logits_runs(std::span<const RunAttention> runs, int64_t shared, int64_t position,
                             int64_t window) override {
    cpu_policy::attention_logits_runs(policy_context(), runs, shared, position, window);
  }
  void attention_visible_runs(std::span<const RunAttention> runs, int64_t shared,
                              int64_t cols) override {
    cpu_policy::attention_visible_runs(policy_context(), runs, shared, cols);
  }
  void select_top_k(const DeviceTensor& scores, int64_t cols, const DeviceTensor* eligible,
                    int64_t k, DeviceTensor& selected) override {
    cpu_policy::select_top_k(policy_context(), scores, cols, eligible, k, selected);
  }
  void fill_columns(DeviceTensor& mask, int64_t begin, int64_t end, uint8_t value) override {
    cpu_policy::fill_columns(mask, begin, end, value);
  }
  void count_nonzero_rows(const DeviceTensor& mask, int64_t cols,
                          std::span<int64_t> counts) override {
    cpu_policy::count_nonzero_rows(mask, cols, counts);
  }
  void mask_and(DeviceTensor& mask, const DeviceTensor& other, int64_t cols) override {
    cpu_policy::mask_and(mask, other, cols);
  }
  void accumulate_rows(DeviceTensor& acc, const DeviceTensor& x, const DeviceTensor* keep,
                       int64_t cols) override {
    cpu_policy::accumulate_rows(acc, x, keep, cols);
  }
  void sum_row_groups(const DeviceTensor& x, int64_t cols, int64_t group,
                      DeviceTensor& out) override {
    cpu_policy::sum_row_groups(x, cols, group, out);
  }
  void expand_row_groups(const DeviceTensor& mask, int64_t cols, int64_t group,
                         DeviceTensor& out) override {
    cpu_policy::expand_row_groups(mask, cols, group, out);
  }
  void random_rows(uint64_t seed, uint64_t stream, int64_t cols, DeviceTensor& out) override {
    cpu_policy::random_rows(seed, stream, cols, out);
  }
  void axpby_rows(DeviceTensor& y, float alpha, const DeviceTensor& x, float beta,
                  int64_t cols) override {
    cpu_policy::axpby_rows(policy_context(), y, alpha, x, beta, cols);
  }
  void pool_rows(const DeviceTensor& x, int64_t cols, Pool pool, int64_t kernel,
                 DeviceTensor& out) override {
    cpu_policy::pool_rows(x, cols, pool, kernel, out);
  }
  void select_pages(const DeviceTensor& scores, int64_t cols, int64_t page_size, int64_t k,
                    DeviceTensor& selected) override {
    cpu_policy::select_pages(policy_context(), scores, cols, page_size, k, selected);
  }
  void zero_unless(DeviceTensor& rows, const DeviceTensor& keep) override {
    cpu_policy::zero_unless(rows, keep);
  }

  // The pool and kernels the policies' CPU op extensions run on (cpu_policy::context_of).
  cpu_policy::Context policy_context() { return {pool_, kernels_}; }

 private:
  // x seen as [rows, width]; returns width.
  int64_t check_rows(const DeviceTensor& x, int64_t rows, OpName op) {
    require_f32(x, op + ": x");
    KVLENS_REQUIRE(!x.shape.empty() && x.shape.back() > 0, op + ": x", "an [n, V] tensor",
                   describe(x));
    const int64_t width = x.shape.back();
    KVLENS_REQUIRE(x.numel() == rows * width, op + ": x",
                   cat("[", rows, ", V] to match the output span"), describe(x));
    return width;
  }

  ThreadPool pool_;
  DotKernels kernels_;
  PanelArena panels_;  // the weight panels upload_weight makes
  size_t cache_bytes_;
  std::shared_ptr<HostReduceGroup> reduce_group_;
  int rank_ = 0;
};

}  // namespace

int64_t cpu_lockstep_groups(int64_t runs, int64_t threads, int64_t layer_weight_bytes,
                            int64_t layers, size_t cache_bytes) {
  const int64_t groups = std::min(runs, threads);
  if (groups < 2 || layers < 1 || layer_weight_bytes < 0 ||
      layer_weight_bytes > kSplitLayerBytes * layers ||
      size_t(layer_weight_bytes) * size_t(groups) > cache_bytes)
    return 1;
  return groups;
}

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

std::vector<std::unique_ptr<Backend>> make_cpu_backend_group(int ranks, CpuBackendOptions options) {
  options.reduce_group = std::make_shared<HostReduceGroup>(ranks);
  std::vector<std::unique_ptr<Backend>> group;
  for (int r = 0; r < ranks; ++r) {
    options.rank = r;
    group.push_back(make_cpu_backend(options));
  }
  return group;
}

std::unique_ptr<Backend> make_cpu_backend(int threads) {
  CpuBackendOptions options;
  options.threads = threads;
  return make_cpu_backend(options);
}

std::string_view cpu_backend_isa(const Backend& backend) {
  const auto* cpu = dynamic_cast<const CpuBackend*>(&backend);
  return cpu ? cpu->isa() : std::string_view();
}

cpu_policy::Context cpu_policy::context_of(Backend& backend) {
  auto* cpu = dynamic_cast<CpuBackend*>(&backend);
  if (cpu == nullptr)
    throw Error(kWhere, "cpu_policy::context_of: backend", "the CPU backend", backend.name());
  return cpu->policy_context();
}

int cpu_backend_threads(const Backend& backend) {
  const auto* cpu = dynamic_cast<const CpuBackend*>(&backend);
  return cpu ? cpu->threads() : 0;
}

}  // namespace kvlens
