// CPU reference backend: every op against a naive double-precision reference written here, on
// seeded random inputs with odd sizes (not multiples of the 8/16-lane kernels), plus the thread
// pool. Shapes as in backend.h: x [n, in], w [out, in], q/out [n, H, D], caches [G, cap, D].
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "engine/common/error.h"
#include "engine/runtime/cpu_backend.h"
#include "engine/runtime/thread_pool.h"
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
}

}  // namespace

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
  // 3 rows: one partial register block; 9: two full blocks of 4 rows and one of 1.
  const int64_t n = GENERATE(3, 9), in = 293, out = 1037;
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
  const int64_t n = 3, heads = 5, head_dim = 10, half = head_dim / 2;
  const std::vector<int64_t> positions = {0, 7, 1234};
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
