// CPU reference backend: every op and the attention kernels against naive double-precision
// references written here, on seeded random inputs with odd sizes (not multiples of the 8/16-lane
// kernels), plus the thread pool. Shapes as in backend.h: x [n, in], w [out, in], q/out [n, H, D],
// caches [G, cap, D].
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/cpu_dot_kernels.h"
#include "engine/backend/cpu/cpu_matmul.h"
#include "engine/backend/thread_pool.h"
#include "engine/common/error.h"
#include "tests/support/backend_checks.h"
#include "tests/support/random_values.h"

using namespace kvlens;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using kvlens::test::make_f32;
using kvlens::test::random_values;

std::vector<float> read(Backend& backend, const DeviceTensor& t) {
  std::vector<float> values(size_t(t.numel()));
  backend.to_host(t, values.data(), values.size() * sizeof(float));
  return values;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
  return bits;
}

// Nearest F16 by binary search over the bit patterns of one sign (they are ordered like the
// values they encode); values stay small so there is no overflow.
uint16_t to_f16(float value) {
  const uint16_t sign = std::signbit(value) ? 0x8000u : 0u;
  const float magnitude = std::fabs(value);
  uint32_t lo = 0, hi = 0x7bffu;  // largest finite
  while (lo < hi) {               // first pattern >= magnitude
    const uint32_t mid = (lo + hi) / 2;
    if (f16_to_f32(uint16_t(mid)) < magnitude) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  if (lo > 0 && magnitude - f16_to_f32(uint16_t(lo - 1)) <= f16_to_f32(uint16_t(lo)) - magnitude) {
    --lo;
  }
  return uint16_t(sign | lo);
}

TensorView view_of(const void* data, DType dtype, std::vector<int64_t> shape) {
  TensorView view;
  view.name = "test.weight";
  view.dtype = dtype;
  view.shape = std::move(shape);
  view.data = static_cast<const std::byte*>(data);
  view.bytes = size_t(view.numel()) * dtype_size(dtype);
  view.file = "memory";
  return view;
}

// y[i, o] = sum_k x[i, k] * w[o, k] in double; also the sum of |products| for tolerances.
void reference_matmul(const std::vector<float>& x, const std::vector<float>& w, int64_t n,
                      int64_t in, int64_t out, std::vector<double>& y,
                      std::vector<double>& magnitude) {
  y.assign(size_t(n * out), 0.0);
  magnitude.assign(size_t(n * out), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0, abs_sum = 0.0;
      for (int64_t k = 0; k < in; ++k) {
        const double p = double(x[size_t(i * in + k)]) * double(w[size_t(o * in + k)]);
        sum += p;
        abs_sum += std::fabs(p);
      }
      y[size_t(i * out + o)] = sum;
      magnitude[size_t(i * out + o)] = abs_sum;
    }
  }
}

void check_matmul_close(const std::vector<float>& got, const std::vector<double>& want,
                        const std::vector<double>& magnitude) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    // Float accumulation: a few ulps of the sum of magnitudes.
    INFO("element " << i);
    REQUIRE(std::fabs(double(got[i]) - want[i]) <= 1e-5 * magnitude[i] + 1e-30);
  }
}

struct AttentionCase {
  int64_t n, heads, groups, head_dim, capacity, first_position, window;
};

// Double-precision attention over the caches; `visible` [H, context] or empty.
void reference_attention(const AttentionCase& c, const std::vector<float>& q,
                         const std::vector<float>& k_cache, const std::vector<float>& v_cache,
                         const std::vector<uint8_t>& visible, std::vector<double>& out,
                         std::vector<double>& logits) {
  const int64_t context = c.first_position + c.n;
  out.assign(size_t(c.n * c.heads * c.head_dim), 0.0);
  logits.assign(size_t(c.n * c.heads * context), -std::numeric_limits<double>::infinity());
  const double scale = 1.0 / std::sqrt(double(c.head_dim));
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t p = c.first_position + i;
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t kv = h / (c.heads / c.groups);
      double* row = &logits[size_t((i * c.heads + h) * context)];
      double max_logit = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j <= p; ++j) {
        if (c.window > 0 && j < p - c.window + 1) continue;
        if (!visible.empty() && !visible[size_t(h * context + j)]) continue;
        double dot = 0.0;
        for (int64_t d = 0; d < c.head_dim; ++d) {
          dot += double(q[size_t((i * c.heads + h) * c.head_dim + d)]) *
                 double(k_cache[size_t((kv * c.capacity + j) * c.head_dim + d)]);
        }
        row[j] = dot * scale;
        max_logit = std::max(max_logit, row[j]);
      }
      if (std::isinf(max_logit)) continue;
      double total = 0.0;
      for (int64_t j = 0; j <= p; ++j) {
        if (std::isinf(row[j])) continue;
        const double weight = std::exp(row[j] - max_logit);
        total += weight;
        for (int64_t d = 0; d < c.head_dim; ++d) {
          out[size_t((i * c.heads + h) * c.head_dim + d)] +=
              weight * double(v_cache[size_t((kv * c.capacity + j) * c.head_dim + d)]);
        }
      }
      for (int64_t d = 0; d < c.head_dim; ++d) {
        out[size_t((i * c.heads + h) * c.head_dim + d)] /= total;
      }
    }
  }
}

// Runs the backend's attention on random caches filled through kv_append and compares output
// and logits with the reference.
void check_attention(Backend& backend, const AttentionCase& c, const std::vector<uint8_t>& mask,
                     uint32_t seed) {
  const int64_t context = c.first_position + c.n;
  const auto keys = random_values(size_t(context * c.groups * c.head_dim), seed);
  const auto values = random_values(size_t(context * c.groups * c.head_dim), seed + 1);
  const auto q_values = random_values(size_t(c.n * c.heads * c.head_dim), seed + 2);
  DeviceTensor k_cache = backend.alloc(DType::F32, {c.groups, c.capacity, c.head_dim});
  DeviceTensor v_cache = backend.alloc(DType::F32, {c.groups, c.capacity, c.head_dim});
  // Append in two chunks to exercise first_position in kv_append too.
  const int64_t split = context / 2;
  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, split}, {split, context}}) {
    const size_t row = size_t(c.groups * c.head_dim);
    std::vector<float> k_part(keys.begin() + long(size_t(begin) * row),
                              keys.begin() + long(size_t(end) * row));
    std::vector<float> v_part(values.begin() + long(size_t(begin) * row),
                              values.begin() + long(size_t(end) * row));
    backend.kv_append(make_f32(backend, k_part, {end - begin, c.groups, c.head_dim}),
                      make_f32(backend, v_part, {end - begin, c.groups, c.head_dim}), k_cache,
                      v_cache, begin);
  }
  // The reference reads the cache layout [G, capacity, D].
  std::vector<float> k_layout(size_t(c.groups * c.capacity * c.head_dim), 0.0f);
  std::vector<float> v_layout = k_layout;
  for (int64_t j = 0; j < context; ++j) {
    for (int64_t g = 0; g < c.groups; ++g) {
      for (int64_t d = 0; d < c.head_dim; ++d) {
        k_layout[size_t((g * c.capacity + j) * c.head_dim + d)] =
            keys[size_t((j * c.groups + g) * c.head_dim + d)];
        v_layout[size_t((g * c.capacity + j) * c.head_dim + d)] =
            values[size_t((j * c.groups + g) * c.head_dim + d)];
      }
    }
  }
  REQUIRE(read(backend, k_cache) == k_layout);
  REQUIRE(read(backend, v_cache) == v_layout);

  DeviceTensor q = make_f32(backend, q_values, {c.n, c.heads, c.head_dim});
  DeviceTensor out = backend.alloc(DType::F32, {c.n, c.heads, c.head_dim});
  DeviceTensor logits = backend.alloc(DType::F32, {c.n, c.heads, context});
  DeviceTensor mask_tensor;
  Visibility visibility;
  if (!mask.empty()) {
    mask_tensor = backend.alloc(DType::U8, {c.heads, context});
    backend.from_host(mask_tensor, mask.data(), mask.size());
    visibility.mask = &mask_tensor;
  }
  backend.attention(q, k_cache, v_cache, c.first_position, c.window, visibility, out, &logits);

  std::vector<double> want_out, want_logits;
  reference_attention(c, q_values, k_layout, v_layout, mask, want_out, want_logits);
  const auto got_out = read(backend, out);
  const auto got_logits = read(backend, logits);
  for (size_t i = 0; i < want_logits.size(); ++i) {
    INFO("logit " << i);
    if (std::isinf(want_logits[i])) {
      REQUIRE(got_logits[i] == kNegInf);
    } else {
      REQUIRE(std::fabs(double(got_logits[i]) - want_logits[i]) <= 1e-5);
    }
  }
  for (size_t i = 0; i < want_out.size(); ++i) {
    INFO("output " << i);
    REQUIRE(std::fabs(double(got_out[i]) - want_out[i]) <= 1e-5);
  }

  // Without logits_out the output is the same, bit for bit.
  DeviceTensor out_again = backend.alloc(DType::F32, {c.n, c.heads, c.head_dim});
  backend.attention(q, k_cache, v_cache, c.first_position, c.window, visibility, out_again,
                    nullptr);
  REQUIRE(read(backend, out_again) == got_out);

  // Logit rows wider than the context (a recording session's): the same bits in the first
  // context columns, the rest untouched, the same output.
  const int64_t wide = context + 5;
  DeviceTensor wide_logits = make_f32(
      backend, std::vector<float>(size_t(c.n * c.heads * wide), 42.0f), {c.n, c.heads, wide});
  backend.attention(q, k_cache, v_cache, c.first_position, c.window, visibility, out_again,
                    &wide_logits);
  REQUIRE(read(backend, out_again) == got_out);
  const std::vector<float> wide_rows = read(backend, wide_logits);
  int64_t wrong = 0;
  for (int64_t r = 0; r < c.n * c.heads; ++r)
    for (int64_t j = 0; j < wide; ++j) {
      const float value = wide_rows[size_t(r * wide + j)];
      wrong += j < context ? std::memcmp(&value, &got_logits[size_t(r * context + j)], 4) != 0
                           : value != 42.0f;
    }
  CHECK(wrong == 0);
  // Narrower rows, or not [n, H, S]: errors.
  DeviceTensor narrow = backend.alloc(DType::F32, {c.n, c.heads, context - 1});
  CHECK_THROWS_AS(backend.attention(q, k_cache, v_cache, c.first_position, c.window, visibility,
                                    out_again, &narrow),
                  Error);
  DeviceTensor flat = backend.alloc(DType::F32, {c.n * c.heads * context});
  CHECK_THROWS_AS(backend.attention(q, k_cache, v_cache, c.first_position, c.window, visibility,
                                    out_again, &flat),
                  Error);
}

}  // namespace

