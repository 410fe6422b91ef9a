// CPU reference backend extras beyond make_cpu_backend() in backend.h: kernel selection (tests
// run both the SIMD and the portable kernels) and what a given backend ended up using.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "engine/runtime/backend.h"

namespace kvlens {

struct CpuBackendOptions {
  int threads = 0;           // participants in parallel ops, the caller included (0 = all cores)
  bool allow_simd = true;    // false: portable kernels even where AVX2/FMA are present
  bool allow_avx512 = true;  // false: AVX2 kernels even where AVX-512 is present
  // The last-level cache size lockstep_groups assumes (0: the system's, last_level_cache_bytes):
  // tests fix it so that they take the same path everywhere.
  size_t cache_bytes = 0;
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

// The CPU backend's lockstep_groups: one group per thread (at most one per run), when those
// groups' passes over `layer_weight_bytes` of layer weights all fit in a last-level cache of
// `cache_bytes` (0: unknown); otherwise 1. Each group streams every layer's weights: served from
// the cache that is cheaper than the threads meeting at every op (10 runs of the 16 MB demo model:
// 1.5 against 2.0 ms per step on 16 threads of a Xeon), but from memory it multiplies the
// traffic (10 runs of an 800 MB model there: 75 against 26 ms).
int64_t cpu_lockstep_groups(int64_t runs, int64_t threads, int64_t layer_weight_bytes,
                            size_t cache_bytes);

// The matmul/dot kernels `backend` runs ("avx2+fma, avx512f matmul, logits, softmax, avx512bw
// top-k", "avx2+fma" or "generic", say) and its thread count; empty and 0 when `backend` is not
// the CPU backend.
std::string_view cpu_backend_isa(const Backend& backend);
int cpu_backend_threads(const Backend& backend);

}  // namespace kvlens
