// The CUDA backend's model ops beyond the op table: every op's results against the CPU's are the
// table's (tests/support/backend_op_table.cpp, run by test_cuda_backend_ops.cpp); here what it
// cannot express: memory, copies, uploads and fences, weights kept in their stored dtype in GPU
// memory, bit-equalities between the GPU's own ops, results against host arithmetic, and
// argument errors. Shapes as in backend.h: x [n, in], w [out, in], q/out [n, H, D], caches
// [G, capacity, D], logits [n, H, context].
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/common/error.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_support.h"
#include "kernels/gemv_mma.cuh"
#include "tests/support/backend_checks.h"
#include "tests/support/random_values.h"

using namespace kvlens;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr double kEps32 = 1.0 / (1 << 24);  // unit roundoff of F32

struct Backends {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
};

// One logical tensor on both backends.
struct Pair {
  DeviceTensor cpu, gpu;
};

using kvlens::test::check_within;
using kvlens::test::random_values;

int64_t count_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Pair make_f32(Backends& b, const std::vector<float>& values, const std::vector<int64_t>& shape) {
  Pair p{b.cpu->alloc(DType::F32, shape), b.gpu->alloc(DType::F32, shape)};
  REQUIRE(size_t(count_of(shape)) == values.size());
  b.cpu->from_host(p.cpu, values.data(), values.size() * sizeof(float));
  b.gpu->from_host(p.gpu, values.data(), values.size() * sizeof(float));
  return p;
}

Pair zeros_f32(Backends& b, const std::vector<int64_t>& shape) {
  return {b.cpu->alloc(DType::F32, shape), b.gpu->alloc(DType::F32, shape)};
}

std::vector<float> read(Backend& backend, const DeviceTensor& t) {
  std::vector<float> values(size_t(count_of(t.shape)));
  backend.to_host(t, values.data(), values.size() * sizeof(float));
  return values;
}

// A weight as a checkpoint stores it: raw bits of `dtype`, plus the exact F32 values they encode.
struct HostWeight {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::shared_ptr<std::vector<std::byte>> bytes;
  std::vector<float> values;
};

HostWeight random_weight(DType dtype, std::vector<int64_t> shape, uint32_t seed) {
  HostWeight w;
  w.dtype = dtype;
  w.shape = std::move(shape);
  const size_t count = size_t(count_of(w.shape));
  w.bytes = std::make_shared<std::vector<std::byte>>(count * dtype_size(dtype));
  w.values.resize(count);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::F32) {
      w.values[i] = normal(rng);
      std::memcpy(w.bytes->data() + 4 * i, &w.values[i], 4);
    } else {
      uint16_t bits = 0;
      if (dtype == DType::BF16) {
        bits = f32_to_bf16(normal(rng));
        w.values[i] = bf16_to_f32(bits);
      } else {
        // Random F16 patterns: sign, exponent 11..16 (|v| in [2^-4, 4)), any mantissa.
        bits = uint16_t(((rng() & 1u) << 15) | ((11u + rng() % 6u) << 10) | (rng() & 0x3ffu));
        w.values[i] = f16_to_f32(bits);
      }
      std::memcpy(w.bytes->data() + 2 * i, &bits, 2);
    }
  }
  return w;
}

TensorView view_of(const HostWeight& w) {
  TensorView view;
  view.name = "test.weight";
  view.dtype = w.dtype;
  view.shape = w.shape;
  view.data = w.bytes->data();
  view.bytes = w.bytes->size();
  view.file = "memory";
  return view;
}

// Uploaded the way checkpoints are (the CUDA backend keeps the stored dtype).
Pair upload(Backends& b, const HostWeight& w) {
  return {b.cpu->upload_weight(view_of(w), w.bytes), b.gpu->upload_weight(view_of(w), w.bytes)};
}

// The weight kept in its stored dtype in GPU memory (alloc + from_host): the path where the
// kernels themselves read BF16/F16.
DeviceTensor raw_on_gpu(Backends& b, const HostWeight& w) {
  DeviceTensor t = b.gpu->alloc(w.dtype, w.shape);
  b.gpu->from_host(t, w.bytes->data(), w.bytes->size());
  return t;
}

void check_close(const std::vector<float>& want, const std::vector<float>& got, double rtol,
                 double atol, const std::string& what) {
  std::vector<double> tolerance(want.size());
  for (size_t i = 0; i < want.size(); ++i)
    tolerance[i] = atol + rtol * (std::isfinite(want[i]) ? std::fabs(want[i]) : 0.0);
  check_within(want, got, tolerance, what);
}

}  // namespace

TEST_CASE("cuda backend: memory, copies, uploads and errors", "[cuda]") {
  Backends b;
  CHECK(b.gpu->name() == "cuda");

  // alloc is zero-filled, for every dtype.
  DeviceTensor z = b.gpu->alloc(DType::F32, {3, 5});
  CHECK(read(*b.gpu, z) == std::vector<float>(15, 0.0f));
  DeviceTensor bytes = b.gpu->alloc(DType::U8, {2, 7});
  std::vector<uint8_t> host_bytes(14, 0xff);
  b.gpu->to_host(bytes, host_bytes.data(), host_bytes.size());
  CHECK(host_bytes == std::vector<uint8_t>(14, 0));

  const std::vector<float> values = random_values(15, 1);
  b.gpu->from_host(z, values.data(), values.size() * sizeof(float));
  CHECK(read(*b.gpu, z) == values);
  // More bytes than the tensor holds: a kvlens::Error, never an out-of-bounds copy.
  std::vector<float> too_big(16);
  CHECK_THROWS_AS(b.gpu->to_host(z, too_big.data(), too_big.size() * sizeof(float)), Error);
  CHECK_THROWS_AS(b.gpu->from_host(z, too_big.data(), too_big.size() * sizeof(float)), Error);

  // copy_rows, including overlapping ranges inside one tensor (memmove semantics on the CPU).
  // Copies are exact, so the two backends must agree bit for bit.
  Pair src = make_f32(b, random_values(6 * 8, 2), {6, 8});
  Pair dst = make_f32(b, random_values(5 * 8, 3), {5, 8});
  for (auto [backend, s, d] :
       {std::tuple{b.cpu.get(), &src.cpu, &dst.cpu}, std::tuple{b.gpu.get(), &src.gpu, &dst.gpu}}) {
    backend->copy_rows(*s, 1, *d, 2, 3, 8);
    backend->copy_rows(*d, 0, *d, 1, 3, 8);  // overlap, copying forward
    backend->copy_rows(*d, 2, *d, 0, 3, 8);  // overlap, copying backward
  }
  CHECK(read(*b.gpu, dst.gpu) == read(*b.cpu, dst.cpu));
  CHECK_THROWS_AS(b.gpu->copy_rows(src.gpu, 4, dst.gpu, 0, 3, 8), Error);

  // Uploads keep the checkpoint's dtype and bytes (the kernels widen as they read).
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    INFO("dtype " << dtype_name(dtype));
    const HostWeight w = random_weight(dtype, {4, 9}, 4);
    const DeviceTensor up = b.gpu->upload_weight(view_of(w), w.bytes);
    CHECK(up.dtype == dtype);
    CHECK(up.shape == w.shape);
    std::vector<std::byte> stored(w.bytes->size());
    b.gpu->to_host(up, stored.data(), stored.size());
    CHECK(stored == *w.bytes);
    // What upload_weight filled is marked: the tensor and views inside it count as uploaded
    // weights (the decode products read those early); a view reaching past it does not.
    CHECK(cuda::is_uploaded_weight(up));
    DeviceTensor second_row = up;
    second_row.data = static_cast<std::byte*>(up.data) + 9 * dtype_size(dtype);
    second_row.shape = {1, 9};
    CHECK(cuda::is_uploaded_weight(second_row));
    DeviceTensor past_the_end = second_row;
    past_the_end.shape = {4, 9};
    CHECK_FALSE(cuda::is_uploaded_weight(past_the_end));
  }
  CHECK_FALSE(cuda::is_uploaded_weight(z));  // alloc: activations, caches, scratch

  CHECK_THROWS_AS(make_cuda_backend(-1), Error);
  CHECK_THROWS_AS(make_cuda_backend(1 << 20), Error);
}

