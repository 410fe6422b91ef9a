// cuBLAS SGEMM for y[n, out] = x[n, in] * w[out, in]^T with row-major F32 operands (y's rows
// y_stride apart, so a slice of the output features can be written in place).
// cuBLAS is column-major: a row-major [r, c] matrix is the column-major [c, r] matrix, i.e. its
// transpose. So we compute y^T[out, n] = w[out, in] * x^T[in, n] in column-major terms, where w
// is seen as column-major [in, out] (hence op T) and x as column-major [in, n] (op N).
#include "kernels/matmul.cuh"

namespace kvlens::cuda {

cublasStatus_t sgemm_x_wt(cublasHandle_t handle, const float* x, const float* w, float* y,
                          int64_t n, int64_t in, int64_t out, int64_t y_stride) {
  const float alpha = 1.0f;
  const float beta = 0.0f;
  return cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, int(out), int(n), int(in), &alpha, w,
                     int(in), x, int(in), &beta, y, int(y_stride));
}

}  // namespace kvlens::cuda
