// Element-wise row kernels of the CPU policy ops: y = alpha * x + beta * y over one row of n F32
// values, with the rounding the axpby_rows contract fixes (backend.h). AVX2/FMA when the CPU has
// it (chosen at run time), portable otherwise; both give the same bits (an FMA is exact either
// way).
#pragma once

#include <cstdint>

namespace kvlens {

// y[j] = alpha * x[j] (beta == 0: y is not read) or fma(alpha, x[j], beta * y[j]), j < n.
using AxpbyRowFn = void (*)(float alpha, const float* x, float beta, float* y, int64_t n);

struct RowKernels {
  AxpbyRowFn axpby = nullptr;
};

// The fastest row kernels this CPU supports (portable ones when allow_simd is false).
RowKernels pick_row_kernels(bool allow_simd);

}  // namespace kvlens