TEST_CASE("cuda backend: rows read back while the stream works on, behind a fence", "[cuda]") {
  Backends b;
  // F32 rows of 37 of which 29 are read, and U8 rows (masks) of 19 of which 5: packed on arrival.
  const std::vector<float> values = random_values(6 * 37, 5);
  const Pair rows = make_f32(b, values, {6, 37});
  std::vector<uint8_t> bytes(4 * 19);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 7);
  DeviceTensor masks = b.gpu->alloc(DType::U8, {4, 19});
  b.gpu->from_host(masks, bytes.data(), bytes.size());
  std::shared_ptr<void> host = b.gpu->alloc_host(6 * 29 * 4 + 4 * 5);
  auto* floats = static_cast<float*>(host.get());
  auto* mask_bytes = reinterpret_cast<uint8_t*>(floats + 6 * 29);
  // Queued behind a long op, so the copy is really asynchronous: a matmul of 4096 x 4096.
  const Pair x = make_f32(b, random_values(64 * 4096, 6), {64, 4096});
  const Pair w = make_f32(b, random_values(size_t(4096) * 4096, 7), {4096, 4096});
  Pair y = zeros_f32(b, {64, 4096});
  b.gpu->matmul(x.gpu, w.gpu, y.gpu);
  b.gpu->rows_to_host_async(rows.gpu, 5, 29, floats);  // 5 of the 6 rows
  b.gpu->rows_to_host_async(masks, 4, 5, mask_bytes);
  const std::unique_ptr<Backend::Fence> fence = b.gpu->fence();
  fence->wait();
  int64_t wrong = 0;
  for (int64_t r = 0; r < 5; ++r)
    for (int64_t j = 0; j < 29; ++j) wrong += floats[r * 29 + j] != values[size_t(r * 37 + j)];
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t j = 0; j < 5; ++j) wrong += mask_bytes[r * 5 + j] != bytes[size_t(r * 19 + j)];
  CHECK(wrong == 0);
  // The CPU backend's (the default) gives the same.
  std::vector<float> on_cpu(5 * 29);
  b.cpu->rows_to_host_async(rows.cpu, 5, 29, on_cpu.data());
  b.cpu->fence()->wait();
  CHECK(std::equal(on_cpu.begin(), on_cpu.end(), floats));
  // Wider than the rows, or more rows than there are: errors.
  CHECK_THROWS_AS(b.gpu->rows_to_host_async(rows.gpu, 5, 38, floats), Error);
  CHECK_THROWS_AS(b.gpu->rows_to_host_async(rows.gpu, 7, 29, floats), Error);
  CHECK_THROWS_AS(b.cpu->rows_to_host_async(rows.cpu, 7, 29, floats), Error);
}

// embed against the CPU (F32, BF16 and F16 tables, ids at both ends): the op table
// (tests/support/backend_op_table.cpp). Here the path the table cannot take, a table kept in its
// stored dtype in GPU memory, against the host table's values, and bad ids.
TEST_CASE("cuda backend: embed from a table in its stored dtype, and bad ids", "[cuda]") {
  Backends b;
  const std::vector<int32_t> ids = {0, 999, 5, 5, 123, 998, 1};
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    INFO("table dtype " << dtype_name(dtype));
    const HostWeight table = random_weight(dtype, {1000, 96}, 10);
    // A gather of exactly widened values: the host table's values, bit for bit.
    std::vector<float> want;
    for (int32_t id : ids)
      want.insert(want.end(), table.values.begin() + id * 96, table.values.begin() + (id + 1) * 96);
    DeviceTensor raw_out = b.gpu->alloc(DType::F32, {7, 96});
    b.gpu->embed(raw_on_gpu(b, table), ids, raw_out);
    CHECK(read(*b.gpu, raw_out) == want);

    const DeviceTensor t = b.gpu->upload_weight(view_of(table), table.bytes);
    const std::vector<int32_t> past_end = {3, 1000};
    const std::vector<int32_t> negative = {-1, 3};
    CHECK_THROWS_AS(b.gpu->embed(t, past_end, raw_out), Error);
    CHECK_THROWS_AS(b.gpu->embed(t, negative, raw_out), Error);
  }
}

