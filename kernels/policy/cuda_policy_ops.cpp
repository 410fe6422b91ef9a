// The policies' op extensions on the CUDA backend (cuda_policy_ops.h): each interface of
// engine/policy/*_ops.h implemented over the CUDA backend's device, streams and argument checks,
// launching the kernels of this folder. The checks and launches are those the CUDA backend ran
// as its own ops before the ops moved beside their policies. Row tensors are [rows, stride]; only
// the first `cols` columns are read or written.
#include "kernels/policy/cuda_policy_ops.h"

#include <cmath>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/backend/op_extension.h"
#include "engine/backend/policy_op_math.h"
#include "engine/common/error.h"
#include "engine/policy/keydiff_ops.h"
#include "engine/policy/quest_ops.h"
#include "engine/policy/tokenfilter_ops.h"
#include "kernels/cuda_backend_impl.h"
#include "kernels/policy/keydiff_kernels.cuh"
#include "kernels/policy/quest_kernels.cuh"
#include "kernels/policy/tokenfilter_kernels.cuh"

namespace kvlens::cuda {
namespace {

using CacheShape = CudaBackend::CacheShape;

// Quest's page summaries: two F32 [G, pages, D] tensors of one shape, G and D those of
// `expected` (a cache's or q's); returns the page count.
int64_t page_summary_pages(const DeviceTensor& page_min, const DeviceTensor& page_max,
                           const CacheShape& expected, const std::string& op) {
  require(page_min, DType::F32, op, "page_min");
  require(page_max, DType::F32, op, "page_max");
  if (page_min.shape.size() != 3 || page_min.dim(0) != expected.kv_heads || page_min.dim(1) < 0 ||
      page_min.dim(2) != expected.head_dim || page_max.shape != page_min.shape)
    bad_argument(op + ": page_min, page_max",
                 cat({"two F32 [", std::to_string(expected.kv_heads), ", pages, ",
                      std::to_string(expected.head_dim), "] tensors"}),
                 describe(page_min) + ", " + describe(page_max));
  return page_min.dim(1);
}

void require_page_size(int64_t page_size, const std::string& op) {
  if (page_size < 1)
    bad_argument(op + ": page_size", "a page size >= 1", std::to_string(page_size));
}

class CudaKeyDiffOps final : public KeyDiffOps {
 public:
  explicit CudaKeyDiffOps(Backend& backend)
      : backend_(cuda_backend_of_extension(backend, KeyDiffOps::kExtensionName)) {}

  void key_anchor_scores(const DeviceTensor& k_cache, int64_t cols, const DeviceTensor& members,
                         DeviceTensor& out) override {
    const std::string op = "key_anchor_scores";
    require_cols(cols, op);
    const CacheShape cache = CudaBackend::cache_shape(k_cache, op, "k_cache", cols);
    const RowShape shape = row_shape(out, DType::F32, -1, cols, op, "out");
    if (cache.kv_heads == 0 || shape.rows % cache.kv_heads != 0)
      bad_argument(op + ": out",
                   cat({"a row count that is a multiple of the ", std::to_string(cache.kv_heads),
                        " KV heads"}),
                   describe(out));
    // Members per row, or one row per KV head (KeyDiffOps::key_anchor_scores).
    if (cache.head_dim > cuda::kMaxKeyAnchorDim)
      bad_argument(op + ": k_cache",
                   cat({"a head dimension of at most ", std::to_string(cuda::kMaxKeyAnchorDim)}),
                   describe(k_cache));
    const bool per_group = members.shape.size() == 2 && members.dim(0) == cache.kv_heads &&
                           cache.kv_heads != shape.rows;
    const RowShape member_shape =
        row_shape(members, DType::U8, per_group ? cache.kv_heads : shape.rows, cols, op, "members");
    if (shape.rows == 0 || cols == 0) return;
    backend_.activate();
    cuda::KeyAnchorArgs args;
    args.k_cache = k_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.members = rows_ref<const uint8_t>(members, member_shape);
    args.out = rows_ref<float>(out, shape);
    args.rows = shape.rows;
    args.rows_per_group = shape.rows / cache.kv_heads;
    args.members_per_group = per_group;
    args.head_dim = cache.head_dim;
    args.capacity = cache.capacity;
    args.cols = cols;
    cuda::launch_key_anchor_scores(args, backend_.stream());
    check_launch("key_anchor_scores");
  }