TEST_CASE("rows_to_host_async packs the first columns of rows, and its fence is passed at once",
          "[backend]") {
  auto backend = make_cpu_backend(2);
  std::vector<float> values(4 * 9);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i) * 0.5f;
  DeviceTensor rows = make_f32(*backend, values, {4, 9});
  std::shared_ptr<void> host = backend->alloc_host(3 * 6 * sizeof(float));
  auto* packed = static_cast<float*>(host.get());
  backend->rows_to_host_async(rows, 3, 6, packed);
  backend->fence()->wait();
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t j = 0; j < 6; ++j) CHECK(packed[r * 6 + j] == values[size_t(r * 9 + j)]);
  backend->rows_to_host_async(rows, 2, 9, packed);  // whole rows: one copy
  CHECK(std::equal(packed, packed + 18, values.begin()));
  CHECK_THROWS_AS(backend->rows_to_host_async(rows, 3, 10, packed), Error);
  CHECK_THROWS_AS(backend->rows_to_host_async(rows, 5, 6, packed), Error);
  CHECK_THROWS_AS(backend->rows_to_host_async(rows, -1, 6, packed), Error);
}

TEST_CASE("DeviceTensor numel and bytes, alloc is zero-filled, host round trip", "[backend]") {
  auto backend = make_cpu_backend(2);
  DeviceTensor t = backend->alloc(DType::BF16, {3, 5, 7});
  CHECK(t.numel() == 105);
  CHECK(t.bytes() == 210);
  std::vector<uint16_t> bits(105, 1);
  backend->to_host(t, bits.data(), t.bytes());
  for (uint16_t b : bits) REQUIRE(b == 0);
  const auto values = random_values(35, 1);
  DeviceTensor f = make_f32(*backend, values, {5, 7});
  CHECK(read(*backend, f) == values);
  CHECK_THROWS_AS(backend->to_host(f, bits.data(), f.bytes() + 4), Error);
  CHECK(backend->name() == "cpu");
  CHECK(cpu_backend_threads(*backend) == 2);
}

TEST_CASE("matmul F32 matches a double reference at odd sizes", "[backend]") {
  const bool simd = GENERATE(true, false);
  CpuBackendOptions options;
  options.threads = 2;
  options.allow_simd = simd;
  auto backend = make_cpu_backend(options);
  INFO("kernels " << cpu_backend_isa(*backend));
  for (auto [n, in, out] : {std::tuple<int64_t, int64_t, int64_t>{1, 37, 13},
                            {1, 131, 67},
                            {5, 131, 67},
                            {3, 7, 5},
                            {2, 1000, 301}}) {
    INFO("n " << n << " in " << in << " out " << out);
    const auto x = random_values(size_t(n * in), 11);
    const auto w = random_values(size_t(out * in), 12);
    DeviceTensor y = backend->alloc(DType::F32, {n, out});
    backend->matmul(make_f32(*backend, x, {n, in}), make_f32(*backend, w, {out, in}), y);
    std::vector<double> want, magnitude;
    reference_matmul(x, w, n, in, out, want, magnitude);
    check_matmul_close(read(*backend, y), want, magnitude);
  }
}

TEST_CASE("matmul is bit-identical for 1 and 2 threads and between prefill and decode",
          "[backend]") {
  const bool simd = GENERATE(true, false);
  CpuBackendOptions one, two;
  one.threads = 1;
  two.threads = 2;
  one.allow_simd = two.allow_simd = simd;
  auto single = make_cpu_backend(one);
  auto dual = make_cpu_backend(two);
  // 3 rows: one group of 3 rows by 2 panels per kernel call; 9: groups of 5 and 4 rows, panel
  // by panel; 13: three groups, L2 blocks of panels. out = 1037 ends in a partial panel.
  const int64_t n = GENERATE(3, 9, 13), in = 293, out = 1037;
  const auto x = random_values(size_t(n * in), 21);
  const auto w = random_values(size_t(out * in), 22);
  DeviceTensor y1 = single->alloc(DType::F32, {n, out});
  DeviceTensor y2 = dual->alloc(DType::F32, {n, out});
  single->matmul(make_f32(*single, x, {n, in}), make_f32(*single, w, {out, in}), y1);
  dual->matmul(make_f32(*dual, x, {n, in}), make_f32(*dual, w, {out, in}), y2);
  const auto r1 = read(*single, y1);
  REQUIRE(r1 == read(*dual, y2));
  // Each row of the n = 3 product equals the n = 1 product of that row alone.
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> row(x.begin() + long(i * in), x.begin() + long((i + 1) * in));
    DeviceTensor y = dual->alloc(DType::F32, {1, out});
    dual->matmul(make_f32(*dual, row, {1, in}), make_f32(*dual, w, {out, in}), y);
    REQUIRE(read(*dual, y) ==
            std::vector<float>(r1.begin() + long(i * out), r1.begin() + long((i + 1) * out)));
  }
}

TEST_CASE("matmul: the AVX-512, AVX2 and portable kernels give the same bits", "[backend]") {
  // All sum every output as one fused multiply-add chain over k, so they agree exactly, for
  // every way panel_matmul groups the rows (AVX2: up to 6 rows a call; AVX-512: up to 12, so
  // 13 and 25 rows make several groups) and panels (out = 83 and 1037 end in partial panels).
  CpuBackendOptions widest, avx2, portable;
  widest.threads = avx2.threads = portable.threads = 2;
  avx2.allow_avx512 = false;
  portable.allow_simd = false;
  auto widest_backend = make_cpu_backend(widest);
  auto avx2_backend = make_cpu_backend(avx2);
  auto portable_backend = make_cpu_backend(portable);
  if (!cpu_has_avx512f()) WARN("no AVX-512 on this CPU: its matmul kernels are not exercised");
  INFO("kernels " << cpu_backend_isa(*widest_backend));
  const bool bf16 = GENERATE(false, true);
  const int64_t n = GENERATE(1, 2, 3, 5, 10, 12, 13, 25);
  const int64_t in = GENERATE(45, 256), out = GENERATE(83, 1037);
  INFO("bf16 " << bf16 << " n " << n << " in " << in << " out " << out);
  const auto x = random_values(size_t(n * in), 51);
  const auto w = random_values(size_t(out * in), 52);
  const auto bits = to_bf16(w);
  auto run = [&](Backend& backend) {
    DeviceTensor weight =
        bf16 ? backend.upload_weight(view_of(bits.data(), DType::BF16, {out, in}), {})
             : backend.upload_weight(view_of(w.data(), DType::F32, {out, in}), {});
    DeviceTensor y = backend.alloc(DType::F32, {n, out});
    backend.matmul(make_f32(backend, x, {n, in}), weight, y);
    return read(backend, y);
  };
  const auto a = run(*widest_backend), b = run(*avx2_backend), c = run(*portable_backend);
  REQUIRE(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)) == 0);
  REQUIRE(std::memcmp(b.data(), c.data(), b.size() * sizeof(float)) == 0);
}

