// The CPU backend's kernel set: the attention kernels (logits, softmax weights, weighted value
// sum) of one query row of one head over a KV cache [capacity, head_dim], and the matmul, policy
// row and top-k kernels of their own files. AVX2/FMA when the CPU has it, and AVX-512 matmul
// kernels where it has that too (chosen at run time, so the binary stays portable), portable
// loops otherwise; every set gives the same bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_matmul.h"
#include "engine/backend/cpu/cpu_page_kernels.h"
#include "engine/backend/cpu/cpu_row_kernels.h"
#include "engine/backend/cpu/cpu_top_k.h"
#include "engine/common/dtype.h"

namespace kvlens {

// The attention kernels. Both the attention op and the policy path (attention_logits +
// attention_visible) run exactly these functions of one kernel set, so they agree bit for bit.
// Every output has one fixed order of operations that depends only on its own inputs and the
// absolute column indices j: never on the range passed, on how many query heads share a call, on
// the thread or the head. Adding a weight of exactly 0 changes no bit, so a range that also covers
// columns of weight 0 (outside a window, hidden) gives the same result.
//
// Logits of nq query rows q_i = q + i * q_stride that read the same keys (the query heads of one
// KV head: each key row is loaded once for all of them): row_i[j] = (q_i . keys[j * head_dim ...])
// * scale for j in [lo, hi] and -inf for j in [0, lo), row_i = row + i * row_stride. Each dot sums
// lanes d mod 8, folds them as ((l0 + l2) + (l1 + l3)) + ((l4 + l6) + (l5 + l7)), then adds the
// last head_dim % 8 products in order; the product with scale is rounded separately.
using AttentionLogitsFn = void (*)(const float* q, int64_t q_stride, int nq, const float* keys,
                                   int64_t head_dim, int64_t lo, int64_t hi, float scale,
                                   float* row, int64_t row_stride);
// Softmax numerators over columns [begin, end) of one logits row: with m = the largest logits[j]
// among visible columns (visible null: every column; NaN logits are passed over),
// weights[j] = exp(logits[j] - m) for visible j (exactly 0 for a -inf logit, exactly 1 at the
// max) and 0 for hidden j. Returns their sum (lanes j mod 8 in ascending j, folded as
// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))), which is >= 1, or 0 when no visible logit is
// finite (then every weight is 0). exp is accurate to about 1 ulp.
using SoftmaxWeightsFn = float (*)(const float* logits, const uint8_t* visible, int64_t begin,
                                   int64_t end, float* weights);
// One query row's logits at the listed columns only: row[columns[c]] = the logit
// attention_logits of the same set gives for key columns[c] (the same operations), c < count;
// nothing else of row is written. For a policy's visible set chosen before the logits.
using AttentionLogitsAtFn = void (*)(const float* q, const float* keys, int64_t head_dim,
                                     const int32_t* columns, int64_t count, float scale,
                                     float* row);
// The columns j in [begin, end) with visible[j] != 0, ascending, into columns (room for
// end - begin); returns how many.
using VisibleColumnsFn = int64_t (*)(const uint8_t* visible, int64_t begin, int64_t end,
                                     int32_t* columns);
// For nq weight rows w_i = weights + i * weights_stride over the same values [capacity,
// head_dim]: out_i[d] = (sum of w_i[j] * values[j * head_dim + d] over j in [begin, end)) *
// scales[i], out_i = out + i * out_stride, d < head_dim: one sum per output, j ascending, then
// one product with the scale. Columns of weight 0 are skipped (so values behind hidden columns,
// even inf or NaN, never reach the output; a row of zero weights with scale 0 gives zeros).
using WeightedValuesFn = void (*)(const float* weights, int64_t weights_stride, int nq,
                                  const float* values, int64_t head_dim, int64_t begin, int64_t end,
                                  const float* scales, float* out, int64_t out_stride);
// The same sums without the scale, continued from sums_i = sums + i * sums_stride (the same
// operations in the same order, so a range cut into pieces, each continuing the last one's sums,
// gives weighted_values' sums before the product with the scale, bit for bit).
using WeightedValuesAccumulateFn = void (*)(const float* weights, int64_t weights_stride, int nq,
                                            const float* values, int64_t head_dim, int64_t begin,
                                            int64_t end, float* sums, int64_t sums_stride);

// weighted_values_accumulate for `rows` weight rows over the same values, each with its own
// sums (the query heads of several runs over their common cache rows: each key's values are
// read once for all): sums[i][d] continued with weights[i][j] * values[j * head_dim + d] over j
// in [begin, end), the same operations per output as weighted_values_accumulate, so the same
// bits. Only in the AVX-512 set, for head_dim a multiple of 16 (null otherwise).
using WeightedValuesRowsFn = void (*)(const float* const* weights, const float* values,
                                      float* const* sums, int rows, int64_t head_dim, int64_t begin,
                                      int64_t end);

// out[j] = SiLU(gate[j]) * up[j] for j < n, as (g >= 0 ? g : g * e) / (1 + e) * up[j] with
// e = exp(-|g|): g / (1 + exp(-g)) * up rearranged so that exp never overflows. The AVX2 kernel's
// exp is the softmax's (about 1 ulp), the portable one's std::exp.
using SiluMulFn = void (*)(const float* gate, const float* up, float* out, int64_t n);

struct DotKernels {
  const char* isa = "generic";                       // set by pick_dot_kernels
  PanelMatmulFn matmul_f32 = nullptr;                // matmul over F32 weight panels (cpu_matmul.h)
  PanelMatmulFn matmul_bf16 = nullptr;               // and over BF16 ones
  PanelCallLimits matmul_limits = kAvx2PanelLimits;  // the shapes one call of them takes
  AttentionLogitsFn attention_logits = nullptr;
  AttentionLogitsAtFn attention_logits_at = nullptr;
  VisibleColumnsFn visible_columns = nullptr;
  SoftmaxWeightsFn softmax_weights = nullptr;
  WeightedValuesFn weighted_values = nullptr;
  WeightedValuesAccumulateFn weighted_values_accumulate = nullptr;
  WeightedValuesRowsFn weighted_values_rows = nullptr;
  SiluMulFn silu_mul = nullptr;
  AxpbyRowFn axpby = nullptr;  // the policy ops' element-wise row kernel (cpu_row_kernels.h)
  SquaredNormsFn squared_norms = nullptr;  // key_anchor_scores' lengths (cpu_row_kernels.h)
  TopKRowFn top_k = nullptr;               // select_top_k's row kernel (cpu_top_k.h)
  // Quest's page_bounds and select_pages row kernels (cpu_page_kernels.h).
  PageBoundsFn page_bounds = nullptr;
  PageBestFn page_best = nullptr;
};

// The fastest kernel set this CPU supports: portable ones when allow_simd is false, the AVX2 ones
// when allow_avx512 is false (benchmarks and tests compare the sets).
DotKernels pick_dot_kernels(bool allow_simd, bool allow_avx512 = true);

}  // namespace kvlens