TEST_CASE(
    "cuda backend: matmul with stored-dtype weights, a decode row's bits in any batch, weights "
    "just written, bad shapes",
    "[cuda]") {
  Backends b;
  struct Shape {
    int64_t n, in, out;
  };
  uint32_t seed = 20;
  // Few rows (the weight-streaming GEMV: vector loads where `in` allows them, scalar loads
  // otherwise, 1..16 rows, 4 features a warp from 3 rows on), and many rows (cuBLAS SGEMM; BF16/F16
  // weights widened in slices of 2^24 elements, so 20 x 4096 x 4100 takes two slices).
  for (const Shape& s :
       {Shape{1, 257, 131}, Shape{7, 96, 300}, Shape{3, 64, 1}, Shape{1, 2048, 333},
        Shape{16, 520, 70}, Shape{12, 1000, 9}, Shape{17, 96, 40}, Shape{20, 4096, 4100},
        // rows that do not fit shared memory at once: staged in chunks, the last one partial
        Shape{8, 4000, 37}, Shape{13, 2600, 5}}) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      INFO("n " << s.n << " in " << s.in << " out " << s.out << " w " << dtype_name(dtype));
      const HostWeight w = random_weight(dtype, {s.out, s.in}, ++seed);
      const std::vector<float> xs = random_values(size_t(s.n * s.in), ++seed);
      const Pair wt = upload(b, w);
      const Pair x = make_f32(b, xs, {s.n, s.in});
      Pair y = zeros_f32(b, {s.n, s.out});
      b.cpu->matmul(x.cpu, wt.cpu, y.cpu);
      b.gpu->matmul(x.gpu, wt.gpu, y.gpu);
      // Both sides sum the same `in` exact products in F32, in different orders (CPU: 16 lanes
      // and a pairwise tree; GPU: 32 lanes and a butterfly, or cuBLAS's own blocking). Any F32 dot
      // product of `in` terms, FMA or not, is within about in * 2^-24 * sum_k |x_k w_k| of the
      // exact value (the classic gamma_in bound; +2 terms of slack for its higher-order part), so
      // the two differ by at most twice that. Uploaded BF16/F16 weights are widened exactly, so the
      // bound holds for them.
      std::vector<double> tolerance(size_t(s.n * s.out));
      for (int64_t i = 0; i < s.n; ++i)
        for (int64_t o = 0; o < s.out; ++o) {
          double magnitude = 0.0;
          for (int64_t k = 0; k < s.in; ++k)
            magnitude += std::fabs(double(xs[size_t(i * s.in + k)]) *
                                   double(w.values[size_t(o * s.in + k)]));
          tolerance[size_t(i * s.out + o)] = 2.0 * double(s.in + 2) * kEps32 * magnitude + 1e-30;
        }
      // The uploaded weight's product against the CPU's: the op table's "matmul path" entries
      // (these shapes, F32/BF16/F16). Here what the table cannot express.
      const std::vector<float> want = read(*b.cpu, y.cpu);
      // A decode row's result does not depend on how many rows share the product (lockstep
      // runs get the bits of a single run): each row's sum has a fixed order.
      if (s.n <= 16) {
        DeviceTensor first_x = x.gpu, first_y = b.gpu->alloc(DType::F32, {1, s.out});
        first_x.shape = {1, s.in};
        b.gpu->matmul(first_x, wt.gpu, first_y);
        const std::vector<float> batched = read(*b.gpu, y.gpu);
        CHECK(read(*b.gpu, first_y) ==
              std::vector<float>(batched.begin(), batched.begin() + s.out));
      }
      // A weight made by alloc + from_host: the same kernels, the same bound.
      DeviceTensor raw_y = b.gpu->alloc(DType::F32, {s.n, s.out});
      b.gpu->matmul(x.gpu, raw_on_gpu(b, w), raw_y);
      check_within(want, read(*b.gpu, raw_y), tolerance, "matmul (stored-dtype weight)");
    }
  }
  {
    // Weights a kernel has just written (not uploaded): the product reads them only after that
    // kernel is done. Uploaded weights are requested before the kernels ahead of a product
    // finish (dependent launches); these would be read half-written if they were too. (A race:
    // twenty tries make it likely, not certain, to show.)
    const int64_t in = 2048, out = 333;
    const std::vector<float> xs = random_values(size_t(in), 91);
    const std::vector<float> halves = random_values(size_t(in * out), 92);
    DeviceTensor w = b.gpu->alloc(DType::F32, {out, in});
    b.gpu->from_host(w, halves.data(), halves.size() * sizeof(float));
    const Pair x = make_f32(b, xs, {1, in});
    std::vector<float> product_of_sum;
    for (int repeat = 0; repeat < 20; ++repeat) {
      DeviceTensor summed = b.gpu->alloc(DType::F32, {out, in});
      b.gpu->add_inplace(summed, w);  // summed = 0 + w
      b.gpu->add_inplace(summed, w);  // summed = 2 w, exactly
      DeviceTensor y = b.gpu->alloc(DType::F32, {1, out});
      b.gpu->matmul(x.gpu, summed, y);
      product_of_sum = read(*b.gpu, y);
      DeviceTensor y_once = b.gpu->alloc(DType::F32, {1, out});
      b.gpu->matmul(x.gpu, w, y_once);
      std::vector<float> doubled = read(*b.gpu, y_once);
      for (float& v : doubled) v *= 2.0f;  // scaling by 2 is exact: the same sums, doubled
      REQUIRE(product_of_sum == doubled);
    }
  }
  const Pair w = make_f32(b, random_values(12, 1), {3, 4});
  const Pair x = make_f32(b, random_values(10, 2), {2, 5});
  Pair y = zeros_f32(b, {2, 3});
  CHECK_THROWS_AS(b.gpu->matmul(x.gpu, w.gpu, y.gpu), Error);  // in 5 vs 4
}

TEST_CASE("cuda backend: matmul_many and matmul_add give matmul's bits", "[cuda]") {
  // q, k and v through matmul_many, and the residual add in the product's epilogue: the same
  // per-feature sums, so the same bits as separate matmuls and add_inplace (decode rows, the
  // weight-streaming kernel; 20 rows, the defaults over cuBLAS).
  Backends b;
  uint32_t seed = 80;
  for (const int64_t n : {int64_t(1), int64_t(5), int64_t(20)}) {
    for (DType dtype : {DType::BF16, DType::F32}) {
      INFO("rows " << n << " w " << dtype_name(dtype));
      const int64_t in = 256;
      const HostWeight wq = random_weight(dtype, {320, in}, ++seed);
      const HostWeight wk = random_weight(dtype, {64, in}, ++seed);
      const HostWeight wv = random_weight(dtype, {72, in}, ++seed);
      const DeviceTensor q_w = raw_on_gpu(b, wq), k_w = raw_on_gpu(b, wk), v_w = raw_on_gpu(b, wv);
      const Pair x = make_f32(b, random_values(size_t(n * in), ++seed), {n, in});
      std::vector<DeviceTensor> separate, together;
      for (const DeviceTensor* w : {&q_w, &k_w, &v_w}) {
        separate.push_back(b.gpu->alloc(DType::F32, {n, w->dim(0)}));
        together.push_back(b.gpu->alloc(DType::F32, {n, w->dim(0)}));
        b.gpu->matmul(x.gpu, *w, separate.back());
      }
      const DeviceTensor* const weights[] = {&q_w, &k_w, &v_w};
      DeviceTensor* const outputs[] = {&together[0], &together[1], &together[2]};
      b.gpu->matmul_many(x.gpu, weights, outputs);
      for (size_t i = 0; i < 3; ++i) CHECK(read(*b.gpu, together[i]) == read(*b.gpu, separate[i]));

      const std::vector<float> residual = random_values(size_t(n * 320), ++seed);
      Pair acc = make_f32(b, residual, {n, 320});
      Pair want = make_f32(b, residual, {n, 320});
      DeviceTensor scratch = b.gpu->alloc(DType::F32, {n, 320});
      b.gpu->matmul_add(x.gpu, q_w, scratch, acc.gpu);
      b.gpu->add_inplace(want.gpu, separate[0]);
      CHECK(read(*b.gpu, acc.gpu) == read(*b.gpu, want.gpu));
    }
  }
}