TEST_CASE("matmul: repacked weights are used only for the tensor they were made from",
          "[backend]") {
  // upload_weight keeps a repacked copy for matmul; a tensor copied from it with other data
  // (a view, or storage reused) must multiply its own data, not the stale copy.
  auto backend = make_cpu_backend(2);
  const int64_t n = 3, in = 40, out = 24;
  const auto x = random_values(size_t(n * in), 61);
  const auto first = random_values(size_t(out * in), 62);
  const auto second = random_values(size_t(out * in), 63);
  DeviceTensor uploaded = backend->upload_weight(view_of(first.data(), DType::F32, {out, in}), {});
  REQUIRE(uploaded.backend_layout != nullptr);
  DeviceTensor other = uploaded;  // shares the repacked copy of `first`
  other.data = const_cast<float*>(second.data());
  DeviceTensor narrower = uploaded;  // the first 8 rows only
  narrower.shape = {8, in};
  const DeviceTensor xt = make_f32(*backend, x, {n, in});
  DeviceTensor y = backend->alloc(DType::F32, {n, out});
  backend->matmul(xt, other, y);
  DeviceTensor want = backend->alloc(DType::F32, {n, out});
  backend->matmul(xt, make_f32(*backend, second, {out, in}), want);
  CHECK(read(*backend, y) == read(*backend, want));
  DeviceTensor y8 = backend->alloc(DType::F32, {n, 8});
  backend->matmul(xt, narrower, y8);
  DeviceTensor y_first = backend->alloc(DType::F32, {n, out});
  backend->matmul(xt, uploaded, y_first);
  const auto all_rows = read(*backend, y_first);
  const auto first_rows = read(*backend, y8);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t o = 0; o < 8; ++o)
      CHECK(first_rows[size_t(i * 8 + o)] == all_rows[size_t(i * out + o)]);
  }
}

TEST_CASE("PanelArena: zeroed, page-aligned, disjoint storage that outlives the arena",
          "[backend]") {
  std::vector<std::shared_ptr<void>> parts;
  {
    PanelArena arena;
    // Small parts share a chunk; a part larger than a chunk gets one of its own.
    for (size_t bytes : {size_t(100), size_t(5000), size_t(40u << 20), size_t(3), size_t(70000)})
      parts.push_back(arena.allocate(bytes));
  }
  const std::vector<size_t> sizes = {100, 5000, 40u << 20, 3, 70000};
  for (size_t i = 0; i < parts.size(); ++i) {
    INFO("part " << i);
    auto* bytes = static_cast<unsigned char*>(parts[i].get());
    CHECK(reinterpret_cast<uintptr_t>(bytes) % 4096 == 0);
    for (size_t b = 0; b < sizes[i]; b += 997) REQUIRE(bytes[b] == 0);
    std::memset(bytes, int(i + 1), sizes[i]);  // writable after the arena is gone
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto* bytes = static_cast<const unsigned char*>(parts[i].get());
    CHECK(bytes[0] == i + 1);  // no part overlaps a later one
    CHECK(bytes[sizes[i] - 1] == i + 1);
  }
}

TEST_CASE("matmul: rows repeated in x (lockstep runs alike) give each row's own product",
          "[backend]") {
  auto backend = make_cpu_backend(2);
  const int64_t in = 96, out = 70;
  const auto a = random_values(size_t(in), 31), b = random_values(size_t(in), 32);
  auto c = random_values(size_t(in), 33);
  c[5] = std::numeric_limits<float>::quiet_NaN();  // equal bits, NaN included
  // b differs from a only in its last element: a comparison must read the whole row.
  std::vector<float> b_like_a = a;
  b_like_a.back() += 1.0f;
  const std::vector<const std::vector<float>*> rows = {&a, &b, &a, &a, &c, &b, &c, &b_like_a};
  std::vector<float> x;
  for (const auto* row : rows) x.insert(x.end(), row->begin(), row->end());
  const int64_t n = int64_t(rows.size());
  const auto w = random_values(size_t(out * in), 34);
  const DeviceTensor w_t = make_f32(*backend, w, {out, in});
  DeviceTensor y = backend->alloc(DType::F32, {n, out});
  backend->matmul(make_f32(*backend, x, {n, in}), w_t, y);
  const auto got = read(*backend, y);
  auto same_bits = [](const std::vector<float>& p, const std::vector<float>& q) {
    return p.size() == q.size() && std::memcmp(p.data(), q.data(), p.size() * sizeof(float)) == 0;
  };
  for (int64_t i = 0; i < n; ++i) {
    INFO("row " << i);
    DeviceTensor alone = backend->alloc(DType::F32, {1, out});
    backend->matmul(make_f32(*backend, *rows[size_t(i)], {1, in}), w_t, alone);
    CHECK(same_bits(read(*backend, alone), std::vector<float>(got.begin() + long(i * out),
                                                              got.begin() + long((i + 1) * out))));
  }
}

TEST_CASE("matmul reads BF16 (and F16) weights exactly as if widened first", "[backend]") {
  const bool simd = GENERATE(true, false);
  CpuBackendOptions options;
  options.threads = 2;
  options.allow_simd = simd;
  auto backend = make_cpu_backend(options);
  const int64_t n = 6, in = 77, out = 45;
  const auto x = random_values(size_t(n * in), 31);
  const auto bits = to_bf16(random_values(size_t(out * in), 32));
  std::vector<float> widened(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) widened[i] = bf16_to_f32(bits[i]);

  DeviceTensor w16 = backend->upload_weight(view_of(bits.data(), DType::BF16, {out, in}), {});
  CHECK(w16.dtype == DType::BF16);
  CHECK(w16.data == static_cast<const void*>(bits.data()));  // aliased, not copied
  DeviceTensor xt = make_f32(*backend, x, {n, in});
  DeviceTensor y16 = backend->alloc(DType::F32, {n, out});
  DeviceTensor y32 = backend->alloc(DType::F32, {n, out});
  backend->matmul(xt, w16, y16);
  backend->matmul(xt, make_f32(*backend, widened, {out, in}), y32);
  REQUIRE(read(*backend, y16) == read(*backend, y32));
  // The register-blocked n > 1 path gives each row the bits of the n = 1 path.
  const std::vector<float> all_rows = read(*backend, y16);
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> row(x.begin() + long(i * in), x.begin() + long((i + 1) * in));
    DeviceTensor y = backend->alloc(DType::F32, {1, out});
    backend->matmul(make_f32(*backend, row, {1, in}), w16, y);
    REQUIRE(read(*backend, y) == std::vector<float>(all_rows.begin() + long(i * out),
                                                    all_rows.begin() + long((i + 1) * out)));
  }
  std::vector<double> want, magnitude;
  reference_matmul(x, widened, n, in, out, want, magnitude);
  check_matmul_close(read(*backend, y16), want, magnitude);

  // F16 weights normally arrive widened by upload_weight, but a F16 tensor is read directly too.
  std::vector<uint16_t> halves(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) halves[i] = to_f16(widened[i]);
  std::vector<float> halves_widened(halves.size());
  for (size_t i = 0; i < halves.size(); ++i) halves_widened[i] = f16_to_f32(halves[i]);
  DeviceTensor wh = backend->alloc(DType::F16, {out, in});
  backend->from_host(wh, halves.data(), halves.size() * sizeof(uint16_t));
  backend->matmul(xt, wh, y16);
  backend->matmul(xt, make_f32(*backend, halves_widened, {out, in}), y32);
  REQUIRE(read(*backend, y16) == read(*backend, y32));
}

TEST_CASE("upload_weight: F32 aliases, F16 widens once, misaligned data is copied", "[backend]") {
  auto backend = make_cpu_backend(1);
  const int64_t in = 19, out = 6;
  const auto values = random_values(size_t(out * in), 41, 0.5f);

  auto owner = std::make_shared<std::vector<float>>(values);
  DeviceTensor w32 = backend->upload_weight(view_of(owner->data(), DType::F32, {out, in}), owner);
  CHECK(w32.data == static_cast<void*>(owner->data()));
  CHECK(owner.use_count() == 2);  // the tensor keeps the mapping alive
  CHECK(w32.shape == std::vector<int64_t>{out, in});

  std::vector<uint16_t> halves(values.size());
  for (size_t i = 0; i < values.size(); ++i) halves[i] = to_f16(values[i]);
  DeviceTensor w16 = backend->upload_weight(view_of(halves.data(), DType::F16, {out, in}), {});
  CHECK(w16.dtype == DType::F32);
  CHECK(w16.data != static_cast<void*>(halves.data()));
  const auto widened = read(*backend, w16);
  for (size_t i = 0; i < halves.size(); ++i) REQUIRE(widened[i] == f16_to_f32(halves[i]));
  // Matmul on the widened F16 weight agrees with the reference on the widened values.
  const auto x = random_values(size_t(in), 42);
  DeviceTensor y = backend->alloc(DType::F32, {1, out});
  backend->matmul(make_f32(*backend, x, {1, in}), w16, y);
  std::vector<double> want, magnitude;
  reference_matmul(x, widened, 1, in, out, want, magnitude);
  check_matmul_close(read(*backend, y), want, magnitude);

  // F32 data at an odd address (safetensors does not promise alignment) gets an aligned copy.
  std::vector<std::byte> bytes(values.size() * sizeof(float) + 1);
  std::memcpy(bytes.data() + 1, values.data(), values.size() * sizeof(float));
  DeviceTensor odd = backend->upload_weight(view_of(bytes.data() + 1, DType::F32, {out, in}), {});
  CHECK(reinterpret_cast<uintptr_t>(odd.data) % alignof(float) == 0);
  CHECK(read(*backend, odd) == values);
}

