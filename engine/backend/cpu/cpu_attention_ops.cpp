// The CPU backend's policy-path attention (contracts in backend.h): attention_logits and
// attention_visible, for one run or for the runs of a lockstep step at once. Caches are
// [G, capacity, D], logits / probs F32 and masks U8 [H, stride]; query head h reads KV head
// h / (H/G). The runs' caches hold the same rows [0, shared) (the common prompt): those are read
// from run 0's cache, block by block, each block once for every run while it sits in L1, rather
// than once per run from memory. The kernels (cpu_dot_kernels.h) give each output one fixed order
// of operations, so the results are those of each run alone, bit for bit, and those of the
// attention op (the same kernels) when nothing is masked.
#include <algorithm>
#include <limits>
#include <vector>

#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/cpu/cpu_policy_ops.h"

namespace kvlens::cpu_policy {

using namespace cpu_checks;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Keys or values per block of the common rows: about 8 KB of one KV head, so that a block stays
// in L1 while every run reads it.
int64_t rows_per_block(int64_t head_dim) {
  return std::max<int64_t>(
      8, 8192 / (int64_t(sizeof(float)) * std::max<int64_t>(1, head_dim)) / 8 * 8);
}

// Asks the cache for `count` rows of `row_floats` floats from `rows` on, ahead of their use: in
// a lockstep step a layer's keys and values come from memory (the step streams more than the
// last-level cache holds), and the hardware prefetchers start too late for the value sums to
// hide the misses.
void prefetch_rows(const float* rows, int64_t count, int64_t row_floats) {
  if (count <= 0) return;
  const char* begin = reinterpret_cast<const char*>(rows);
  const size_t bytes = size_t(count * row_floats) * sizeof(float);
  for (size_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(begin + offset, 0, 3);
}

struct Geometry {
  int64_t heads = 0, groups = 0, head_dim = 0;
};

// Every run must have run 0's shape: the common rows are read with run 0's geometry.
void require_same_geometry(const Geometry& first, const Geometry& run, int64_t index, OpName op) {
  KVLENS_REQUIRE(
      run.heads == first.heads && run.groups == first.groups && run.head_dim == first.head_dim,
      op + ": runs",
      cat("runs of one model shape (", first.heads, " heads, ", first.groups, " KV heads of ",
          first.head_dim, ")"),
      cat("run ", index, ": ", run.heads, " heads, ", run.groups, " KV heads of ", run.head_dim));
}

void check_shared(int64_t shared, int64_t limit, OpName op) {
  KVLENS_REQUIRE(shared >= 0 && shared <= limit, op + ": shared",
                 cat("a common row count in [0, ", limit, "]"), std::to_string(shared));
}

}  // namespace

void attention_logits_runs(const Context& context, std::span<const Backend::RunAttention> runs,
                           int64_t shared, int64_t position, int64_t window) {
  const OpName op{"attention_logits"};
  if (runs.empty()) return;
  // Reused per calling thread (a lockstep step calls this once per run and layer); the tasks
  // below read the caller's copy through the reference (a lambda does not capture a
  // thread_local: named inside it, it would be the running thread's own).
  thread_local std::vector<int64_t> strides_storage;
  std::vector<int64_t>& strides = strides_storage;
  strides.assign(runs.size(), 0);
  Geometry geometry;
  for (size_t r = 0; r < runs.size(); ++r) {
    const Backend::RunAttention& run = runs[r];
    KVLENS_REQUIRE(run.q && run.k_cache && run.logits, op + ": run",
                   "q, k_cache and logits tensors", "a missing one");
    require_f32(*run.q, op + ": q");
    const CacheShape cache = cache_shape(*run.k_cache, position + 1, op, "k_cache");
    KVLENS_REQUIRE(
        run.q->shape.size() == 3 && run.q->dim(0) == 1 && run.q->dim(2) == cache.head_dim,
        op + ": q", cat("[1, H, ", cache.head_dim, "]"), describe(*run.q));
    const int64_t heads = run.q->dim(1);
    KVLENS_REQUIRE(cache.groups > 0 && heads % cache.groups == 0, op + ": q",
                   cat("a head count divisible by the ", cache.groups, " KV heads"),
                   describe(*run.q));
    KVLENS_REQUIRE(position >= 0, op + ": position", "a position >= 0", std::to_string(position));
    require_cols(position + 1, op);
    strides[r] = row_shape(*run.logits, DType::F32, heads, position + 1, op + ": logits").stride;
    if (run.visible) row_shape(*run.visible, DType::U8, heads, position + 1, op + ": visible");
    const Geometry own{heads, cache.groups, cache.head_dim};
    if (r == 0) geometry = own;
    require_same_geometry(geometry, own, int64_t(r), op);
  }
  check_shared(shared, position, op);
  if (geometry.heads == 0) return;

  const int64_t per_group = geometry.heads / geometry.groups, head_dim = geometry.head_dim;
  const int64_t lo = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
  // One run alone (a fused lockstep task) reads its own cache: blocks would only add calls.
  const int64_t common_end = std::max(lo, shared);
  const int64_t block = runs.size() > 1 ? rows_per_block(head_dim) : position + 1;
  const float scale = attention_scale(head_dim);
  const DotKernels& kernels = context.kernels;
  const int64_t cols = position + 1, work = int64_t(runs.size()) * per_group * cols * head_dim;
  auto query = [&](size_t r, int64_t h0) { return runs[r].q->as<const float>() + h0 * head_dim; };
  auto row = [&](size_t r, int64_t h0) { return runs[r].logits->as<float>() + h0 * strides[r]; };
  // One task per KV head; the kernel's logits depend only on the query and key, so a range cut
  // into blocks (passed as offset pointers) gives the same bits as one call over [lo, position].
  context.pool.parallel_for(
      0, geometry.groups,
      [&](int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g) {
          const int64_t h0 = g * per_group;
          for (size_t r = 0; r < runs.size(); ++r)
            for (int64_t e = 0; e < per_group; ++e)
              std::fill(row(r, h0) + e * strides[r], row(r, h0) + e * strides[r] + lo, kNegInf);
          const DeviceTensor& common_cache = *runs[0].k_cache;
          const float* common = common_cache.as<const float>() + g * common_cache.dim(1) * head_dim;
          // A run whose visible set is known gets its logits at those columns only, head by
          // head (the same operations per logit).
          for (size_t r = 0; r < runs.size(); ++r) {
            if (!runs[r].visible) continue;
            const DeviceTensor& own = *runs[r].k_cache;
            const float* own_keys = own.as<const float>() + g * own.dim(1) * head_dim;
            thread_local std::vector<int32_t> columns;
            columns.resize(size_t(position + 1 - lo + 8));
            for (int64_t e = 0; e < per_group; ++e) {
              const uint8_t* shown =
                  runs[r].visible->as<const uint8_t>() + (h0 + e) * runs[r].visible->dim(1);
              const float* qe = query(r, h0) + e * head_dim;
              float* logits = row(r, h0) + e * strides[r];
              const int64_t in_common =
                  kernels.visible_columns(shown, lo, common_end, columns.data());
              kernels.attention_logits_at(qe, common, head_dim, columns.data(), in_common, scale,
                                          logits);
              const int64_t in_own =
                  kernels.visible_columns(shown, common_end, position + 1, columns.data());
              kernels.attention_logits_at(qe, own_keys, head_dim, columns.data(), in_own, scale,
                                          logits);
            }
          }
          for (int64_t j0 = lo; j0 < common_end; j0 += block) {
            const int64_t j1 = std::min(j0 + block, common_end);
            for (size_t r = 0; r < runs.size(); ++r) {
              if (runs[r].visible) continue;
              kernels.attention_logits(query(r, h0), head_dim, int(per_group),
                                       common + j0 * head_dim, head_dim, 0, j1 - 1 - j0, scale,
                                       row(r, h0) + j0, strides[r]);
            }
          }
          for (size_t r = 0; r < runs.size(); ++r) {
            if (runs[r].visible) continue;
            const DeviceTensor& own = *runs[r].k_cache;
            kernels.attention_logits(
                query(r, h0), head_dim, int(per_group),
                own.as<const float>() + (g * own.dim(1) + common_end) * head_dim, head_dim, 0,
                position - common_end, scale, row(r, h0) + common_end, strides[r]);
          }
        }
      },
      grain_for(work / geometry.groups));
}

