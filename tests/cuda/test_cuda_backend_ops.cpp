// Every backend op of the shared table (tests/support/backend_op_table.h), core ops and the
// policies' op extensions (registered by the suite's main: register_cuda_policy_ops), on the
// CUDA backend against the generic CPU backend, each within its entry's tolerance.
#include <catch2/catch.hpp>

#include <memory>

#include "engine/backend/cpu/cpu_backend.h"
#include "kernels/cuda_backend.h"
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
