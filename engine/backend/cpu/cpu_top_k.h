// The CPU backend's top-k row kernel (select_top_k's contract in backend.h, one row): among the
// candidate columns j < cols (chosen[j] == 0, and allowed[j] != 0 when allowed is given) sets
// chosen[j] = 1 for the k largest scores in top_k_key's order (ties to the higher column, NaN
// lowest); all candidates when there are no more than k. The portable, AVX2 and AVX-512 kernels
// choose the same set; pick_dot_kernels puts one of them in the backend's kernel set.
#pragma once

#include <cstdint>

namespace kvlens {

using TopKRowFn = void (*)(const float* scores, const uint8_t* allowed, int64_t cols, int64_t k,
                           uint8_t* chosen);

void top_k_row_generic(const float* scores, const uint8_t* allowed, int64_t cols, int64_t k,
                       uint8_t* chosen);
// Only on x86 builds, and only to be called where the CPU has AVX2.
void top_k_row_avx2(const float* scores, const uint8_t* allowed, int64_t cols, int64_t k,
                    uint8_t* chosen);
// Only on x86 builds, and only where cpu_has_avx512_top_k() (AVX-512 F, BW and VL).
void top_k_row_avx512(const float* scores, const uint8_t* allowed, int64_t cols, int64_t k,
                      uint8_t* chosen);
bool cpu_has_avx512_top_k();

}  // namespace kvlens
