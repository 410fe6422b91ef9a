// ApproxLogitOps (engine/policy/approx_logit_ops.h) on the CUDA backend: the operand checks the
// CPU implementation makes, then the kernels of approx_logit_kernels.cu. q [1, H, D], k_cache
// [G, capacity, D] (F32, BF16 or F16), basis [B, D, dims], projected [B, width, dims], out
// [H, stride]. register_cuda_policy_ops (cuda_policy_ops.cpp) registers it.
#include <cmath>
#include <memory>
#include <string>

#include "engine/backend/op_extension.h"
#include "engine/common/error.h"
#include "engine/policy/approx_logit_math.h"
#include "engine/policy/approx_logit_ops.h"
#include "kernels/cuda_backend_impl.h"
#include "kernels/policy/approx_logit_kernels.cuh"

namespace kvlens::cuda {
namespace {

using CacheShape = CudaBackend::CacheShape;

int64_t query_heads(const DeviceTensor& q, int64_t groups, int64_t head_dim,
                    const std::string& op) {
  require(q, DType::F32, op, "q");
  if (q.shape.size() != 3 || q.dim(0) != 1 || q.dim(2) != head_dim || groups <= 0 ||
      q.dim(1) % groups != 0)
    bad_argument(op + ": q",
                 cat({"a [1, H, ", std::to_string(head_dim), "] tensor with H a multiple of ",
                      std::to_string(groups)}),
                 describe(q));
  return q.dim(1);
}

void require_head_dim(int64_t head_dim, const std::string& op) {
  if (head_dim < 1 || head_dim > kApproxMaxHeadDim)
    bad_argument(op + ": head_dim",
                 cat({"a head dimension in [1, ", std::to_string(kApproxMaxHeadDim), "]"}),
                 std::to_string(head_dim));
}

void require_basis(const DeviceTensor& basis, int64_t groups, int64_t head_dim,
                   const std::string& op) {
  require(basis, DType::F32, op, "basis");
  if (basis.shape.size() != 3 || basis.dim(0) < 1 || basis.dim(1) != head_dim || basis.dim(2) < 1 ||
      basis.dim(2) > head_dim || (groups != 0 && basis.dim(0) % groups != 0))
    bad_argument(op + ": basis",
                 cat({"a [B, ", std::to_string(head_dim),
                      ", dims] tensor (1 <= dims <= ", std::to_string(head_dim),
                      groups ? ", B a multiple of the KV heads" : "", ")"}),
                 describe(basis));
}

void require_projected(const DeviceTensor& projected, const DeviceTensor& basis, int64_t end,
                       const std::string& op) {
  require(projected, DType::F32, op, "projected");
  if (projected.shape.size() != 3 || projected.dim(0) != basis.dim(0) || projected.dim(1) < end ||
      projected.dim(2) != basis.dim(2))
    bad_argument(op + ": projected",
                 cat({"a [", std::to_string(basis.dim(0)), ", >= ", std::to_string(end), ", ",
                      std::to_string(basis.dim(2)), "] tensor"}),
                 describe(projected));
}

class CudaApproxLogitOps final : public ApproxLogitOps {
 public:
  explicit CudaApproxLogitOps(Backend& backend)
      : backend_(cuda_backend_of_extension(backend, ApproxLogitOps::kExtensionName)) {}

  void sparq_logits(const DeviceTensor& q, const DeviceTensor& k_cache, int64_t cols, int64_t rank,
                    DeviceTensor& out) override {
    const std::string op = "sparq_logits";
    require_cols(cols, op);
    const CacheShape cache = CudaBackend::cache_shape(k_cache, op, "k_cache", cols);
    require_head_dim(cache.head_dim, op);
    if (rank < 1 || rank > cache.head_dim)
      bad_argument(op + ": rank",
                   cat({"a channel count in [1, ", std::to_string(cache.head_dim), "]"}),
                   std::to_string(rank));
    const int64_t heads = query_heads(q, cache.kv_heads, cache.head_dim, op);
    const RowShape shape = row_shape(out, DType::F32, heads, cols, op, "out");
    if (heads == 0 || cols == 0) return;
    backend_.activate();
    SparqLogitArgs args;
    args.q = q.as<float>();
    args.k_cache = k_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.out = rows_ref<float>(out, shape);
    args.heads = heads;
    args.kv_heads = cache.kv_heads;
    args.head_dim = cache.head_dim;
    args.capacity = cache.capacity;
    args.rank = rank;
    args.cols = cols;
    launch_sparq_logits(args, backend_.stream());
    check_launch("sparq_logits");
  }

  void project_keys(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                    const DeviceTensor& basis, DeviceTensor& projected) override {
    const std::string op = "project_keys";
    const CacheShape cache = CudaBackend::cache_shape(k_cache, op, "k_cache");
    if (begin < 0 || begin > end || end > cache.capacity)
      bad_argument(op + ": columns",
                   cat({"a range inside [0, ", std::to_string(cache.capacity), "]"}),
                   cat({std::to_string(begin), ":", std::to_string(end)}));
    require_basis(basis, cache.kv_heads, cache.head_dim, op);
    require_projected(projected, basis, end, op);
    if (begin == end) return;
    backend_.activate();
    ProjectKeysArgs args;
    args.k_cache = k_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.basis = basis.as<float>();
    args.projected = projected.as<float>();
    args.rows = basis.dim(0);
    args.kv_heads = cache.kv_heads;
    args.head_dim = cache.head_dim;
    args.capacity = cache.capacity;
    args.dims = basis.dim(2);
    args.width = projected.dim(1);
    args.begin = begin;
    args.end = end;
    launch_project_keys(args, backend_.stream());
    check_launch("project_keys");
  }

  void projected_logits(const DeviceTensor& q, const DeviceTensor& basis,
                        const DeviceTensor& projected, int64_t cols, DeviceTensor& out) override {
    const std::string op = "projected_logits";
    require_cols(cols, op);
    require_basis(basis, 0, basis.shape.size() == 3 ? basis.dim(1) : 0, op);
    const int64_t heads = query_heads(q, basis.dim(0), basis.dim(1), op);
    require_projected(projected, basis, cols, op);
    const RowShape shape = row_shape(out, DType::F32, heads, cols, op, "out");
    if (heads == 0 || cols == 0) return;
    backend_.activate();
    ProjectedLogitArgs args;
    args.q = q.as<float>();
    args.basis = basis.as<float>();
    args.projected = projected.as<float>();
    args.out = rows_ref<float>(out, shape);
    args.heads = heads;
    args.rows = basis.dim(0);
    args.head_dim = basis.dim(1);
    args.dims = basis.dim(2);
    args.width = projected.dim(1);
    args.cols = cols;
    args.scale = float(1.0 / std::sqrt(double(basis.dim(1))));  // as in attention()
    launch_projected_logits(args, backend_.stream());
    check_launch("projected_logits");
  }

 private:
  CudaBackend& backend_;
};

}  // namespace

void register_cuda_approx_logit_ops() {
  register_op_extension(std::string(ApproxLogitOps::kExtensionName), "cuda", [](Backend& backend) {
    return std::make_unique<CudaApproxLogitOps>(backend);
  });
}

}  // namespace kvlens::cuda
