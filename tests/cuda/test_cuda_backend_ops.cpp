// Every backend op of the shared table (tests/support/backend_op_table.h), core ops and the
// policies' op extensions (registered by the suite's main: register_cuda_policy_ops), on the
// CUDA backend against the generic CPU backend, each within its entry's tolerance.
#include <catch2/catch.hpp>

#include <memory>
#include <string>

#include "engine/backend/cpu/cpu_backend.h"
#include "kernels/cuda_backend.h"
#include "kernels/gemv_mma.cuh"
#include "tests/support/backend_op_table.h"

using namespace kvlens;

TEST_CASE(
    "cuda backend ops: the CUDA backend against the generic CPU backend, every op of the table",
    "[cuda]") {
  CpuBackendOptions options;
  options.threads = 2;
  options.allow_simd = false;
  const auto reference = make_cpu_backend(options);
  const auto gpu = make_cuda_backend(0);
  for (const test::OpEntry& entry : test::backend_op_table()) {
    INFO(entry.name);
    test::check_op_entry(entry, *reference, *gpu);
  }
}

TEST_CASE("cuda backend ops: every product of the table on the tensor cores", "[cuda]") {
  // The tensor cores are off by default (gemv_mma.cuh); here every BF16 product takes them,
  // against the same CPU reference and tolerance as the CUDA-core kernels.
  CpuBackendOptions options;
  options.threads = 2;
  options.allow_simd = false;
  const auto reference = make_cpu_backend(options);
  const auto gpu = make_cuda_backend(0);
  const cuda::GemvMmaScope default_scope = cuda::gemv_mma_scope();
  cuda::set_gemv_mma_scope(cuda::GemvMmaScope::All);
  size_t products = 0;
  for (const test::OpEntry& entry : test::backend_op_table()) {
    const bool product = entry.name.find("matmul") != std::string::npos ||
                         entry.name.find("gate_up") != std::string::npos;
    if (!product || entry.name.find("BF16") == std::string::npos) continue;
    INFO(entry.name);
    test::check_op_entry(entry, *reference, *gpu);
    ++products;
  }
  cuda::set_gemv_mma_scope(default_scope);
  CHECK(products >= 10);
}
