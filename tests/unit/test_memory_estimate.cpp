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

TEST_CASE("GPU memory of a tensor-parallel split, and the fewest GPUs that hold a model",
          "[memory]") {
  // 3 layers, 8 heads, 2 KV heads, MLP 172, hidden 64, F32.
  const auto model = Model::load(test::source_path("tests/fixtures/llama-gqa-f32"));
  const MemoryEstimate e = estimate_memory(*model);
  const ModelConfig& c = model->config;
  const int64_t E = c.hidden_size, D = c.head_dim, L = c.num_layers;
  // q and o: H * D x E each; gate, up, down: F x E each; k and v: G * D x E each (F32).
  CHECK(e.cuda_split_bytes == L * 4 * (2 * c.num_heads * D * E + 3 * c.intermediate_size * E));
  CHECK(e.cuda_kv_proj_bytes == L * 4 * 2 * c.num_kv_heads * D * E);
  const int64_t whole = e.cuda_weight_bytes - e.cuda_split_bytes - e.cuda_kv_proj_bytes;
  CHECK(whole > 0);  // embeddings, lm_head and norms stay whole on every GPU
  // 300 positions: caches of 512 (they double from 256).
  const int64_t cache = e.cuda_kv_cache_per_1k / 2;
  CHECK(e.cuda_bytes_per_gpu(1, 300) == e.cuda_weight_bytes + cache);
  CHECK(e.cuda_bytes_per_gpu(2, 300) ==
        whole + e.cuda_split_bytes / 2 + e.cuda_kv_proj_bytes / 2 + cache / 2);
  // 4 ranks over 2 KV heads: each KV head (its products and cache) on 2 GPUs.
  CHECK(e.cuda_bytes_per_gpu(4, 300) ==
        whole + e.cuda_split_bytes / 4 + e.cuda_kv_proj_bytes / 2 + cache / 2);
  CHECK(e.cuda_bytes_per_gpu(2, 300, 3) ==
        whole + e.cuda_split_bytes / 2 + e.cuda_kv_proj_bytes / 2 + 3 * cache / 2);
  CHECK(e.cuda_bytes_per_gpu(1, 300, 1, 0.5) == e.cuda_weight_bytes / 2 + cache);

  // A GPU whose usable nine tenths hold 2 ranks' share but not the whole model.
  const int64_t two = e.cuda_bytes_per_gpu(2, 4096);
  const int64_t device = two * 10 / 9 + 10;
  REQUIRE(e.cuda_bytes_per_gpu(1, 4096) > device - device / 10);
  CHECK(gpus_needed_split(*model, e, 4096, device) == 2);
  // Between 2's and 4's needs: 3 does not divide 8 heads, so 4.
  const int64_t four = e.cuda_bytes_per_gpu(4, 4096);
  CHECK(gpus_needed_split(*model, e, 4096, four * 10 / 9 + 10) == 4);
  CHECK(gpus_needed_split(*model, e, 4096, e.cuda_bytes_per_gpu(1, 4096) * 2) == 1);
  // Nothing fits a GPU smaller than the parts every rank holds whole.
  CHECK(gpus_needed_split(*model, e, 4096, whole) == 0);
}
