// Quest's op extension on the CPU backend (quest_ops.h): the code the CPU backend ran as
// Backend::page_minmax_update and Backend::page_bounds, the bounds on the backend's thread pool
// with its kernel set's page_bounds row kernel (cpu_policy::Context).
#include "engine/policy/quest_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/cpu/cpu_policy_ops.h"
#include "engine/backend/policy_op_math.h"

namespace kvlens {

namespace {

using namespace cpu_checks;  // require*, describe, cat, shape_string, row_shape, grain_for
using cpu_policy::Context;

// Quest's page summaries page_min / page_max: two F32 [G, P, D] tensors of one shape matching
// the cache's G and D.
int64_t page_summary_pages(const DeviceTensor& page_min, const DeviceTensor& page_max,
                           int64_t groups, int64_t head_dim, OpName op) {
  require_f32(page_min, op + ": page_min");
  require_f32(page_max, op + ": page_max");
  KVLENS_REQUIRE(
      page_min.shape.size() == 3 && page_min.dim(0) == groups && page_min.dim(2) == head_dim &&
          page_min.dim(1) >= 0 && page_max.shape == page_min.shape,
      op + ": page_min, page_max", cat("two F32 [", groups, ", pages, ", head_dim, "] tensors"),
      describe(page_min) + ", " + describe(page_max));
  return page_min.dim(1);
}

void require_page_size(int64_t page_size, OpName op) {
  KVLENS_REQUIRE(page_size >= 1, op + ": page_size", "a page size >= 1", std::to_string(page_size));
}

KVLENS_POLICY_CLONES void run_page_minmax_update(const DeviceTensor& k_cache, int64_t begin,
                                                 int64_t end, int64_t page_size,
                                                 DeviceTensor& page_min, DeviceTensor& page_max) {
  const OpName op{"page_minmax_update"};
  require_page_size(page_size, op);
  const CacheShape cache_dims = cache_shape(k_cache, 0, op, "k_cache");
  const int64_t groups = cache_dims.groups, capacity = cache_dims.capacity,
                head_dim = cache_dims.head_dim;
  KVLENS_REQUIRE(begin >= 0 && begin <= end && end <= capacity, op + ": columns",
                 cat("a range inside [0, ", capacity, "]"), cat(begin, ":", end));
  const int64_t pages = page_summary_pages(page_min, page_max, groups, head_dim, op);
  KVLENS_REQUIRE(pages * page_size >= end, op + ": page_min",
                 cat("at least ", (end + page_size - 1) / page_size, " pages"), describe(page_min));
  if (begin == end) return;
  const int64_t first = begin / page_size, last = (end - 1) / page_size;
  for (int64_t g = 0; g < groups; ++g) {
    const float* keys = k_cache.as<const float>() + g * capacity * head_dim;
    for (int64_t p = first; p <= last; ++p) {
      float* lo = page_min.as<float>() + (g * pages + p) * head_dim;
      float* hi = page_max.as<float>() + (g * pages + p) * head_dim;
      const int64_t j0 = p * page_size, j1 = std::min(j0 + page_size, end);
      std::memcpy(lo, keys + j0 * head_dim, size_t(head_dim) * sizeof(float));
      std::memcpy(hi, keys + j0 * head_dim, size_t(head_dim) * sizeof(float));
      // The CUDA kernel runs the same comparisons in the same column order.
      for (int64_t j = j0 + 1; j < j1; ++j) {
        const float* k = keys + j * head_dim;
        for (int64_t d = 0; d < head_dim; ++d) {
          lo[d] = k[d] < lo[d] ? k[d] : lo[d];
          hi[d] = hi[d] < k[d] ? k[d] : hi[d];
        }
      }
    }
  }
}

void run_page_bounds(const Context& context, const DeviceTensor& q, const DeviceTensor& page_min,
                     const DeviceTensor& page_max, int64_t cols, int64_t page_size, bool max_only,
                     DeviceTensor& out) {
  const OpName op{"page_bounds"};
  require_cols(cols, op);
  require_page_size(page_size, op);
  require_f32(q, op + ": q");
  KVLENS_REQUIRE(q.shape.size() == 3 && q.dim(0) == 1 && q.dim(1) >= 0 && q.dim(2) >= 0, op + ": q",
                 "a [1, H, D] tensor", describe(q));
  const int64_t heads = q.dim(1), head_dim = q.dim(2);
  KVLENS_REQUIRE(page_min.shape.size() == 3 && page_min.dim(0) > 0 && heads % page_min.dim(0) == 0,
                 op + ": page_min",
                 cat("[G, pages, ", head_dim, "] with G dividing the ", heads, " heads"),
                 describe(page_min));
  const int64_t groups = page_min.dim(0);
  const int64_t pages = page_summary_pages(page_min, page_max, groups, head_dim, op);
  KVLENS_REQUIRE(pages * page_size >= cols, op + ": page_min",
                 cat("at least ", (cols + page_size - 1) / page_size, " pages"),
                 describe(page_min));
  const RowShape shape = row_shape(out, DType::F32, heads, cols, op + ": out");
  if (heads == 0 || cols == 0) return;

  const int64_t heads_per_group = heads / groups;
  const int64_t used = (cols + page_size - 1) / page_size;
  const float scale = attention_scale(head_dim);
  const PageBoundsFn bounds_of = context.kernels.page_bounds;
  context.pool.parallel_for(
      0, heads,
      [&](int64_t begin, int64_t end) {
        thread_local std::vector<float> bounds;
        bounds.resize(size_t(used));
        for (int64_t h = begin; h < end; ++h) {
          const int64_t base = (h / heads_per_group) * pages * head_dim;
          bounds_of(q.as<const float>() + h * head_dim, page_min.as<const float>() + base,
                    page_max.as<const float>() + base, used, head_dim, max_only, scale,
                    bounds.data());
          float* row = out.as<float>() + h * shape.stride;
          for (int64_t p = 0; p < used; ++p) {
            const int64_t j1 = std::min((p + 1) * page_size, cols);
            std::fill(row + p * page_size, row + j1, bounds[size_t(p)]);
          }
        }
      },
      grain_for(used * head_dim));
}

class CpuQuestOps final : public QuestOps {
 public:
  explicit CpuQuestOps(Backend& backend) : context_(cpu_policy::context_of(backend)) {}
  void page_minmax_update(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                          int64_t page_size, DeviceTensor& page_min,
                          DeviceTensor& page_max) override {
    run_page_minmax_update(k_cache, begin, end, page_size, page_min, page_max);
  }
  void page_bounds(const DeviceTensor& q, const DeviceTensor& page_min,
                   const DeviceTensor& page_max, int64_t cols, int64_t page_size, bool max_only,
                   DeviceTensor& out) override {
    run_page_bounds(context_, q, page_min, page_max, cols, page_size, max_only, out);
  }

 private:
  Context context_;
};

}  // namespace

QuestOps& quest_ops(Backend& backend) {
  return extension_with_cpu<QuestOps, CpuQuestOps>(backend);
}

}  // namespace kvlens
