// CPU reference backend extras beyond make_cpu_backend() in backend.h: kernel selection (tests
// run both the SIMD and the portable kernels) and what a given backend ended up using.
#pragma once

#include <memory>
#include <string_view>

#include "engine/runtime/backend.h"

namespace kvlens {

struct CpuBackendOptions {
  int threads = 0;           // participants in parallel ops, the caller included (0 = all cores)
  bool allow_simd = true;    // false: portable kernels even where AVX2/FMA are present
  bool allow_avx512 = true;  // false: AVX2 kernels even where AVX-512 is present
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

// The matmul/dot kernels `backend` runs ("avx2+fma, avx512f matmul, logits, softmax, avx512bw
// top-k", "avx2+fma" or "generic", say) and its thread count; empty and 0 when `backend` is not
// the CPU backend.
std::string_view cpu_backend_isa(const Backend& backend);
int cpu_backend_threads(const Backend& backend);

}  // namespace kvlens