TEST_CASE("embed gathers rows of F32, BF16 and F16 tables and rejects bad ids", "[backend]") {
  auto backend = make_cpu_backend(2);
  const int64_t vocab = 11, width = 13;
  const auto table = random_values(size_t(vocab * width), 51);
  const auto bits = to_bf16(table);
  std::vector<uint16_t> halves(table.size());
  for (size_t i = 0; i < table.size(); ++i) halves[i] = to_f16(table[i]);
  DeviceTensor t32 = make_f32(*backend, table, {vocab, width});
  DeviceTensor t16 = backend->alloc(DType::BF16, {vocab, width});
  backend->from_host(t16, bits.data(), bits.size() * 2);
  DeviceTensor th = backend->alloc(DType::F16, {vocab, width});
  backend->from_host(th, halves.data(), halves.size() * 2);
  const std::vector<int32_t> ids = {3, 0, 10, 3};
  DeviceTensor out = backend->alloc(DType::F32, {4, width});
  for (int which = 0; which < 3; ++which) {
    const DeviceTensor& t = which == 0 ? t32 : which == 1 ? t16 : th;
    backend->embed(t, ids, out);
    const auto got = read(*backend, out);
    for (size_t i = 0; i < ids.size(); ++i) {
      for (int64_t e = 0; e < width; ++e) {
        const size_t src = size_t(ids[i] * width + e);
        const float want = which == 0   ? table[src]
                           : which == 1 ? bf16_to_f32(bits[src])
                                        : f16_to_f32(halves[src]);
        REQUIRE(got[i * size_t(width) + size_t(e)] == want);
      }
    }
  }
  const std::vector<int32_t> too_big = {1, int32_t(vocab)};
  const std::vector<int32_t> negative = {-1};
  DeviceTensor out2 = backend->alloc(DType::F32, {2, width});
  DeviceTensor out1 = backend->alloc(DType::F32, {1, width});
  CHECK_THROWS_AS(backend->embed(t32, too_big, out2), Error);
  CHECK_THROWS_AS(backend->embed(t32, negative, out1), Error);
  try {
    backend->embed(t32, too_big, out2);
  } catch (const Error& error) {
    CHECK(error.found() == std::to_string(vocab));
  }
}

TEST_CASE("rmsnorm, silu_mul and add_inplace match double references", "[backend]") {
  auto backend = make_cpu_backend(2);
  const int64_t n = 3, width = 29;
  const float eps = 1e-5f;
  const auto x = random_values(size_t(n * width), 61, 2.0f);
  const auto gain = random_values(size_t(width), 62);
  const auto gain_bits = to_bf16(gain);
  DeviceTensor xt = make_f32(*backend, x, {n, width});
  DeviceTensor y = backend->alloc(DType::F32, {n, width});
  for (bool bf16 : {false, true}) {
    DeviceTensor weight;
    if (bf16) {
      weight = backend->alloc(DType::BF16, {width});
      backend->from_host(weight, gain_bits.data(), gain_bits.size() * 2);
    } else {
      weight = make_f32(*backend, gain, {width});
    }
    backend->rmsnorm(xt, weight, eps, y);
    const auto got = read(*backend, y);
    for (int64_t i = 0; i < n; ++i) {
      double mean_square = 0.0;
      for (int64_t e = 0; e < width; ++e)
        mean_square += std::pow(double(x[size_t(i * width + e)]), 2);
      mean_square /= double(width);
      for (int64_t e = 0; e < width; ++e) {
        const double g = bf16 ? double(bf16_to_f32(gain_bits[size_t(e)])) : double(gain[size_t(e)]);
        const double want = double(x[size_t(i * width + e)]) / std::sqrt(mean_square + eps) * g;
        REQUIRE(std::fabs(double(got[size_t(i * width + e)]) - want) <=
                1e-5 * (1 + std::fabs(want)));
      }
    }
  }

  const auto gate = random_values(size_t(n * width), 63, 3.0f);
  const auto up = random_values(size_t(n * width), 64);
  DeviceTensor act = backend->alloc(DType::F32, {n, width});
  backend->silu_mul(make_f32(*backend, gate, {n, width}), make_f32(*backend, up, {n, width}), act);
  const auto got_act = read(*backend, act);
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    const double want = g / (1.0 + std::exp(-g)) * double(up[i]);
    REQUIRE(std::fabs(double(got_act[i]) - want) <= 1e-6 * (1 + std::fabs(want)));
  }

  backend->add_inplace(xt, make_f32(*backend, up, {n, width}));
  const auto sum = read(*backend, xt);
  for (size_t i = 0; i < x.size(); ++i) REQUIRE(sum[i] == x[i] + up[i]);
  CHECK_THROWS_AS(backend->add_inplace(xt, make_f32(*backend, gain, {width})), Error);
}

TEST_CASE("rope rotates halves at each row's position", "[backend]") {
  auto backend = make_cpu_backend(1);
  const int64_t n = 5, heads = 5, head_dim = 10, half = head_dim / 2;
  // Repeated positions (lockstep rows) share one table; a new position gets its own.
  const std::vector<int64_t> positions = {0, 7, 7, 1234, 1234};
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t f = 0; f < half; ++f) {
    inv_freq[size_t(f)] = float(1.0 / std::pow(10000.0, double(2 * f) / double(head_dim)));
  }
  const auto x = random_values(size_t(n * heads * head_dim), 71);
  DeviceTensor xt = make_f32(*backend, x, {n, heads, head_dim});
  backend->rope(xt, positions, make_f32(*backend, inv_freq, {half}));
  const auto got = read(*backend, xt);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const size_t base = size_t((i * heads + h) * head_dim);
      for (int64_t f = 0; f < half; ++f) {
        const double angle = double(float(positions[size_t(i)]) * inv_freq[size_t(f)]);
        const double a = x[base + size_t(f)], b = x[base + size_t(f + half)];
        const double want_a = a * std::cos(angle) - b * std::sin(angle);
        const double want_b = b * std::cos(angle) + a * std::sin(angle);
        REQUIRE(std::fabs(double(got[base + size_t(f)]) - want_a) <=
                1e-6 * (1 + std::fabs(want_a)));
        REQUIRE(std::fabs(double(got[base + size_t(f + half)]) - want_b) <=
                1e-6 * (1 + std::fabs(want_b)));
      }
    }
  }
}

TEST_CASE("rope: partial rotary (first R of D channels) with cos/sin scaled", "[backend]") {
  auto backend = make_cpu_backend(1);
  // phi3 partial rotary: 6 of 10 channels rotated (3 pairs: (0, 3), (1, 4), (2, 5)), 6..9 kept;
  // cos and sin multiplied by a yarn / longrope attention factor in F32 first.
  const int64_t n = 3, heads = 2, head_dim = 10, half = 3;
  const float scale = 1.19f;
  const std::vector<int64_t> positions = {0, 5, 4097};
  const std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f};
  const auto x = random_values(size_t(n * heads * head_dim), 72);
  DeviceTensor xt = make_f32(*backend, x, {n, heads, head_dim});
  backend->rope(xt, positions, make_f32(*backend, inv_freq, {half}), scale);
  const auto got = read(*backend, xt);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < heads; ++h) {
      const size_t base = size_t((i * heads + h) * head_dim);
      for (int64_t f = 0; f < half; ++f) {
        const double angle = double(float(positions[size_t(i)]) * inv_freq[size_t(f)]);
        const double c = std::cos(angle) * scale, s = std::sin(angle) * scale;
        const double a = x[base + size_t(f)], b = x[base + size_t(f + half)];
        REQUIRE(std::fabs(double(got[base + size_t(f)]) - (a * c - b * s)) <= 1e-5);
        REQUIRE(std::fabs(double(got[base + size_t(f + half)]) - (b * c + a * s)) <= 1e-5);
      }
      for (int64_t d = 2 * half; d < head_dim; ++d) {
        REQUIRE(got[base + size_t(d)] == x[base + size_t(d)]);  // passed through untouched
      }
    }
  }
  // More rotated channels than the head has is an error.
  DeviceTensor narrow = make_f32(*backend, std::vector<float>(8, 1.0f), {1, 2, 4});
  CHECK_THROWS_AS(
      backend->rope(narrow, std::vector<int64_t>{0}, make_f32(*backend, inv_freq, {half}), 1.0f),
      Error);
}

