// Row kernels of the CPU policy ops: y = alpha * x + beta * y over one row of n F32 values, with
// the rounding the axpby_rows contract fixes (backend.h), and the squared lengths of rows (keys
// [count, dim] -> out[count]). pick_dot_kernels puts the AVX2 ones or the portable ones in the
// backend's kernel set; both give the same bits (an FMA is exact either way, and the lengths add
// in one fixed order).
#pragma once

#include <cstdint>

namespace kvlens {

// y[j] = alpha * x[j] (beta == 0: y is not read) or fma(alpha, x[j], beta * y[j]), j < n.
using AxpbyRowFn = void (*)(float alpha, const float* x, float beta, float* y, int64_t n);

void axpby_row_generic(float alpha, const float* x, float beta, float* y, int64_t n);
// Only on x86 builds, and only to be called where the CPU has AVX2 and FMA.
void axpby_row_avx2(float alpha, const float* x, float beta, float* y, int64_t n);

// out[i] = the squared length of rows[i * dim, (i + 1) * dim), i < count: products rounded, then
// added in 8 lanes (lane l: the elements d = l mod 8 of the whole blocks of 8, in ascending d),
// the lanes folded as ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)), then the last dim % 8
// products added in order (key_anchor_scores' key and anchor lengths).
using SquaredNormsFn = void (*)(const float* rows, int64_t count, int64_t dim, float* out);

void squared_norms_generic(const float* rows, int64_t count, int64_t dim, float* out);
// Only on x86 builds, and only to be called where the CPU has AVX2.
void squared_norms_avx2(const float* rows, int64_t count, int64_t dim, float* out);

}  // namespace kvlens
