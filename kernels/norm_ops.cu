// Elementwise and per-row activation kernels (embed gather, RMSNorm, SiLU * up, add, weight
// widening). Plain grid-stride or block-per-row kernels; F32 activations [rows, width].
#include "kernels/dependent_launch.cuh"
#include "kernels/device_common.cuh"
#include "kernels/norm_ops.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void widen_kernel(const T* src, int64_t count, float* dst) {
  begin_dependent_grid();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = to_f32(src[i]);
}

// One block per output row.
template <typename T>
__global__ void embed_kernel(const T* table, int64_t width, const int32_t* ids, SmallIds small,
                             float* out) {
  begin_dependent_grid();
  const int64_t row = blockIdx.x;
  const int32_t id = ids != nullptr ? ids[row] : small.ids[row];
  const T* src = table + int64_t(id) * width;
  float* dst = out + row * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) dst[i] = to_f32(src[i]);
}

// One block per row: block-wide sum of squares, then scale. Each thread reads and writes the
// same elements after the reduction barrier, so y may alias x. The sum of squares is kept in
// double and the inverse RMS rounded to F32 once, like the CPU reference (which then applies
// (x * inv) * weight in F32, as transformers does), so both agree to an ulp or two.
template <typename T>
__global__ void rmsnorm_kernel(const float* x, const T* weight, int64_t width, float eps,
                               float* y) {
  begin_dependent_grid();
  __shared__ double scratch[32];
  const float* xr = x + int64_t(blockIdx.x) * width;
  float* yr = y + int64_t(blockIdx.x) * width;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) sum += double(xr[i]) * double(xr[i]);
  sum = block_reduce(sum, SumOp{}, 0.0, scratch);
  const float inv = float(1.0 / sqrt(sum / double(width) + double(eps)));
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x)
    yr[i] = (xr[i] * inv) * to_f32(weight[i]);
}

// One block per row: the mean, then the variance around it, in double (two passes, as the CPU
// reference), the inverse deviation rounded to F32 once. y may alias x (each thread rewrites
// only the elements it read, after both reductions).
template <typename T>
__global__ void layer_norm_kernel(const float* x, const T* weight, const T* bias, int64_t width,
                                  float eps, float* y) {
  begin_dependent_grid();
  __shared__ double scratch[32];
  block_layer_norm(x + int64_t(blockIdx.x) * width, y + int64_t(blockIdx.x) * width, width, weight,
                   bias, eps, scratch);
}

template <typename T>
__global__ void bias_activation_kernel(float* x, int64_t count, const T* bias, int64_t width,
                                       int act) {
  begin_dependent_grid();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    // The sum rounded to F32, the activation in double rounded once: the CPU reference's steps.
    x[i] = activation_in_double(x[i] + (bias != nullptr ? to_f32(bias[i % width]) : 0.0f), act);
  }
}

__global__ void silu_mul_kernel(const float* gate, const float* up, int64_t count, float* out) {
  begin_dependent_grid();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    // expf (not __expf): full precision, and expf(large) = inf gives g / inf = -0 for very
    // negative g, the limit of silu.
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t count) {
  begin_dependent_grid();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

}  // namespace

void launch_widen_to_f32(const void* src, DType dtype, int64_t count, float* dst,
                         cudaStream_t stream) {
  if (count <= 0) return;
  dispatch_weight(dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent(widen_kernel<T>, grid_for(count, kThreads), kThreads, 0, stream,
                     static_cast<const T*>(src), count, dst);
  });
}

void launch_embed(const void* table, DType dtype, int64_t width, const int32_t* ids,
                  const SmallIds& small, int64_t rows, float* out, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return;
  dispatch_weight(dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent(embed_kernel<T>, unsigned(rows), kThreads, 0, stream,
                     static_cast<const T*>(table), width, ids, small, out);
  });
}

void launch_rmsnorm(const float* x, const void* weight, DType weight_dtype, int64_t rows,
                    int64_t width, float eps, float* y, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return;
  dispatch_weight(weight_dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent(rmsnorm_kernel<T>, unsigned(rows), kThreads, 0, stream, x,
                     static_cast<const T*>(weight), width, eps, y);
  });
}

__global__ void gelu_tanh_mul_kernel(const float* gate, const float* up, int64_t count,
                                     float* out) {
  begin_dependent_grid();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    // The CPU backend's expression: in double, rounded once, then the F32 product.
    const double v = double(gate[i]);
    const float g = float(0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))));
    out[i] = g * up[i];
  }
}

__global__ void soft_cap_kernel(float* x, int64_t count, float cap) {
  begin_dependent_grid();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (!isinf(x[i])) x[i] = float(tanh(double(x[i] / cap))) * cap;  // -inf: masked, stays
  }
}

void launch_layer_norm(const float* x, const void* weight, const void* bias, DType dtype,
                       int64_t rows, int64_t width, float eps, float* y, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return;
  dispatch_weight(dtype, [&](auto tag) {
    using T = decltype(tag);
    // A wide row (the TokenButler predictor's, 2048 for the 1B shape, one row a decode step)
    // takes a wider block: 8 double loads a thread in a row of 256 threads took 7.5 us.
    const int threads = width >= 2048 ? 1024 : width >= 1024 ? 512 : kThreads;
    launch_dependent(layer_norm_kernel<T>, unsigned(rows), threads, 0, stream, x,
                     static_cast<const T*>(weight), static_cast<const T*>(bias), width, eps, y);
  });
}

void launch_bias_activation(float* x, int64_t count, const void* bias, DType bias_dtype,
                            int64_t width, int act, cudaStream_t stream) {
  if (count <= 0) return;
  dispatch_weight(bias_dtype, [&](auto tag) {
    using T = decltype(tag);
    launch_dependent(bias_activation_kernel<T>, grid_for(count, kThreads), kThreads, 0, stream, x,
                     count, static_cast<const T*>(bias), width, act);
  });
}

void launch_silu_mul(const float* gate, const float* up, int64_t count, float* out,
                     cudaStream_t stream) {
  if (count <= 0) return;
  launch_dependent(silu_mul_kernel, grid_for(count, kThreads), kThreads, 0, stream, gate, up, count,
                   out);
}

void launch_gelu_tanh_mul(const float* gate, const float* up, int64_t count, float* out,
                          cudaStream_t stream) {
  if (count <= 0) return;
  launch_dependent(gelu_tanh_mul_kernel, grid_for(count, kThreads), kThreads, 0, stream, gate, up,
                   count, out);
}

void launch_soft_cap(float* x, int64_t count, float cap, cudaStream_t stream) {
  if (count <= 0) return;
  launch_dependent(soft_cap_kernel, grid_for(count, kThreads), kThreads, 0, stream, x, count, cap);
}

void launch_add_inplace(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  launch_dependent(add_kernel, grid_for(count, kThreads), kThreads, 0, stream, x, y, count);
}

}  // namespace kvlens::cuda