TEST_CASE("rope_append_runs: each run's rope_pair, then its rotated key and value appended",
          "[backend]") {
  auto backend = make_cpu_backend(1);
  const int64_t heads = 4, groups = 2, head_dim = 10, half = 3, capacity = 8, position = 5;
  const std::vector<float> inv_freq_values = {1.0f, 0.1f, 0.01f};  // partial rotary: 6 of 10
  const DeviceTensor inv_freq = make_f32(*backend, inv_freq_values, {half});
  const float scale = 1.19f;
  struct Run {
    DeviceTensor q, k, v, k_cache, v_cache;
  };
  auto make_runs = [&] {
    std::vector<Run> runs;
    for (uint32_t r = 0; r < 3; ++r) {
      runs.push_back({make_f32(*backend, random_values(size_t(heads * head_dim), 80 + r),
                               {1, heads, head_dim}),
                      make_f32(*backend, random_values(size_t(groups * head_dim), 90 + r),
                               {1, groups, head_dim}),
                      make_f32(*backend, random_values(size_t(groups * head_dim), 100 + r),
                               {1, groups, head_dim}),
                      backend->alloc(DType::F32, {groups, capacity, head_dim}),
                      backend->alloc(DType::F32, {groups, capacity, head_dim})});
    }
    return runs;
  };
  std::vector<Run> fused = make_runs(), apart = make_runs();
  std::vector<Backend::RunRopeAppend> calls;
  for (Run& run : fused) calls.push_back({&run.q, &run.k, &run.v, &run.k_cache, &run.v_cache});
  backend->rope_append_runs(calls, position, inv_freq, scale);
  for (Run& run : apart) {
    backend->rope_pair(run.q, run.k, std::vector<int64_t>{position}, inv_freq, scale);
    backend->kv_append(run.k, run.v, run.k_cache, run.v_cache, position);
  }
  for (size_t r = 0; r < fused.size(); ++r) {
    for (auto member : {&Run::q, &Run::k, &Run::k_cache, &Run::v_cache}) {
      const std::vector<float> got = read(*backend, fused[r].*member);
      REQUIRE(got == read(*backend, apart[r].*member));
    }
    // The key went in rotated: not its value before the rotation.
    const std::vector<float> cache = read(*backend, fused[r].k_cache);
    const std::vector<float> raw = random_values(size_t(groups * head_dim), 90 + uint32_t(r));
    CHECK(cache[size_t(position * head_dim)] != raw[0]);
  }
  // Errors: a missing tensor, or more than one row.
  std::vector<Backend::RunRopeAppend> missing = {calls[0]};
  missing[0].v = nullptr;
  CHECK_THROWS_AS(backend->rope_append_runs(missing, position, inv_freq, scale), Error);
  DeviceTensor two_rows = backend->alloc(DType::F32, {2, heads, head_dim});
  std::vector<Backend::RunRopeAppend> rows = {calls[0]};
  rows[0].q = &two_rows;
  CHECK_THROWS_AS(backend->rope_append_runs(rows, position, inv_freq, scale), Error);
}

TEST_CASE("attention: decode with GQA, sliding window and visibility masks", "[backend]") {
  const bool simd = GENERATE(true, false);
  CpuBackendOptions options;
  options.threads = 2;
  options.allow_simd = simd;
  auto backend = make_cpu_backend(options);
  // 6 query heads over 2 KV heads (heads 0-2 read KV 0, heads 3-5 read KV 1); D = 12.
  AttentionCase c{1, 6, 2, 12, 40, 22, 0};
  SECTION("full causal") {
    check_attention(*backend, c, {}, 81);
  }
  SECTION("sliding window") {
    c.window = 7;
    check_attention(*backend, c, {}, 82);
  }
  SECTION("visibility mask, one head sees nothing, window on top") {
    const int64_t context = c.first_position + 1;
    std::vector<uint8_t> mask(size_t(c.heads * context));
    std::mt19937 rng(83);
    for (auto& m : mask) m = uint8_t(rng() % 3 != 0);
    for (int64_t j = 0; j < context; ++j) mask[size_t(2 * context + j)] = 0;  // head 2: none
    mask[size_t(4 * context + 0)] = 1;  // head 4 sees key 0, outside the window below
    c.window = 9;
    check_attention(*backend, c, mask, 84);
  }
  SECTION("single key") {
    c.first_position = 0;
    check_attention(*backend, c, {}, 85);
  }
}

TEST_CASE("attention: prefill rows are causal, with and without a window", "[backend]") {
  auto backend = make_cpu_backend(2);
  // 4 heads over 1 KV head (multi-query), 5 new rows after 3 cached ones, D = 9.
  AttentionCase c{5, 4, 1, 9, 16, 3, 0};
  check_attention(*backend, c, {}, 91);
  c.window = 2;
  check_attention(*backend, c, {}, 92);
  c.first_position = 0;
  c.n = 7;
  c.heads = 4;
  c.groups = 4;  // plain multi-head
  c.window = 0;
  check_attention(*backend, c, {}, 93);
}

TEST_CASE("attention rejects a mask for several rows and wrong shapes", "[backend]") {
  auto backend = make_cpu_backend(1);
  DeviceTensor k_cache = backend->alloc(DType::F32, {1, 8, 4});
  DeviceTensor v_cache = backend->alloc(DType::F32, {1, 8, 4});
  DeviceTensor q = backend->alloc(DType::F32, {2, 2, 4});
  DeviceTensor out = backend->alloc(DType::F32, {2, 2, 4});
  DeviceTensor mask = backend->alloc(DType::U8, {2, 2});
  CHECK_THROWS_AS(backend->attention(q, k_cache, v_cache, 0, 0, Visibility{&mask}, out, nullptr),
                  Error);
  DeviceTensor small_logits = backend->alloc(DType::F32, {2, 2, 1});
  CHECK_THROWS_AS(backend->attention(q, k_cache, v_cache, 0, 0, Visibility{}, out, &small_logits),
                  Error);
  CHECK_THROWS_AS(backend->attention(q, k_cache, v_cache, 7, 0, Visibility{}, out, nullptr), Error);
}

TEST_CASE("argmax_rows breaks ties toward the lower index, log_prob_rows in double", "[backend]") {
  auto backend = make_cpu_backend(1);
  const int64_t rows = 3, vocab = 17;
  auto values = random_values(size_t(rows * vocab), 101, 4.0f);
  values[5] = values[11] = 100.0f;  // row 0: tie between 5 and 11
  values[size_t(vocab + 16)] = 50.0f;
  values[size_t(2 * vocab + 0)] = 60.0f;
  DeviceTensor x = make_f32(*backend, values, {rows, vocab});
  std::vector<int32_t> best(rows);
  backend->argmax_rows(x, best);
  CHECK(best == std::vector<int32_t>{5, 16, 0});

  const std::vector<int32_t> targets = {5, 3, 16};
  std::vector<double> got(rows);
  backend->log_prob_rows(x, targets, got);
  for (int64_t i = 0; i < rows; ++i) {
    double max_value = -1e300, sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j)
      max_value = std::max(max_value, double(values[size_t(i * vocab + j)]));
    for (int64_t j = 0; j < vocab; ++j)
      sum += std::exp(double(values[size_t(i * vocab + j)]) - max_value);
    const double want =
        double(values[size_t(i * vocab + targets[size_t(i)])]) - max_value - std::log(sum);
    CHECK(got[size_t(i)] == Approx(want).epsilon(1e-12));
  }
  const std::vector<int32_t> bad = {5, 3, int32_t(vocab)};
  CHECK_THROWS_AS(backend->log_prob_rows(x, bad, got), Error);
  std::vector<int32_t> wrong_rows(2);
  CHECK_THROWS_AS(backend->argmax_rows(x, wrong_rows), Error);
}

TEST_CASE("copy_rows copies row ranges and checks bounds", "[backend]") {
  auto backend = make_cpu_backend(1);
  const auto values = random_values(4 * 3, 111);
  DeviceTensor src = make_f32(*backend, values, {4, 3});
  DeviceTensor dst = backend->alloc(DType::F32, {5, 3});
  backend->copy_rows(src, 1, dst, 3, 2, 3);
  const auto got = read(*backend, dst);
  for (size_t i = 0; i < 9; ++i) REQUIRE(got[i] == 0.0f);
  for (size_t i = 0; i < 6; ++i) REQUIRE(got[9 + i] == values[3 + i]);
  CHECK_THROWS_AS(backend->copy_rows(src, 3, dst, 0, 2, 3), Error);
}

