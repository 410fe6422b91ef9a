// Rotary position embedding (rotate-half convention, as in Hugging Face Llama) of the CUDA
// backend, in place on x[rows, heads, head_dim] (and x2[rows, heads2, head_dim], the keys with
// the queries, in the same launch): the first rotary_dim channels of each head are rotated with
// inv_freq[rotary_dim / 2] (F32), the others pass through (phi3 partial rotary).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvlens::cuda {

// Row r sits at positions[r] (device memory); with positions null at *step_position (device
// memory: a captured step, every row at the step's position) or, with that null too, at
// first_position + r * position_stride. cos and sin are multiplied by `scale` (F32) first.
// x2 may be null (heads2 ignored).
void launch_rope(float* x, int64_t heads, float* x2, int64_t heads2, int64_t rows, int64_t head_dim,
                 int64_t rotary_dim, const int64_t* positions, int64_t first_position,
                 int64_t position_stride, const int64_t* step_position, const float* inv_freq,
                 float scale, cudaStream_t stream);

}  // namespace kvlens::cuda
