// MagicPIG's LSH ops (magicpig_ops.h) on the CPU backend: magicpig_math.h's arithmetic, KV heads
// (hash_keys) or query heads (lsh_sample) spread over the backend's thread pool. k_cache F32
// [G, capacity, D], codes F32 [G, stride, tables], rows [H, stride].
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_checks.h"
#include "engine/backend/cpu/cpu_policy_ops.h"
#include "engine/policy/magicpig_math.h"
#include "engine/policy/magicpig_ops.h"

namespace kvlens {

namespace {

using namespace cpu_checks;  // require*, describe, cat, row_shape, cache_shape
using cpu_policy::Context;

// The tables of `codes` [G, >= cols, tables] for a cache of `groups` KV heads, planes
// [tables * bits, D] checked against them.
int64_t checked_tables(const DeviceTensor& codes, const DeviceTensor& planes, int64_t bits,
                       int64_t groups, int64_t cols, int64_t head_dim, OpName op) {
  KVLENS_REQUIRE(bits >= 1 && bits <= 20, op + ": bits", "1 to 20 bits per table",
                 std::to_string(bits));
  require_f32(codes, op + ": codes");
  KVLENS_REQUIRE(codes.shape.size() == 3 && codes.dim(0) == groups && codes.dim(1) >= cols &&
                     codes.dim(2) >= 1,
                 op + ": codes", cat("an F32 [", groups, ", >= ", cols, ", tables] tensor"),
                 describe(codes));
  const int64_t tables = codes.dim(2);
  require_f32(planes, op + ": planes");
  KVLENS_REQUIRE(
      planes.shape.size() == 2 && planes.dim(0) == tables * bits && planes.dim(1) == head_dim,
      op + ": planes", cat("an F32 [", tables * bits, ", ", head_dim, "] tensor"),
      describe(planes));
  return tables;
}

void run_hash_keys(const Context& context, const DeviceTensor& k_cache, int64_t begin, int64_t end,
                   const DeviceTensor& planes, int64_t bits, DeviceTensor& codes) {
  const OpName op{"hash_keys"};
  require_cols(end, op);
  const CacheShape cache = cache_shape(k_cache, end, op, "k_cache");
  KVLENS_REQUIRE(0 <= begin && begin <= end, op + ": columns", "0 <= begin <= end",
                 cat(begin, ", ", end));
  const int64_t tables = checked_tables(codes, planes, bits, cache.groups, end, cache.head_dim, op);
  const int64_t D = cache.head_dim, stride = codes.dim(1);
  const auto widen = [](float v) { return v; };
  context.pool.parallel_for(0, cache.groups * (end - begin), [&](int64_t first, int64_t last) {
    for (int64_t item = first; item < last; ++item) {
      const int64_t g = item / (end - begin), j = begin + item % (end - begin);
      const float* key = k_cache.as<const float>() + (g * cache.capacity + j) * D;
      float* out = codes.as<float>() + (g * stride + j) * tables;
      for (int64_t t = 0; t < tables; ++t)
        out[t] = simhash_code(key, planes.as<const float>(), D, t, bits, widen);
    }
  });
}

void run_lsh_sample(const Context& context, const DeviceTensor& q, const DeviceTensor& k_cache,
                    const DeviceTensor& codes, const DeviceTensor& planes, int64_t bits,
                    int64_t cols, int64_t sink_end, int64_t recent_begin, DeviceTensor& visible,
                    DeviceTensor& log_weights, DeviceTensor& scores) {
  const OpName op{"lsh_sample"};
  require_cols(cols, op);
  const CacheShape cache = cache_shape(k_cache, cols, op, "k_cache");
  const int64_t tables =
      checked_tables(codes, planes, bits, cache.groups, cols, cache.head_dim, op);
  KVLENS_REQUIRE(0 <= sink_end && sink_end <= recent_begin && recent_begin <= cols,
                 op + ": forced columns", cat("0 <= sink_end <= recent_begin <= ", cols),
                 cat(sink_end, ", ", recent_begin));
  const RowShape mask = row_shape(visible, DType::U8, -1, cols, op + ": visible");
  const RowShape weights =
      row_shape(log_weights, DType::F32, mask.rows, cols, op + ": log_weights");
  const RowShape score_rows = row_shape(scores, DType::F32, mask.rows, cols, op + ": scores");
  const int64_t H = mask.rows, D = cache.head_dim;
  KVLENS_REQUIRE(cache.groups > 0 && H % cache.groups == 0, op + ": visible",
                 cat("a row count that is a multiple of the ", cache.groups, " KV heads"),
                 describe(visible));
  require_f32(q, op + ": q");
  KVLENS_REQUIRE(q.numel() == H * D, op + ": q", cat("an F32 tensor of ", H, " x ", D, " values"),
                 describe(q));
  const int64_t per_group = H / cache.groups, stride = codes.dim(1);
  const auto widen = [](float v) { return v; };
  context.pool.parallel_for(0, H, [&](int64_t begin, int64_t end) {
    std::vector<float> q_codes(static_cast<size_t>(tables));
    for (int64_t h = begin; h < end; ++h) {
      const int64_t g = h / per_group;
      const float* qh = q.as<const float>() + h * D;
      for (int64_t t = 0; t < tables; ++t)
        q_codes[size_t(t)] = simhash_code(qh, planes.as<const float>(), D, t, bits, widen);
      const float q_squared = dot_fixed(qh, qh, D, widen);
      uint8_t* v = visible.as<uint8_t>() + h * mask.stride;
      float* w = log_weights.as<float>() + h * weights.stride;
      float* s = scores.as<float>() + h * score_rows.stride;
      for (int64_t j = 0; j < cols; ++j) {
        if (j < sink_end || j >= recent_begin) {
          v[j] = 1, w[j] = 0.0f, s[j] = 1.0f;
          continue;
        }
        const float* key = k_cache.as<const float>() + (g * cache.capacity + j) * D;
        const float p = magicpig_probability(
            magicpig_u(dot_fixed(qh, key, D, widen), q_squared, dot_fixed(key, key, D, widen)),
            bits, tables);
        const bool sampled =
            code_collisions(q_codes.data(), codes.as<const float>() + (g * stride + j) * tables,
                            tables) >= kMagicpigCollisions;
        v[j] = sampled ? 1 : 0;
        w[j] = sampled ? magicpig_log_weight(p) : 0.0f;
        s[j] = p;
      }
    }
  });
}

class CpuMagicpigOps final : public MagicpigOps {
 public:
  explicit CpuMagicpigOps(Backend& backend) : context_(cpu_policy::context_of(backend)) {}
  void hash_keys(const DeviceTensor& k_cache, int64_t begin, int64_t end,
                 const DeviceTensor& planes, int64_t bits, DeviceTensor& codes) override {
    run_hash_keys(context_, k_cache, begin, end, planes, bits, codes);
  }
  void lsh_sample(const DeviceTensor& q, const DeviceTensor& k_cache, const DeviceTensor& codes,
                  const DeviceTensor& planes, int64_t bits, int64_t cols, int64_t sink_end,
                  int64_t recent_begin, DeviceTensor& visible, DeviceTensor& log_weights,
                  DeviceTensor& scores) override {
    run_lsh_sample(context_, q, k_cache, codes, planes, bits, cols, sink_end, recent_begin, visible,
                   log_weights, scores);
  }

 private:
  Context context_;
};

}  // namespace

MagicpigOps& magicpig_ops(Backend& backend) {
  return extension_with_cpu<MagicpigOps, CpuMagicpigOps>(backend);
}

}  // namespace kvlens