TEST_CASE("matmul rejects mismatched shapes", "[backend]") {
  auto backend = make_cpu_backend(1);
  DeviceTensor x = backend->alloc(DType::F32, {2, 5});
  DeviceTensor w = backend->alloc(DType::F32, {3, 4});
  DeviceTensor y = backend->alloc(DType::F32, {2, 3});
  CHECK_THROWS_AS(backend->matmul(x, w, y), Error);
  DeviceTensor w_ok = backend->alloc(DType::F32, {3, 5});
  DeviceTensor y_bad = backend->alloc(DType::F32, {2, 4});
  CHECK_THROWS_AS(backend->matmul(x, w_ok, y_bad), Error);
}

TEST_CASE("ThreadPool covers each index once, runs nested calls inline, rethrows",
          "[backend][thread_pool]") {
  ThreadPool pool(3);
  CHECK(pool.size() == 3);
  for (int64_t grain : {1, 7, 1000}) {
    std::vector<std::atomic<int>> hits(1001);
    pool.parallel_for(
        0, 1001,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) hits[size_t(i)]++;
        },
        grain);
    for (auto& h : hits) REQUIRE(h.load() == 1);
  }
  std::atomic<int64_t> total{0};
  pool.parallel_for(0, 8, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      pool.parallel_for(0, 10, [&](int64_t b, int64_t e) { total += e - b; });
    }
  });
  CHECK(total.load() == 80);
  CHECK_THROWS_AS(pool.parallel_for(0, 100,
                                    [](int64_t begin, int64_t) {
                                      if (begin > 50) throw std::runtime_error("boom");
                                    }),
                  std::runtime_error);
  // Still usable afterwards; an empty range calls nothing.
  std::atomic<int> calls{0};
  pool.parallel_for(5, 5, [&](int64_t, int64_t) { calls++; });
  pool.parallel_for(0, 64, [&](int64_t, int64_t) { calls++; });
  CHECK(calls.load() >= 1);
  ThreadPool single(1);
  CHECK(single.size() == 1);
  ThreadPool automatic(0);
  CHECK(automatic.size() >= 1);
}

TEST_CASE("ThreadPool::for_each and Backend::run_tasks run every task once, ops inside inline",
          "[backend][thread_pool]") {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(11);
  pool.for_each(11, [&](int64_t i) { hits[size_t(i)]++; });
  for (auto& h : hits) CHECK(h.load() == 1);
  pool.for_each(0, [](int64_t) { FAIL("no task for a count of 0"); });
  CHECK_THROWS_AS(pool.for_each(6,
                                [](int64_t i) {
                                  if (i == 3) throw std::runtime_error("boom");
                                }),
                  std::runtime_error);
  // The backend's tasks may issue ops of their own (the lockstep runs): each task's matmul gives
  // the same bits as the same matmul issued alone.
  auto backend = make_cpu_backend(2);
  constexpr int64_t kTasks = 5, kIn = 37, kOut = 29;
  std::vector<float> w_host(size_t(kOut * kIn)), x_host(size_t(kTasks * kIn));
  for (size_t i = 0; i < w_host.size(); ++i) w_host[i] = float(std::sin(0.37 * double(i)));
  for (size_t i = 0; i < x_host.size(); ++i) x_host[i] = float(std::cos(0.11 * double(i)));
  DeviceTensor w = backend->alloc(DType::F32, {kOut, kIn});
  backend->from_host(w, w_host.data(), w_host.size() * sizeof(float));
  std::vector<DeviceTensor> xs, ys, alone;
  for (int64_t t = 0; t < kTasks; ++t) {
    xs.push_back(backend->alloc(DType::F32, {1, kIn}));
    backend->from_host(xs.back(), x_host.data() + t * kIn, kIn * sizeof(float));
    ys.push_back(backend->alloc(DType::F32, {1, kOut}));
    alone.push_back(backend->alloc(DType::F32, {1, kOut}));
    backend->matmul(xs.back(), w, alone.back());
  }
  backend->run_tasks(kTasks, [&](int64_t t) { backend->matmul(xs[size_t(t)], w, ys[size_t(t)]); });
  for (int64_t t = 0; t < kTasks; ++t) {
    std::vector<float> got(kOut), want(kOut);
    backend->to_host(ys[size_t(t)], got.data(), got.size() * sizeof(float));
    backend->to_host(alone[size_t(t)], want.data(), want.size() * sizeof(float));
    CHECK(got == want);
  }
  // Tasks run in order inside a task (and on a backend of one thread): a session then batches
  // its runs' ops instead of making tasks of them.
  CHECK_FALSE(backend->runs_tasks_in_order());
  std::vector<std::atomic<int>> inside(3);
  backend->run_tasks(3, [&](int64_t t) { inside[size_t(t)] = backend->runs_tasks_in_order(); });
  for (auto& flag : inside) CHECK(flag.load() == 1);
  CHECK(make_cpu_backend(1)->runs_tasks_in_order());
}

// --- attention kernels (cpu_dot_kernels.h): both kernel sets against double references, their
// -inf and empty-row conventions, and the invariances the attention op and the policy path
// (attention_logits + attention_visible) rely on to agree bit for bit ---

namespace {

std::vector<std::pair<const char*, DotKernels>> kernel_sets() {
  return {{"simd", pick_dot_kernels(true)}, {"portable", pick_dot_kernels(false)}};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Distance in representable floats between two non-negative finite floats.
int64_t ulps_apart(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, sizeof ia);
  std::memcpy(&ib, &b, sizeof ib);
  return std::abs(int64_t(ia) - int64_t(ib));
}

}  // namespace

TEST_CASE("attention kernels match double references at odd head_dim and context sizes",
          "[backend][attention_kernels]") {
  for (const auto& [name, kernels] : kernel_sets()) {
    INFO(name);
    for (int64_t head_dim : {8, 24, 32, 40, 128}) {
      for (int64_t context : {1, 7, 129}) {
        for (int nq : {1, 2, 3, 5}) {
          INFO("head_dim " << head_dim << ", context " << context << ", nq " << nq);
          const uint32_t seed = uint32_t(head_dim * 1000 + context * 10 + nq);
          const auto q = random_values(size_t(nq * head_dim), seed);
          const auto keys = random_values(size_t(context * head_dim), seed + 1);
          const auto values = random_values(size_t(context * head_dim), seed + 2);
          const int64_t lo = context / 3, hi = context - 1;  // a window start inside the row
          const float scale = attention_scale(head_dim);
          const int64_t stride = context + 3;  // rows wider than the context
          std::vector<float> logits(size_t(nq * stride), 42.0f);
          kernels.attention_logits(q.data(), head_dim, nq, keys.data(), head_dim, lo, hi, scale,
                                   logits.data(), stride);

          std::vector<float> weights(size_t(nq * stride), 7.0f);
          std::vector<float> scales(static_cast<size_t>(nq));
          for (int i = 0; i < nq; ++i) {
            const float* row = logits.data() + i * stride;
            for (int64_t j = 0; j < lo; ++j) REQUIRE(row[j] == kNegInf);
            for (int64_t j = hi + 1; j < stride; ++j) REQUIRE(row[j] == 42.0f);  // untouched
            double max_logit = -1e300;
            std::vector<double> want(static_cast<size_t>(context));
            for (int64_t j = lo; j <= hi; ++j) {
              double dot = 0.0, magnitude = 0.0;
              for (int64_t d = 0; d < head_dim; ++d) {
                const double p =
                    double(q[size_t(i * head_dim + d)]) * double(keys[size_t(j * head_dim + d)]);
                dot += p;
                magnitude += std::fabs(p);
              }
              want[size_t(j)] = dot * double(scale);
              REQUIRE(std::fabs(double(row[j]) - want[size_t(j)]) <=
                      1e-6 * magnitude * double(scale) + 1e-30);
              max_logit = std::max(max_logit, double(row[j]));
            }
            // Weights from the kernel's own logits: exp(logit - max), exactly 1 at the max.
            float* w = weights.data() + i * stride;
            const float total = kernels.softmax_weights(row, nullptr, 0, context, w);
            double want_total = 0.0;
            bool saw_one = false;
            for (int64_t j = 0; j < context; ++j) {
              if (j < lo) {
                REQUIRE(w[j] == 0.0f);
                continue;
              }
              const double e = std::exp(double(row[j]) - max_logit);
              want_total += e;
              REQUIRE(std::fabs(double(w[j]) - e) <= 3e-7 * e);
              if (double(row[j]) == max_logit) {
                REQUIRE(w[j] == 1.0f);
                saw_one = true;
              }
            }
            REQUIRE(saw_one);
            REQUIRE(std::fabs(double(total) - want_total) <= 1e-6 * want_total);
            scales[size_t(i)] = 1.0f / total;
          }

          std::vector<float> out(size_t(nq * (head_dim + 1)), 42.0f);
          kernels.weighted_values(weights.data(), stride, nq, values.data(), head_dim, lo, hi + 1,
                                  scales.data(), out.data(), head_dim + 1);
          for (int i = 0; i < nq; ++i) {
            const float* w = weights.data() + i * stride;
            for (int64_t d = 0; d < head_dim; ++d) {
              double sum = 0.0, magnitude = 0.0;
              for (int64_t j = lo; j <= hi; ++j) {
                sum += double(w[j]) * double(values[size_t(j * head_dim + d)]);
                magnitude += std::fabs(double(w[j]) * double(values[size_t(j * head_dim + d)]));
              }
              const double want = sum * double(scales[size_t(i)]);
              REQUIRE(std::fabs(double(out[size_t(i * (head_dim + 1) + d)]) - want) <=
                      1e-6 * magnitude * double(scales[size_t(i)]) + 1e-30);
            }
            REQUIRE(out[size_t(i * (head_dim + 1) + head_dim)] == 42.0f);  // untouched
          }
        }
      }
    }
  }
}

