// CPU reference backend extras beyond make_cpu_backend() in engine/backend/backend.h: kernel
// selection (tests run both the SIMD and the portable kernels) and what a given backend ended up
// using. engine/backend/cpu/ holds the CPU backend: this entry point, its ops and its kernels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/host_reduce_group.h"

namespace kvlens {

struct CpuBackendOptions {
  int threads = 0;           // participants in parallel ops, the caller included (0 = all cores)
  bool allow_simd = true;    // false: portable kernels even where AVX2/FMA are present
  bool allow_avx512 = true;  // false: AVX2 kernels even where AVX-512 is present
  // The last-level cache size lockstep_groups assumes (0: the system's, last_level_cache_bytes):
  // tests fix it so that they take the same path everywhere.
  size_t cache_bytes = 0;
  // Rank `rank` of a tensor-parallel group of CPU backends (null: alone), each rank stepped by a
  // thread of its own (engine/session/tensor_parallel_session.h).
  std::shared_ptr<HostReduceGroup> reduce_group;
  int rank = 0;
};

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options);

// A tensor-parallel group of `ranks` CPU backends sharing one HostReduceGroup (rank r at [r]),
// each with `options` (threads: each rank's own).
std::vector<std::unique_ptr<Backend>> make_cpu_backend_group(int ranks, CpuBackendOptions options);

// The CPU backend's lockstep_groups: one group per thread (at most one per run) where the
// layers are small (kSplitLayerBytes each at most) and the groups' passes over all of them fit
// in a last-level cache of `cache_bytes` (0: unknown); otherwise 1. Each group streams every
// layer's weights. For small layers that is cheaper than the threads meeting at every op, whose
// ops are then short (10 runs of the 16 MB demo model, 1.45 MB a layer: 1.5 against 2.0 ms per
// step on 16 threads of a Xeon with 300 MiB of L3; 1.21 against 1.40 ms on the 2-core dev VM).
// For large layers the extra passes cost more than the meetings save, from the cache (10 runs of
// a 200 MB model, 10 MB a layer, 2 threads of that Xeon: about 12% slower) and far more from
// memory (an 800 MB model there: 3x slower on 16 threads).
inline constexpr int64_t kSplitLayerBytes = int64_t(4) << 20;
int64_t cpu_lockstep_groups(int64_t runs, int64_t threads, int64_t layer_weight_bytes,
                            int64_t layers, size_t cache_bytes);

// The matmul/dot kernels `backend` runs ("avx2+fma, avx512f matmul, logits, softmax, avx512bw
// top-k", "avx2+fma" or "generic", say) and its thread count; empty and 0 when `backend` is not
// the CPU backend.
std::string_view cpu_backend_isa(const Backend& backend);
int cpu_backend_threads(const Backend& backend);

}  // namespace kvlens
