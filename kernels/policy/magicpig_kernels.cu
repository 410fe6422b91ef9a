// MagicPIG's kernels (magicpig_kernels.cuh). Every value is magicpig_math.h's, the code the CPU
// runs, one thread per value in the CPU's order: the same codes, samples and weights.
#include "engine/policy/magicpig_math.h"
#include "kernels/device_common.cuh"
#include "kernels/policy/magicpig_kernels.cuh"

namespace kvlens::cuda {
namespace {

constexpr int kThreads = 256;

struct Widen {
  template <typename C>
  __device__ float operator()(C v) const {
    return to_f32(v);
  }
};

template <typename C>
__global__ void hash_keys_kernel(HashKeysArgs a) {
  const int64_t span = a.end - a.begin;
  const int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= a.kv_heads * span * a.tables) return;
  const int64_t t = item % a.tables, j = a.begin + (item / a.tables) % span,
                g = item / (a.tables * span);
  const C* key = static_cast<const C*>(a.k_cache) + (g * a.capacity + j) * a.head_dim;
  a.codes[(g * a.code_stride + j) * a.tables + t] =
      simhash_code(key, a.planes, a.head_dim, t, a.bits, Widen{});
}

template <typename C>
__global__ void lsh_sample_kernel(LshSampleArgs a) {
  extern __shared__ float q_codes[];  // [tables]
  __shared__ float q_squared;
  const int64_t h = blockIdx.x, g = h / (a.heads / a.kv_heads), D = a.head_dim;
  const float* q = a.q + h * D;
  const auto same = [](float v) { return v; };
  for (int64_t t = threadIdx.x; t < a.tables; t += blockDim.x)
    q_codes[t] = simhash_code(q, a.planes, D, t, a.bits, same);
  if (threadIdx.x == 0) q_squared = dot_fixed(q, q, D, same);
  __syncthreads();
  uint8_t* v = a.visible.data + h * a.visible.stride;
  float* w = a.log_weights.data + h * a.log_weights.stride;
  float* s = a.scores.data + h * a.scores.stride;
  const C* keys = static_cast<const C*>(a.k_cache) + g * a.capacity * D;
  for (int64_t j = threadIdx.x; j < a.cols; j += blockDim.x) {
    if (j < a.sink_end || j >= a.recent_begin) {
      v[j] = 1, w[j] = 0.0f, s[j] = 1.0f;
      continue;
    }
    const C* key = keys + j * D;
    // k . k with the key widened on both sides: the CPU's dot_fixed(key, key) on F32 keys.
    float k_squared = 0.0f;
    for (int64_t d = 0; d < D; ++d) {
      const float x = to_f32(key[d]);
      k_squared = add_rn(k_squared, mul_rn(x, x));
    }
    const float p = magicpig_probability(
        magicpig_u(dot_fixed(q, key, D, Widen{}), q_squared, k_squared), a.bits, a.tables);
    const bool sampled = code_collisions(q_codes, a.codes + (g * a.code_stride + j) * a.tables,
                                         a.tables) >= kMagicpigCollisions;
    v[j] = sampled ? 1 : 0;
    w[j] = sampled ? magicpig_log_weight(p) : 0.0f;
    s[j] = p;
  }
}

template <typename F>
void dispatch_cache(DType dtype, F&& f) {
  dispatch_weight(dtype, f);
}

}  // namespace

void launch_hash_keys(const HashKeysArgs& args, cudaStream_t stream) {
  const int64_t items = args.kv_heads * (args.end - args.begin) * args.tables;
  if (items <= 0) return;
  const unsigned blocks = unsigned((items + kThreads - 1) / kThreads);
  dispatch_cache(args.cache_dtype, [&](auto c) {
    hash_keys_kernel<decltype(c)><<<blocks, kThreads, 0, stream>>>(args);
  });
}

void launch_lsh_sample(const LshSampleArgs& args, cudaStream_t stream) {
  if (args.heads <= 0 || args.cols <= 0) return;
  const size_t shared = size_t(args.tables) * sizeof(float);
  dispatch_cache(args.cache_dtype, [&](auto c) {
    lsh_sample_kernel<decltype(c)><<<unsigned(args.heads), kThreads, shared, stream>>>(args);
  });
}

}  // namespace kvlens::cuda