TEST_CASE("cuda backend: the fused norm and products give the separate ops' bits", "[cuda]") {
  // rmsnorm_matmul_many and rmsnorm_gate_up stage the rows in the products' kernel and normalise
  // them there, or run the rmsnorm op first (from 4 rows of 1024 or more; 16 rows of 2048 do not
  // fit shared memory): either way the normed rows, the products and silu(gate) * up must have
  // the bits of rmsnorm, matmul and silu_mul. Rows of 256 take the fused kernel at every count.
  Backends b;
  uint32_t seed = 300;
  for (const auto& [n, in] : {std::pair{int64_t(1), int64_t(2048)},
                              {int64_t(3), int64_t(2048)},
                              {int64_t(8), int64_t(2048)},
                              {int64_t(16), int64_t(2048)},
                              {int64_t(10), int64_t(256)},
                              {int64_t(4), int64_t(256)}}) {
    for (DType dtype : {DType::BF16, DType::F32}) {
      INFO("rows " << n << " width " << in << " w " << dtype_name(dtype));
      const DeviceTensor norm = raw_on_gpu(b, random_weight(dtype, {in}, ++seed));
      const DeviceTensor wq = raw_on_gpu(b, random_weight(dtype, {96, in}, ++seed));
      const DeviceTensor wk = raw_on_gpu(b, random_weight(dtype, {40, in}, ++seed));
      const DeviceTensor gate_w = raw_on_gpu(b, random_weight(dtype, {72, in}, ++seed));
      const DeviceTensor up_w = raw_on_gpu(b, random_weight(dtype, {72, in}, ++seed));
      const Pair x = make_f32(b, random_values(size_t(n * in), ++seed), {n, in});
      auto alloc = [&](int64_t cols) { return b.gpu->alloc(DType::F32, {n, cols}); };
      DeviceTensor normed = alloc(in), q = alloc(96), k = alloc(40);
      b.gpu->rmsnorm(x.gpu, norm, 1e-5f, normed);
      b.gpu->matmul(normed, wq, q);
      b.gpu->matmul(normed, wk, k);
      DeviceTensor fused_normed = alloc(in), fused_q = alloc(96), fused_k = alloc(40);
      const DeviceTensor* const qk_w[] = {&wq, &wk};
      DeviceTensor* const qk[] = {&fused_q, &fused_k};
      b.gpu->rmsnorm_matmul_many(x.gpu, norm, 1e-5f, fused_normed, qk_w, qk);
      CHECK(read(*b.gpu, fused_normed) == read(*b.gpu, normed));
      CHECK(read(*b.gpu, fused_q) == read(*b.gpu, q));
      CHECK(read(*b.gpu, fused_k) == read(*b.gpu, k));

      DeviceTensor gate = alloc(72), up = alloc(72), act = alloc(72);
      b.gpu->matmul(normed, gate_w, gate);
      b.gpu->matmul(normed, up_w, up);
      b.gpu->silu_mul(gate, up, act);
      DeviceTensor fused_gate = alloc(72), fused_up = alloc(72), fused_act = alloc(72);
      DeviceTensor again_normed = alloc(in);
      b.gpu->rmsnorm_gate_up(x.gpu, norm, 1e-5f, again_normed, gate_w, up_w, fused_gate, fused_up,
                             fused_act);
      CHECK(read(*b.gpu, again_normed) == read(*b.gpu, normed));
      CHECK(read(*b.gpu, fused_act) == read(*b.gpu, act));
    }
  }
}

