// The table of every backend op (backend_op_table.h). Inputs are uniform in [-1, 1) unless an
// entry says otherwise, so sum_k |x_k w_k| <= terms bounds every dot product's magnitude; the
// tolerances below follow from that (worst cases, not fitted to runs).
#include "tests/support/backend_op_table.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <span>
#include <sstream>
#include <utility>

#include "engine/backend/policy_op_math.h"
#include "engine/common/dtype.h"
#include "engine/common/tensor_view.h"
#include "engine/policy/approx_logit_ops.h"
#include "engine/policy/keydiff_ops.h"
#include "engine/policy/magicpig_ops.h"
#include "engine/policy/quest_ops.h"
#include "engine/policy/rocketkv_ops.h"
#include "engine/policy/tokenfilter_ops.h"
#include "engine/policy/top_p_ops.h"
#include "tests/support/tiny_checkpoint.h"

namespace kvlens::test {

namespace {

constexpr double kEps32 = 1.0 / (1 << 24);  // 2^-24, F32's unit roundoff

// Two F32 dot products of `terms` products each, summed in any orders (lanes, trees, FMA or
// not), differ by at most 2 * (terms + 2) * 2^-24 * sum |x_k w_k| (the gamma_n bound of each
// side plus slack for its higher-order part), with sum |x_k w_k| <= magnitude.
Tolerance dot_tolerance(int64_t terms, double magnitude) {
  return {2.0 * double(terms + 2) * kEps32 * magnitude, 0.0};
}

std::string cat_name(std::initializer_list<std::pair<const char*, int64_t>> parts,
                     const std::string& op) {
  std::string name = op;
  for (const auto& [key, value] : parts) {
    name += ' ';
    name += key;
    name += std::to_string(value);
  }
  return name;
}

// inv_freq of a rotation of R channels (RoPE's base 10000), as the model code makes it.
std::vector<float> inv_freq_values(int64_t rotary) {
  std::vector<float> values(size_t(rotary / 2));
  for (int64_t i = 0; i < rotary / 2; ++i)
    values[size_t(i)] = float(1.0 / std::pow(10000.0, double(2 * i) / double(rotary)));
  return values;
}

// The shapes of the attention-family entries: H query heads over G KV heads of D channels, a
// cache of `capacity` positions of which `filled` hold keys.
struct AttentionShape {
  int64_t heads, kv_heads, head_dim, capacity, filled;
};
constexpr AttentionShape kAttentionShapes[] = {
    {4, 2, 32, 40, 29},  // GQA, a partial cache
    {6, 3, 20, 24, 24},  // a head dimension off the vector widths, the cache full
    {2, 2, 64, 70, 1},   // MHA, one position
};
std::string shape_name(const std::string& op, const AttentionShape& s) {
  return cat_name({{"H", s.heads},
                   {"G", s.kv_heads},
                   {"D", s.head_dim},
                   {"cap", s.capacity},
                   {"filled", s.filled}},
                  op);
}

// Row-op shapes: rows x cols used of a stride.
struct RowShape {
  int64_t rows, cols, stride;
};
// The last two: rows long enough for the CUDA kernels' block-strided loops and the CPU's vector
// loops with a tail (from tests/cuda/test_cuda_policy_ops.cpp's 8 x 1001 of 1030, 8 x 4100 of
// 4200).
constexpr RowShape kRowShapes[] = {
    {4, 13, 16}, {3, 70, 77}, {8, 1, 4}, {8, 1001, 1030}, {8, 4100, 4200}};
std::string rows_name(const std::string& op, const RowShape& s) {
  return cat_name({{"rows", s.rows}, {"cols", s.cols}, {"stride", s.stride}}, op);
}

// Caches [G, capacity, D] with `filled` positions of random keys and values (the rest zero).
struct Caches {
  DeviceTensor k, v;
};
Caches filled_caches(OpRun& r, const AttentionShape& s) {
  std::vector<float> k = r.values(s.kv_heads * s.capacity * s.head_dim);
  std::vector<float> v = r.values(s.kv_heads * s.capacity * s.head_dim);
  for (int64_t g = 0; g < s.kv_heads; ++g)
    for (int64_t j = s.filled; j < s.capacity; ++j)
      for (int64_t d = 0; d < s.head_dim; ++d) {
        const size_t at = size_t((g * s.capacity + j) * s.head_dim + d);
        k[at] = v[at] = 0.0f;
      }
  const std::vector<int64_t> shape = {s.kv_heads, s.capacity, s.head_dim};
  return {r.f32_of(k, shape), r.f32_of(v, shape)};
}

std::vector<OpEntry> make_table() {
  std::vector<OpEntry> entries;
  auto add = [&](std::string name, Tolerance tolerance, std::function<void(OpRun&)> run) {
    entries.push_back({std::move(name), tolerance, std::move(run)});
  };

  // ----------------------------------------------------------------- memory and copies
  for (const RowShape& s : kRowShapes) {
    // Copies move bytes: exact.
    add(rows_name("copy_rows", s), kExact, [s](OpRun& r) {
      const DeviceTensor src = r.f32({s.rows, s.stride});
      DeviceTensor dst = r.f32({s.rows + 2, s.stride});
      r.backend().copy_rows(src, 1, dst, 2, s.rows - 1, s.stride);
      r.out("dst", dst);
    });
    add(rows_name("broadcast_rows", s), kExact, [s](OpRun& r) {
      const DeviceTensor src = r.u8({s.rows, s.stride}, 50);
      DeviceTensor a = r.u8({s.rows, s.stride}, 50), b = r.u8({s.rows + 1, s.stride}, 50);
      DeviceTensor* const dsts[] = {&a, &b};
      r.backend().broadcast_rows(src, 0, dsts, 1, s.rows - 1, s.stride);
      r.out("a", a);
      r.out("b", b);
    });
    // Read-back behind a fence: the bytes themselves.
    add(rows_name("rows_to_host_async", s), kExact, [s](OpRun& r) {
      const DeviceTensor src = r.f32({s.rows, s.stride});
      std::shared_ptr<void> host = r.backend().alloc_host(size_t(s.rows * s.cols) * sizeof(float));
      r.backend().rows_to_host_async(src, s.rows, s.cols, host.get());
      r.backend().fence()->wait();
      const float* values = static_cast<const float*>(host.get());
      r.out("host", std::vector<double>(values, values + s.rows * s.cols));
    });
  }

  // ----------------------------------------------------------------- model ops
  for (const DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    // A row copy of the table (BF16/F16 widened exactly): exact.
    add("embed " + std::string(dtype_name(dtype)) + " vocab50 E24", kExact, [dtype](OpRun& r) {
      const DeviceTensor table = r.weight({50, 24}, dtype);
      const std::vector<int32_t> ids = {0, 49, 7, 7, 31};
      DeviceTensor out = r.backend().alloc(DType::F32, {5, 24});
      r.backend().embed(table, ids, out);
      r.out("out", out);
    });
  }
  struct Product {
    int64_t n, in, out;
  };
  {
    // A large table and ids at both ends (tests/cuda/test_cuda_backend.cpp's embed case): exact.
    for (const DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      add("embed " + std::string(dtype_name(dtype)) + " vocab1000 E96", kExact, [dtype](OpRun& r) {
        const DeviceTensor table = r.weight({1000, 96}, dtype);
        const std::vector<int32_t> ids = {0, 999, 5, 5, 123, 998, 1};
        DeviceTensor out = r.backend().alloc(DType::F32, {7, 96});
        r.backend().embed(table, ids, out);
        r.out("out", out);
      });
    }
  }
  // matmul alone at the shapes that take the CUDA backend's other paths (from
  // tests/cuda/test_cuda_backend.cpp): few rows take the weight-streaming GEMV (vector loads
  // where `in` allows them, scalar loads otherwise, one output feature, 4 features a warp from 3
  // rows on), rows too long for shared memory are staged in chunks (8 x 4000, 13 x 2600), and
  // many rows take cuBLAS (20 x 4096 x 4100: BF16/F16 widened in two slices of 2^24 elements);
  // with the tensor cores on (test_cuda_backend_ops.cpp's second case) BF16 weights take
  // gemv_mma.cu (k-blocks of 32 columns, the last partial at 520, 1000, 2600; 33000 features:
  // many 16-feature tiles a block).
  // F16 weights here too. The tolerance is the table's dot bound with sum |x w| bounded by `in`
  // (the hand test bounded it per element by the actual sum, about in / 4 for these inputs: the
  // same formula, within a factor of about 4).
  for (const Product p :
       {Product{1, 257, 131}, Product{7, 96, 300}, Product{3, 64, 1}, Product{1, 2048, 333},
        Product{16, 520, 70}, Product{12, 1000, 9}, Product{20, 4096, 4100}, Product{8, 4000, 37},
        Product{13, 2600, 5}, Product{2, 256, 33000}}) {
    for (const DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      add("matmul path" + cat_name({{"n", p.n}, {"in", p.in}, {"out", p.out}}, "") + " " +
              std::string(dtype_name(dtype)),
          dot_tolerance(p.in, double(p.in)), [p, dtype](OpRun& r) {
            const DeviceTensor x = r.f32({p.n, p.in});
            const DeviceTensor w = r.weight({p.out, p.in}, dtype);
            DeviceTensor y = r.backend().alloc(DType::F32, {p.n, p.out});
            r.backend().matmul(x, w, y);
            r.out("y", y);
          });
    }
  }
  // rmsnorm with a long row (4099: off every vector width, many warps), BF16 and F32 weights,
  // two epsilons, and in place (y aliases x), from tests/cuda/test_cuda_backend.cpp; inputs in
  // [-3, 3). The tolerance of the rmsnorm entries below.
  for (const DType dtype : {DType::F32, DType::BF16}) {
    for (const float eps : {1e-5f, 1e-6f}) {
      add("rmsnorm n5 E4099 " + std::string(dtype_name(dtype)) +
              (eps == 1e-5f ? " eps1e-5" : " eps1e-6"),
          {1e-7, 1e-5}, [dtype, eps](OpRun& r) {
            const std::vector<float> xs = r.values(5 * 4099, 3.0f);
            const DeviceTensor x = r.f32_of(xs, {5, 4099});
            const DeviceTensor w = r.weight({4099}, dtype);
            DeviceTensor y = r.backend().alloc(DType::F32, {5, 4099});
            r.backend().rmsnorm(x, w, eps, y);
            r.out("y", y);
            DeviceTensor inplace = r.f32_of(xs, {5, 4099});
            r.backend().rmsnorm(inplace, w, eps, inplace);
            r.out("y in place", inplace);
          });
    }
  }
  // The gated activations over 5 x 1001 with gates far out on both sides and 0: silu_mul (exp
  // overflows at -100: silu is -0) and gemma3's GeGLU gelu_tanh_mul (tanh saturates: gelu is 0 or
  // the gate itself; gelu_tanh in double rounded once, then the F32 product). add_inplace at the
  // same size. The tolerances of the entries below.
  for (const bool gelu : {false, true}) {
    add(gelu ? "gelu_tanh_mul n5 F1001 saturating gates" : "silu_mul n5 F1001 overflowing gates",
        {1e-7, 1e-5}, [gelu](OpRun& r) {
          std::vector<float> gate = r.values(5 * 1001, 6.0f);
          gate[0] = -100.0f;
          gate[1] = 90.0f;
          gate[2] = 0.0f;
          const DeviceTensor g = r.f32_of(gate, {5, 1001}), u = r.f32({5, 1001});
          DeviceTensor out = r.backend().alloc(DType::F32, {5, 1001});
          if (gelu) {
            r.backend().gelu_tanh_mul(g, u, out);
          } else {
            r.backend().silu_mul(g, u, out);
          }
          r.out("out", out);
        });
  }
  // Logit soft-capping at 30 (Gemma 2/3's final cap) over logits up to +-200: saturated rows and
  // the near-linear middle.
  add("soft_cap n3 V1001 cap30", {1e-7, 1e-6}, [](OpRun& r) {
    DeviceTensor x = r.f32({3, 1001}, 200.0f);
    r.backend().soft_cap(x, 30.0f);
    r.out("x", x);
  });
  add("add_inplace n5 E1001", kExact, [](OpRun& r) {
    DeviceTensor x = r.f32({5, 1001});
    const DeviceTensor y = r.f32({5, 1001});
    r.backend().add_inplace(x, y);
    r.out("x", x);
  });
  // rope at llama-3's base (500000) with D 64 and 128 over far (131071), consecutive and repeated
  // positions, and phi3's partial rotary (96 of 128) with a longrope factor scaling cos and sin at
  // positions up to 70000 (tests/cuda/test_cuda_backend.cpp). The rope entries' tolerance; the
  // channels past the rotary ones are compared too (untouched: the same bits).
  for (const int64_t head_dim : {int64_t(64), int64_t(128)}) {
    for (const auto& positions :
         {std::vector<int64_t>{0, 1, 517, 4095}, std::vector<int64_t>{10, 11, 12, 13, 14},
          std::vector<int64_t>{131071}, std::vector<int64_t>{77, 77, 77}}) {
      add("rope base500000" + cat_name({{"n", int64_t(positions.size())},
                                        {"H", 6},
                                        {"D", head_dim},
                                        {"first", positions[0]}},
                                       ""),
          {1e-6, 1e-5}, [head_dim, positions](OpRun& r) {
            std::vector<float> inv_freq(size_t(head_dim / 2));
            for (int64_t i = 0; i < head_dim / 2; ++i)
              inv_freq[size_t(i)] =
                  float(1.0 / std::pow(500000.0, double(2 * i) / double(head_dim)));
            const DeviceTensor freq = r.f32_of(inv_freq, {head_dim / 2});
            DeviceTensor x = r.f32({int64_t(positions.size()), 6, head_dim});
            r.backend().rope(x, positions, freq);
            r.out("x", x);
          });
    }
  }
  add("rope partial n4 H3 D128 R96 longrope scale", {1e-6, 1e-5}, [](OpRun& r) {
    const std::vector<int64_t> positions = {0, 3, 4096, 70000};
    const DeviceTensor freq = r.f32_of(inv_freq_values(96), {48});
    DeviceTensor x = r.f32({4, 3, 128});
    r.backend().rope(x, positions, freq, 1.1902381f);
    r.out("x", x);
    DeviceTensor q = r.f32({4, 3, 128}), k = r.f32({4, 2, 128});
    r.backend().rope_pair(q, k, positions, freq, 1.1902381f);
    r.out("rope_pair q", q);
    r.out("rope_pair k", k);
  });
  for (const Product p : {Product{1, 37, 19}, Product{5, 64, 48}, Product{17, 96, 40}}) {
    for (const DType dtype : {DType::F32, DType::BF16}) {
      const std::string suffix = cat_name({{"n", p.n}, {"in", p.in}, {"out", p.out}}, "") + " " +
                                 std::string(dtype_name(dtype));
      // Dot products of `in` terms of magnitude <= 1 (BF16 weights widened exactly).
      const Tolerance dot = dot_tolerance(p.in, double(p.in));
      add("matmul" + suffix, dot, [p, dtype](OpRun& r) {
        const DeviceTensor x = r.f32({p.n, p.in});
        const DeviceTensor w = r.weight({p.out, p.in}, dtype);
        DeviceTensor y = r.backend().alloc(DType::F32, {p.n, p.out});
        r.backend().matmul(x, w, y);
        r.out("y", y);
      });
      add("matmul_many" + suffix, dot, [p, dtype](OpRun& r) {
        const DeviceTensor x = r.f32({p.n, p.in});
        const DeviceTensor w0 = r.weight({p.out, p.in}, dtype);
        const DeviceTensor w1 = r.weight({p.out + 3, p.in}, dtype);
        DeviceTensor y0 = r.backend().alloc(DType::F32, {p.n, p.out});
        DeviceTensor y1 = r.backend().alloc(DType::F32, {p.n, p.out + 3});
        const DeviceTensor* const ws[] = {&w0, &w1};
        DeviceTensor* const ys[] = {&y0, &y1};
        r.backend().matmul_many(x, ws, ys);
        r.out("y0", y0);
        r.out("y1", y1);
      });
      // The product plus acc (|acc| <= 1): one more rounding of a value <= in + 1.
      const Tolerance dot_add = {dot.abs + 2.0 * kEps32 * double(p.in + 1), 0.0};
      add("matmul_add" + suffix, dot_add, [p, dtype](OpRun& r) {
        const DeviceTensor x = r.f32({p.n, p.in});
        const DeviceTensor w = r.weight({p.out, p.in}, dtype);
        DeviceTensor scratch = r.backend().alloc(DType::F32, {p.n, p.out});
        DeviceTensor acc = r.f32({p.n, p.out});
        r.backend().matmul_add(x, w, scratch, acc);
        r.out("acc", acc);
      });
      // normed = x / rms(x) * weight: |normed| <= sqrt(in) (all the energy in one element), so
      // the products' magnitude is <= in * sqrt(in); the norm itself within rmsnorm's 1e-5.
      const Tolerance normed_dot = {dot.abs * std::sqrt(double(p.in)) + 1e-5, 1e-5};
      add("rmsnorm_matmul_many" + suffix, normed_dot, [p, dtype](OpRun& r) {
        const DeviceTensor x = r.f32({p.n, p.in});
        const DeviceTensor norm = r.weight({p.in}, dtype);
        const DeviceTensor w0 = r.weight({p.out, p.in}, dtype);
        const DeviceTensor w1 = r.weight({p.out + 1, p.in}, dtype);
        DeviceTensor normed = r.backend().alloc(DType::F32, {p.n, p.in});
        DeviceTensor y0 = r.backend().alloc(DType::F32, {p.n, p.out});
        DeviceTensor y1 = r.backend().alloc(DType::F32, {p.n, p.out + 1});
        const DeviceTensor* const ws[] = {&w0, &w1};
        DeviceTensor* const ys[] = {&y0, &y1};
        r.backend().rmsnorm_matmul_many(x, norm, 1e-5f, normed, ws, ys);
        r.out("normed", normed);
        r.out("y0", y0);
        r.out("y1", y1);
      });
      // act = silu(gate) * up with gate and up products as above, each within normed_dot: act
      // moves by |up| * 1.1 (silu's largest slope) times gate's error plus |silu(gate)| times
      // up's. |gate| and |up| are sums of `in` random-sign terms of the seeded values (|normed|
      // about 1): below 10 here, so 20 times a product's bound, plus act's own roundings.
      // gate and up may stay unwritten (the fused form), so only normed and act are compared.
      const Tolerance act = {20.0 * normed_dot.abs + 1e-5, 1e-5};
      add("rmsnorm_gate_up" + suffix, act, [p, dtype](OpRun& r) {
        const DeviceTensor x = r.f32({p.n, p.in});
        const DeviceTensor norm = r.weight({p.in}, dtype);
        const DeviceTensor w_gate = r.weight({p.out, p.in}, dtype);
        const DeviceTensor w_up = r.weight({p.out, p.in}, dtype);
        DeviceTensor normed = r.backend().alloc(DType::F32, {p.n, p.in});
        DeviceTensor gate = r.backend().alloc(DType::F32, {p.n, p.out});
        DeviceTensor up = r.backend().alloc(DType::F32, {p.n, p.out});
        DeviceTensor out = r.backend().alloc(DType::F32, {p.n, p.out});
        r.backend().rmsnorm_gate_up(x, norm, 1e-5f, normed, w_gate, w_up, gate, up, out);
        r.out("normed", normed);
        r.out("act", out);
      });
    }
  }
  for (const Product p : {Product{1, 37, 0}, Product{6, 256, 0}}) {
    // The sum of squares' order differs (lanes or warps), moving the F32 inverse root by a few
    // ulp: 1e-5 relative is ~80 ulp.
    add(cat_name({{"n", p.n}, {"E", p.in}}, "rmsnorm"), {1e-7, 1e-5}, [p](OpRun& r) {
      const DeviceTensor x = r.f32({p.n, p.in});
      const DeviceTensor w = r.weight({p.in});
      DeviceTensor y = r.backend().alloc(DType::F32, {p.n, p.in});
      r.backend().rmsnorm(x, w, 1e-6f, y);
      r.out("y", y);
    });
    // Mean and variance summed in other orders, then one normalisation: as rmsnorm.
    add(cat_name({{"n", p.n}, {"E", p.in}}, "layer_norm"), {1e-5, 1e-5}, [p](OpRun& r) {
      const DeviceTensor x = r.f32({p.n, p.in});
      const DeviceTensor w = r.weight({p.in}), b = r.weight({p.in});
      DeviceTensor y = r.backend().alloc(DType::F32, {p.n, p.in});
      r.backend().layer_norm(x, w, b, 1e-5f, y);
      r.out("y", y);
    });
    // Element-wise: silu(g) * u is an exp, a division and a product; the backends' exp and
    // division differ by an ulp or two: 1e-5 relative.
    add(cat_name({{"n", p.n}, {"F", p.in}}, "silu_mul"), {1e-7, 1e-5}, [p](OpRun& r) {
      const DeviceTensor gate = r.f32({p.n, p.in}, 4.0f), up = r.f32({p.n, p.in});
      DeviceTensor out = r.backend().alloc(DType::F32, {p.n, p.in});
      r.backend().silu_mul(gate, up, out);
      r.out("out", out);
    });
    // The same F32 sum, then the activation in double rounded once on every backend: 2 ulp of
    // max(1, |y|) (the CUDA suite's bound), i.e. 1.2e-7 absolute and 1.2e-7 relative.
    for (const auto act :
         {Backend::Activation::None, Backend::Activation::Gelu, Backend::Activation::Silu}) {
      const int which = act == Backend::Activation::None   ? 0
                        : act == Backend::Activation::Gelu ? 1
                                                           : 2;
      add(cat_name({{"n", p.n}, {"F", p.in}, {"act", which}}, "bias_activation"), {1.2e-7, 1.2e-7},
          [p, act](OpRun& r) {
            DeviceTensor x = r.f32({p.n, p.in}, 3.0f);
            const DeviceTensor bias = r.weight({p.in});
            r.backend().bias_activation(x, &bias, act);
            r.out("x", x);
            DeviceTensor y = r.f32({p.n, p.in}, 3.0f);
            r.backend().bias_activation(y, nullptr, act);
            r.out("x without bias", y);
          });
    }
    // One IEEE addition per element: exact.
    add(cat_name({{"n", p.n}, {"E", p.in}}, "add_inplace"), kExact, [p](OpRun& r) {
      DeviceTensor x = r.f32({p.n, p.in});
      const DeviceTensor y = r.f32({p.n, p.in});
      r.backend().add_inplace(x, y);
      r.out("x", x);
    });
  }
  struct RopeShape {
    int64_t n, heads, head_dim, rotary;
    float scale;
  };
  for (const RopeShape s : {RopeShape{1, 4, 32, 32, 1.0f}, RopeShape{3, 2, 64, 64, 1.0f},
                            RopeShape{2, 3, 48, 24, 1.25f}}) {
    const std::string name =
        cat_name({{"n", s.n}, {"H", s.heads}, {"D", s.head_dim}, {"R", s.rotary}}, "");
    // cos and sin of position * inv_freq from the backends' own sincos (an ulp or two apart,
    // more for the large angles of far positions): 1e-5 relative, 1e-6 absolute near 0.
    const Tolerance rope = {1e-6, 1e-5};
    add("rope" + name, rope, [s](OpRun& r) {
      DeviceTensor x = r.f32({s.n, s.heads, s.head_dim});
      const DeviceTensor inv_freq = r.f32_of(inv_freq_values(s.rotary), {s.rotary / 2});
      const std::vector<int64_t> positions = {0, 5, 517};
      r.backend().rope(x, std::span(positions).first(size_t(s.n)), inv_freq, s.scale);
      r.out("x", x);
    });
    add("rope_pair" + name, rope, [s](OpRun& r) {
      DeviceTensor q = r.f32({s.n, s.heads, s.head_dim});
      DeviceTensor k = r.f32({s.n, 1, s.head_dim});
      const DeviceTensor inv_freq = r.f32_of(inv_freq_values(s.rotary), {s.rotary / 2});
      const std::vector<int64_t> positions = {3, 4, 4095};
      r.backend().rope_pair(q, k, std::span(positions).first(size_t(s.n)), inv_freq, s.scale);
      r.out("q", q);
      r.out("k", k);
    });
  }
  for (const AttentionShape& s : kAttentionShapes) {
    const int64_t H = s.heads, G = s.kv_heads, D = s.head_dim;
    // Writes rows: exact.
    add(shape_name("kv_append", s), kExact, [=](OpRun& r) {
      Caches c = filled_caches(r, s);
      const int64_t n = std::min<int64_t>(3, s.capacity - s.filled + 1);
      const DeviceTensor k = r.f32({n, G, D}), v = r.f32({n, G, D});
      r.backend().kv_append(k, v, c.k, c.v, s.capacity - n);
      r.out("k_cache", c.k);
      r.out("v_cache", c.v);
      DeviceTensor keys_only = r.f32({G, s.capacity, D});
      DeviceTensor none;
      r.backend().kv_append(k, v, keys_only, none, 0);
      r.out("keys only", keys_only);
    });
    add(shape_name("kv_append_runs", s), kExact, [=](OpRun& r) {
      Caches a = filled_caches(r, s), b = filled_caches(r, s);
      const DeviceTensor ka = r.f32({1, G, D}), va = r.f32({1, G, D});
      const DeviceTensor kb = r.f32({1, G, D}), vb = r.f32({1, G, D});
      const Backend::RunAppend runs[] = {{&ka, &va, &a.k, &a.v}, {&kb, &vb, &b.k, &b.v}};
      r.backend().kv_append_runs(runs, s.capacity - 1);
      r.out("a.k", a.k);
      r.out("a.v", a.v);
      r.out("b.k", b.k);
      r.out("b.v", b.v);
    });
    // rope's tolerance; the appended rows are the rotated keys (the same tolerance).
    add(shape_name("rope_append_runs", s), {1e-6, 1e-5}, [=](OpRun& r) {
      Caches a = filled_caches(r, s), b = filled_caches(r, s);
      DeviceTensor qa = r.f32({1, H, D}), ka = r.f32({1, G, D});
      DeviceTensor qb = r.f32({1, H, D}), kb = r.f32({1, G, D});
      const DeviceTensor va = r.f32({1, G, D}), vb = r.f32({1, G, D});
      const DeviceTensor inv_freq = r.f32_of(inv_freq_values(D), {D / 2});
      const Backend::RunRopeAppend runs[] = {{&qa, &ka, &va, &a.k, &a.v},
                                             {&qb, &kb, &vb, &b.k, &b.v}};
      r.backend().rope_append_runs(runs, s.capacity - 1, inv_freq, 1.0f);
      for (auto [name, tensor] :
           {std::pair{"qa", &qa}, std::pair{"qb", &qb}, std::pair{"a.k", &a.k},
            std::pair{"b.k", &b.k}, std::pair{"a.v", &a.v}, std::pair{"b.v", &b.v}})
        r.out(name, *tensor);
    });
    // Softmax-weighted sums of D-term logits (scale 1/sqrt(D)) over up to `filled` values in
    // [-1, 1]: the logits differ by a dot product's rounding, the exponentials and the sums'
    // orders (online softmax, tiles) by a few ulp of the weights: 1e-4 absolute and relative
    // (the CUDA suite's bound for attention). The logits: the dot bound times the scale.
    const Tolerance attention_tolerance = {1e-4, 1e-4};
    add(shape_name("attention prefill", s), attention_tolerance, [=](OpRun& r) {
      const Caches c = filled_caches(r, s);
      const int64_t n = std::min<int64_t>(3, s.filled);
      const DeviceTensor q = r.f32({n, H, D});
      DeviceTensor out = r.backend().alloc(DType::F32, {n, H, D});
      DeviceTensor logits = r.f32({n, H, s.capacity});
      r.backend().attention(q, c.k, c.v, s.filled - n, 0, {}, out, &logits);
      r.out("out", out);
      r.out("logits", logits);
      DeviceTensor windowed = r.backend().alloc(DType::F32, {n, H, D});
      r.backend().attention(q, c.k, c.v, s.filled - n, 4, {}, windowed, nullptr);
      r.out("out, window 4", windowed);
    });
    add(shape_name("attention decode visible", s), attention_tolerance, [=](OpRun& r) {
      const Caches c = filled_caches(r, s);
      const DeviceTensor q = r.f32({1, H, D});
      std::vector<uint8_t> mask = r.bits(H * s.filled, 60);
      mask[0] = 1;  // every head sees something
      for (int64_t h = 0; h < H; ++h) mask[size_t(h * s.filled + s.filled - 1)] = 1;
      const DeviceTensor visible = r.u8_of(mask, {H, s.filled});
      DeviceTensor out = r.backend().alloc(DType::F32, {1, H, D});
      DeviceTensor logits = r.f32({1, H, s.capacity});
      r.backend().attention(q, c.k, c.v, s.filled - 1, 0, {&visible}, out, &logits);
      r.out("out", out);
      r.out("logits", logits);
    });
    const Tolerance logit_tolerance =
        dot_tolerance(D, double(D) / std::sqrt(double(D)));  // scale * sum |q k| <= sqrt(D)
    add(shape_name("attention_logits", s), logit_tolerance, [=](OpRun& r) {
      const Caches c = filled_caches(r, s);
      const DeviceTensor q = r.f32({1, H, D});
      DeviceTensor logits = r.f32({H, s.capacity});
      r.backend().attention_logits(q, c.k, s.filled - 1, 0, logits);
      r.out("logits", logits);
      DeviceTensor windowed = r.f32({H, s.capacity});
      r.backend().attention_logits(q, c.k, s.filled - 1, 5, windowed);
      r.out("logits, window 5", windowed);
    });
    // Probabilities from the same logits (inputs, not computed): exp and the sum's order, a few
    // ulp: 1e-5 relative. The value sums: values in [-1, 1] weighted by them: 1e-5 absolute.
    const Tolerance visible_tolerance = {1e-5, 1e-5};
    add(shape_name("attention_visible", s), visible_tolerance, [=](OpRun& r) {
      const Caches c = filled_caches(r, s);
      const DeviceTensor logits = r.f32({H, s.capacity}, 4.0f);
      std::vector<uint8_t> mask = r.bits(H * s.capacity, 50);
      mask[size_t(s.filled - 1)] = 1;
      const DeviceTensor visible = r.u8_of(mask, {H, s.capacity});
      DeviceTensor out = r.backend().alloc(DType::F32, {1, H, D});
      DeviceTensor probs = r.f32({H, s.capacity});
      r.backend().attention_visible(logits, s.filled, &visible, c.v, out, &probs);
      r.out("out", out);
      r.out("probs", probs);
      DeviceTensor all_out = r.backend().alloc(DType::F32, {1, H, D});
      r.backend().attention_visible(logits, s.filled, nullptr, c.v, all_out, nullptr);
      r.out("out, all visible", all_out);
      DeviceTensor no_out, probs_only = r.f32({H, s.capacity});
      r.backend().attention_visible(logits, s.filled, nullptr, c.v, no_out, &probs_only);
      r.out("probs only", probs_only);
    });
    // The batched forms: each run's results within the single-run op's tolerances (the larger
    // of the two, as logits and the softmax are both compared).
    add(shape_name("attention_logits_runs and attention_visible_runs", s),
        {std::max(logit_tolerance.abs, 1e-4), 1e-4}, [=](OpRun& r) {
          const Caches a = filled_caches(r, s), b = filled_caches(r, s);
          const DeviceTensor qa = r.f32({1, H, D}), qb = r.f32({1, H, D});
          DeviceTensor la = r.f32({H, s.capacity}), lb = r.f32({H, s.capacity});
          DeviceTensor oa = r.backend().alloc(DType::F32, {1, H, D});
          DeviceTensor ob = r.backend().alloc(DType::F32, {1, H, D});
          DeviceTensor pa = r.f32({H, s.capacity});
          const Backend::RunAttention runs[] = {{&qa, &a.k, &a.v, &la, nullptr, &oa, &pa},
                                                {&qb, &b.k, &b.v, &lb, nullptr, &ob, nullptr}};
          r.backend().attention_logits_runs(runs, 0, s.filled - 1, 0);
          r.backend().attention_visible_runs(runs, 0, s.filled);
          for (auto [name, tensor] :
               {std::pair{"la", &la}, std::pair{"lb", &lb}, std::pair{"oa", &oa},
                std::pair{"ob", &ob}, std::pair{"pa", &pa}})
            r.out(name, *tensor);
        });
    // The two in one call for runs that want no probabilities: a run under a mask of [H,
    // capacity] rows (keys no head of a KV head sees, head 1 seeing nothing) and one without,
    // with and without a window, each alone (the CUDA backend's split decode attention under the
    // mask) and both in one call; the outputs within the attention entries' tolerance.
    add(shape_name("attention_masked_runs", s), attention_tolerance, [=](OpRun& r) {
      const Caches a = filled_caches(r, s), b = filled_caches(r, s);
      const DeviceTensor qa = r.f32({1, H, D}), qb = r.f32({1, H, D});
      DeviceTensor la = r.f32({H, s.capacity}), lb = r.f32({H, s.capacity});
      std::vector<uint8_t> mask = r.bits(H * s.capacity, 40);
      if (H > 1) std::fill(mask.begin() + s.capacity, mask.begin() + 2 * s.capacity, uint8_t(0));
      const DeviceTensor visible = r.u8_of(mask, {H, s.capacity});
      for (const int64_t window : {int64_t(0), int64_t(5)}) {
        const std::string suffix = ", window " + std::to_string(window);
        std::vector<DeviceTensor> outs;
        for (int i = 0; i < 4; ++i) outs.push_back(r.backend().alloc(DType::F32, {1, H, D}));
        const Backend::RunAttention alone[] = {{&qa, &a.k, &a.v, &la, &visible, &outs[0], nullptr},
                                               {&qb, &b.k, &b.v, &lb, nullptr, &outs[1], nullptr}};
        for (const Backend::RunAttention& run : alone)
          r.backend().attention_masked_runs(std::span(&run, 1), 0, s.filled - 1, window);
        const Backend::RunAttention both[] = {{&qa, &a.k, &a.v, &la, &visible, &outs[2], nullptr},
                                              {&qb, &b.k, &b.v, &lb, nullptr, &outs[3], nullptr}};
        r.backend().attention_masked_runs(both, 0, s.filled - 1, window);
        r.out("masked run alone" + suffix, outs[0]);
        r.out("unmasked run alone" + suffix, outs[1]);
        r.out("masked run of two" + suffix, outs[2]);
        r.out("unmasked run of two" + suffix, outs[3]);
      }
    });
  }
  // attention at the shapes and cases of tests/cuda/test_cuda_backend.cpp, which take the CUDA
  // kernels' paths: GQA 8 over 2 with a whole prefill, a chunk with a window, decode with and
  // without logits, windows, masks (head 1 sees nothing) and a mask inside a window; a context of
  // 600 (several 256-key tiles) with a peaky softmax (q scaled by 4) and a 600-row prefill;
  // decode over 5123 keys (many slices of the split kernel), GQA 4; one KV head (MQA) at D 80;
  // heads of 8 and 16 channels over thousands of keys (the split kernel's one- and two-lane keys).
  // The output within the attention entries' 1e-4; the logits within the larger of that and the
  // dot bound for q in [-q_scale, q_scale) (scale * sum |q k| <= q_scale * sqrt(D)).
  struct AttentionCase {
    int64_t first, rows, window;
    bool mask, logits;
    int q_scale;
  };
  const std::pair<AttentionShape, std::vector<AttentionCase>> attention_cases[] = {
      {{8, 2, 64, 96, 41},
       {{0, 41, 0, false, true, 1},
        {36, 5, 8, false, true, 1},
        {40, 1, 0, false, true, 1},
        {40, 1, 0, false, false, 1},
        {40, 1, 16, false, true, 1},
        {40, 1, 0, true, true, 1},
        {40, 1, 20, true, true, 2},
        {40, 1, 0, true, false, 1}}},
      {{4, 4, 128, 700, 600},
       {{599, 1, 0, false, true, 4},
        {597, 3, 300, false, true, 4},
        {0, 600, 0, false, false, 1},
        {599, 1, 0, true, true, 4},
        {599, 1, 513, true, true, 1}}},
      {{32, 8, 64, 5200, 5123},
       {{5122, 1, 0, false, true, 2},
        {5122, 1, 1000, true, true, 2},
        {5122, 1, 0, true, false, 8}}},
      {{6, 1, 80, 40, 33},
       {{32, 1, 0, false, true, 1}, {0, 33, 5, false, true, 1}, {32, 1, 0, true, true, 1}}},
      // The TokenButler predictor's heads: 8 and 16 channels, one query head per KV head.
      {{32, 32, 8, 4200, 4100}, {{4099, 1, 0, false, true, 2}, {4099, 1, 0, true, false, 2}}},
      {{8, 8, 16, 3000, 2900}, {{2899, 1, 0, false, true, 2}, {2899, 1, 700, true, true, 2}}},
  };
  for (const auto& shape_cases : attention_cases) {
    const AttentionShape s = shape_cases.first;
    for (const AttentionCase& a : shape_cases.second) {
      const int64_t H = s.heads, D = s.head_dim, context = a.first + a.rows;
      const double logit_bound =
          dot_tolerance(D, double(a.q_scale) * double(D) / std::sqrt(double(D))).abs;
      add(shape_name("attention case", s) + cat_name({{"first", a.first},
                                                      {"rows", a.rows},
                                                      {"window", a.window},
                                                      {"mask", a.mask},
                                                      {"logits", a.logits},
                                                      {"qscale", a.q_scale}},
                                                     ""),
          {std::max(1e-4, logit_bound), 1e-4}, [=](OpRun& r) {
            const Caches c = filled_caches(r, s);
            const DeviceTensor q = r.f32({a.rows, H, D}, float(a.q_scale));
            DeviceTensor mask;
            Visibility visible;
            if (a.mask) {
              std::vector<uint8_t> bits = r.bits(H * context, 50);
              for (int64_t h = 0; h < H; ++h) bits[size_t(h * context + context - 1)] = 1;
              if (H > 1) std::fill(bits.begin() + context, bits.begin() + 2 * context, uint8_t(0));
              mask = r.u8_of(bits, {H, context});
              visible.mask = &mask;
            }
            DeviceTensor out = r.backend().alloc(DType::F32, {a.rows, H, D});
            DeviceTensor logits = r.f32({a.rows, H, context});
            r.backend().attention(q, c.k, c.v, a.first, a.window, visible, out,
                                  a.logits ? &logits : nullptr);
            r.out("out", out);
            if (a.logits) r.out("logits", logits);
          });
    }
  }
  // attention_logits and attention_visible at the shapes of tests/cuda/test_cuda_policy_ops.cpp:
  // 578 columns over three 256-key tiles (with and without a window of 100), MQA at D 80, one
  // column, and 1301 of 1536 (attention_visible's split over slices); q in [-2, 2), logits rows
  // wider than the columns. attention_visible from logits in [-4, 4) with about a quarter of the
  // keys visible (head 1 none), probabilities and outputs apart: probabilities within 1e-5
  // relative (exponentials a few ulp apart, sums of n <= 1301 positive terms in other orders: a
  // random walk of ~sqrt(n) 2^-24), the outputs within 1e-5 absolute (sums of p |v| <= 1 terms).
  struct LogitShape {
    int64_t heads, kv_heads, head_dim, stride, cols, window;
  };
  for (const LogitShape s : {LogitShape{8, 2, 64, 600, 578, 0}, LogitShape{8, 2, 64, 600, 578, 100},
                             LogitShape{6, 1, 80, 40, 33, 0}, LogitShape{4, 4, 16, 8, 1, 0},
                             LogitShape{8, 2, 64, 1536, 1301, 0}}) {
    const std::string name = cat_name({{"H", s.heads},
                                       {"G", s.kv_heads},
                                       {"D", s.head_dim},
                                       {"stride", s.stride},
                                       {"cols", s.cols},
                                       {"window", s.window}},
                                      "");
    const int64_t H = s.heads, G = s.kv_heads, D = s.head_dim;
    add("attention_logits wide rows" + name,
        dot_tolerance(D, 2.0 * double(D) / std::sqrt(double(D))), [=](OpRun& r) {
          const DeviceTensor q = r.f32({1, H, D}, 2.0f);
          const DeviceTensor k = r.f32({G, s.stride, D});
          DeviceTensor logits = r.f32({H, s.stride});
          r.backend().attention_logits(q, k, s.cols - 1, s.window, logits);
          r.out("logits", logits);
        });
    auto visible_run = [=](OpRun& r, bool probs) {
      const DeviceTensor v = r.f32({G, s.stride, D});
      const DeviceTensor logits = r.f32({H, s.stride}, 4.0f);
      std::vector<uint8_t> mask = r.bits(H * s.stride, 25);
      for (int64_t h = 0; h < H; ++h) mask[size_t(h * s.stride + s.cols - 1)] = 1;
      if (H > 1) std::fill(mask.begin() + s.stride, mask.begin() + 2 * s.stride, uint8_t(0));
      const DeviceTensor visible = r.u8_of(mask, {H, s.stride});
      for (const bool masked : {false, true}) {
        DeviceTensor out = r.f32({1, H, D});
        DeviceTensor p = r.f32({H, s.stride});
        r.backend().attention_visible(logits, s.cols, masked ? &visible : nullptr, v, out, &p);
        if (probs)
          r.out(masked ? "probs, masked" : "probs", p);
        else
          r.out(masked ? "out, masked" : "out", out);
      }
    };
    add("attention_visible probs" + name, {1e-12, 1e-5},
        [visible_run](OpRun& r) { visible_run(r, true); });
    add("attention_visible out" + name, {1e-5, 0.0},
        [visible_run](OpRun& r) { visible_run(r, false); });
  }
  for (const Product p : {Product{1, 1000, 0}, Product{4, 37, 0}}) {
    // Ids: exact (ties, from whole-number inputs, go to the lower index everywhere).
    add(cat_name({{"n", p.n}, {"V", p.in}}, "argmax_rows"), kExact, [p](OpRun& r) {
      const DeviceTensor x = r.f32_of(r.levels(p.n * p.in, 7), {p.n, p.in});
      std::vector<int32_t> ids(size_t(p.n));
      r.backend().argmax_rows(x, ids);
      r.out("ids", std::vector<double>(ids.begin(), ids.end()));
    });
    // Sums of V exponentials in double: ~1e-12 relative apart; 1e-9 is far below F32
    // resolution (the CUDA suite's bound).
    add(cat_name({{"n", p.n}, {"V", p.in}}, "log_prob_rows"), {1e-9, 1e-9}, [p](OpRun& r) {
      const DeviceTensor x = r.f32({p.n, p.in}, 8.0f);
      std::vector<int32_t> targets(size_t(p.n));
      for (auto& id : targets) id = int32_t(r.below(p.in));
      std::vector<double> out(size_t(p.n));
      r.backend().log_prob_rows(x, targets, out);
      r.out("log p", out);
    });
  }

  // ----------------------------------------------------------------- selection and row ops
  // Every op here promises the same bits on every backend (backend.h): exact.
  for (const RowShape& s : kRowShapes) {
    const int64_t R = s.rows, C = s.cols, S = s.stride;
    add(rows_name("select_top_k", s), kExact, [=](OpRun& r) {
      std::vector<float> scores = r.levels(R * S, 5);  // ties
      if (C > 4) scores[2] = std::numeric_limits<float>::quiet_NaN();
      const DeviceTensor sc = r.f32_of(scores, {R, S});
      const DeviceTensor eligible = r.u8({R, S}, 70);
      for (const int64_t k : {int64_t(1), C / 2, C + 3}) {
        DeviceTensor selected = r.u8({R, S}, 10);  // forced columns kept
        r.backend().select_top_k(sc, C, &eligible, k, selected);
        r.out("selected k" + std::to_string(k), selected);
        DeviceTensor all = r.backend().alloc(DType::U8, {R, S});
        r.backend().select_top_k(sc, C, nullptr, k, all);
        r.out("selected, all eligible, k" + std::to_string(k), all);
      }
    });
    add(rows_name("fill_columns", s), kExact, [=](OpRun& r) {
      DeviceTensor mask = r.u8({R, S}, 50);
      r.backend().fill_columns(mask, C / 3, C, 1);
      r.backend().fill_columns(mask, 0, C / 4, 0);
      r.out("mask", mask);
    });
    add(rows_name("count_nonzero_rows", s), kExact, [=](OpRun& r) {
      const DeviceTensor mask = r.u8({R, S}, 40);
      std::vector<int64_t> counts(static_cast<size_t>(R)), deferred(static_cast<size_t>(R)),
          many(static_cast<size_t>(R));
      r.backend().count_nonzero_rows(mask, C, counts);
      r.backend().count_nonzero_rows_deferred(mask, C, deferred);
      const Backend::RowCount masks[] = {{&mask, C - 1 > 0 ? C - 1 : C, many}};
      r.backend().count_nonzero_rows_deferred_many(masks);
      r.backend().synchronize();
      r.out("counts", std::vector<double>(counts.begin(), counts.end()));
      r.out("deferred", std::vector<double>(deferred.begin(), deferred.end()));
      r.out("many", std::vector<double>(many.begin(), many.end()));
    });
    add(rows_name("mask_and", s), kExact, [=](OpRun& r) {
      DeviceTensor mask = r.u8({R, S}, 60);
      const DeviceTensor other = r.u8({R, S}, 60);
      r.backend().mask_and(mask, other, C);
      r.out("mask", mask);
    });
    add(rows_name("mark_columns", s), kExact, [=](OpRun& r) {
      DeviceTensor mask = r.u8({R, S}, 50), plain = r.u8({R, S}, 50);
      const DeviceTensor keep = r.u8({R, S}, 70);
      r.backend().mark_columns(mask, C, std::min<int64_t>(2, C), C - C / 3, &keep);
      r.backend().mark_columns(plain, C, 1, C, nullptr);
      r.out("mask", mask);
      r.out("mask, no keep", plain);
    });
    add(rows_name("mark_and_select_top_k", s), kExact, [=](OpRun& r) {
      const DeviceTensor sc = r.f32_of(r.levels(R * S, 6), {R, S});
      const DeviceTensor eligible = r.u8({R, S}, 70);
      for (const int64_t k : {int64_t(0), int64_t(2), C}) {
        DeviceTensor selected = r.u8({R, S}, 30);
        r.backend().mark_and_select_top_k(sc, C, &eligible, std::min<int64_t>(1, C), C - 1, k,
                                          selected);
        r.out("selected k" + std::to_string(k), selected);
      }
    });
    add(rows_name("keep_selected", s), kExact, [=](OpRun& r) {
      DeviceTensor kept = r.u8({R, S}, 80);
      const DeviceTensor selected = r.u8({R, S}, 50);
      r.backend().keep_selected(kept, selected, C, 2);
      r.out("kept", kept);
    });
    add(rows_name("accumulate_rows", s), kExact, [=](OpRun& r) {
      DeviceTensor acc = r.f32({R, S}), plain = r.f32({R, S});
      const DeviceTensor x = r.f32({R, S});
      const DeviceTensor keep = r.u8({R, S}, 70);
      r.backend().accumulate_rows(acc, x, &keep, C);
      r.backend().accumulate_rows(plain, x, nullptr, C);
      r.out("acc", acc);
      r.out("acc, keep all", plain);
    });
    add(rows_name("sum_row_groups and expand_row_groups", s), kExact, [=](OpRun& r) {
      const int64_t group = 2;
      const DeviceTensor x = r.f32({R * group, S});
      DeviceTensor sums = r.f32({R, S});
      r.backend().sum_row_groups(x, C, group, sums);
      r.out("sums", sums);
      const DeviceTensor mask = r.u8({R, S}, 50);
      DeviceTensor expanded = r.u8({R * group, S}, 50);
      r.backend().expand_row_groups(mask, C, group, expanded);
      r.out("expanded", expanded);
    });
    add(rows_name("random_rows", s), kExact, [=](OpRun& r) {
      DeviceTensor out = r.f32({R, S});
      r.backend().random_rows(0x5eed, 3, C, out);
      r.out("random", out);
    });
    add(rows_name("axpby_rows", s), kExact, [=](OpRun& r) {
      const DeviceTensor x = r.f32({R, S}), row = r.f32({1, S});
      for (const auto& [alpha, beta] : {std::pair{1.0f, 1.0f}, std::pair{-1.0f, 1.0f},
                                        std::pair{0.75f, 0.0f}, std::pair{0.3f, -1.7f}}) {
        DeviceTensor y = r.f32({R, S});
        r.backend().axpby_rows(y, alpha, x, beta, C);
        r.out("y", y);
        DeviceTensor broadcast = r.f32({R, S});
        r.backend().axpby_rows(broadcast, alpha, row, beta, C);
        r.out("y, broadcast row", broadcast);
      }
    });
    add(rows_name("pool_rows", s), kExact, [=](OpRun& r) {
      std::vector<float> values = r.values(R * S);
      if (C > 5) values[3] = std::numeric_limits<float>::quiet_NaN();
      const DeviceTensor x = r.f32_of(values, {R, S});
      for (const int64_t kernel : {int64_t(1), int64_t(3), int64_t(7)}) {
        for (const auto pool : {Backend::Pool::Max, Backend::Pool::Average}) {
          DeviceTensor out = r.f32({R, S});
          r.backend().pool_rows(x, C, pool, kernel, out);
          r.out("pool kernel " + std::to_string(kernel), out);
        }
      }
    });
    add(rows_name("select_pages", s), kExact, [=](OpRun& r) {
      const DeviceTensor sc = r.f32_of(r.levels(R * S, 4), {R, S});
      for (const int64_t page_size : {int64_t(1), int64_t(4)}) {
        for (const int64_t k : {int64_t(1), int64_t(5), C}) {
          DeviceTensor selected = r.u8({R, S}, 10);
          r.backend().select_pages(sc, C, page_size, k, selected);
          r.out("selected page " + std::to_string(page_size) + " k" + std::to_string(k), selected);
        }
      }
    });
    add(rows_name("zero_unless", s), kExact, [=](OpRun& r) {
      for (const uint8_t gate : {uint8_t(0), uint8_t(1)}) {
        DeviceTensor rows = r.f32({R, S});
        const DeviceTensor keep = r.u8_of({gate}, {1, 1});
        r.backend().zero_unless(rows, keep);
        r.out("rows gate " + std::to_string(gate), rows);
      }
    });
  }

  // ----------------------------------------------------------------- selection: hard inputs
  // From tests/cuda/test_cuda_policy_ops.cpp, every op here exact. select_top_k and
  // mark_and_select_top_k on four score patterns (distinct normal-like values; heavy ties with
  // NaN, +-inf and +-0; all equal, where the higher columns win; tiny probabilities with exact
  // zeros), at rows of 4100 of 4200 (the CUDA kernels' long-row path), 257 of 300, 7 of 10 and 1
  // of 4, for k 0, 1, 2, cols / 3, cols - 1 and past cols, with and without eligibility, forced
  // columns kept; and 256 or more rows at once (tokenbutler's every layer, which the CUDA kernel
  // selects with narrower blocks).
  struct SelectShape {
    int64_t rows, cols, stride;
  };
  for (const SelectShape c :
       {SelectShape{8, 4100, 4200}, SelectShape{5, 257, 300}, SelectShape{3, 7, 10},
        SelectShape{2, 1, 4}, SelectShape{300, 513, 520}, SelectShape{256, 4100, 4104}}) {
    for (int pattern = 0; pattern < 4; ++pattern) {
      add(cat_name({{"rows", c.rows}, {"cols", c.cols}, {"stride", c.stride}, {"pattern", pattern}},
                   "select_top_k and mark_and_select_top_k, hard scores"),
          kExact, [c, pattern](OpRun& r) {
            const int64_t count = c.rows * c.stride;
            std::vector<float> scores = r.values(count);
            const std::vector<float> noise = r.values(count);
            for (size_t i = 0; i < scores.size(); ++i) {
              const int64_t u = r.below(32);
              float& v = scores[i];
              switch (pattern) {
                case 0:  // distinct-ish: a sum of two uniforms
                  v = v + noise[i];
                  break;
                case 1:  // heavy ties, NaN, +-inf, +-0
                  v = u == 0   ? std::numeric_limits<float>::quiet_NaN()
                      : u == 1 ? -std::numeric_limits<float>::infinity()
                      : u == 2 ? std::numeric_limits<float>::infinity()
                      : u == 3 ? -0.0f
                               : float(r.below(7) - 3) * 0.25f;
                  break;
                case 2:  // all equal
                  v = 0.5f;
                  break;
                default:  // probabilities: tiny positive values, some exact 0
                  v = u < 4 ? 0.0f : std::ldexp(float(r.below(1000)), -int(r.below(40)));
              }
            }
            const DeviceTensor s = r.f32_of(scores, {c.rows, c.stride});
            const DeviceTensor eligible = r.u8({c.rows, c.stride}, 67);
            const std::vector<uint8_t> forced = r.bits(count, 11);
            const int64_t ones_end = std::min<int64_t>(3, c.cols);
            const int64_t ones_begin = std::max<int64_t>(c.cols - 2, ones_end);
            for (const int64_t k :
                 {int64_t(0), int64_t(1), int64_t(2), c.cols / 3, c.cols - 1, c.cols + 5}) {
              for (const bool use_eligible : {false, true}) {
                const std::string tag =
                    " k" + std::to_string(k) + (use_eligible ? " eligible" : " all eligible");
                DeviceTensor selected = r.u8_of(forced, {c.rows, c.stride});
                r.backend().select_top_k(s, c.cols, use_eligible ? &eligible : nullptr, k,
                                         selected);
                r.out("selected" + tag, selected);
                DeviceTensor marked = r.u8_of(forced, {c.rows, c.stride});
                r.backend().mark_and_select_top_k(s, c.cols, use_eligible ? &eligible : nullptr,
                                                  ones_end, ones_begin, k, marked);
                r.out("marked" + tag, marked);
              }
            }
          });
    }
  }
  // select_pages on scores constant per page (as quest writes them) with ties across pages
  // (row 1) and NaN (row 2), and on per-column noise, at page sizes 16, 1, 7 and one past the
  // row (2000), k from 1 past the columns (5000), forced columns kept.
  add("select_pages rows8 cols1001 stride1030 page scores", kExact, [](OpRun& r) {
    const int64_t H = 8, stride = 1030, cols = 1001;
    for (const int64_t page_size : {int64_t(16), int64_t(1), int64_t(7), int64_t(2000)}) {
      std::vector<float> per_page = r.values(H * stride);
      for (int64_t row = 0; row < H; ++row)
        for (int64_t j = 0; j < stride; ++j) {
          float& v = per_page[size_t(row * stride + j)];
          v = per_page[size_t(row * stride + (j / page_size) * page_size)];
          if (row == 1) v = std::round(v);
          if (row == 2 && j % 5 == 0) v = std::numeric_limits<float>::quiet_NaN();
        }
      const std::vector<float> noisy = r.values(H * stride);
      for (const std::vector<float>* values : {&std::as_const(per_page), &noisy}) {
        const DeviceTensor scores = r.f32_of(*values, {H, stride});
        const std::vector<uint8_t> forced = r.bits(H * stride, 11);
        for (const int64_t k :
             {int64_t(1), int64_t(16), int64_t(333), int64_t(999), int64_t(5000)}) {
          DeviceTensor selected = r.u8_of(forced, {H, stride});
          r.backend().select_pages(scores, cols, page_size, k, selected);
          r.out("selected page " + std::to_string(page_size) + " k" + std::to_string(k), selected);
        }
      }
    }
  });
  // accumulate_rows onto NaN and inf, and 8 query heads over 2 KV groups (4 rows a group):
  // sum_row_groups into rows wider than the mask's, expand_row_groups.
  add("accumulate_rows, sum_row_groups, expand_row_groups H8 G2 cols1001 stride1030", kExact,
      [](OpRun& r) {
        const int64_t H = 8, G = 2, stride = 1030, cols = 1001;
        std::vector<float> acc_values = r.values(H * stride);
        acc_values[3] = std::numeric_limits<float>::quiet_NaN();
        acc_values[4] = std::numeric_limits<float>::infinity();
        DeviceTensor acc = r.f32_of(acc_values, {H, stride});
        const DeviceTensor x = r.f32({H, stride});
        const DeviceTensor keep = r.u8({H, stride}, 50);
        r.backend().accumulate_rows(acc, x, nullptr, cols);
        r.out("acc", acc);
        r.backend().accumulate_rows(acc, x, &keep, cols);
        r.out("acc, keep", acc);
        DeviceTensor sums = r.f32({G, stride + 3});
        r.backend().sum_row_groups(x, cols, H / G, sums);
        r.out("sums", sums);
        const DeviceTensor groups = r.u8({G, stride}, 50);
        DeviceTensor expanded = r.u8({H, stride}, 50);
        r.backend().expand_row_groups(groups, cols, H / G, expanded);
        r.out("expanded", expanded);
      });
  // random_rows at seeds and streams at the ends of their ranges.
  add("random_rows rows8 cols1001 stride1030 extreme seeds", kExact, [](OpRun& r) {
    for (const auto& [seed, stream] :
         {std::pair{uint64_t(0), uint64_t(0)}, std::pair{uint64_t(42), uint64_t(7)},
          std::pair{~uint64_t(0), uint64_t(1) << 63}}) {
      DeviceTensor out = r.f32({8, 1030});
      r.backend().random_rows(seed, stream, 1001, out);
      r.out("random " + std::to_string(seed), out);
    }
  });
  // pool_rows with kernels 5 and one wider than the row (2049).
  add("pool_rows rows8 cols1001 stride1030 kernels 5 and 2049", kExact, [](OpRun& r) {
    const DeviceTensor x = r.f32({8, 1030});
    for (const int64_t kernel : {int64_t(5), int64_t(2049)}) {
      for (const auto pool : {Backend::Pool::Max, Backend::Pool::Average}) {
        DeviceTensor out = r.f32({8, 1030});
        r.backend().pool_rows(x, 1001, pool, kernel, out);
        r.out("pool kernel " + std::to_string(kernel), out);
      }
    }
  });
  // axpby_rows with NaN and inf in y, alpha 1/3 and beta 0.7 (roundings the contract fixes).
  add("axpby_rows rows8 cols1001 stride1030 special values", kExact, [](OpRun& r) {
    std::vector<float> y_values = r.values(8 * 1030);
    y_values[5] = std::numeric_limits<float>::quiet_NaN();
    y_values[6] = std::numeric_limits<float>::infinity();
    const DeviceTensor x = r.f32({8, 1030}), row = r.f32({1, 1030});
    for (const DeviceTensor* source : {&x, &row}) {
      for (const auto& [alpha, beta] :
           {std::pair{1.0f, 0.0f}, std::pair{0.125f, 1.0f}, std::pair{1.0f / 3, 0.7f}}) {
        DeviceTensor y = r.f32_of(y_values, {8, 1030});
        r.backend().axpby_rows(y, alpha, *source, beta, 1001);
        r.out(source == &row ? "y, broadcast row" : "y", y);
      }
    }
  });

  // ----------------------------------------------------------------- op extensions
  for (const AttentionShape& s : kAttentionShapes) {
    const int64_t H = s.heads, G = s.kv_heads, D = s.head_dim, C = s.filled;
    // keydiff: cosines in [-1, 1] from F32 sums in other orders (KeyDiffOps' contract: about
    // 1e-6). These keys are random, not sharing a direction, so the anchor (a mean of n unit
    // vectors) has a norm near n^-1/2 and its rounding grows by that much: 1e-5 absolute, the
    // CUDA suite's bound for key_anchor_scores.
    add(shape_name("keydiff.key_anchor_scores", s), {1e-5, 0.0}, [=](OpRun& r) {
      const Caches c = filled_caches(r, s);
      KeyDiffOps& ops = keydiff_ops(r.backend());
      const DeviceTensor members = r.u8({H, s.capacity}, 60);
      DeviceTensor out = r.f32({H, s.capacity});
      ops.key_anchor_scores(c.k, C, members, out);
      r.out("per row", out);
      const DeviceTensor group_members = r.u8({G, s.capacity}, 60);
      DeviceTensor by_group = r.f32({H, s.capacity});
      ops.key_anchor_scores(c.k, C, group_members, by_group);
      r.out("per KV head", by_group);
    });
    // quest: plain comparisons and page_bound's fixed roundings: exact (QuestOps' contract).
    add(shape_name("quest.page_minmax_update and page_bounds", s), kExact, [=](OpRun& r) {
      const Caches c = filled_caches(r, s);
      QuestOps& ops = quest_ops(r.backend());
      const int64_t page_size = 4, pages = (s.capacity + page_size - 1) / page_size;
      DeviceTensor lo = r.f32({G, pages, D}), hi = r.f32({G, pages, D});
      ops.page_minmax_update(c.k, 0, C / 2, page_size, lo, hi);  // then the rest, incrementally
      ops.page_minmax_update(c.k, C / 2, C, page_size, lo, hi);
      r.out("page_min", lo);
      r.out("page_max", hi);
      const DeviceTensor q = r.f32({1, H, D});
      for (const bool max_only : {false, true}) {
        DeviceTensor bounds = r.f32({H, s.capacity});
        ops.page_bounds(q, lo, hi, C, page_size, max_only, bounds);
        r.out(max_only ? "bounds, max only" : "bounds", bounds);
      }
    });
    // sparq, loki, doublesparsity: approx_logit_math.h's fixed roundings: exact
    // (ApproxLogitOps' contract). Bases of KV-head rows (loki) and query-head rows
    // (doublesparsity), keys projected in two calls as a policy does step by step.
    add(shape_name("approx_logits.sparq_logits, project_keys and projected_logits", s), kExact,
        [=](OpRun& r) {
          const Caches c = filled_caches(r, s);
          ApproxLogitOps& ops = approx_logit_ops(r.backend());
          const DeviceTensor q = r.f32({1, H, D});
          for (const int64_t rank : {int64_t(1), (D + 3) / 4, D}) {
            DeviceTensor logits = r.f32({H, s.capacity});
            ops.sparq_logits(q, c.k, C, rank, logits);
            r.out("sparq, rank " + std::to_string(rank), logits);
          }
          const int64_t dims = (D + 1) / 2;
          for (const int64_t rows : {G, H}) {
            const DeviceTensor basis = r.f32({rows, D, dims});
            DeviceTensor projected = r.f32({rows, s.capacity, dims});
            ops.project_keys(c.k, 0, C / 2, basis, projected);
            ops.project_keys(c.k, C / 2, C, basis, projected);
            r.out("projected keys, " + std::to_string(rows) + " rows", projected);
            DeviceTensor logits = r.f32({H, s.capacity});
            ops.projected_logits(q, basis, projected, C, logits);
            r.out("projected logits, " + std::to_string(rows) + " rows", logits);
          }
        });
    // rocketkv: quest's page summaries read by rocketkv_math.h's fixed roundings: exact
    // (RocketkvOps' contract), at pages of 1 (the keys themselves) and 3, few and all channels.
    add(shape_name("rocketkv.page_logits", s), kExact, [=](OpRun& r) {
      const Caches c = filled_caches(r, s);
      const DeviceTensor q = r.f32({1, H, D});
      for (const int64_t page_size : {int64_t(1), int64_t(3)}) {
        const int64_t pages = (s.capacity + page_size - 1) / page_size;
        DeviceTensor lo = r.f32({G, pages, D}), hi = r.f32({G, pages, D});
        quest_ops(r.backend()).page_minmax_update(c.k, 0, C, page_size, lo, hi);
        for (const int64_t rank : {int64_t(1), (D + 1) / 2, D}) {
          DeviceTensor logits = r.f32({H, s.capacity});
          rocketkv_ops(r.backend()).page_logits(q, lo, hi, C, page_size, rank, logits);
          r.out("page " + std::to_string(page_size) + ", rank " + std::to_string(rank), logits);
        }
      }
    });
    // twilight: top_p_math.h's fixed roundings (its own exp): exact (TopPOps' contract). Scores
    // on the logit scale (a spread of +-8) and on levels (ties), thresholds from one column to
    // all, forced columns at both ends.
    add(shape_name("top_p.top_p_prune", s), kExact, [=](OpRun& r) {
      for (const bool ties : {false, true}) {
        const DeviceTensor scores = ties ? r.f32_of(r.levels(H * s.capacity, 4), {H, s.capacity})
                                         : r.f32({H, s.capacity}, 8.0f);
        for (const float top_p : {0.3f, 0.85f, 1.0f}) {
          DeviceTensor visible = r.u8({H, s.capacity}, 70);
          top_p_ops(r.backend())
              .top_p_prune(scores, C, top_p, std::min<int64_t>(1, C),
                           std::max<int64_t>(std::min<int64_t>(1, C), C - 2), visible);
          r.out(std::string(ties ? "levels" : "spread") + ", top_p " + std::to_string(top_p),
                visible);
        }
      }
    });
    // magicpig: magicpig_math.h's fixed roundings (its own acos, log and powers): exact
    // (MagicpigOps' contract). Random planes over the filled keys, few and many bits and tables,
    // so some columns collide and some do not; forced columns at both ends.
    add(shape_name("magicpig.hash_keys and lsh_sample", s), kExact, [=](OpRun& r) {
      const Caches c = filled_caches(r, s);
      const DeviceTensor q = r.f32({1, H, D});
      MagicpigOps& ops = magicpig_ops(r.backend());
      for (const auto& [bits, tables] : {std::pair<int64_t, int64_t>{1, 2}, {3, 8}, {6, 40}}) {
        const DeviceTensor planes = r.f32({tables * bits, D});
        DeviceTensor codes = r.f32({G, s.capacity, tables});
        ops.hash_keys(c.k, 0, C, planes, bits, codes);
        DeviceTensor visible = r.u8({H, s.capacity}, 50);
        DeviceTensor weights = r.f32({H, s.capacity});
        DeviceTensor scores = r.f32({H, s.capacity});
        ops.lsh_sample(q, c.k, codes, planes, bits, C, std::min<int64_t>(1, C),
                       std::max<int64_t>(std::min<int64_t>(1, C), C - 1), visible, weights, scores);
        const std::string name = std::to_string(bits) + " bits, " + std::to_string(tables);
        r.out("codes, " + name, codes);
        r.out("visible, " + name, visible);
        r.out("log weights, " + name, weights);
        r.out("scores, " + name, scores);
      }
    });
    // tokenfilter: cosine_similarity's and token_filter_step's fixed arithmetic: exact
    // (TokenFilterOps' contract).
    add(shape_name("tokenfilter.anchor_cosine_update and token_filter_step", s), kExact,
        [=](OpRun& r) {
          const Caches c = filled_caches(r, s);
          TokenFilterOps& ops = tokenfilter_ops(r.backend());
          DeviceTensor anchor_k = r.backend().alloc(DType::F32, {G, D});
          DeviceTensor anchor_v = r.backend().alloc(DType::F32, {G, D});
          DeviceTensor similarities = r.backend().alloc(DType::F32, {2, G});
          auto row = [&](int64_t i) {
            DeviceTensor one = similarities;
            one.data = similarities.as<float>() + i * G;
            one.shape = {G};
            return one;
          };
          double initial[kTokenFilterState] = {};
          initial[kTfTau] = 0.5;
          DeviceTensor state = r.backend().alloc(DType::U8, {int64_t(sizeof initial)});
          r.backend().from_host(state, initial, sizeof initial);
          DeviceTensor scores = r.f32({H, s.capacity});
          DeviceTensor keep = r.backend().alloc(DType::U8, {1, 1});
          for (int64_t t = 0; t < C; ++t) {
            DeviceTensor sim_k = row(0), sim_v = row(1);
            const float decay = t == 0 ? 0.0f : 0.9f;
            ops.anchor_cosine_update(c.k, t, decay, anchor_k, sim_k);
            ops.anchor_cosine_update(c.v, t, decay, anchor_v, sim_v);
            ops.token_filter_step(t == 0 ? nullptr : &similarities, 0.1, 0.3, t, state, scores,
                                  keep);
            r.out("similarities at " + std::to_string(t), similarities);
            r.out("keep at " + std::to_string(t), keep);
          }
          r.out("anchor_k", anchor_k);
          r.out("anchor_v", anchor_v);
          r.out("state", state);
          r.out("scores", scores);
        });
  }
  return entries;
}

// Same bits, or both NaN (an x86 add keeps a NaN operand's payload, a GPU add makes the
// canonical NaN).
bool same_value(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

}  // namespace

std::vector<float> OpRun::values(int64_t count, float scale) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = (float(rng_() >> 8) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
  return v;
}

std::vector<float> OpRun::levels(int64_t count, int levels) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = float(rng_() % uint32_t(levels));
  return v;
}

std::vector<uint8_t> OpRun::bits(int64_t count, int percent) {
  std::vector<uint8_t> v(static_cast<size_t>(count));
  for (uint8_t& x : v) x = rng_() % 100 < uint32_t(percent) ? 1 : 0;
  return v;
}

DeviceTensor OpRun::f32(std::vector<int64_t> shape, float scale) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return f32_of(values(count, scale), std::move(shape));
}