void attention_logits(const Context& context, const DeviceTensor& q, const DeviceTensor& k_cache,
                      int64_t position, int64_t window, DeviceTensor& logits) {
  const Backend::RunAttention run{.q = &q, .k_cache = &k_cache, .logits = &logits};
  attention_logits_runs(context, std::span(&run, 1), 0, position, window);
}

void attention_visible_runs(const Context& context, std::span<const Backend::RunAttention> runs,
                            int64_t shared, int64_t cols) {
  const OpName op{"attention_visible"};
  if (runs.empty()) return;
  require_cols(cols, op);
  struct Strides {
    int64_t logits = 0, visible = 0, probs = 0;
  };
  // Reused per calling thread, read by the tasks through the references (see
  // attention_logits_runs).
  thread_local std::vector<Strides> strides_storage;
  thread_local std::vector<int64_t> offsets_storage;
  std::vector<Strides>& strides = strides_storage;
  std::vector<int64_t>& scratch_offsets = offsets_storage;
  strides.assign(runs.size(), Strides{});
  scratch_offsets.assign(runs.size(), 0);
  int64_t scratch_runs = 0;
  Geometry geometry;
  for (size_t r = 0; r < runs.size(); ++r) {
    const Backend::RunAttention& run = runs[r];
    KVLENS_REQUIRE(run.logits && run.v_cache && run.out, op + ": run",
                   "logits, v_cache and out tensors", "a missing one");
    const CacheShape cache = cache_shape(*run.v_cache, cols, op, "v_cache");
    const RowShape logit_shape = row_shape(*run.logits, DType::F32, -1, cols, op + ": logits");
    const int64_t heads = logit_shape.rows;
    KVLENS_REQUIRE(cache.groups > 0 && heads % cache.groups == 0, op + ": logits",
                   cat("a row count divisible by the ", cache.groups, " KV heads"),
                   describe(*run.logits));
    strides[r].logits = logit_shape.stride;
    if (run.visible)
      strides[r].visible = row_shape(*run.visible, DType::U8, heads, cols, op + ": visible").stride;
    if (run.probs)
      strides[r].probs = row_shape(*run.probs, DType::F32, heads, cols, op + ": probs").stride;
    KVLENS_REQUIRE(!run.out->empty() || run.probs != nullptr, op + ": out",
                   "an output tensor or probs", "neither");
    if (!run.out->empty()) {
      require_f32(*run.out, op + ": out");
      KVLENS_REQUIRE(run.out->numel() == heads * cache.head_dim, op + ": out",
                     shape_string({1, heads, cache.head_dim}), describe(*run.out));
    }
    const Geometry own{heads, cache.groups, cache.head_dim};
    if (r == 0) geometry = own;
    require_same_geometry(geometry, own, int64_t(r), op);
    // Runs without probs keep their weights in the task's scratch.
    if (!run.probs) scratch_offsets[r] = scratch_runs++ * (own.heads / own.groups) * cols;
  }
  check_shared(shared, cols, op);
  if (geometry.heads == 0) return;

  const int64_t per_group = geometry.heads / geometry.groups, head_dim = geometry.head_dim;
  const int64_t runs_count = int64_t(runs.size());
  const int64_t block = rows_per_block(head_dim);
  const DotKernels& kernels = context.kernels;
  // The common rows' value sums go through the rows kernel where the kernel set has one and
  // several runs read them: the heads of all runs in one pass per block have enough independent
  // sums to keep the FMA pipes busy, where one run's two heads wait on the FMA latency key after
  // key (measured warm, 5 runs of 2 heads at half density: 1.6 against 3.2 us per 512 keys).
  // The runs' own rows stay run by run: loaded per run, the rows kernel only adds loads there.
  const bool by_rows = kernels.weighted_values_rows && head_dim % 16 == 0 && runs.size() > 1;
  // One task per KV head: each run's softmax weights of the group's query heads (straight into
  // probs when it is wanted, scaled in place at the end), then the value sums of every run,
  // continued block by block over the common rows and then over the run's own rows. Hidden and
  // -inf columns get weight exactly 0 and are skipped, so they leave the sums as they are.
  context.pool.parallel_for(
      0, geometry.groups,
      [&](int64_t begin, int64_t end) {
        // Per thread and kept between calls (every element is written before it is read):
        // the weights of the runs without probs, then every run's sums, then their 1 / totals.
        thread_local std::vector<float> buffer;
        const int64_t sums_at = scratch_runs * per_group * cols,
                      totals_at = sums_at + runs_count * per_group * head_dim;
        buffer.resize(std::max(buffer.size(), size_t(totals_at + runs_count * per_group)));
        float* const sums = buffer.data() + sums_at;
        float* const inverse_totals = buffer.data() + totals_at;
        thread_local std::vector<float*> weights;
        thread_local std::vector<int64_t> weights_stride;
        weights.assign(runs.size(), nullptr);
        weights_stride.assign(runs.size(), 0);
        for (int64_t g = begin; g < end; ++g) {
          const int64_t h0 = g * per_group;
          const DeviceTensor& common_cache = *runs[0].v_cache;
          const float* common = common_cache.as<const float>() + g * common_cache.dim(1) * head_dim;
          // The first values are on their way while the softmax runs.
          prefetch_rows(common, std::min(block, shared), head_dim);
          for (size_t r = 0; r < runs.size(); ++r) {
            const Backend::RunAttention& run = runs[r];
            weights_stride[r] = run.probs ? strides[r].probs : cols;
            weights[r] = run.probs ? run.probs->as<float>() + h0 * strides[r].probs
                                   : buffer.data() + scratch_offsets[r];
            for (int64_t e = 0; e < per_group; ++e) {
              const int64_t h = h0 + e;
              const float total = kernels.softmax_weights(
                  run.logits->as<const float>() + h * strides[r].logits,
                  run.visible ? run.visible->as<const uint8_t>() + h * strides[r].visible : nullptr,
                  0, cols, weights[r] + e * weights_stride[r]);
              // Nothing finite visible: every weight is 0 and scale 0 gives zeros (probs too), as
              // attention gives.
              inverse_totals[int64_t(r) * per_group + e] = total == 0.0f ? 0.0f : 1.0f / total;
            }
          }
          std::fill(sums, sums + runs_count * per_group * head_dim, 0.0f);
          auto run_sums = [&](size_t r) { return sums + int64_t(r) * per_group * head_dim; };
          auto accumulate = [&](size_t r, const float* values, int64_t from, int64_t to) {
            if (runs[r].out->empty()) return;
            kernels.weighted_values_accumulate(weights[r], weights_stride[r], int(per_group),
                                               values, head_dim, from, to, run_sums(r), head_dim);
          };
          // The common rows, block by block, each block once for every run: with the rows
          // kernel every head of the runs with an output in one call per block.
          thread_local std::vector<const float*> row_weights;
          thread_local std::vector<float*> row_sums;
          row_weights.clear();
          row_sums.clear();
          for (size_t r = 0; r < runs.size() && by_rows; ++r) {
            if (runs[r].out->empty()) continue;
            for (int64_t e = 0; e < per_group; ++e) {
              row_weights.push_back(weights[r] + e * weights_stride[r]);
              row_sums.push_back(run_sums(r) + e * head_dim);
            }
          }
          for (int64_t j0 = 0; j0 < shared; j0 += block) {
            const int64_t j1 = std::min(j0 + block, shared);
            prefetch_rows(common + j1 * head_dim, std::min(block, shared - j1), head_dim);
            if (by_rows) {
              kernels.weighted_values_rows(row_weights.data(), common, row_sums.data(),
                                           int(row_weights.size()), head_dim, j0, j1);
            } else {
              for (size_t r = 0; r < runs.size(); ++r) accumulate(r, common, j0, j1);
            }
          }
          // Each run's own rows, run by run (measured: through the rows kernel, each row loading
          // its run's values, about 1.2x slower than this warm, for lack of registers).
          for (size_t r = 0; r < runs.size(); ++r) {
            const DeviceTensor& own = *runs[r].v_cache;
            const float* own_values = own.as<const float>() + g * own.dim(1) * head_dim;
            for (int64_t j0 = shared; j0 < cols; j0 += block) {
              const int64_t j1 = std::min(j0 + block, cols);
              prefetch_rows(own_values + j1 * head_dim, std::min(block, cols - j1), head_dim);
              accumulate(r, own_values, j0, j1);
            }
          }
          for (size_t r = 0; r < runs.size(); ++r) {
            for (int64_t e = 0; e < per_group; ++e) {
              const float inverse = inverse_totals[int64_t(r) * per_group + e];
              if (!runs[r].out->empty()) {
                const float* sum = run_sums(r) + e * head_dim;
                float* out = runs[r].out->as<float>() + (h0 + e) * head_dim;
                for (int64_t d = 0; d < head_dim; ++d) out[d] = sum[d] * inverse;
              }
              if (runs[r].probs) {
                float* p = weights[r] + e * weights_stride[r];
                for (int64_t j = 0; j < cols; ++j) p[j] *= inverse;
              }
            }
          }
        }
      },
      grain_for(runs_count * per_group * cols * head_dim));
}

void attention_visible(const Context& context, const DeviceTensor& logits, int64_t cols,
                       const DeviceTensor* visible, const DeviceTensor& v_cache, DeviceTensor& out,
                       DeviceTensor* probs) {
  // logits is only read here (RunAttention's pointer is the logits op's output).
  const Backend::RunAttention run{.v_cache = &v_cache,
                                  .logits = const_cast<DeviceTensor*>(&logits),
                                  .visible = visible,
                                  .out = &out,
                                  .probs = probs};
  attention_visible_runs(context, std::span(&run, 1), 0, cols);
}

}  // namespace kvlens::cpu_policy