TEST_CASE("cuda backend: one row's products have the bits of that row in a batch", "[cuda]") {
  // A single row (a dense decode step, a run decoded alone) takes the one-row kernel
  // (gemv_row.cu), a batch of rows the general one (gemv.cu); with the tensor cores on
  // (gemv_mma.cuh; the second pass) BF16 weights take gemv_mma.cu at any rows. Lockstep keeps a
  // run's bits only if every feature is summed in the same order alone and in a batch. Widths that
  // give every lane the same number of vectors and widths that do not (the tensor cores' last
  // k-block partial: 264, 1000); rows wider than the batch kernels' shared memory (12000 columns:
  // in chunks through gemv.cu's two buffers; read from L2 by gemv_mma.cu); more features than the
  // grid has warps (several a warp; 33000: 2063 tiles, several a block); 3 rows and 9 (two
  // tensor-core B tiles, and from 4 rows the norm run first); weights uploaded (requested before
  // the grid waits) and allocated; all four epilogues.
  Backends b;
  uint32_t seed = 900;
  const cuda::GemvMmaScope default_scope = cuda::gemv_mma_scope();
  for (const cuda::GemvMmaScope scope : {default_scope, cuda::GemvMmaScope::All}) {
    cuda::set_gemv_mma_scope(scope);
    for (const int64_t n : {int64_t(3), int64_t(9)}) {
      for (const auto& [in, out] : {std::pair{int64_t(2048), int64_t(600)},
                                    {int64_t(8192), int64_t(136)},
                                    {int64_t(264), int64_t(7000)},
                                    {int64_t(1000), int64_t(72)},
                                    {int64_t(12000), int64_t(300)},
                                    {int64_t(256), int64_t(33000)}}) {
        for (DType dtype : {DType::BF16, DType::F32, DType::F16}) {
          for (const bool uploaded : {true, false}) {
            INFO("tensor-core scope " << int(scope) << " rows " << n << " width " << in << " out "
                                      << out << " w " << dtype_name(dtype) << " uploaded "
                                      << uploaded);
            auto weight = [&](std::vector<int64_t> shape) {
              const HostWeight w = random_weight(dtype, std::move(shape), ++seed);
              return uploaded ? upload(b, w).gpu : raw_on_gpu(b, w);
            };
            const DeviceTensor norm = weight({in});
            const DeviceTensor w1 = weight({out, in}), w2 = weight({40, in}),
                               up_w = weight({out, in});
            const std::vector<float> xs = random_values(size_t(n * in), ++seed);
            const std::vector<float> residual = random_values(size_t(n * out), ++seed);
            // Every op once on all n rows, then once per row; row r of each batch result must be
            // the row's own result.
            auto run = [&](int64_t rows, const float* x_rows, const float* residual_rows) {
              std::vector<std::vector<float>> results;
              const Pair x =
                  make_f32(b, std::vector<float>(x_rows, x_rows + rows * in), {rows, in});
              auto alloc = [&](int64_t cols) { return b.gpu->alloc(DType::F32, {rows, cols}); };
              DeviceTensor y = alloc(out);
              b.gpu->matmul(x.gpu, w1, y);
              results.push_back(read(*b.gpu, y));
              Pair acc = make_f32(b, std::vector<float>(residual_rows, residual_rows + rows * out),
                                  {rows, out});
              DeviceTensor scratch = alloc(out);
              b.gpu->matmul_add(x.gpu, w1, scratch, acc.gpu);
              results.push_back(read(*b.gpu, acc.gpu));
              DeviceTensor normed = alloc(in), y1 = alloc(out), y2 = alloc(40);
              const DeviceTensor* const ws[] = {&w1, &w2};
              DeviceTensor* const ys[] = {&y1, &y2};
              b.gpu->rmsnorm_matmul_many(x.gpu, norm, 1e-5f, normed, ws, ys);
              for (const DeviceTensor* t : {&normed, &y1, &y2}) results.push_back(read(*b.gpu, *t));
              DeviceTensor gate = alloc(out), up = alloc(out), act = alloc(out),
                           normed2 = alloc(in);
              b.gpu->rmsnorm_gate_up(x.gpu, norm, 1e-5f, normed2, w1, up_w, gate, up, act);
              results.push_back(read(*b.gpu, act));
              results.push_back(read(*b.gpu, normed2));
              return results;
            };
            const auto batch = run(n, xs.data(), residual.data());
            for (int64_t r = 0; r < n; ++r) {
              const auto alone = run(1, xs.data() + r * in, residual.data() + r * out);
              REQUIRE(alone.size() == batch.size());
              for (size_t k = 0; k < alone.size(); ++k) {
                INFO("row " << r << " result " << k);
                const size_t cols = alone[k].size();
                const std::vector<float> row(batch[k].begin() + ptrdiff_t(r * cols),
                                             batch[k].begin() + ptrdiff_t((r + 1) * cols));
                CHECK(alone[k] == row);
              }
            }
          }
        }
      }
    }
  }
  cuda::set_gemv_mma_scope(default_scope);
}

// rmsnorm against the CPU (widths 96 and 4099, F32/BF16 weights, two epsilons, in place): the
// op table. Here the weight kept in its stored dtype in GPU memory (a path the table cannot
// take), in place.
TEST_CASE("cuda backend: rmsnorm in place with the weight in its stored dtype", "[cuda]") {
  Backends b;
  uint32_t seed = 40;
  for (int64_t width : {96, 4099}) {
    for (DType dtype : {DType::F32, DType::BF16}) {
      for (float eps : {1e-5f, 1e-6f}) {
        INFO("width " << width << " weight " << dtype_name(dtype) << " eps " << eps);
        const int64_t n = 5;
        const std::vector<float> xs = random_values(size_t(n * width), ++seed, 3.0f);
        const HostWeight w = random_weight(dtype, {width}, ++seed);
        const DeviceTensor weight = b.cpu->upload_weight(view_of(w), w.bytes);
        const Pair x = make_f32(b, xs, {n, width});
        Pair y = zeros_f32(b, {n, width});
        b.cpu->rmsnorm(x.cpu, weight, eps, y.cpu);
        // Same formula and rounding points on both sides (sum of squares in double, inverse RMS
        // rounded to F32 once, then (x * inv) * w in F32); only the order of the double sum
        // differs, which can move the F32 inverse by an ulp. 1e-5 relative is ~80 ulp.
        const std::vector<float> want = read(*b.cpu, y.cpu);
        Pair inplace = make_f32(b, xs, {n, width});
        b.gpu->rmsnorm(inplace.gpu, raw_on_gpu(b, w), eps, inplace.gpu);
        check_close(want, read(*b.gpu, inplace.gpu), 1e-5, 1e-30, "rmsnorm in place, raw weight");
      }
    }
  }
}

// rope and rope_pair against the CPU (llama-3's base at D 64 and 128, far, consecutive and
// repeated positions; phi3's partial rotary with a longrope factor): the op table. Here what it
// cannot say: the channels past the rotary ones are the input's bits, and rope_pair gives each
// tensor rope's bits.
TEST_CASE("cuda backend: rope leaves the channels past the rotary ones, rope_pair is rope's bits",
          "[cuda]") {
  Backends b;
  uint32_t seed = 68;
  // phi3 partial rotary (96 of 128 channels, the rest untouched) with a longrope attention
  // factor scaling cos and sin.
  const int64_t head_dim = 128, rotary_dim = 96;
  std::vector<float> inv_freq(size_t(rotary_dim / 2));
  for (int64_t i = 0; i < rotary_dim / 2; ++i)
    inv_freq[size_t(i)] = float(1.0 / std::pow(10000.0, double(2 * i) / double(rotary_dim)));
  const Pair freq = make_f32(b, inv_freq, {rotary_dim / 2});
  const std::vector<int64_t> positions = {0, 3, 4096, 70000};
  const int64_t n = int64_t(positions.size()), heads = 3;
  const std::vector<float> xs = random_values(size_t(n * heads * head_dim), ++seed);
  Pair x = make_f32(b, xs, {n, heads, head_dim});
  b.gpu->rope(x.gpu, positions, freq.gpu, 1.1902381f);
  const std::vector<float> gpu = read(*b.gpu, x.gpu);
  for (int64_t r = 0; r < n * heads; ++r) {
    for (int64_t d = rotary_dim; d < head_dim; ++d)
      CHECK(gpu[size_t(r * head_dim + d)] == xs[size_t(r * head_dim + d)]);
  }
  // rope_pair (queries and keys in one launch) gives each tensor rope's bits.
  const int64_t kv_heads = 2;
  const std::vector<float> ks = random_values(size_t(n * kv_heads * head_dim), ++seed);
  Pair q = make_f32(b, xs, {n, heads, head_dim}), k = make_f32(b, ks, {n, kv_heads, head_dim});
  b.gpu->rope_pair(q.gpu, k.gpu, positions, freq.gpu, 1.1902381f);
  CHECK(read(*b.gpu, q.gpu) == gpu);
  Pair k_alone = make_f32(b, ks, {n, kv_heads, head_dim});
  b.gpu->rope(k_alone.gpu, positions, freq.gpu, 1.1902381f);
  CHECK(read(*b.gpu, k.gpu) == read(*b.gpu, k_alone.gpu));
}

