// Every backend op of the shared table (tests/support/backend_op_table.h), core ops and the
// policies' op extensions, on the CPU backend's kernel sets against the generic (portable) CPU
// backend: "auto" (AVX-512 where present, else AVX2/FMA, else generic) and "avx2" (AVX2/FMA
// where present), the selections of --cpu-kernels. Where the CPU lacks a set, the comparison
// still runs (the same kernels both sides). tests/cuda/test_cuda_backend_ops.cpp runs the same
// table on the CUDA backend.
#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <string>

#include "engine/backend/cpu/cpu_backend.h"
#include "tests/support/backend_op_table.h"

using namespace kvlens;

namespace {

std::unique_ptr<Backend> cpu_backend(bool allow_simd, bool allow_avx512) {
  CpuBackendOptions options;
  options.threads = 2;
  options.allow_simd = allow_simd;
  options.allow_avx512 = allow_avx512;
  return make_cpu_backend(options);
}

}  // namespace

TEST_CASE("backend ops: the CPU kernel sets against the generic CPU backend, every op of the table",
          "[backend_ops]") {
  const auto generic = cpu_backend(false, false);
  const auto avx2 = cpu_backend(true, false);
  const auto widest = cpu_backend(true, true);
  for (const test::OpEntry& entry : test::backend_op_table()) {
    for (Backend* backend : {avx2.get(), widest.get()}) {
      INFO("kernels " << cpu_backend_isa(*backend) << " against " << cpu_backend_isa(*generic));
      test::check_op_entry(entry, *generic, *backend);
    }
  }
}

TEST_CASE("backend ops: the table has an entry for every op and every op extension",
          "[backend_ops]") {
  const auto& table = test::backend_op_table();
  // Every op of Backend (backend.h) but the hints and plumbing that compute nothing
  // (supports_cache_dtype, same_bytes, record_step, copy_bandwidth_gbps, run_tasks,
  // runs_tasks_in_order, lockstep_groups; alloc, from_host and to_host run in every entry), and
  // every op of the policies' extensions. An op added to either belongs in the table.
  for (const char* op : {"copy_rows",
                         "broadcast_rows",
                         "rows_to_host_async",
                         "embed",
                         "matmul ",
                         "matmul_many",
                         "matmul_add",
                         "rmsnorm_matmul_many",
                         "rmsnorm_gate_up",
                         "rmsnorm ",
                         "layer_norm",
                         "silu_mul",
                         "bias_activation",
                         "add_inplace",
                         "rope ",
                         "rope_pair",
                         "kv_append ",
                         "kv_append_runs",
                         "rope_append_runs",
                         "attention prefill",
                         "attention decode visible",
                         "argmax_rows",
                         "log_prob_rows",
                         "attention_logits ",
                         "attention_visible ",
                         "attention_logits_runs",
                         "attention_visible_runs",
                         "select_top_k",
                         "fill_columns",
                         "count_nonzero_rows",
                         "mask_and",
                         "mark_columns",
                         "mark_and_select_top_k",
                         "keep_selected",
                         "accumulate_rows",
                         "sum_row_groups",
                         "expand_row_groups",
                         "random_rows",
                         "axpby_rows",
                         "pool_rows",
                         "select_pages",
                         "zero_unless",
                         "keydiff.key_anchor_scores",
                         "quest.page_minmax_update",
                         "page_bounds",
                         "tokenfilter.anchor_cosine_update",
                         "token_filter_step"}) {
    INFO(op);
    CHECK(std::any_of(table.begin(), table.end(), [&](const test::OpEntry& e) {
      return e.name.find(op) != std::string::npos;
    }));
  }
  for (const test::OpEntry& entry : table) {
    INFO(entry.name);
    CHECK(entry.name.find_first_of(";[]") == std::string::npos);
  }
}