 private:
  CudaBackend& backend_;
};

class CudaQuestOps final : public QuestOps {
 public:
  explicit CudaQuestOps(Backend& backend)
      : backend_(cuda_backend_of_extension(backend, QuestOps::kExtensionName)) {}

  void page_minmax_update(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                          int64_t page_size, DeviceTensor& page_min,
                          DeviceTensor& page_max) override {
    const std::string op = "page_minmax_update";
    require_page_size(page_size, op);
    const CacheShape cache = CudaBackend::cache_shape(k_cache, op, "k_cache");
    if (begin < 0 || begin > end || end > cache.capacity)
      bad_argument(op + ": columns",
                   cat({"a range inside [0, ", std::to_string(cache.capacity), "]"}),
                   cat({std::to_string(begin), ":", std::to_string(end)}));
    const int64_t pages = page_summary_pages(page_min, page_max, cache, op);
    if (pages * page_size < end)
      bad_argument(op + ": page_min",
                   cat({"at least ", std::to_string((end + page_size - 1) / page_size), " pages"}),
                   describe(page_min));
    if (begin == end || cache.kv_heads == 0 || cache.head_dim == 0) return;
    backend_.activate();
    cuda::PageMinMaxArgs args;
    args.k_cache = k_cache.data;
    args.cache_dtype = k_cache.dtype;
    args.page_min = page_min.as<float>();
    args.page_max = page_max.as<float>();
    args.kv_heads = cache.kv_heads;
    args.capacity = cache.capacity;
    args.head_dim = cache.head_dim;
    args.pages = pages;
    args.page_size = page_size;
    args.first = begin / page_size;
    args.last = (end - 1) / page_size;
    args.end = end;
    cuda::launch_page_minmax_update(args, backend_.stream());
    check_launch("page_minmax_update");
  }

  void page_bounds(const DeviceTensor& q, const DeviceTensor& page_min,
                   const DeviceTensor& page_max, int64_t cols, int64_t page_size, bool max_only,
                   DeviceTensor& out) override {
    const std::string op = "page_bounds";
    require_cols(cols, op);
    require_page_size(page_size, op);
    require(q, DType::F32, op, "q");
    if (q.shape.size() != 3 || q.dim(0) != 1 || q.dim(1) < 0 || q.dim(2) < 0)
      bad_argument(op + ": q", "[1, H, D]", describe(q));
    const int64_t heads = q.dim(1), head_dim = q.dim(2);
    if (page_min.shape.size() != 3 || page_min.dim(0) <= 0 || heads % page_min.dim(0) != 0)
      bad_argument(op + ": page_min",
                   cat({"[G, pages, ", std::to_string(head_dim), "] with G dividing the ",
                        std::to_string(heads), " heads"}),
                   describe(page_min));
    const CacheShape groups{page_min.dim(0), 0, head_dim};
    const int64_t pages = page_summary_pages(page_min, page_max, groups, op);
    if (pages * page_size < cols)
      bad_argument(op + ": page_min",
                   cat({"at least ", std::to_string((cols + page_size - 1) / page_size), " pages"}),
                   describe(page_min));
    const RowShape shape = row_shape(out, DType::F32, heads, cols, op, "out");
    if (heads == 0 || cols == 0) return;
    backend_.activate();
    cuda::PageBoundArgs args;
    args.q = q.as<float>();
    args.page_min = page_min.as<float>();
    args.page_max = page_max.as<float>();
    args.out = rows_ref<float>(out, shape);
    args.heads = heads;
    args.kv_heads = groups.kv_heads;
    args.head_dim = head_dim;
    args.pages = pages;
    args.page_size = page_size;
    args.cols = cols;
    args.max_only = max_only;
    args.scale = float(1.0 / std::sqrt(double(head_dim)));  // as in attention()
    cuda::launch_page_bounds(args, backend_.stream());
    check_launch("page_bounds");
  }

 private:
  CudaBackend& backend_;
};

class CudaTokenFilterOps final : public TokenFilterOps {
 public:
  explicit CudaTokenFilterOps(Backend& backend)
      : backend_(cuda_backend_of_extension(backend, TokenFilterOps::kExtensionName)) {}

