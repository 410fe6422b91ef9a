// Quest's page kernels of the CPU backend, one query head or one selection row at a time: the
// page bounds of page_bounds and each page's best score and cost for select_pages (contracts in
// engine/policy/quest_ops.h and backend.h). Page summaries are [pages, head_dim] rows of channel
// minima and maxima. The portable kernels and the AVX2 ones give the same bits; pick_dot_kernels
// chooses.
#pragma once

#include <cstdint>

namespace kvlens {

// bounds[p] = page_bound(q, lows + p * head_dim, highs + p * head_dim, head_dim, max_only, scale)
// (policy_op_math.h) for p < pages: each page's sum in channel order.
using PageBoundsFn = void (*)(const float* q, const float* lows, const float* highs, int64_t pages,
                              int64_t head_dim, bool max_only, float scale, float* bounds);
// For the pages of page_size columns covering [0, cols) (the last may be short): best[p] = the
// fmax of the page's scores (NaN only when all of them are; the sign of a zero maximum is
// unspecified) and cost[p] = how many of its columns have chosen[j] == 0.
using PageBestFn = void (*)(const float* scores, const uint8_t* chosen, int64_t cols,
                            int64_t page_size, float* best, int32_t* cost);

void page_bounds_generic(const float* q, const float* lows, const float* highs, int64_t pages,
                         int64_t head_dim, bool max_only, float scale, float* bounds);
void page_best_generic(const float* scores, const uint8_t* chosen, int64_t cols, int64_t page_size,
                       float* best, int32_t* cost);
// Only on x86 builds, and only to be called where the CPU has AVX2.
void page_bounds_avx2(const float* q, const float* lows, const float* highs, int64_t pages,
                      int64_t head_dim, bool max_only, float scale, float* bounds);
void page_best_avx2(const float* scores, const uint8_t* chosen, int64_t cols, int64_t page_size,
                    float* best, int32_t* cost);

}  // namespace kvlens