TEST_CASE("attention softmax kernel: -inf and hidden columns weigh exactly 0, exp within 2 ulp",
          "[backend][attention_kernels]") {
  for (const auto& [name, kernels] : kernel_sets()) {
    INFO(name);
    SECTION("exp(x - max) over the whole range down to the subnormals and 0") {
      // x from 0 down to -110 (exp underflows to 0 below about -103.97), max exactly 0.
      std::vector<float> row;
      for (float x = 0.0f; x >= -110.0f; x -= 0.01371f) row.push_back(x);
      row.push_back(-87.336f);  // around the smallest normal result
      row.push_back(-103.9f);   // a few subnormal steps
      row.push_back(-1e-30f);
      row.push_back(-0.0f);
      std::vector<float> weights(row.size());
      kernels.softmax_weights(row.data(), nullptr, 0, int64_t(row.size()), weights.data());
      int64_t worst = 0;
      for (size_t j = 0; j < row.size(); ++j) {
        const float want = float(std::exp(double(row[j])));  // exp in double, rounded once
        INFO("x = " << row[j] << ": want " << want << " got " << weights[j]);
        REQUIRE(weights[j] >= 0.0f);
        worst = std::max(worst, ulps_apart(want, weights[j]));
        REQUIRE(ulps_apart(want, weights[j]) <= 2);
      }
      INFO("worst " << worst << " ulp");
      CHECK(worst <= 2);
      CHECK(weights[0] == 1.0f);
    }
    SECTION("-inf, hidden and out-of-range columns") {
      const int64_t cols = 21;
      auto row = random_values(size_t(cols), 301, 3.0f);
      for (int64_t j : {0, 1, 2, 9, 20}) row[size_t(j)] = kNegInf;
      std::vector<uint8_t> seen(size_t(cols), 1);
      seen[4] = seen[5] = seen[17] = 0;
      row[17] = 1000.0f;  // hidden, so it is not the max
      std::vector<float> weights(size_t(cols + 2), 9.0f);
      const float total =
          kernels.softmax_weights(row.data(), seen.data(), 1, cols, weights.data() + 1);
      REQUIRE(weights[0] == 9.0f);  // before begin: untouched
      float max_logit = kNegInf;
      for (int64_t j = 1; j < cols; ++j)
        if (seen[size_t(j)]) max_logit = std::max(max_logit, row[size_t(j)]);
      double want_total = 0.0;
      for (int64_t j = 1; j < cols; ++j) {
        const float w = weights[size_t(j + 1)];
        if (!seen[size_t(j)] || row[size_t(j)] == kNegInf) {
          REQUIRE(w == 0.0f);
          REQUIRE(!std::signbit(w));
        } else {
          const double e = std::exp(double(row[size_t(j)]) - double(max_logit));
          REQUIRE(std::fabs(double(w) - e) <= 3e-7 * e);
          want_total += e;
        }
      }
      REQUIRE(weights[size_t(cols + 1)] == 9.0f);  // past end: untouched
      REQUIRE(std::fabs(double(total) - want_total) <= 1e-6 * want_total);
    }
    SECTION("nothing finite visible: every weight 0 and a total of 0") {
      const int64_t cols = 19;
      std::vector<float> row(size_t(cols), kNegInf);
      row[3] = 2.0f;
      std::vector<uint8_t> seen(size_t(cols), 1);
      seen[3] = 0;
      std::vector<float> weights(size_t(cols), 9.0f);
      CHECK(kernels.softmax_weights(row.data(), seen.data(), 0, cols, weights.data()) == 0.0f);
      for (float w : weights) CHECK(w == 0.0f);
      std::fill(seen.begin(), seen.end(), 0);
      auto finite = random_values(size_t(cols), 302);
      CHECK(kernels.softmax_weights(finite.data(), seen.data(), 0, cols, weights.data()) == 0.0f);
      for (float w : weights) CHECK(w == 0.0f);
      CHECK(kernels.softmax_weights(finite.data(), nullptr, 5, 5, weights.data()) == 0.0f);
    }
    SECTION("values behind weight-0 columns never reach the output") {
      const int64_t head_dim = 40, cols = 23;
      auto values = random_values(size_t(cols * head_dim), 303);
      std::vector<float> weights(size_t(cols), 0.0f);
      weights[3] = 0.25f;
      weights[11] = 1.0f;
      for (int64_t d = 0; d < head_dim; ++d) {
        values[size_t(5 * head_dim + d)] = std::numeric_limits<float>::quiet_NaN();
        values[size_t(12 * head_dim + d)] = std::numeric_limits<float>::infinity();
      }
      const float scale = 0.8f;
      std::vector<float> out(static_cast<size_t>(head_dim));
      kernels.weighted_values(weights.data(), cols, 1, values.data(), head_dim, 0, cols, &scale,
                              out.data(), head_dim);
      for (int64_t d = 0; d < head_dim; ++d) {
        const double want = (0.25 * double(values[size_t(3 * head_dim + d)]) +
                             double(values[size_t(11 * head_dim + d)])) *
                            0.8;
        REQUIRE(std::fabs(double(out[size_t(d)]) - want) <= 1e-6);
      }
      // All weights 0 with scale 0 (a head that sees nothing): zeros.
      std::fill(weights.begin(), weights.end(), 0.0f);
      const float zero = 0.0f;
      kernels.weighted_values(weights.data(), cols, 1, values.data(), head_dim, 0, cols, &zero,
                              out.data(), head_dim);
      for (float o : out) CHECK(o == 0.0f);
    }
  }
}

TEST_CASE("attention kernels: results do not depend on the range start or on heads per call",
          "[backend][attention_kernels]") {
  for (const auto& [name, kernels] : kernel_sets()) {
    INFO(name);
    for (int64_t head_dim : {24, 32, 64}) {
      INFO("head_dim " << head_dim);
      const int nq = 7;  // 4 + 2 + 1 heads in one call
      const int64_t context = 75, lo = 13, hi = context - 1;
      const auto q = random_values(size_t(nq * head_dim), 311);
      const auto keys = random_values(size_t(context * head_dim), 312);
      const auto values = random_values(size_t(context * head_dim), 313);
      const float scale = attention_scale(head_dim);
      std::vector<float> together(size_t(nq * context)), alone(size_t(nq * context));
      kernels.attention_logits(q.data(), head_dim, nq, keys.data(), head_dim, lo, hi, scale,
                               together.data(), context);
      for (int i = 0; i < nq; ++i)
        kernels.attention_logits(q.data() + i * head_dim, head_dim, 1, keys.data(), head_dim, lo,
                                 hi, scale, alone.data() + i * context, context);
      REQUIRE(same_bits(together, alone));
      // The same logits computed from lo = 0 agree from lo on (each key's dot stands alone).
      std::vector<float> from_zero(size_t(nq * context));
      kernels.attention_logits(q.data(), head_dim, nq, keys.data(), head_dim, 0, hi, scale,
                               from_zero.data(), context);
      for (int i = 0; i < nq; ++i)
        for (int64_t j = lo; j <= hi; ++j)
          REQUIRE(from_zero[size_t(i * context + j)] == together[size_t(i * context + j)]);

      // Softmax from begin = lo and from begin = 0 over -inf below lo: the same weights and total.
      std::vector<float> w_lo(size_t(nq * context), 0.0f), w_zero(size_t(nq * context));
      std::vector<float> scales(static_cast<size_t>(nq));
      for (int i = 0; i < nq; ++i) {
        const float* row = together.data() + i * context;
        const float t_lo =
            kernels.softmax_weights(row, nullptr, lo, context, w_lo.data() + i * context);
        const float t_zero =
            kernels.softmax_weights(row, nullptr, 0, context, w_zero.data() + i * context);
        REQUIRE(t_lo == t_zero);
        scales[size_t(i)] = 1.0f / t_lo;
      }
      REQUIRE(same_bits(w_lo, w_zero));

      // Value sums: one call for 7 heads, 7 calls of one head, and from begin = 0.
      std::vector<float> out_together(size_t(nq * head_dim)), out_alone(size_t(nq * head_dim));
      std::vector<float> out_zero(size_t(nq * head_dim));
      kernels.weighted_values(w_lo.data(), context, nq, values.data(), head_dim, lo, context,
                              scales.data(), out_together.data(), head_dim);
      for (int i = 0; i < nq; ++i)
        kernels.weighted_values(w_lo.data() + i * context, context, 1, values.data(), head_dim, lo,
                                context, scales.data() + i, out_alone.data() + i * head_dim,
                                head_dim);
      kernels.weighted_values(w_zero.data(), context, nq, values.data(), head_dim, 0, context,
                              scales.data(), out_zero.data(), head_dim);
      REQUIRE(same_bits(out_together, out_alone));
      REQUIRE(same_bits(out_together, out_zero));
    }
  }
}

