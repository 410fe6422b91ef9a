// The memory estimate kvlens-cli info prints and the check against MemAvailable (issue 27 item
// 3), with injected figures.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

#include "engine/common/error.h"
#include "engine/model/model.h"
#include "engine/session/memory_estimate.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;

TEST_CASE("memory estimate of a tiny checkpoint per backend and per 1k tokens", "[memory]") {
  test::TinyLlamaSpec spec;  // 2 layers, 4 heads, 2 KV heads, head_dim 8, hidden 32, F32
  spec.dtype = "BF16";
  spec.predictor = false;
  const std::string dir = test::write_tiny_llama(test::make_temp_dir("memory"), spec);
  const auto model = Model::load(dir);
  const MemoryEstimate e = estimate_memory(*model);
  int64_t matrices = 0, vectors = 0;
  for (const std::string& name : model->weights.files->names()) {
    const TensorView t = model->weights.files->tensor(name);
    (t.shape.size() == 2 ? matrices : vectors) += t.numel();
  }
  REQUIRE(e.mapped_bytes == 2 * (matrices + vectors));
  REQUIRE(e.cuda_weight_bytes == e.mapped_bytes);
  REQUIRE(e.cpu_weight_bytes == 2 * matrices);  // BF16 panels; nothing widened
  REQUIRE(e.kv_cache_per_1k == 2 * 2 * 2 * 8 * 4 * 1024);
  // The CUDA cache is in the weights' dtype, BF16 here.
  REQUIRE(e.cuda_kv_cache_per_1k == e.kv_cache_per_1k / 2);
  REQUIRE(e.policy_rows_per_1k == ((2 + 2) * 4 + 2) * 4 * 1024);
  REQUIRE(e.trace_step_rows_at_1k == 2 * 4 * 9 * 1024);
  // 300 tokens: caches of 512 positions.
  REQUIRE(e.cpu_session_bytes(300, 3, true) ==
          e.cpu_weight_bytes + 3 * (e.kv_cache_per_1k + 2 * e.policy_rows_per_1k) / 2);

  spec.dtype = "F16";
  const auto f16 = Model::load(test::write_tiny_llama(test::make_temp_dir("memory"), spec));
  REQUIRE(estimate_memory(*f16).cpu_weight_bytes == 4 * (matrices + vectors) + 4 * matrices);
}

TEST_CASE("asking for more memory than is available is an error naming both figures", "[memory]") {
  const std::string dir = test::make_temp_dir("meminfo");
  test::write_file(dir + "/meminfo",
                   "MemTotal:       24000000 kB\nMemFree:         1000 kB\n"
                   "MemAvailable:    2097152 kB\nBuffers: 0 kB\n");
  REQUIRE(available_memory_bytes(dir + "/meminfo") == 2097152ll * 1024);
  REQUIRE(available_memory_bytes(dir + "/missing") == -1);
  REQUIRE_NOTHROW(require_memory(int64_t(1) << 30, int64_t(2) << 30, "--context"));
  REQUIRE_NOTHROW(require_memory(int64_t(1) << 40, -1, "--context"));  // unknown: no check
  try {
    require_memory((int64_t(3) << 30) + 1, int64_t(2) << 30, "--context");
    FAIL("no error");
  } catch (const Error& error) {
    const std::string message = error.what();
    INFO(message);
    REQUIRE(error.file() == "memory");
    REQUIRE(error.field() == "--context");
    REQUIRE(message.find("2048 MiB") != std::string::npos);
    REQUIRE(message.find("3073 MiB needed") != std::string::npos);
  }
}
