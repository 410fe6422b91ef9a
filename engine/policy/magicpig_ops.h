// MagicPIG's op extension (op_extension.h): SimHash codes of keys as they are written, and the
// per-step LSH sample with its importance weights, beside magicpig_policy.cpp. The arithmetic is
// magicpig_math.h's on both backends (CPU: magicpig_ops_cpu.cpp, CUDA:
// kernels/policy/magicpig_*), so both sample the same keys and give the same weights.
// k_cache [G, capacity, D]; planes F32 [tables * bits, D]; codes F32 [G, stride, tables];
// q [1, H, D] F32 (H a multiple of G); visible U8, log_weights and scores F32, all [H, stride].
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/backend/backend.h"

namespace kvlens {

class MagicpigOps : public OpExtension {
 public:
  static constexpr std::string_view kExtensionName = "magicpig";

  // codes[g, j, t] = simhash_code(k_cache[g, j, :], planes, t, bits) for begin <= j < end and
  // every table t < codes.dim(2) (planes has codes.dim(2) * bits rows). 1 <= bits <= 20.
  virtual void hash_keys(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                         const DeviceTensor& planes, int64_t bits, DeviceTensor& codes) = 0;

  // For every query head h (KV head g = h / (H / G)) and column j < cols: forced columns
  // ([0, sink_end) and [recent_begin, cols)) get visible 1, log weight 0, score 1. Every other
  // column gets score p = magicpig_probability(magicpig_u(q_h . k_j, |q_h|^2, |k_j|^2)); it is
  // sampled (visible 1, log weight magicpig_log_weight(p)) when q_h's codes (hashed here, as
  // simhash_code) equal codes[g, j, :] in at least kMagicpigCollisions tables, else visible 0
  // and log weight 0. 0 <= sink_end <= recent_begin <= cols.
  virtual void lsh_sample(const DeviceTensor& q, const DeviceTensor& k_cache,
                          const DeviceTensor& codes, const DeviceTensor& planes, int64_t bits,
                          int64_t cols, int64_t sink_end, int64_t recent_begin,
                          DeviceTensor& visible, DeviceTensor& log_weights,
                          DeviceTensor& scores) = 0;
};

// `backend`'s MagicpigOps (the CPU implementation registered by the first call). Throws
// kvlens::Error naming the extension and the backend when the backend has none.
MagicpigOps& magicpig_ops(Backend& backend);

}  // namespace kvlens