TEST_CASE("silu_mul kernels: within 1e-6 relative of a double reference, special values too",
          "[backend]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> gate = {-200.0f, -104.0f, -90.0f, -88.0f, -20.0f,       -1.0f,
                             -1e-30f, -0.0f,   0.0f,   1e-30f, 1.0f,         20.0f,
                             88.0f,   100.0f,  inf,    -inf,   std::nanf("")};
  const auto more = random_values(40, 65, 12.0f);
  gate.insert(gate.end(), more.begin(), more.end());
  const auto up = random_values(gate.size(), 66, 2.0f);
  for (const auto& [name, kernels] : kernel_sets()) {
    // Every length up to the whole input, so each element is also seen in a tail.
    for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(13), gate.size()}) {
      INFO(name << " n " << n);
      std::vector<float> out(n, 123.0f);
      kernels.silu_mul(gate.data(), up.data(), out.data(), int64_t(n));
      for (size_t j = 0; j < n; ++j) {
        INFO("gate " << gate[j] << " up " << up[j]);
        const double g = gate[j], want = g / (1.0 + std::exp(-g)) * double(up[j]);
        if (std::isnan(want)) {
          CHECK(std::isnan(out[j]));  // NaN and -inf gates
        } else if (std::isinf(want)) {
          CHECK(double(out[j]) == want);
        } else {
          CHECK(std::fabs(double(out[j]) - want) <= 1e-6 * std::fabs(want) + 1e-37);
        }
      }
    }
  }
}

// The SIMD and portable attention kernel sets against each other: each against double
// references above (head_dim 8 to 128, contexts to 129, 1 to 5 query rows), and the CPU
// backend's SIMD kernel sets against its generic one through the attention ops at head_dim 20
// to 128 and contexts to 5123 in the op table (tests/unit/test_backend_ops.cpp).

TEST_CASE("attention equals attention_logits + attention_visible bit for bit, any thread count",
          "[backend][attention_kernels]") {
  struct Case {
    int64_t heads, groups, head_dim, position, window;
    bool masked;
  };
  const Case cases[] = {
      {8, 4, 32, 300, 0, false},  // the demo model's shape
      {8, 4, 32, 300, 0, true},  {6, 2, 40, 130, 17, true}, {12, 2, 24, 77, 0, true},
      {5, 5, 128, 40, 9, false}, {4, 1, 8, 0, 0, false},    {4, 2, 64, 200, 64, true},
  };
  for (bool simd : {true, false}) {
    std::unique_ptr<Backend> backends[2];
    for (int t = 0; t < 2; ++t) {
      CpuBackendOptions options;
      options.threads = t + 1;
      options.allow_simd = simd;
      backends[t] = make_cpu_backend(options);
    }
    uint32_t seed = 400;
    for (const Case& c : cases) {
      INFO("simd " << simd << ", heads " << c.heads << "/" << c.groups << ", head_dim "
                   << c.head_dim << ", position " << c.position << ", window " << c.window
                   << ", masked " << c.masked);
      const int64_t cols = c.position + 1, capacity = cols + 5;
      const auto q_values = random_values(size_t(c.heads * c.head_dim), ++seed, 2.0f);
      const auto k_values = random_values(size_t(c.groups * capacity * c.head_dim), ++seed);
      const auto v_values = random_values(size_t(c.groups * capacity * c.head_dim), ++seed);
      std::vector<uint8_t> mask(size_t(c.heads * cols), 1);
      if (c.masked) {
        std::mt19937 rng(++seed);
        for (auto& m : mask) m = uint8_t(rng() % 4 != 0);
        for (int64_t j = 0; j < cols; ++j) mask[size_t(1 * cols + j)] = 0;  // head 1: none
      }
      std::vector<float> reference_out;
      for (auto& backend : backends) {
        Backend& b = *backend;
        DeviceTensor q = make_f32(b, q_values, {1, c.heads, c.head_dim});
        DeviceTensor k = make_f32(b, k_values, {c.groups, capacity, c.head_dim});
        DeviceTensor v = make_f32(b, v_values, {c.groups, capacity, c.head_dim});
        DeviceTensor mask_t = b.alloc(DType::U8, {c.heads, cols});
        b.from_host(mask_t, mask.data(), mask.size());
        Visibility visibility;
        if (c.masked) visibility.mask = &mask_t;

        DeviceTensor out = b.alloc(DType::F32, {1, c.heads, c.head_dim});
        DeviceTensor logits = b.alloc(DType::F32, {1, c.heads, cols});
        b.attention(q, k, v, c.position, c.window, visibility, out, &logits);

        const int64_t stride = cols + 6;
        DeviceTensor policy_logits = b.alloc(DType::F32, {c.heads, stride});
        DeviceTensor policy_out = b.alloc(DType::F32, {1, c.heads, c.head_dim});
        DeviceTensor probs = b.alloc(DType::F32, {c.heads, stride});
        DeviceTensor visible = b.alloc(DType::U8, {c.heads, stride});
        std::vector<uint8_t> wide(size_t(c.heads * stride), 0);
        for (int64_t h = 0; h < c.heads; ++h)
          std::copy_n(mask.begin() + long(h * cols), cols, wide.begin() + long(h * stride));
        b.from_host(visible, wide.data(), wide.size());
        b.attention_logits(q, k, c.position, c.window, policy_logits);
        b.attention_visible(policy_logits, cols, c.masked ? &visible : nullptr, v, policy_out,
                            &probs);

        const auto got_out = read(b, out), got_policy = read(b, policy_out);
        REQUIRE(same_bits(got_out, got_policy));
        const auto got_logits = read(b, logits), got_policy_logits = read(b, policy_logits);
        const auto got_probs = read(b, probs);
        for (int64_t h = 0; h < c.heads; ++h) {
          float sum = 0.0f;
          for (int64_t j = 0; j < cols; ++j) {
            const float plain = got_logits[size_t(h * cols + j)];
            const float policy = got_policy_logits[size_t(h * stride + j)];
            const float p = got_probs[size_t(h * stride + j)];
            if (mask[size_t(h * cols + j)]) {
              REQUIRE(plain == policy);  // the same logit where visible
            } else {
              REQUIRE(plain == kNegInf);
            }
            if (plain == kNegInf) REQUIRE(p == 0.0f);
            sum += p;
          }
          if (c.masked && h == 1) {  // sees nothing: zeros
            REQUIRE(sum == 0.0f);
            for (int64_t d = 0; d < c.head_dim; ++d)
              REQUIRE(got_out[size_t(h * c.head_dim + d)] == 0.0f);
          } else {
            REQUIRE(std::fabs(sum - 1.0f) <= 1e-5f);
          }
        }
        // Thread-count independent: 2 threads give the 1-thread bits.
        if (reference_out.empty()) {
          reference_out = got_out;
        } else {
          REQUIRE(same_bits(reference_out, got_out));
        }
      }
    }
  }
}

TEST_CASE(
    "same_bytes: the CPU backend compares contents, shape and dtype; the default never claims",
    "[backend]") {
  auto backend = make_cpu_backend({});
  const std::vector<float> values = {1.0f, -2.5f, 3.0f, 0.0f};
  DeviceTensor a = backend->alloc(DType::F32, {1, 4}), b = backend->alloc(DType::F32, {1, 4});
  backend->from_host(a, values.data(), values.size() * sizeof(float));
  backend->from_host(b, values.data(), values.size() * sizeof(float));
  CHECK(backend->same_bytes(a, b));
  CHECK(backend->same_bytes(a, a));
  std::vector<float> other = values;
  other[3] = -0.0f;  // equal as a number, not as bytes
  backend->from_host(b, other.data(), other.size() * sizeof(float));
  CHECK_FALSE(backend->same_bytes(a, b));
  DeviceTensor reshaped = a;
  reshaped.shape = {4, 1};
  CHECK_FALSE(backend->same_bytes(a, reshaped));
  DeviceTensor as_int = a;
  as_int.dtype = DType::U8;
  as_int.shape = {1, 16};
  CHECK_FALSE(backend->same_bytes(a, as_int));
  // The default (a backend that cannot tell cheaply) never claims equal contents.
  CHECK_FALSE(backend->Backend::same_bytes(a, a));
}
