// TopPOps (engine/policy/top_p_ops.h) on the CUDA backend: the operand checks the CPU
// implementation makes, then top_p_kernels.cu. scores F32 [H, stride], visible U8 [H, stride].
// register_cuda_policy_ops (cuda_policy_ops.cpp) registers it.
#include <memory>
#include <string>

#include "engine/backend/op_extension.h"
#include "engine/common/error.h"
#include "engine/policy/top_p_ops.h"
#include "kernels/cuda_backend_impl.h"
#include "kernels/policy/top_p_kernels.cuh"

namespace kvlens::cuda {
namespace {

class CudaTopPOps final : public TopPOps {
 public:
  explicit CudaTopPOps(Backend& backend)
      : backend_(cuda_backend_of_extension(backend, TopPOps::kExtensionName)) {}

  void top_p_prune(const DeviceTensor& scores, int64_t cols, float top_p, int64_t sink_end,
                   int64_t recent_begin, DeviceTensor& visible) override {
    const std::string op = "top_p_prune";
    require_cols(cols, op);
    if (!(top_p > 0.0f && top_p <= 1.0f))
      bad_argument(op + ": top_p", "a share in (0, 1]", std::to_string(top_p));
    if (!(0 <= sink_end && sink_end <= recent_begin && recent_begin <= cols))
      bad_argument(op + ": forced columns",
                   cat({"0 <= sink_end <= recent_begin <= ", std::to_string(cols)}),
                   cat({std::to_string(sink_end), ", ", std::to_string(recent_begin)}));
    const RowShape mask = row_shape(visible, DType::U8, -1, cols, op, "visible");
    const RowShape rows = row_shape(scores, DType::F32, mask.rows, cols, op, "scores");
    if (mask.rows == 0 || cols == 0) return;
    backend_.activate();
    TopPPruneArgs args;
    args.scores = rows_ref<const float>(scores, rows);
    args.visible = rows_ref<uint8_t>(visible, mask);
    args.rows = mask.rows;
    args.cols = cols;
    args.sink_end = sink_end;
    args.recent_begin = recent_begin;
    args.top_p = top_p;
    launch_top_p_prune(args, backend_.stream());
    check_launch("top_p_prune");
  }

 private:
  CudaBackend& backend_;
};

}  // namespace

void register_cuda_top_p_ops() {
  register_op_extension(std::string(TopPOps::kExtensionName), "cuda",
                        [](Backend& backend) { return std::make_unique<CudaTopPOps>(backend); });
}

}  // namespace kvlens::cuda
