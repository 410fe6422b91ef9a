// The policies' op extensions on the CUDA backend (engine/backend/op_extension.h): keydiff,
// quest and tokenfilter ops, whose interfaces live beside the policies (engine/policy/*_ops.h).
// Built as kvlens_cuda_policy_ops, which links kvlens_cuda and kvlens_policy (kvlens_cuda itself
// links only the backend layer).
#pragma once

namespace kvlens {

// Registers the CUDA implementations of every policy op extension for backends named "cuda".
// Idempotent and thread-safe. Whoever makes a CUDA backend that policies will run on calls it
// (app/session's make_backend, the cuda test suite's main): registration by static initialisers
// would be dropped by the linker from a static library.
void register_cuda_policy_ops();

namespace cuda {
// The approximate-logit policies' ops (approx_logit_ops_cuda.cpp), registered by the above.
void register_cuda_approx_logit_ops();
// RocketKV's stage-2 page estimate (rocketkv_ops_cuda.cpp), registered by the above.
void register_cuda_rocketkv_ops();
// Twilight's top-p pruning (top_p_ops_cuda.cpp), registered by the above.
void register_cuda_top_p_ops();
// MagicPIG's LSH sampling (magicpig_ops_cuda.cpp), registered by the above.
void register_cuda_magicpig_ops();
// TokenButler's fused predictor step (predictor_step_ops_cuda.cpp), registered by the above.
void register_cuda_predictor_step_ops();
}  // namespace cuda

}  // namespace kvlens