DeviceTensor OpRun::f32_of(const std::vector<float>& host, std::vector<int64_t> shape) {
  DeviceTensor t = backend_.alloc(DType::F32, std::move(shape));
  REQUIRE(size_t(t.numel()) == host.size());
  backend_.from_host(t, host.data(), host.size() * sizeof(float));
  return t;
}

DeviceTensor OpRun::u8(std::vector<int64_t> shape, int percent) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return u8_of(bits(count, percent), std::move(shape));
}

DeviceTensor OpRun::u8_of(const std::vector<uint8_t>& host, std::vector<int64_t> shape) {
  DeviceTensor t = backend_.alloc(DType::U8, std::move(shape));
  REQUIRE(size_t(t.numel()) == host.size());
  backend_.from_host(t, host.data(), host.size());
  return t;
}

DeviceTensor OpRun::weight(std::vector<int64_t> shape, DType dtype, float scale) {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  const std::vector<float> v = values(count, scale);
  auto bytes = std::make_shared<std::vector<std::byte>>(size_t(count) * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::F32) {
      std::memcpy(bytes->data() + i * 4, &v[i], 4);
    } else {
      const uint16_t half = dtype == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16_bits(v[i]);
      std::memcpy(bytes->data() + i * 2, &half, 2);
    }
  }
  TensorView view;
  view.name = "op table weight";
  view.dtype = dtype;
  view.shape = std::move(shape);
  view.data = bytes->data();
  view.bytes = bytes->size();
  view.file = "tests/support/backend_op_table.cpp";
  return backend_.upload_weight(view, bytes);
}

