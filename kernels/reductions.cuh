// Row reductions over logits of the CUDA backend: argmax (ties to the lower index) and the
// log-softmax value of a target column. x is F32 [rows, cols] row-major.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvlens::cuda {

// out[r] = argmax_j x[r, j]; out in device memory.
void launch_argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out,
                        cudaStream_t stream);
// out[r] = x[r, t] - logsumexp(x[r, :]) with t = targets[r] (checked by the caller), the sum of
// exponentials accumulated in double. targets and out in device memory.
void launch_log_prob_rows(const float* x, int64_t rows, int64_t cols, const int32_t* targets,
                          double* out, cudaStream_t stream);

// counts[r] = how many of x[r, 0:cols] are NaN or infinite (x rows `stride` apart; counts in
// device memory). One block per row.
void launch_count_nonfinite_rows(const float* x, int64_t rows, int64_t stride, int64_t cols,
                                 int64_t* counts, cudaStream_t stream);

}  // namespace kvlens::cuda
