// What the CPU tensor-parallel tests share: a group of CPU ranks (their all-reduce a
// HostReduceGroup), the tolerance a split's logits keep against one backend's, and the token ids
// they feed.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"

namespace kvlens::test {

struct CpuRankGroup {
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Backend*> pointers;  // rank order, as upload_tensor_parallel takes them
  explicit CpuRankGroup(int ranks, int threads = 1) {
    CpuBackendOptions options;
    options.threads = threads;
    backends = make_cpu_backend_group(ranks, options);
    for (auto& b : backends) pointers.push_back(b.get());
  }
};

// The split sums o_proj and down_proj over heads and columns in another order than one backend
// does: f32 rounding of a 64-256 wide sum, a few ulps of values of order 1-10 that then pass
// through the later layers. 1e-4 relative to the logits' scale (their largest magnitude) bounds it
// with margin, as the other f32 checks of the engine do.
inline void check_split_close(const std::vector<float>& want, const std::vector<float>& got) {
  REQUIRE(want.size() == got.size());
  float scale = 0.0f;
  for (const float w : want) scale = std::max(scale, std::fabs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("index " << i);
    REQUIRE(std::fabs(want[i] - got[i]) <= 1e-4f * scale);
  }
}

inline std::vector<int32_t> split_token_ids(int64_t count, int64_t vocab, int64_t seed) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < count; ++i) ids.push_back(int32_t((i * 37 + seed * 11 + 3) % vocab));
  return ids;
}

}  // namespace kvlens::test
