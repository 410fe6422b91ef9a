// The CUDA backend's batched forms of the per-run ops (kv_append_runs, attention_logits_runs,
// attention_visible_runs, count_nonzero_rows_deferred_many) against the single-run ops on the
// same GPU: each run's results must be the single-run op's bits. Run counts above the 16 runs
// (and 64 masks) of one launch make the ops split into several launches.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/common/dtype.h"
#include "engine/common/error.h"
#include "kernels/cuda_backend.h"
#include "tests/support/random_values.h"

using namespace kvlens;
using kvlens::test::random_values;

namespace {

constexpr float kSentinel = 123.0f;

template <typename T>
DeviceTensor upload(Backend& gpu, DType dtype, const std::vector<T>& values,
                    const std::vector<int64_t>& shape) {
  DeviceTensor t = gpu.alloc(dtype, shape);
  gpu.from_host(t, values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> read(Backend& gpu, const DeviceTensor& t) {
  std::vector<T> values(size_t(t.numel()) * dtype_size(t.dtype) / sizeof(T));
  gpu.to_host(t, values.data(), values.size() * sizeof(T));
  return values;
}

// Same bits, NaN payloads included (both sides are the GPU's).
template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// A cache's bytes in `dtype` (F32 or BF16) from seeded random values.
std::vector<uint8_t> random_cache_bytes(DType dtype, size_t count, uint32_t seed) {
  const std::vector<float> values = random_values(count, seed);
  std::vector<uint8_t> bytes(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::BF16) {
      const uint16_t bits = f32_to_bf16(values[i]);
      std::memcpy(&bytes[i * 2], &bits, 2);
    } else {
      std::memcpy(&bytes[i * 4], &values[i], 4);
    }
  }
  return bytes;
}

std::vector<uint8_t> random_mask(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> mask(count);
  for (auto& m : mask) m = uint8_t(rng() % 3 == 0);
  return mask;
}

// One run's operands: its own caches (capacity `capacity`), query, mask and outputs, twice (the
// single-run op's outputs and the batched op's).
struct RunOperands {
  DeviceTensor q, k_cache, v_cache, visible;
  DeviceTensor logits[2], out[2], probs[2];
};

}  // namespace

TEST_CASE("cuda batched run ops give each run the single-run op's bits", "[cuda]") {
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  const int64_t H = 8, G = 2, D = 64, stride = 1600;
  uint32_t seed = 900;
  struct Case {
    const char* name;
    int64_t runs, position, window;
    bool mixed_capacity;  // a few caches past the one-kernel path's 1024 positions
    DType cache_dtype;
  };
  for (const Case& c : {Case{"18 runs, one kernel each", 18, 577, 0, false, DType::F32},
                        Case{"3 runs, window, BF16 caches", 3, 300, 64, false, DType::BF16},
                        Case{"5 runs, mixed capacities", 5, 700, 0, true, DType::F32}}) {
    INFO(c.name);
    std::vector<RunOperands> runs(size_t(c.runs));
    std::vector<Backend::RunAttention> batch[2];
    std::vector<Backend::RunAppend> appends;
    std::vector<DeviceTensor> new_k, new_v, k_copies, v_copies;
    for (size_t r = 0; r < runs.size(); ++r) {
      RunOperands& run = runs[r];
      const int64_t capacity = c.mixed_capacity && r % 2 == 1 ? 1536 : 1000;
      run.q = upload(*gpu, DType::F32, random_values(size_t(H * D), ++seed, 2.0f), {1, H, D});
      // Two copies of each cache, random throughout: kv_append writes the position's row into
      // the first, kv_append_runs into the second.
      const size_t cells = size_t(G * capacity * D);
      const std::vector<uint8_t> ks = random_cache_bytes(c.cache_dtype, cells, ++seed);
      const std::vector<uint8_t> vs = random_cache_bytes(c.cache_dtype, cells, ++seed);
      run.k_cache = upload(*gpu, c.cache_dtype, ks, {G, capacity, D});
      run.v_cache = upload(*gpu, c.cache_dtype, vs, {G, capacity, D});
      k_copies.push_back(upload(*gpu, c.cache_dtype, ks, {G, capacity, D}));
      v_copies.push_back(upload(*gpu, c.cache_dtype, vs, {G, capacity, D}));
      new_k.push_back(upload(*gpu, DType::F32, random_values(size_t(G * D), ++seed), {1, G, D}));
      new_v.push_back(upload(*gpu, DType::F32, random_values(size_t(G * D), ++seed), {1, G, D}));
      run.visible = upload(*gpu, DType::U8, random_mask(size_t(H * stride), ++seed), {H, stride});
      for (int side = 0; side < 2; ++side) {
        run.logits[side] = upload(*gpu, DType::F32,
                                  std::vector<float>(size_t(H * stride), kSentinel), {H, stride});
        run.out[side] = gpu->alloc(DType::F32, {1, H, D});
        run.probs[side] = upload(*gpu, DType::F32,
                                 std::vector<float>(size_t(H * stride), kSentinel), {H, stride});
        Backend::RunAttention a;
        a.q = &run.q;
        a.k_cache = &run.k_cache;
        a.v_cache = &run.v_cache;
        a.logits = &run.logits[side];
        a.visible = r % 3 == 0 ? nullptr : &run.visible;  // some runs see every column
        a.out = &run.out[side];
        a.probs = r % 4 == 1 ? nullptr : &run.probs[side];  // some want no probabilities
        batch[side].push_back(a);
      }
    }
    for (size_t r = 0; r < runs.size(); ++r) {
      gpu->kv_append(new_k[r], new_v[r], runs[r].k_cache, runs[r].v_cache, c.position);
      appends.push_back({&new_k[r], &new_v[r], &k_copies[r], &v_copies[r]});
    }
    gpu->kv_append_runs(appends, c.position);
    for (size_t r = 0; r < runs.size(); ++r) {
      INFO("run " << r);
      CHECK(same_bytes(read<uint8_t>(*gpu, k_copies[r]), read<uint8_t>(*gpu, runs[r].k_cache)));
      CHECK(same_bytes(read<uint8_t>(*gpu, v_copies[r]), read<uint8_t>(*gpu, runs[r].v_cache)));
    }

    // Single-run ops into side 0, the batched ops into side 1.
    for (const Backend::RunAttention& a : batch[0])
      gpu->attention_logits(*a.q, *a.k_cache, c.position, c.window, *a.logits);
    gpu->attention_logits_runs(batch[1], 0, c.position, c.window);
    const int64_t cols = c.position + 1;
    for (const Backend::RunAttention& a : batch[0])
      gpu->attention_visible(*a.logits, cols, a.visible, *a.v_cache, *a.out, a.probs);
    gpu->attention_visible_runs(batch[1], 0, cols);
    for (size_t r = 0; r < runs.size(); ++r) {
      INFO("run " << r);
      const RunOperands& run = runs[r];
      CHECK(same_bytes(read<float>(*gpu, run.logits[0]), read<float>(*gpu, run.logits[1])));
      CHECK(same_bytes(read<float>(*gpu, run.out[0]), read<float>(*gpu, run.out[1])));
      CHECK(same_bytes(read<float>(*gpu, run.probs[0]), read<float>(*gpu, run.probs[1])));
    }
  }
}

TEST_CASE("cuda count_nonzero_rows_deferred_many gives count_nonzero_rows' counts", "[cuda]") {
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  // 70 masks (two launches of at most 64), of 1 to 8 rows and 1 to 900 columns.
  std::mt19937 rng(77);
  std::vector<DeviceTensor> masks;
  std::vector<int64_t> cols;
  for (int i = 0; i < 70; ++i) {
    const int64_t rows = 1 + int64_t(rng() % 8), c = 1 + int64_t(rng() % 900);
    masks.push_back(upload(*gpu, DType::U8, random_mask(size_t(rows * 1000), rng()), {rows, 1000}));
    cols.push_back(c);
  }
  std::vector<std::vector<int64_t>> want(masks.size()), got(masks.size());
  std::vector<Backend::RowCount> requests;
  for (size_t i = 0; i < masks.size(); ++i) {
    want[i].assign(size_t(masks[i].dim(0)), -1);
    got[i].assign(size_t(masks[i].dim(0)), -1);
    gpu->count_nonzero_rows(masks[i], cols[i], want[i]);
    requests.push_back({&masks[i], cols[i], got[i]});
  }
  gpu->count_nonzero_rows_deferred_many(requests);
  gpu->synchronize();
  for (size_t i = 0; i < masks.size(); ++i) {
    INFO("mask " << i);
    CHECK(got[i] == want[i]);
  }

  // A bad request anywhere fails the call before anything is queued: no count arrives.
  std::vector<int64_t> untouched(size_t(masks[0].dim(0)), -1), short_counts(1, -1);
  const DeviceTensor floats = gpu->alloc(DType::F32, {2, 8});
  std::vector<int64_t> two(2, -1);
  const Backend::RowCount bad_dtype[] = {{&masks[0], cols[0], untouched}, {&floats, 4, two}};
  CHECK_THROWS_AS(gpu->count_nonzero_rows_deferred_many(bad_dtype), Error);
  const Backend::RowCount too_wide[] = {{&masks[0], cols[0], untouched}, {&masks[1], 1001, got[1]}};
  CHECK_THROWS_AS(gpu->count_nonzero_rows_deferred_many(too_wide), Error);
  gpu->synchronize();
  CHECK(untouched == std::vector<int64_t>(untouched.size(), -1));
}

TEST_CASE("cuda rope_append_runs gives rope_pair's and kv_append_runs' bits", "[cuda]") {
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  const int64_t H = 8, G = 2, capacity = 700, position = 513;
  uint32_t seed = 1700;
  struct Case {
    const char* name;
    int64_t runs, head_dim, half;  // half: rotated pairs (partial rotary below head_dim / 2)
    float scale;
  };
  for (const Case& c : {Case{"18 runs (two launches), F32 and BF16 caches", 18, 64, 32, 1.0f},
                        Case{"3 runs, partial rotary, scaled", 3, 80, 16, 1.19f}}) {
    INFO(c.name);
    const int64_t D = c.head_dim;
    std::vector<float> inv_freq_values(size_t(c.half));
    for (int64_t f = 0; f < c.half; ++f)
      inv_freq_values[size_t(f)] = float(1.0 / std::pow(500000.0, double(2 * f) / double(D)));
    const DeviceTensor inv_freq =
        upload(*gpu, DType::F32, inv_freq_values, {int64_t(inv_freq_values.size())});
    // Side 0: rope_pair and kv_append_runs; side 1: rope_append_runs. Caches random throughout.
    struct Side {
      std::vector<DeviceTensor> q, k, v, k_cache, v_cache;
    } sides[2];
    std::vector<float> first_key;
    for (int64_t r = 0; r < c.runs; ++r) {
      const DType dtype = r % 3 == 2 ? DType::BF16 : DType::F32;  // dtypes interleaved
      const std::vector<float> q = random_values(size_t(H * D), ++seed, 2.0f);
      const std::vector<float> k = random_values(size_t(G * D), ++seed, 2.0f);
      if (r == 0) first_key = k;
      const std::vector<float> v = random_values(size_t(G * D), ++seed);
      const std::vector<uint8_t> ks = random_cache_bytes(dtype, size_t(G * capacity * D), ++seed);
      const std::vector<uint8_t> vs = random_cache_bytes(dtype, size_t(G * capacity * D), ++seed);
      for (Side& side : sides) {
        side.q.push_back(upload(*gpu, DType::F32, q, {1, H, D}));
        side.k.push_back(upload(*gpu, DType::F32, k, {1, G, D}));
        side.v.push_back(upload(*gpu, DType::F32, v, {1, G, D}));
        side.k_cache.push_back(upload(*gpu, dtype, ks, {G, capacity, D}));
        side.v_cache.push_back(upload(*gpu, dtype, vs, {G, capacity, D}));
      }
    }
    std::vector<Backend::RunAppend> appends;
    std::vector<Backend::RunRopeAppend> fused;
    for (size_t r = 0; r < size_t(c.runs); ++r) {
      Side& apart = sides[0];
      gpu->rope_pair(apart.q[r], apart.k[r], std::vector<int64_t>{position}, inv_freq, c.scale);
      appends.push_back({&apart.k[r], &apart.v[r], &apart.k_cache[r], &apart.v_cache[r]});
      Side& one = sides[1];
      fused.push_back({&one.q[r], &one.k[r], &one.v[r], &one.k_cache[r], &one.v_cache[r]});
    }
    gpu->kv_append_runs(appends, position);
    gpu->rope_append_runs(fused, position, inv_freq, c.scale);
    for (size_t r = 0; r < size_t(c.runs); ++r) {
      INFO("run " << r);
      CHECK(same_bytes(read<float>(*gpu, sides[0].q[r]), read<float>(*gpu, sides[1].q[r])));
      CHECK(same_bytes(read<float>(*gpu, sides[0].k[r]), read<float>(*gpu, sides[1].k[r])));
      CHECK(same_bytes(read<uint8_t>(*gpu, sides[0].k_cache[r]),
                       read<uint8_t>(*gpu, sides[1].k_cache[r])));
      CHECK(same_bytes(read<uint8_t>(*gpu, sides[0].v_cache[r]),
                       read<uint8_t>(*gpu, sides[1].v_cache[r])));
    }
    // Not vacuous: the keys were rotated (run 0's differs from its row before RoPE).
    CHECK_FALSE(same_bytes(read<float>(*gpu, sides[1].k[0]), first_key));
  }

  // Errors name the op; nothing is queued for a call that fails.
  const int64_t D = 64;
  const DeviceTensor inv_freq =
      upload(*gpu, DType::F32, std::vector<float>(size_t(D / 2), 0.5f), {D / 2});
  const std::vector<float> q_values = random_values(size_t(H * D), 1799);
  DeviceTensor q = upload(*gpu, DType::F32, q_values, {1, H, D});
  DeviceTensor k = gpu->alloc(DType::F32, {1, G, D});
  DeviceTensor v = gpu->alloc(DType::F32, {1, G, D});
  DeviceTensor k_cache = gpu->alloc(DType::F32, {G, capacity, D});
  DeviceTensor v_cache = gpu->alloc(DType::F32, {G, capacity, D});
  DeviceTensor two_rows = gpu->alloc(DType::F32, {2, H, D});
  DeviceTensor narrow_q = gpu->alloc(DType::F32, {1, H, D / 2});
  const Backend::RunRopeAppend good{&q, &k, &v, &k_cache, &v_cache};
  auto fails = [&](Backend::RunRopeAppend run, int64_t at) {
    const std::vector<Backend::RunRopeAppend> runs = {good, run};
    CHECK_THROWS_WITH(gpu->rope_append_runs(runs, at, inv_freq, 1.0f),
                      Catch::Contains("rope_append_runs") || Catch::Contains("kv_append"));
  };
  Backend::RunRopeAppend missing = good;
  missing.v = nullptr;
  fails(missing, position);
  Backend::RunRopeAppend rows = good;
  rows.q = &two_rows;
  fails(rows, position);
  Backend::RunRopeAppend narrow = good;
  narrow.q = &narrow_q;
  fails(narrow, position);
  fails(good, capacity);                              // past the cache
  CHECK(same_bytes(read<float>(*gpu, q), q_values));  // the good run was not rotated either
}