// silu_mul and add_inplace against the CPU (5 x 1001, gates whose exp overflows): the op table.
TEST_CASE("cuda backend: add_inplace rejects a shorter tensor", "[cuda]") {
  Backends b;
  Pair x = make_f32(b, random_values(5 * 1001, 82), {5, 1001});
  const Pair shorter = make_f32(b, random_values(10, 83), {10});
  CHECK_THROWS_AS(b.gpu->add_inplace(x.gpu, shorter.gpu), Error);
}

namespace {

struct AttentionShape {
  int64_t heads, kv_heads, head_dim, capacity, filled;
};

struct Caches {
  DeviceTensor k, v;
};

// Fills `filled` positions of the GPU's caches in two kv_append chunks (the second at a non-zero
// first position).
Caches make_caches(Backend& gpu, const AttentionShape& s, uint32_t seed) {
  Caches c{gpu.alloc(DType::F32, {s.kv_heads, s.capacity, s.head_dim}),
           gpu.alloc(DType::F32, {s.kv_heads, s.capacity, s.head_dim})};
  const int64_t split = s.filled * 2 / 3;
  for (auto [first, rows] : {std::pair{int64_t(0), split}, std::pair{split, s.filled - split}}) {
    const std::vector<int64_t> shape = {rows, s.kv_heads, s.head_dim};
    const size_t count = size_t(count_of(shape));
    DeviceTensor k = gpu.alloc(DType::F32, shape), v = gpu.alloc(DType::F32, shape);
    const std::vector<float> ks = random_values(count, ++seed), vs = random_values(count, ++seed);
    gpu.from_host(k, ks.data(), ks.size() * sizeof(float));
    gpu.from_host(v, vs.data(), vs.size() * sizeof(float));
    gpu.kv_append(k, v, c.k, c.v, first);
  }
  return c;
}

struct AttentionCase {
  int64_t first, rows, window;
  bool use_mask;
  float q_scale;
};

// A random visibility mask [H, context]: about half the keys, the current token always visible,
// except head 1 which sees nothing.
std::vector<uint8_t> random_mask(int64_t heads, int64_t context, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> mask(size_t(heads * context));
  for (auto& m : mask) m = uint8_t(rng() & 1u);
  for (int64_t h = 0; h < heads; ++h) mask[size_t(h * context + context - 1)] = 1;
  if (heads > 1) std::fill(mask.begin() + context, mask.begin() + 2 * context, uint8_t(0));
  return mask;
}

// What the GPU's attention must do by itself (its results against the CPU's are the op table's
// "attention case" entries, at these shapes and cases): -inf logits exactly where a key is not
// visible (outside the causal range, the window or the mask), finite ones elsewhere; a head that
// sees nothing outputs zeros; logits rows wider than the context (a recording session's, as wide
// as the cache) get the packed rows' bits in their first context columns and keep the rest, and
// the output does not change with them.
void check_attention(Backend& gpu, const Caches& c, const AttentionShape& s, const AttentionCase& a,
                     uint32_t seed) {
  INFO("H " << s.heads << " G " << s.kv_heads << " D " << s.head_dim << " first " << a.first
            << " rows " << a.rows << " window " << a.window << " mask " << a.use_mask);
  const int64_t H = s.heads, D = s.head_dim, context = a.first + a.rows;
  const std::vector<float> qs = random_values(size_t(a.rows * H * D), seed, a.q_scale);
  DeviceTensor q = gpu.alloc(DType::F32, {a.rows, H, D});
  gpu.from_host(q, qs.data(), qs.size() * sizeof(float));
  DeviceTensor out = gpu.alloc(DType::F32, {a.rows, H, D});
  DeviceTensor logits = gpu.alloc(DType::F32, {a.rows, H, context});
  std::vector<uint8_t> mask;
  DeviceTensor mask_t;
  Visibility visible;
  if (a.use_mask) {
    mask = random_mask(H, context, seed + 1);
    mask_t = gpu.alloc(DType::U8, {H, context});
    gpu.from_host(mask_t, mask.data(), mask.size());
    visible.mask = &mask_t;
  }
  gpu.attention(q, c.k, c.v, a.first, a.window, visible, out, &logits);
  const std::vector<float> got = read(gpu, logits);
  const std::vector<float> got_out = read(gpu, out);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t position = a.first + i;
      const int64_t lo = a.window > 0 ? std::max<int64_t>(0, position - a.window + 1) : 0;
      bool sees_any = false;
      for (int64_t j = 0; j < context; ++j) {
        const size_t at = size_t((i * H + h) * context + j);
        const bool visible_key =
            j >= lo && j <= position && (mask.empty() || mask[size_t(h * context + j)] != 0);
        sees_any = sees_any || visible_key;
        if (visible_key ? !std::isfinite(got[at]) : got[at] != kNegInf) {
          FAIL_CHECK("logit visibility wrong at row " << i << " head " << h << " key " << j << ": "
                                                      << got[at]);
          return;
        }
      }
      if (!sees_any)
        for (int64_t d = 0; d < D; ++d) CHECK(got_out[size_t((i * H + h) * D + d)] == 0.0f);
    }

