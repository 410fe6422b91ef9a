// RocketkvOps (engine/policy/rocketkv_ops.h) on the CUDA backend: the operand checks the CPU
// implementation makes, then rocketkv_kernels.cu. q [1, H, D], page_min and page_max [G, P, D],
// out [H, stride]. register_cuda_policy_ops (cuda_policy_ops.cpp) registers it.
#include <memory>
#include <string>

#include "engine/backend/op_extension.h"
#include "engine/common/error.h"
#include "engine/policy/approx_logit_math.h"
#include "engine/policy/rocketkv_ops.h"
#include "kernels/cuda_backend_impl.h"
#include "kernels/policy/cuda_policy_ops.h"
#include "kernels/policy/rocketkv_kernels.cuh"

namespace kvlens::cuda {
namespace {

class CudaRocketkvOps final : public RocketkvOps {
 public:
  explicit CudaRocketkvOps(Backend& backend)
      : backend_(cuda_backend_of_extension(backend, RocketkvOps::kExtensionName)) {}

  void page_logits(const DeviceTensor& q, const DeviceTensor& page_min,
                   const DeviceTensor& page_max, int64_t cols, int64_t page_size, int64_t rank,
                   DeviceTensor& out) override {
    const std::string op = "rocketkv page_logits";
    require_cols(cols, op);
    if (page_size < 1)
      bad_argument(op + ": page_size", "a page size >= 1", std::to_string(page_size));
    require(q, DType::F32, op, "q");
    require(page_min, DType::F32, op, "page_min");
    require(page_max, DType::F32, op, "page_max");
    if (q.shape.size() != 3 || q.dim(0) != 1 || q.dim(1) < 1 || q.dim(2) < 1 ||
        q.dim(2) > kApproxMaxHeadDim)
      bad_argument(op + ": q",
                   cat({"a [1, H, D] tensor with 1 <= D <= ", std::to_string(kApproxMaxHeadDim)}),
                   describe(q));
    const int64_t heads = q.dim(1), D = q.dim(2);
    if (page_min.shape.size() != 3 || page_min.dim(0) < 1 || heads % page_min.dim(0) != 0 ||
        page_min.dim(2) != D || page_min.dim(1) * page_size < cols ||
        page_max.shape != page_min.shape)
      bad_argument(op + ": page_min, page_max",
                   cat({"two F32 [G, >= ", std::to_string((cols + page_size - 1) / page_size), ", ",
                        std::to_string(D), "] tensors with G dividing the ", std::to_string(heads),
                        " heads"}),
                   describe(page_min) + ", " + describe(page_max));
    if (rank < 1 || rank > D)
      bad_argument(op + ": rank", cat({"a channel count in [1, ", std::to_string(D), "]"}),
                   std::to_string(rank));
    const RowShape shape = row_shape(out, DType::F32, heads, cols, op, "out");
    if (cols == 0) return;
    backend_.activate();
    RocketPageLogitArgs args;
    args.q = q.as<float>();
    args.page_min = page_min.as<float>();
    args.page_max = page_max.as<float>();
    args.out = rows_ref<float>(out, shape);
    args.heads = heads;
    args.kv_heads = page_min.dim(0);
    args.head_dim = D;
    args.pages = page_min.dim(1);
    args.page_size = page_size;
    args.rank = rank;
    args.cols = cols;
    launch_rocket_page_logits(args, backend_.stream());
    check_launch("rocketkv page_logits");
  }

 private:
  CudaBackend& backend_;
};

}  // namespace

void register_cuda_rocketkv_ops() {
  register_op_extension(std::string(RocketkvOps::kExtensionName), "cuda", [](Backend& backend) {
    return std::make_unique<CudaRocketkvOps>(backend);
  });
}

}  // namespace kvlens::cuda
