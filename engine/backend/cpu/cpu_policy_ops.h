// The CPU backend's token-selection (policy) ops, the contracts of which are in backend.h. The
// CpuBackend overrides (cpu_backend.cpp) forward here with its thread pool and dot kernel.
// Internal header of the CPU backend.
#pragma once

#include <cstdint>
#include <span>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_dot_kernels.h"
#include "engine/backend/thread_pool.h"

// A policy op's loop compiled twice, for AVX2 (without FMA) and for the baseline, the copy
// chosen once by the CPU (an ifunc). The loops are element-wise or keep their own lane order,
// and without FMA the compiler contracts no multiply-add, so both copies give the same bits.
// KVLENS_POLICY_CLONES_V4 adds an x86-64-v4 (AVX-512) copy for integer loops that need 64-bit
// multiplies in vectors (random_rows' hash: about 4x faster than its AVX2 copy); such a loop has
// no floating-point operation that FMA could contract.
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && defined(__ELF__)
#define KVLENS_POLICY_CLONES __attribute__((target_clones("avx2", "default")))
#define KVLENS_POLICY_CLONES_V4 __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define KVLENS_POLICY_CLONES
#define KVLENS_POLICY_CLONES_V4
#endif

namespace kvlens::cpu_policy {

struct Context {
  ThreadPool& pool;
  // The attention op's own kernel set (logits, softmax, value sum), so both agree bit for bit,
  // and the axpby row kernel.
  const DotKernels& kernels;
};

// The thread pool and kernel set of `backend`, a CPU backend (cpu_backend.cpp), for the policies'
// op extensions on the CPU (engine/policy/*_ops_cpu.cpp); valid while the backend is. Throws
// kvlens::Error when `backend` is not the CPU backend.
Context context_of(Backend& backend);

void attention_logits(const Context& context, const DeviceTensor& q, const DeviceTensor& k_cache,
                      int64_t position, int64_t window, DeviceTensor& logits);
void attention_visible(const Context& context, const DeviceTensor& logits, int64_t cols,
                       const DeviceTensor* visible, const DeviceTensor& v_cache, DeviceTensor& out,
                       DeviceTensor* probs);
void attention_logits_runs(const Context& context, std::span<const Backend::RunAttention> runs,
                           int64_t shared, int64_t position, int64_t window);
void attention_visible_runs(const Context& context, std::span<const Backend::RunAttention> runs,
                            int64_t shared, int64_t cols);
void select_top_k(const Context& context, const DeviceTensor& scores, int64_t cols,
                  const DeviceTensor* eligible, int64_t k, DeviceTensor& selected);
void fill_columns(DeviceTensor& mask, int64_t begin, int64_t end, uint8_t value);
void mask_and(DeviceTensor& mask, const DeviceTensor& other, int64_t cols);
void count_nonzero_rows(const DeviceTensor& mask, int64_t cols, std::span<int64_t> counts);
void accumulate_rows(DeviceTensor& acc, const DeviceTensor& x, const DeviceTensor* keep,
                     int64_t cols);
void sum_row_groups(const DeviceTensor& x, int64_t cols, int64_t group, DeviceTensor& out);
void expand_row_groups(const DeviceTensor& mask, int64_t cols, int64_t group, DeviceTensor& out);
void random_rows(uint64_t seed, uint64_t stream, int64_t cols, DeviceTensor& out);
void axpby_rows(const Context& context, DeviceTensor& y, float alpha, const DeviceTensor& x,
                float beta, int64_t cols);
void pool_rows(const DeviceTensor& x, int64_t cols, Backend::Pool pool, int64_t kernel,
               DeviceTensor& out);
void select_pages(const Context& context, const DeviceTensor& scores, int64_t cols,
                  int64_t page_size, int64_t k, DeviceTensor& selected);
void zero_unless(DeviceTensor& rows, const DeviceTensor& keep);

}  // namespace kvlens::cpu_policy