  const int64_t wide = context + 7;
  const float kSentinel = 42.0f;
  const std::vector<float> sentinels(size_t(a.rows * H * wide), kSentinel);
  DeviceTensor wide_logits = gpu.alloc(DType::F32, {a.rows, H, wide});
  gpu.from_host(wide_logits, sentinels.data(), sentinels.size() * sizeof(float));
  DeviceTensor out_again = gpu.alloc(DType::F32, {a.rows, H, D});
  gpu.attention(q, c.k, c.v, a.first, a.window, visible, out_again, &wide_logits);
  CHECK(read(gpu, out_again) == got_out);
  const std::vector<float> rows = read(gpu, wide_logits);
  int64_t wrong = 0;
  for (int64_t r = 0; r < a.rows * H; ++r)
    for (int64_t j = 0; j < wide; ++j) {
      const float value = rows[size_t(r * wide + j)];
      wrong += j < context ? std::memcmp(&value, &got[size_t(r * context + j)], 4) != 0
                           : value != kSentinel;
    }
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("cuda backend: a masked decode over a long context attends over the keys it keeps",
          "[cuda]") {
  // From 8192 visible keys a masked decode lists the keys each KV head's group sees and cuts its
  // slices over that list. Masks: StreamingLLM's (four sinks and a 300-key window; one head with
  // the sinks only, one with a single key mid-context besides: most of the context no head of a
  // group sees), a random half per head (nearly every key seen by some head of its group; one
  // head sees nothing) and a random tenth (a third of the keys listed), each also under an
  // 8200-key window (the first chunk of positions partly before it, listed by none).
  // The logits and outputs against double-precision host arithmetic on the caches' own values:
  // the F32 kernel sums 64 products per logit and a softmax over up to 10300 keys: within 1e-5
  // relative plus 1e-5 absolute (logits and outputs of order 1; F32 rounding is about 6e-8
  // relative a step).
  Backends b;
  Backend& gpu = *b.gpu;
  const AttentionShape s{32, 8, 64, 10400, 10300};  // (lists from 8192 keys)
  const Caches c = make_caches(gpu, s, 700);
  const int64_t H = s.heads, G = s.kv_heads, D = s.head_dim, context = s.filled;
  const int64_t position = context - 1;
  const std::vector<float> ks = read(gpu, c.k), vs = read(gpu, c.v);  // [G, capacity, D]
  const std::vector<float> qs = random_values(size_t(H * D), 701, 2.0f);
  DeviceTensor q = gpu.alloc(DType::F32, {1, H, D});
  gpu.from_host(q, qs.data(), qs.size() * sizeof(float));

  auto check = [&](const std::vector<uint8_t>& mask, int64_t window) {
    DeviceTensor mask_t = gpu.alloc(DType::U8, {H, context});
    gpu.from_host(mask_t, mask.data(), mask.size());
    Visibility visible;
    visible.mask = &mask_t;
    DeviceTensor out = gpu.alloc(DType::F32, {1, H, D});
    DeviceTensor logits = gpu.alloc(DType::F32, {1, H, context});
    gpu.attention(q, c.k, c.v, position, window, visible, out, &logits);
    const std::vector<float> got_logits = read(gpu, logits), got_out = read(gpu, out);

    const int64_t lo = window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
    const double scale = attention_scale(D);
    std::vector<float> want_logits(size_t(H * context)), want_out(size_t(H * D), 0.0f);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      auto sees = [&](int64_t j) { return j >= lo && mask[size_t(h * context + j)] != 0; };
      std::vector<double> weights(size_t(context), 0.0);
      double most = -1e300;
      for (int64_t j = 0; j < context; ++j) {
        if (!sees(j)) {
          want_logits[size_t(h * context + j)] = kNegInf;
          continue;
        }
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d)
          dot += double(qs[size_t(h * D + d)]) * ks[size_t((g * s.capacity + j) * D + d)];
        weights[size_t(j)] = dot * scale;
        want_logits[size_t(h * context + j)] = float(dot * scale);
        most = std::max(most, dot * scale);
      }
      double total = 0.0;
      for (int64_t j = 0; j < context; ++j)
        if (sees(j)) total += weights[size_t(j)] = std::exp(weights[size_t(j)] - most);
      if (total == 0.0) continue;  // a head that sees nothing outputs zeros
      for (int64_t d = 0; d < D; ++d) {
        double sum = 0.0;
        for (int64_t j = 0; j < context; ++j)
          if (sees(j)) sum += weights[size_t(j)] * vs[size_t((g * s.capacity + j) * D + d)];
        want_out[size_t(h * D + d)] = float(sum / total);
      }
    }
    int64_t wrong_visibility = 0;
    std::vector<float> finite_want, finite_got;
    for (size_t i = 0; i < want_logits.size(); ++i) {
      if (want_logits[i] == kNegInf) {
        wrong_visibility += got_logits[i] != kNegInf;
      } else {
        finite_want.push_back(want_logits[i]);
        finite_got.push_back(got_logits[i]);
      }
    }
    CHECK(wrong_visibility == 0);
    check_close(finite_want, finite_got, 1e-5, 1e-5, "visible logits");
    check_close(want_out, got_out, 1e-5, 1e-5, "outputs");
  };

  SECTION("sinks and a recent window") {
    std::vector<uint8_t> mask(size_t(H * context), 0);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < context; ++j)
        mask[size_t(h * context + j)] = j < 4 || (h != 5 && j > position - 300);
    mask[size_t(9 * context + 2500)] = 1;
    check(mask, 0);
  }
  SECTION("a random half per head, without and with a window") {
    const std::vector<uint8_t> mask = random_mask(H, context, 702);
    check(mask, 0);
    check(mask, 8200);
  }
  SECTION("a random tenth per head, without and with a window") {
    std::mt19937 rng(703);
    std::vector<uint8_t> mask(size_t(H * context));
    for (uint8_t& m : mask) m = rng() % 10 == 0;
    check(mask, 0);
    check(mask, 8200);
  }
}

