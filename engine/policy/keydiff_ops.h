// KeyDiff's op extension (op_extension.h): its one backend op beside the policy
// (keydiff_policy.cpp). The CPU implementation is keydiff_ops_cpu.cpp, the CUDA one
// kernels/policy/.
#pragma once

#include <cstdint>
#include <string_view>

#include "engine/backend/backend.h"

namespace kvlens {

class KeyDiffOps : public OpExtension {
 public:
  static constexpr std::string_view kExtensionName = "keydiff";

  // KeyDiff's score against the mean normalised key. Rows r of `members` (U8 [R, stride]) and
  // `out` (F32 [R, stride]) belong to KV head g = r / (R / G) of k_cache [G, capacity, D] (R a
  // multiple of G); `members` may instead have G rows, row g serving every row of KV head g
  // (then read as if expanded to R rows). With k^ = k / max(||k||, 1e-12): anchor_r = the mean
  // of k^_{g, j} over j < cols with members[r, j] != 0 (zero when there is none), and
  // out[r, j] = -(k^_{g, j} . anchor_r) / max(||anchor_r||, 1e-12) = -cos(k_j, anchor_r) for
  // every j < cols, members or not (0 for a zero key or a zero anchor). F32 sums: the backends
  // agree within rounding (about 1e-6 absolute; cosines lie in [-1, 1]).
  virtual void key_anchor_scores(const DeviceTensor& k_cache, int64_t cols,
                                 const DeviceTensor& members, DeviceTensor& out) = 0;
};

// `backend`'s KeyDiffOps (backend.extension<KeyDiffOps>() once the CPU implementation is
// registered, which the first call does). Throws kvlens::Error naming the extension and the
// backend when the backend has none.
KeyDiffOps& keydiff_ops(Backend& backend);

}  // namespace kvlens