void OpRun::out(const std::string& name, const DeviceTensor& tensor) {
  std::vector<double> values(size_t(tensor.numel()));
  if (tensor.dtype == DType::F32) {
    std::vector<float> host(values.size());
    backend_.to_host(tensor, host.data(), host.size() * sizeof(float));
    values.assign(host.begin(), host.end());
  } else {
    REQUIRE(tensor.dtype == DType::U8);
    std::vector<uint8_t> host(values.size());
    backend_.to_host(tensor, host.data(), host.size());
    values.assign(host.begin(), host.end());
  }
  out(name, std::move(values));
}

void OpRun::out(const std::string& name, std::vector<double> values) {
  outputs.push_back({name, std::move(values)});
}

const std::vector<OpEntry>& backend_op_table() {
  static const std::vector<OpEntry> table = make_table();
  return table;
}

void check_op_entry(const OpEntry& entry, Backend& reference, Backend& backend) {
  // One seed per entry name: the same inputs on both backends.
  const uint32_t seed = uint32_t(std::hash<std::string>{}(entry.name));
  OpRun want(reference, seed), got(backend, seed);
  entry.run(want);
  entry.run(got);
  REQUIRE(want.outputs.size() == got.outputs.size());
  for (size_t o = 0; o < want.outputs.size(); ++o) {
    const OpOutput& w = want.outputs[o];
    const OpOutput& g = got.outputs[o];
    REQUIRE(w.name == g.name);
    REQUIRE(w.values.size() == g.values.size());
    size_t bad = 0, worst = 0;
    double worst_excess = 0.0;
    for (size_t i = 0; i < w.values.size(); ++i) {
      const double a = w.values[i], b = g.values[i];
      bool ok;
      double excess = 0.0;
      if (entry.tolerance.exact() || !std::isfinite(a) || !std::isfinite(b)) {
        ok = same_value(a, b);
        excess = ok ? 0.0 : std::numeric_limits<double>::infinity();
      } else {
        const double allowed = entry.tolerance.abs + entry.tolerance.rel * std::fabs(a);
        excess = std::fabs(a - b) / allowed;
        ok = excess <= 1.0;
      }
      if (!ok && (bad++ == 0 || excess > worst_excess)) worst = i, worst_excess = excess;
    }
    std::ostringstream message;
    message.precision(9);
    message << entry.name << " on " << backend.name() << ": output '" << w.name << "': " << bad
            << " of " << w.values.size() << " elements outside "
            << (entry.tolerance.exact() ? std::string("the same bits")
                                        : "abs " + std::to_string(entry.tolerance.abs) + " + rel " +
                                              std::to_string(entry.tolerance.rel));
    if (bad)
      message << "; worst [" << worst << "] want " << w.values[worst] << " got " << g.values[worst];
    INFO(message.str());
    CHECK(bad == 0);
  }
}

}  // namespace kvlens::test
