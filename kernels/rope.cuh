// Rotary position embedding (rotate-half convention, as in Hugging Face Llama) of the CUDA
// backend, in place on x[rows, heads, head_dim] with inv_freq[head_dim / 2] (F32).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvlens::cuda {

// positions[rows] in device memory.
void launch_rope(float* x, int64_t rows, int64_t heads, int64_t head_dim, const int64_t* positions,
                 const float* inv_freq, cudaStream_t stream);

}  // namespace kvlens::cuda
