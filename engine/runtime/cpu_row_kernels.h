// Element-wise row kernels of the CPU policy ops: y = alpha * x + beta * y over one row of n F32
// values, with the rounding the axpby_rows contract fixes (backend.h). pick_dot_kernels puts the
// AVX2/FMA one or the portable one in the backend's kernel set; both give the same bits (an FMA
// is exact either way).
#pragma once

#include <cstdint>

namespace kvlens {

// y[j] = alpha * x[j] (beta == 0: y is not read) or fma(alpha, x[j], beta * y[j]), j < n.
using AxpbyRowFn = void (*)(float alpha, const float* x, float beta, float* y, int64_t n);

void axpby_row_generic(float alpha, const float* x, float beta, float* y, int64_t n);
// Only on x86 builds, and only to be called where the CPU has AVX2 and FMA.
void axpby_row_avx2(float alpha, const float* x, float beta, float* y, int64_t n);

}  // namespace kvlens