TEST_CASE("cuda backend: attention's visible logits, wide logits rows and bad arguments",
          "[cuda]") {
  Backends b;
  Backend& gpu = *b.gpu;
  uint32_t seed = 100;

  SECTION("GQA (8 query heads on 2 KV heads), windows, visibility masks") {
    const AttentionShape s{8, 2, 64, 96, 41};
    const Caches c = make_caches(gpu, s, seed);
    for (const AttentionCase& a : {
             AttentionCase{0, 41, 0, false, 1.0f},   // whole prefill
             AttentionCase{36, 5, 8, false, 1.0f},   // chunk, window inside the chunk
             AttentionCase{40, 1, 0, false, 1.0f},   // decode
             AttentionCase{40, 1, 16, false, 1.0f},  // windowed decode
             AttentionCase{40, 1, 0, true, 1.0f},    // masked decode
             AttentionCase{40, 1, 20, true, 2.0f},   // mask intersected with a window
         })
      check_attention(gpu, c, s, a, ++seed);
  }

  SECTION("long context across several 256-key tiles, peaky softmax") {
    const AttentionShape s{4, 4, 128, 700, 600};
    const Caches c = make_caches(gpu, s, seed);
    for (const AttentionCase& a : {
             AttentionCase{599, 1, 0, false, 4.0f},
             AttentionCase{597, 3, 300, false, 4.0f},
             AttentionCase{599, 1, 0, true, 4.0f},
             AttentionCase{599, 1, 513, true, 1.0f},
         })
      check_attention(gpu, c, s, a, ++seed);
  }

  SECTION("decode over thousands of keys: many slices of the split kernel, GQA 4") {
    const AttentionShape s{32, 8, 64, 5200, 5123};
    const Caches c = make_caches(gpu, s, seed);
    for (const AttentionCase& a : {
             AttentionCase{5122, 1, 0, false, 2.0f},
             AttentionCase{5122, 1, 1000, true, 2.0f},
         })
      check_attention(gpu, c, s, a, ++seed);
  }

  SECTION("heads of 8 and 16 channels over thousands of keys (the TokenButler predictor's)") {
    for (const AttentionShape& s :
         {AttentionShape{32, 32, 8, 4200, 4100}, AttentionShape{8, 8, 16, 3000, 2900}}) {
      const Caches c = make_caches(gpu, s, seed);
      for (const AttentionCase& a : {
               AttentionCase{s.filled - 1, 1, 0, false, 2.0f},
               AttentionCase{s.filled - 1, 1, 0, true, 2.0f},
               AttentionCase{s.filled - 1, 1, 700, true, 2.0f},
           })
        check_attention(gpu, c, s, a, ++seed);
    }
  }

  SECTION("one KV head (MQA), head_dim 80") {
    const AttentionShape s{6, 1, 80, 40, 33};
    const Caches c = make_caches(gpu, s, seed);
    for (const AttentionCase& a : {
             AttentionCase{32, 1, 0, false, 1.0f},
             AttentionCase{0, 33, 5, false, 1.0f},
             AttentionCase{32, 1, 0, true, 1.0f},
         })
      check_attention(gpu, c, s, a, ++seed);
  }

  SECTION("bad arguments are errors") {
    const AttentionShape s{4, 2, 16, 8, 6};
    Caches c = make_caches(gpu, s, seed);
    const Pair q = make_f32(b, random_values(2 * 4 * 16, 7), {2, 4, 16});
    Pair out = zeros_f32(b, {2, 4, 16});
    DeviceTensor mask = gpu.alloc(DType::U8, {4, 6});
    // A mask is only for one query row.
    CHECK_THROWS_AS(gpu.attention(q.gpu, c.k, c.v, 4, 0, Visibility{&mask}, out.gpu, nullptr),
                    Error);
    DeviceTensor wrong_logits = gpu.alloc(DType::F32, {2, 4, 5});
    CHECK_THROWS_AS(gpu.attention(q.gpu, c.k, c.v, 4, 0, {}, out.gpu, &wrong_logits), Error);
    DeviceTensor flat_logits = gpu.alloc(DType::F32, {2 * 4 * 6});
    CHECK_THROWS_AS(gpu.attention(q.gpu, c.k, c.v, 4, 0, {}, out.gpu, &flat_logits), Error);
    // Past the capacity.
    CHECK_THROWS_AS(gpu.attention(q.gpu, c.k, c.v, 7, 0, {}, out.gpu, nullptr), Error);
    const Pair k = make_f32(b, random_values(2 * 2 * 16, 8), {2, 2, 16});
    CHECK_THROWS_AS(gpu.kv_append(k.gpu, k.gpu, c.k, c.v, 7), Error);
  }
}

TEST_CASE("cuda backend: argmax_rows", "[cuda]") {
  Backends b;
  const int64_t rows = 7, V = 50257;  // odd, many times the 256 threads of a block
  std::vector<float> x = random_values(size_t(rows * V), 120);
  auto at = [&](int64_t r, int64_t j) -> float& { return x[size_t(r * V + j)]; };
  std::vector<int32_t> expected(static_cast<size_t>(rows));
  expected[0] = int32_t(std::max_element(x.begin(), x.begin() + V) - x.begin());
  at(1, 30000) = at(1, 7) = 100.0f;  // tie: the lower index wins
  expected[1] = 7;
  std::fill(x.begin() + 2 * V, x.begin() + 3 * V, 0.5f);  // all equal
  expected[2] = 0;
  at(3, V - 1) = 100.0f;  // the last column
  expected[3] = int32_t(V - 1);
  at(4, 256) = at(4, 255) = at(4, 33) = 100.0f;  // ties across threads and warps
  expected[4] = 33;
  std::fill(x.begin() + 5 * V, x.begin() + 6 * V, kNegInf);  // nothing but -inf
  expected[5] = 0;
  at(6, V - 2) = at(6, 1) = 50.0f;
  at(6, 0) = 49.999f;
  expected[6] = 1;
  const Pair t = make_f32(b, x, {rows, V});
  std::vector<int32_t> cpu(size_t(rows), -1), gpu(size_t(rows), -1);
  b.cpu->argmax_rows(t.cpu, cpu);
  b.gpu->argmax_rows(t.gpu, gpu);
  CHECK(cpu == expected);
  CHECK(gpu == expected);
  std::vector<int32_t> wrong_rows(3);
  CHECK_THROWS_AS(b.gpu->argmax_rows(t.gpu, wrong_rows), Error);
}

TEST_CASE("cuda backend: log_prob_rows", "[cuda]") {
  Backends b;
  const int64_t rows = 5, V = 32003;
  std::vector<float> x = random_values(size_t(rows * V), 140, 5.0f);
  // One row with a huge dynamic range, where an unshifted exponential sum would overflow.
  for (int64_t j = 0; j < V; ++j) x[size_t(4 * V + j)] *= 30.0f;
  const std::vector<int32_t> targets = {0, 32002, 17, 12345, 999};
  const Pair t = make_f32(b, x, {rows, V});
  std::vector<double> cpu(static_cast<size_t>(rows)), gpu(static_cast<size_t>(rows));
  b.cpu->log_prob_rows(t.cpu, targets, cpu);
  b.gpu->log_prob_rows(t.gpu, targets, gpu);
  for (int64_t r = 0; r < rows; ++r) {
    // Host reference in double, the same way (max-shifted sum of exponentials).
    const float* row = x.data() + r * V;
    const double m = *std::max_element(row, row + V);
    double sum = 0.0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - m);
    const double want = double(row[targets[size_t(r)]]) - m - std::log(sum);
    INFO("row " << r << " want " << want << " cpu " << cpu[size_t(r)] << " gpu " << gpu[size_t(r)]);
    // Both backends accumulate in double: they differ only by the order of a double sum of
    // 32003 terms in (0, 1], ~1e-12 relative; 1e-9 absolute is still far below F32 resolution.
    CHECK(std::fabs(gpu[size_t(r)] - want) <= 1e-9 * (1.0 + std::fabs(want)));
    CHECK(std::fabs(cpu[size_t(r)] - want) <= 1e-9 * (1.0 + std::fabs(want)));
  }
  const std::vector<int32_t> bad = {0, 1, 2, 3, int32_t(V)};
  CHECK_THROWS_AS(b.gpu->log_prob_rows(t.gpu, bad, gpu), Error);
}
