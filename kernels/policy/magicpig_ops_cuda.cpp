// MagicpigOps (engine/policy/magicpig_ops.h) on the CUDA backend: the operand checks the CPU
// implementation makes, then magicpig_kernels.cu. Caches F32, BF16 or F16 [G, capacity, D].
// register_cuda_policy_ops (cuda_policy_ops.cpp) registers it.
#include <memory>
#include <string>

#include "engine/backend/op_extension.h"
#include "engine/common/error.h"
#include "engine/policy/magicpig_ops.h"
#include "kernels/cuda_backend_impl.h"
#include "kernels/policy/cuda_policy_ops.h"
#include "kernels/policy/magicpig_kernels.cuh"

namespace kvlens::cuda {
namespace {

// The tables of codes [G, >= cols, tables], planes [tables * bits, D] checked against them.
int64_t checked_tables(const DeviceTensor& codes, const DeviceTensor& planes, int64_t bits,
                       const CudaBackend::CacheShape& cache, int64_t cols, const std::string& op) {
  if (bits < 1 || bits > 20)
    bad_argument(op + ": bits", "1 to 20 bits per table", std::to_string(bits));
  require(codes, DType::F32, op, "codes");
  if (codes.shape.size() != 3 || codes.dim(0) != cache.kv_heads || codes.dim(1) < cols ||
      codes.dim(2) < 1)
    bad_argument(op + ": codes",
                 cat({"an F32 [", std::to_string(cache.kv_heads), ", >= ", std::to_string(cols),
                      ", tables] tensor"}),
                 describe(codes));
  const int64_t tables = codes.dim(2);
  require(planes, DType::F32, op, "planes");
  if (planes.shape.size() != 2 || planes.dim(0) != tables * bits || planes.dim(1) != cache.head_dim)
    bad_argument(op + ": planes",
                 cat({"an F32 [", std::to_string(tables * bits), ", ",
                      std::to_string(cache.head_dim), "] tensor"}),
                 describe(planes));
  return tables;
}

class CudaMagicpigOps final : public MagicpigOps {
 public:
  explicit CudaMagicpigOps(Backend& backend)
      : backend_(cuda_backend_of_extension(backend, MagicpigOps::kExtensionName)) {}

  void hash_keys(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                 const DeviceTensor& planes, int64_t bits, DeviceTensor& codes) override {
    const std::string op = "hash_keys";
    require_cols(end, op);
    const auto cache = CudaBackend::cache_shape(k_cache, op, "k_cache", end);
    if (begin < 0 || begin > end)
      bad_argument(op + ": columns", "0 <= begin <= end",
                   cat({std::to_string(begin), ", ", std::to_string(end)}));
    HashKeysArgs args;
    args.tables = checked_tables(codes, planes, bits, cache, end, op);
    if (begin == end || cache.kv_heads == 0) return;
    backend_.activate();
    args.k_cache = k_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.planes = planes.as<const float>();
    args.codes = codes.as<float>();
    args.kv_heads = cache.kv_heads;
    args.capacity = cache.capacity;
    args.head_dim = cache.head_dim;
    args.code_stride = codes.dim(1);
    args.bits = bits;
    args.begin = begin;
    args.end = end;
    launch_hash_keys(args, backend_.stream());
    check_launch("hash_keys");
  }

  void lsh_sample(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& codes,
                  const DeviceTensor& planes, int64_t bits, int64_t cols, int64_t sink_end,
                  int64_t recent_begin, DeviceTensor& visible, DeviceTensor& log_weights,
                  DeviceTensor& scores) override {
    const std::string op = "lsh_sample";
    require_cols(cols, op);
    const auto cache = CudaBackend::cache_shape(k_cache, op, "k_cache", cols);
    LshSampleArgs args;
    args.tables = checked_tables(codes, planes, bits, cache, cols, op);
    if (!(0 <= sink_end && sink_end <= recent_begin && recent_begin <= cols))
      bad_argument(op + ": forced columns",
                   cat({"0 <= sink_end <= recent_begin <= ", std::to_string(cols)}),
                   cat({std::to_string(sink_end), ", ", std::to_string(recent_begin)}));
    const RowShape mask = row_shape(visible, DType::U8, -1, cols, op, "visible");
    const RowShape weights = row_shape(log_weights, DType::F32, mask.rows, cols, op, "log_weights");
    const RowShape score_rows = row_shape(scores, DType::F32, mask.rows, cols, op, "scores");
    if (cache.kv_heads == 0 || mask.rows % cache.kv_heads != 0)
      bad_argument(op + ": visible",
                   cat({"a row count that is a multiple of the ", std::to_string(cache.kv_heads),
                        " KV heads"}),
                   describe(visible));
    require(q, DType::F32, op, "q");
    if (elements(q) != mask.rows * cache.head_dim)
      bad_argument(op + ": q",
                   cat({"an F32 tensor of ", std::to_string(mask.rows), " x ",
                        std::to_string(cache.head_dim), " values"}),
                   describe(q));
    if (mask.rows == 0 || cols == 0) return;
    backend_.activate();
    args.q = q.as<const float>();
    args.k_cache = k_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.codes = codes.as<const float>();
    args.planes = planes.as<const float>();
    args.visible = rows_ref<uint8_t>(visible, mask);
    args.log_weights = rows_ref<float>(log_weights, weights);
    args.scores = rows_ref<float>(scores, score_rows);
    args.heads = mask.rows;
    args.kv_heads = cache.kv_heads;
    args.capacity = cache.capacity;
    args.head_dim = cache.head_dim;
    args.code_stride = codes.dim(1);
    args.bits = bits;
    args.cols = cols;
    args.sink_end = sink_end;
    args.recent_begin = recent_begin;
    launch_lsh_sample(args, backend_.stream());
    check_launch("lsh_sample");
  }

 private:
  CudaBackend& backend_;
};

}  // namespace

void register_cuda_magicpig_ops() {
  register_op_extension(std::string(MagicpigOps::kExtensionName), "cuda", [](Backend& backend) {
    return std::make_unique<CudaMagicpigOps>(backend);
  });
}

}  // namespace kvlens::cuda
