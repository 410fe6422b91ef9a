// The budget rule, the always-visible columns and the common knobs shared by every policy, and
// the widening of row buffers when the session's caches grow.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/policy/policy.h"

namespace kvlens {

int64_t CommonKnobs::budget(int64_t step) const {
  const int64_t candidates = step + 1;
  int64_t b = 0;
  if (budget_tokens > 0) {
    b = budget_tokens;
  } else {
    // (1 - s) * (t + 1) is often an integer computed with a rounding error above it (0.7 * 10 =
    // 7.000000000000001); without the slack ceil would keep one token more than the rule says.
    b = int64_t(std::ceil((1.0 - sparsity) * double(candidates) - 1e-9));
  }
  b = std::max(b, min_keep);
  if (budget_excludes_sinks) b += std::min(sinks, candidates);
  return std::clamp<int64_t>(b, 1, candidates);
}

int64_t CommonKnobs::budget(const LayerStep& step) const {
  return budget(step.candidates() - 1);
}

ForcedColumns forced_columns(int64_t step, int64_t budget, int64_t sinks, int64_t window) {
  int64_t remaining = std::max<int64_t>(budget, 1) - 1;  // the current token always stays
  ForcedColumns forced;
  forced.sink_end = std::min({sinks, step, remaining});
  remaining -= forced.sink_end;
  // `window` counts the current token, so it adds window - 1 earlier ones.
  const int64_t earlier =
      std::max<int64_t>(0, std::min({window - 1, step - forced.sink_end, remaining}));
  forced.recent_begin = step - earlier;
  return forced;
}

std::vector<ParamSpec> common_param_specs() {
  const double inf = std::numeric_limits<double>::infinity();
  return {
      {"sinks", ParamType::Int, "First tokens always visible (attention sinks)", "4", 0, inf, {}},
      {"window",
       ParamType::Int,
       "Most recent tokens always visible, the current one included (0 = only the current one)",
       "0",
       0,
       inf,
       {}},
      {"dense_layers",
       ParamType::Int,
       "The first layers are left dense (layer 0 in the paper)",
       "1",
       0,
       inf,
       {}},
      {"granularity",
       ParamType::Choice,
       "query_head: each query head selects; kv_head: one selection per KV group, scores summed "
       "over the group (the setting that really saves memory)",
       "query_head",
       -inf,
       inf,
       {"query_head", "kv_head"}},
      {"budget_tokens",
       ParamType::Int,
       "Fixed budget of K visible tokens per head instead of the sparsity fraction (0 = off)",
       "0",
       0,
       inf,
       {}},
      {"min_keep", ParamType::Int, "Smallest budget B(t) at any step", "1", 1, inf, {}},
      {"budget_excludes_sinks",
       ParamType::Bool,
       "Add the sinks on top of the budget (the TokenButler code's accounting)",
       "false",
       -inf,
       inf,
       {}},
  };
}

CommonKnobs read_common_knobs(const ParamValues& values, double sparsity) {
  if (!(sparsity >= 0.0 && sparsity < 1.0)) {
    throw Error("policy", "sparsity", "a number in [0, 1)", std::to_string(sparsity));
  }
  CommonKnobs knobs;
  knobs.sparsity = sparsity;
  knobs.sinks = values.get_int("sinks");
  knobs.window = values.get_int("window");
  knobs.dense_layers = values.get_int("dense_layers");
  knobs.kv_head_granularity = values.get_choice("granularity") == "kv_head";
  knobs.budget_tokens = values.get_int("budget_tokens");
  knobs.min_keep = values.get_int("min_keep");
  knobs.budget_excludes_sinks = values.get_bool("budget_excludes_sinks");
  return knobs;
}

void copy_columns(Backend& backend, const DeviceTensor& src, DeviceTensor& dst) {
  const int64_t rows = src.dim(0), cols = src.dim(1), stride = dst.dim(1);
  if (src.dtype != dst.dtype || dst.dim(0) != rows || stride < cols ||
      (src.dtype != DType::F32 && src.dtype != DType::U8)) {
    throw Error("policy", "copy_columns", "F32 or U8 [R, S] into [R, S' >= S] of the same dtype",
                std::to_string(rows) + " x " + std::to_string(cols) + " into " +
                    std::to_string(dst.dim(0)) + " x " + std::to_string(stride));
  }
  if (rows * cols == 0) return;
  // Row by row, as runs of `cols` one-element rows: the destination's rows are `stride` apart.
  for (int64_t r = 0; r < rows; ++r) backend.copy_rows(src, r * cols, dst, r * stride, cols, 1);
}

DeviceTensor widen_columns(Backend& backend, const DeviceTensor& rows, int64_t stride,
                           uint8_t fill) {
  if (rows.empty() || stride <= rows.dim(1)) return rows;
  DeviceTensor grown = backend.alloc(rows.dtype, {rows.dim(0), stride});
  if (rows.dtype == DType::U8 && fill != 0) backend.fill_columns(grown, rows.dim(1), stride, fill);
  copy_columns(backend, rows, grown);
  return grown;
}

DeviceTensor widen_middle(Backend& backend, const DeviceTensor& blocks, int64_t rows) {
  if (blocks.empty() || rows <= blocks.dim(1)) return blocks;
  const int64_t B = blocks.dim(0), N = blocks.dim(1), W = blocks.dim(2);
  DeviceTensor grown = backend.alloc(DType::F32, {B, rows, W});
  for (int64_t b = 0; b < B; ++b) backend.copy_rows(blocks, b * N, grown, b * rows, N, W);
  return grown;
}

int64_t tensor_bytes(const std::vector<DeviceTensor>& tensors) {
  int64_t bytes = 0;
  for (const DeviceTensor& t : tensors) {
    if (!t.empty()) bytes += int64_t(t.bytes());
  }
  return bytes;
}

}  // namespace kvlens