  void anchor_cosine_update(const DeviceTensor& cache, int64_t column, float decay,
                            DeviceTensor& anchor, DeviceTensor& similarity) override {
    const std::string op = "anchor_cosine_update";
    const CacheShape shape = CudaBackend::cache_shape(cache, op, "cache");
    if (shape.head_dim > cuda::kMaxAnchorDim)
      bad_argument(op + ": cache",
                   cat({"a head dimension of at most ", std::to_string(cuda::kMaxAnchorDim)}),
                   describe(cache));
    if (column < 0 || column >= shape.capacity)
      bad_argument(op + ": column",
                   cat({"a column below the capacity ", std::to_string(shape.capacity)}),
                   std::to_string(column));
    require(anchor, DType::F32, op, "anchor");
    if (anchor.shape != std::vector<int64_t>{shape.kv_heads, shape.head_dim})
      bad_argument(op + ": anchor", shape_string({shape.kv_heads, shape.head_dim}),
                   describe(anchor));
    require(similarity, DType::F32, op, "similarity");
    require_elements(similarity, shape.kv_heads, op, "similarity");
    if (shape.kv_heads == 0) return;
    backend_.activate();
    cuda::AnchorCosineArgs args;
    args.cache = cache.data;
    args.cache_dtype = cache.dtype;
    args.anchor = anchor.as<float>();
    args.similarity = similarity.as<float>();
    args.kv_heads = shape.kv_heads;
    args.capacity = shape.capacity;
    args.head_dim = shape.head_dim;
    args.column = column;
    args.decay = decay;
    cuda::launch_anchor_cosine_update(args, backend_.stream());
    check_launch("anchor_cosine_update");
  }

  void token_filter_step(const DeviceTensor* similarity, double eta, double target, int64_t column,
                         DeviceTensor& state, DeviceTensor& scores, DeviceTensor& keep) override {
    const std::string op = "token_filter_step";
    require(state, DType::U8, op, "state");
    require_elements(state, 8 * kTokenFilterState, op, "state");
    require(keep, DType::U8, op, "keep");
    if (elements(keep) < 1) bad_argument(op + ": keep", "at least one element", describe(keep));
    require(scores, DType::F32, op, "scores");
    if (scores.shape.size() != 2 || column < 0 || column >= scores.dim(1))
      bad_argument(op + ": scores",
                   cat({"[rows, stride] with column ", std::to_string(column), " < stride"}),
                   describe(scores));
    int64_t kv_heads = 0;
    if (similarity != nullptr) {
      require(*similarity, DType::F32, op, "similarity");
      if (elements(*similarity) < 2 || elements(*similarity) % 2 != 0)
        bad_argument(op + ": similarity", "2 * G elements (keys, then values)",
                     describe(*similarity));
      kv_heads = elements(*similarity) / 2;
    }
    backend_.activate();
    cuda::launch_token_filter_step(similarity ? similarity->as<float>() : nullptr, kv_heads, eta,
                                   target, column, static_cast<double*>(state.data),
                                   {scores.as<float>(), scores.dim(1)}, scores.dim(0),
                                   keep.as<uint8_t>(), backend_.stream());
    check_launch(op.c_str());
  }

 private:
  CudaBackend& backend_;
};

}  // namespace
}  // namespace kvlens::cuda

namespace kvlens {

void register_cuda_policy_ops() {
  static std::once_flag registered;
  std::call_once(registered, [] {
    register_op_extension(std::string(KeyDiffOps::kExtensionName), "cuda", [](Backend& backend) {
      return std::make_unique<cuda::CudaKeyDiffOps>(backend);
    });
    register_op_extension(std::string(QuestOps::kExtensionName), "cuda", [](Backend& backend) {
      return std::make_unique<cuda::CudaQuestOps>(backend);
    });
    register_op_extension(
        std::string(TokenFilterOps::kExtensionName), "cuda",
        [](Backend& backend) { return std::make_unique<cuda::CudaTokenFilterOps>(backend); });
    cuda::register_cuda_approx_logit_ops();
    cuda::register_cuda_rocketkv_ops();
    cuda::register_cuda_top_p_ops();
    cuda::register_cuda_magicpig_ops();
    cuda::register_cuda_predictor_step_ops();
  });
}

}  // namespace kvlens
