// The CPU backend's token-selection (policy) ops against hand-computed expectations and the
// attention op. Small row buffers: H = 4 query heads on G = 2 KV heads, D = 4, cols = 7 candidates
// in rows of stride 10 (columns 7..9 hold sentinels that no op may touch).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/cpu_dot_kernels.h"
#include "engine/backend/policy_op_math.h"
#include "engine/common/error.h"
#include "engine/policy/keydiff_ops.h"
#include "engine/policy/quest_ops.h"
#include "engine/policy/tokenfilter_ops.h"
#include "tests/support/backend_checks.h"
#include "tests/support/random_values.h"

using namespace kvlens;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kSentinel = 99.0f;
constexpr uint8_t kMaskSentinel = 7;
constexpr int64_t H = 4, G = 2, D = 4, kCols = 7, kStride = 10;

using kvlens::test::make_f32;
using kvlens::test::make_u8;
using kvlens::test::random_values;
using kvlens::test::read_f32;
using kvlens::test::read_u8;

// Bitwise equality, so -0 vs +0 and NaN payloads count too.
bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Rows of `stride` columns: `rows` given for j < cols, the sentinel after.
std::vector<float> padded(const std::vector<std::vector<float>>& rows, float sentinel) {
  std::vector<float> values;
  for (const auto& row : rows) {
    values.insert(values.end(), row.begin(), row.end());
    values.insert(values.end(), size_t(kStride) - row.size(), sentinel);
  }
  return values;
}
std::vector<uint8_t> padded(const std::vector<std::vector<uint8_t>>& rows, uint8_t sentinel) {
  std::vector<uint8_t> values;
  for (const auto& row : rows) {
    values.insert(values.end(), row.begin(), row.end());
    values.insert(values.end(), size_t(kStride) - row.size(), sentinel);
  }
  return values;
}

// q [1, H, D] and caches [G, kStride, D] of seeded normal values.
struct Inputs {
  std::vector<float> q, k, v;
  DeviceTensor q_t, k_t, v_t;
};

Inputs make_inputs(Backend& backend, uint32_t seed) {
  Inputs in;
  in.q = random_values(size_t(H * D), seed);
  in.k = random_values(size_t(G * kStride * D), seed + 1);
  in.v = random_values(size_t(G * kStride * D), seed + 2);
  in.q_t = make_f32(backend, in.q, {1, H, D});
  in.k_t = make_f32(backend, in.k, {G, kStride, D});
  in.v_t = make_f32(backend, in.v, {G, kStride, D});
  return in;
}

// The existing attention op at position kCols - 1: output [H * D] and logits [H * kCols].
struct Dense {
  std::vector<float> out, logits;
};

Dense run_attention(Backend& backend, const Inputs& in, int64_t window,
                    const std::vector<uint8_t>& mask = {}) {
  DeviceTensor out = backend.alloc(DType::F32, {1, H, D});
  DeviceTensor logits = backend.alloc(DType::F32, {1, H, kCols});
  DeviceTensor mask_t;
  Visibility visible;
  if (!mask.empty()) {
    mask_t = make_u8(backend, mask, {H, kCols});
    visible.mask = &mask_t;
  }
  backend.attention(in.q_t, in.k_t, in.v_t, kCols - 1, window, visible, out, &logits);
  return {read_f32(backend, out), read_f32(backend, logits)};
}

DeviceTensor logits_of(Backend& backend, const Inputs& in, int64_t window) {
  DeviceTensor logits =
      make_f32(backend, std::vector<float>(size_t(H * kStride), kSentinel), {H, kStride});
  backend.attention_logits(in.q_t, in.k_t, kCols - 1, window, logits);
  return logits;
}

}  // namespace

TEST_CASE("attention_logits: q.k / sqrt(D) per head, the attention op's logits bit for bit",
          "[policy_ops]") {
  const bool simd = GENERATE(true, false);
  CpuBackendOptions options;
  options.threads = 2;
  options.allow_simd = simd;
  auto backend = make_cpu_backend(options);
  const Inputs in = make_inputs(*backend, 11);

  for (int64_t window : {int64_t(0), int64_t(3)}) {
    INFO("window " << window << " simd " << simd);
    const std::vector<float> got = read_f32(*backend, logits_of(*backend, in, window));
    const Dense dense = run_attention(*backend, in, window);
    const int64_t lo = window > 0 ? kCols - window : 0;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kv = h / (H / G);  // heads 0, 1 read KV head 0; heads 2, 3 KV head 1
      for (int64_t j = 0; j < kStride; ++j) {
        const float value = got[size_t(h * kStride + j)];
        if (j >= kCols) {
          CHECK(value == kSentinel);  // past the candidates: untouched
          continue;
        }
        CHECK(same_bits(value, dense.logits[size_t(h * kCols + j)]));
        if (j < lo) {
          CHECK(value == kNegInf);
          continue;
        }
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d)
          dot += double(in.q[size_t(h * D + d)]) * double(in.k[size_t((kv * kStride + j) * D + d)]);
        CHECK(value == Approx(dot / 2.0).epsilon(1e-6).margin(1e-6));  // sqrt(4) = 2
      }
    }
  }

  // Errors: position past the capacity, logits rows too short or the wrong row count.
  DeviceTensor logits = backend->alloc(DType::F32, {H, kStride});
  CHECK_THROWS_AS(backend->attention_logits(in.q_t, in.k_t, kStride, 0, logits), Error);
  DeviceTensor narrow = backend->alloc(DType::F32, {H, 5});
  CHECK_THROWS_AS(backend->attention_logits(in.q_t, in.k_t, 6, 0, narrow), Error);
  DeviceTensor wrong_rows = backend->alloc(DType::F32, {G, kStride});
  CHECK_THROWS_AS(backend->attention_logits(in.q_t, in.k_t, 6, 0, wrong_rows), Error);
}

TEST_CASE("attention_visible: softmax over the visible columns only", "[policy_ops]") {
  auto backend = make_cpu_backend(2);
  const Inputs in = make_inputs(*backend, 21);
  const DeviceTensor logits = logits_of(*backend, in, 0);
  const std::vector<float> z = read_f32(*backend, logits);
  DeviceTensor out = backend->alloc(DType::F32, {1, H, D});
  DeviceTensor probs =
      make_f32(*backend, std::vector<float>(size_t(H * kStride), kSentinel), {H, kStride});

  SECTION("no mask: the attention op's output, bit for bit") {
    backend->attention_visible(logits, kCols, nullptr, in.v_t, out, &probs);
    const Dense dense = run_attention(*backend, in, 0);
    const std::vector<float> got = read_f32(*backend, out);
    for (size_t i = 0; i < got.size(); ++i) CHECK(same_bits(got[i], dense.out[i]));
    const std::vector<float> p = read_f32(*backend, probs);
    for (int64_t h = 0; h < H; ++h) {
      double total = 0.0;
      for (int64_t j = 0; j < kCols; ++j) total += p[size_t(h * kStride + j)];
      CHECK(total == Approx(1.0).epsilon(1e-6));
      for (int64_t j = kCols; j < kStride; ++j) CHECK(p[size_t(h * kStride + j)] == kSentinel);
    }
    // Without probs the output is the same.
    DeviceTensor out2 = backend->alloc(DType::F32, {1, H, D});
    backend->attention_visible(logits, kCols, nullptr, in.v_t, out2, nullptr);
    CHECK(read_f32(*backend, out2) == got);
    // Without an output (the oracle's use) the probabilities are the same bits.
    DeviceTensor probs_only =
        make_f32(*backend, std::vector<float>(size_t(H * kStride), kSentinel), {H, kStride});
    DeviceTensor no_output;
    backend->attention_visible(logits, kCols, nullptr, in.v_t, no_output, &probs_only);
    const std::vector<float> p_only = read_f32(*backend, probs_only);
    for (size_t i = 0; i < p.size(); ++i) CHECK(same_bits(p_only[i], p[i]));
  }

  SECTION("sliding-window logits (-inf) without a mask: the windowed attention op") {
    const DeviceTensor windowed = logits_of(*backend, in, 3);
    backend->attention_visible(windowed, kCols, nullptr, in.v_t, out, &probs);
    const Dense dense = run_attention(*backend, in, 3);
    const std::vector<float> got = read_f32(*backend, out);
    for (size_t i = 0; i < got.size(); ++i) CHECK(same_bits(got[i], dense.out[i]));
    const std::vector<float> p = read_f32(*backend, probs);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < kCols - 3; ++j) CHECK(p[size_t(h * kStride + j)] == 0.0f);
  }

  SECTION("mask: a hand softmax over the visible subset, zeros for a head that sees nothing") {
    const std::vector<std::vector<uint8_t>> rows = {
        {1, 0, 1, 0, 0, 1, 1}, {0, 0, 0, 0, 0, 0, 1}, {1, 1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0}};
    // Columns past cols are "visible" but must not be read.
    const DeviceTensor mask = make_u8(*backend, padded(rows, 1), {H, kStride});
    backend->attention_visible(logits, kCols, &mask, in.v_t, out, &probs);
    const std::vector<float> got = read_f32(*backend, out);
    const std::vector<float> p = read_f32(*backend, probs);
    for (int64_t h = 0; h < H; ++h) {
      INFO("head " << h);
      const int64_t kv = h / (H / G);
      double max_z = -INFINITY;
      for (int64_t j = 0; j < kCols; ++j)
        if (rows[size_t(h)][size_t(j)]) max_z = std::max(max_z, double(z[size_t(h * kStride + j)]));
      std::vector<double> want_p(size_t(kCols), 0.0);
      double total = 0.0;
      for (int64_t j = 0; j < kCols; ++j)
        if (rows[size_t(h)][size_t(j)])
          total += want_p[size_t(j)] = std::exp(double(z[size_t(h * kStride + j)]) - max_z);
      for (double& w : want_p) w = total > 0 ? w / total : 0.0;
      for (int64_t j = 0; j < kCols; ++j)
        CHECK(p[size_t(h * kStride + j)] == Approx(want_p[size_t(j)]).epsilon(1e-5).margin(1e-7));
      for (int64_t j = kCols; j < kStride; ++j) CHECK(p[size_t(h * kStride + j)] == kSentinel);
      for (int64_t d = 0; d < D; ++d) {
        double want = 0.0;
        for (int64_t j = 0; j < kCols; ++j)
          want += want_p[size_t(j)] * double(in.v[size_t((kv * kStride + j) * D + d)]);
        CHECK(got[size_t(h * D + d)] == Approx(want).epsilon(1e-5).margin(1e-6));
      }
    }
    // Head 3 sees nothing: zeros, as the attention op gives.
    for (int64_t d = 0; d < D; ++d) CHECK(got[size_t(3 * D + d)] == 0.0f);
    // Same bits as the attention op under the same mask (a [H, context] mask for that op).
    std::vector<uint8_t> dense_mask;
    for (const auto& row : rows) dense_mask.insert(dense_mask.end(), row.begin(), row.end());
    const Dense dense = run_attention(*backend, in, 0, dense_mask);
    for (size_t i = 0; i < got.size(); ++i) CHECK(same_bits(got[i], dense.out[i]));
  }

  SECTION("bad shapes are errors") {
    DeviceTensor small_out = backend->alloc(DType::F32, {1, H, D - 1});
    CHECK_THROWS_AS(backend->attention_visible(logits, kCols, nullptr, in.v_t, small_out, nullptr),
                    Error);
    DeviceTensor f32_mask = backend->alloc(DType::F32, {H, kStride});
    CHECK_THROWS_AS(backend->attention_visible(logits, kCols, &f32_mask, in.v_t, out, nullptr),
                    Error);
    CHECK_THROWS_AS(backend->attention_visible(logits, kStride + 1, nullptr, in.v_t, out, nullptr),
                    Error);
    // Neither an output nor probs: nothing to compute.
    DeviceTensor no_output;
    CHECK_THROWS_AS(backend->attention_visible(logits, kCols, nullptr, in.v_t, no_output, nullptr),
                    Error);
  }
}

namespace {

// An independent reference for select_top_k: candidates sorted best first by the contract's
// order (higher score, NaN lowest, ties to the higher column), first k marked.
void reference_top_k(const std::vector<float>& scores, const std::vector<uint8_t>* eligible,
                     int64_t rows, int64_t cols, int64_t stride, int64_t k,
                     std::vector<uint8_t>& selected) {
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> candidates;
    for (int64_t j = 0; j < cols; ++j)
      if (!selected[size_t(r * stride + j)] && (!eligible || (*eligible)[size_t(r * stride + j)]))
        candidates.push_back(j);
    auto better = [&](int64_t a, int64_t b) {
      const float x = scores[size_t(r * stride + a)], y = scores[size_t(r * stride + b)];
      if (std::isnan(x) || std::isnan(y))
        return std::isnan(x) == std::isnan(y) ? a > b : !std::isnan(x);
      return x > y || (x == y && a > b);
    };
    std::sort(candidates.begin(), candidates.end(), better);
    for (size_t i = 0; i < candidates.size() && int64_t(i) < k; ++i)
      selected[size_t(r * stride + candidates[i])] = 1;
  }
}

}  // namespace

TEST_CASE("select_top_k: ties to the higher column, forced kept, NaN lowest", "[policy_ops]") {
  auto backend = make_cpu_backend(2);
  SECTION("hand cases") {
    const std::vector<std::vector<float>> scores = {
        {1, 5, 3, 5, 2, 0, 5},       // three-way tie at 5
        {9, 1, 8, kNaN, 7, 7, 100},  // 0 and 6 forced; NaN never beats 1
        {1, 2, 3, 4, 5, 6, 7},       // eligible 1, 3, 5 only; k above the candidates
        {kNaN, kNaN, kNegInf, kNaN, 0.0f, -0.0f, kNaN},  // NaN below -inf; -0 ties with +0
    };
    const std::vector<std::vector<uint8_t>> forced = {
        {0, 0, 0, 0, 0, 0, 0}, {1, 0, 0, 0, 0, 0, 1}, {0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0}};
    const std::vector<std::vector<uint8_t>> allowed = {
        {1, 1, 1, 1, 1, 1, 1}, {1, 1, 1, 1, 1, 1, 1}, {0, 1, 0, 1, 0, 1, 0}, {1, 1, 1, 1, 1, 1, 1}};
    // Large scores past cols must be ignored; mask sentinels there must survive.
    const DeviceTensor s = make_f32(*backend, padded(scores, 1000.0f), {4, kStride});
    const DeviceTensor e = make_u8(*backend, padded(allowed, 1), {4, kStride});

    struct Case {
      int64_t k;
      std::vector<std::vector<uint8_t>> want;
    };
    for (const Case& c : {
             Case{2,
                  {{0, 0, 0, 1, 0, 0, 1},
                   {1, 0, 1, 0, 0, 1, 1},
                   {0, 0, 0, 1, 0, 1, 0},
                   {0, 0, 0, 0, 1, 1, 0}}},
             Case{3,
                  {{0, 1, 0, 1, 0, 0, 1},
                   {1, 0, 1, 0, 1, 1, 1},
                   {0, 1, 0, 1, 0, 1, 0},
                   {0, 0, 1, 0, 1, 1, 0}}},
             Case{4,
                  {{0, 1, 1, 1, 0, 0, 1},
                   {1, 1, 1, 0, 1, 1, 1},
                   {0, 1, 0, 1, 0, 1, 0},
                   {0, 0, 1, 0, 1, 1, 1}}},  // then the NaN at the highest column
             Case{6,
                  {{1, 1, 1, 1, 1, 0, 1},
                   {1, 1, 1, 1, 1, 1, 1},  // fewer candidates than k: all, the NaN too
                   {0, 1, 0, 1, 0, 1, 0},
                   {0, 1, 1, 1, 1, 1, 1}}},
             Case{0, forced},
         }) {
      INFO("k " << c.k);
      DeviceTensor selected = make_u8(*backend, padded(forced, kMaskSentinel), {4, kStride});
      backend->select_top_k(s, kCols, &e, c.k, selected);
      const std::vector<uint8_t> got = read_u8(*backend, selected);
      // Row 2 is restricted by the eligible mask; the others have every column eligible.
      CHECK(got == padded(c.want, kMaskSentinel));
    }
    // Without an eligible mask row 2 takes its best columns.
    DeviceTensor selected = backend->alloc(DType::U8, {4, kStride});
    backend->select_top_k(s, kCols, nullptr, 2, selected);
    const std::vector<uint8_t> got = read_u8(*backend, selected);
    CHECK(std::vector<uint8_t>(got.begin() + 2 * kStride, got.begin() + 3 * kStride) ==
          std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 1, 0, 0, 0});
  }

  SECTION("random scores with ties, NaN and forced columns match a sorting reference") {
    const int64_t rows = 6, cols = 211, stride = 230;
    std::mt19937 rng(31);
    std::vector<float> scores(size_t(rows * stride));
    for (float& v : scores) {
      const uint32_t u = rng() % 20;
      v = u == 0 ? kNaN : u == 1 ? kNegInf : float(int(rng() % 9) - 4) * 0.5f;  // many ties
    }
    std::vector<uint8_t> forced(size_t(rows * stride)), allowed(size_t(rows * stride));
    for (auto& f : forced) f = uint8_t(rng() % 7 == 0);
    for (auto& a : allowed) a = uint8_t(rng() % 5 != 0);
    const DeviceTensor s = make_f32(*backend, scores, {rows, stride});
    const DeviceTensor e = make_u8(*backend, allowed, {rows, stride});
    for (int64_t k : {1, 2, 17, 100, 150, 300}) {
      for (bool use_eligible : {false, true}) {
        INFO("k " << k << " eligible " << use_eligible);
        std::vector<uint8_t> want = forced;
        reference_top_k(scores, use_eligible ? &allowed : nullptr, rows, cols, stride, k, want);
        DeviceTensor selected = make_u8(*backend, forced, {rows, stride});
        backend->select_top_k(s, cols, use_eligible ? &e : nullptr, k, selected);
        CHECK(read_u8(*backend, selected) == want);
      }
    }
  }

  SECTION("bad shapes are errors") {
    DeviceTensor s = backend->alloc(DType::F32, {4, kStride});
    DeviceTensor selected = backend->alloc(DType::U8, {3, kStride});
    CHECK_THROWS_AS(backend->select_top_k(s, kCols, nullptr, 1, selected), Error);
    DeviceTensor ok = backend->alloc(DType::U8, {4, kStride});
    CHECK_THROWS_AS(backend->select_top_k(s, kStride + 1, nullptr, 1, ok), Error);
  }
}

TEST_CASE("select_top_k: SIMD and portable kernels choose the sorting reference's set",
          "[policy_ops]") {
  // Rows long enough for every path of the kernels: 8-lane blocks and a tail, a first digit
  // whose pivot bucket holds a few keys or hundreds (a block of equal scores), rows of one score
  // (only the columns decide), probabilities of very different sizes, NaN, -0 and infinities.
  std::mt19937 rng(57);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  // Sorted rows (ascending, descending) are where a sampled pivot could go wrong.
  enum class Fill { Probabilities, FewValues, OneValue, Specials, Ascending, Descending };
  for (const int64_t cols : {1, 7, 8, 9, 16, 17, 33, 64, 213, 1000}) {
    const int64_t rows = 4, stride = cols + 5;
    for (const Fill fill : {Fill::Probabilities, Fill::FewValues, Fill::OneValue, Fill::Specials,
                            Fill::Ascending, Fill::Descending}) {
      std::vector<float> scores(size_t(rows * stride), 1e9f);  // past cols: must be ignored
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) {
          float& v = scores[size_t(r * stride + j)];
          const uint32_t u = rng() % 16;
          switch (fill) {
            case Fill::Probabilities:
              v = std::exp(normal(rng));
              break;
            case Fill::FewValues:
              v = j % 3 == 0 ? 0.25f : float(int(rng() % 5)) * 0.125f;
              break;
            case Fill::OneValue:
              v = 0.5f;
              break;
            case Fill::Ascending:
              v = float(j) * 0.25f;
              break;
            case Fill::Descending:
              v = -float(j);
              break;
            case Fill::Specials:
              v = u == 0   ? kNaN
                  : u == 1 ? kNegInf
                  : u == 2 ? std::numeric_limits<float>::infinity()
                  : u == 3 ? -0.0f
                  : u == 4 ? 0.0f
                  : u == 5 ? std::numeric_limits<float>::denorm_min()
                           : normal(rng);
              break;
          }
        }
      std::vector<uint8_t> forced(size_t(rows * stride), kMaskSentinel), allowed(forced.size(), 0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) {
          forced[size_t(r * stride + j)] = uint8_t(r % 2 == 1 && rng() % 6 == 0);
          allowed[size_t(r * stride + j)] = uint8_t(rng() % 4 != 0);
        }
      // AVX-512 (where the CPU has it), AVX2 and portable kernels.
      for (const CpuBackendOptions& options :
           {CpuBackendOptions{1, true, true}, CpuBackendOptions{1, true, false},
            CpuBackendOptions{1, false, false}}) {
        auto backend = make_cpu_backend(options);
        const DeviceTensor s = make_f32(*backend, scores, {rows, stride});
        const DeviceTensor e = make_u8(*backend, allowed, {rows, stride});
        for (const int64_t k :
             {int64_t(1), int64_t(3), int64_t(31), cols / 3, cols / 2, cols - 1, cols + 2}) {
          for (const bool use_eligible : {false, true}) {
            INFO("cols " << cols << " fill " << int(fill) << " kernels "
                         << cpu_backend_isa(*backend) << " k " << k << " eligible "
                         << use_eligible);
            std::vector<uint8_t> want = forced;
            reference_top_k(scores, use_eligible ? &allowed : nullptr, rows, cols, stride, k, want);
            DeviceTensor selected = make_u8(*backend, forced, {rows, stride});
            backend->select_top_k(s, cols, use_eligible ? &e : nullptr, k, selected);
            CHECK(read_u8(*backend, selected) == want);
          }
        }
      }
    }
  }
}

TEST_CASE("count_nonzero_rows counts each row's nonzero bytes below cols", "[policy_ops]") {
  auto backend = make_cpu_backend(1);
  const int64_t rows = 3, stride = 75;
  std::mt19937 rng(11);
  std::vector<uint8_t> bytes(size_t(rows * stride));
  for (uint8_t& b : bytes) b = uint8_t(rng() % 3 == 0 ? 0 : rng() % 2 == 0 ? 1 : 200);
  const DeviceTensor mask = make_u8(*backend, bytes, {rows, stride});
  for (const int64_t cols : {int64_t(0), int64_t(1), int64_t(31), int64_t(64), stride}) {
    std::vector<int64_t> want(size_t(rows), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) want[size_t(r)] += bytes[size_t(r * stride + j)] != 0;
    std::vector<int64_t> in_place(size_t(rows), -1), read_back(size_t(rows), -1);
    backend->count_nonzero_rows(mask, cols, in_place);
    // The base class's version (reading the rows back), as a backend without its own gets.
    backend->Backend::count_nonzero_rows(mask, cols, read_back);
    INFO("cols " << cols);
    CHECK(in_place == want);
    CHECK(read_back == want);
  }
  std::vector<int64_t> two(2), three(3);
  CHECK_THROWS_AS(backend->count_nonzero_rows(mask, 10, two), Error);  // one count per row
  CHECK_THROWS_AS(backend->Backend::count_nonzero_rows(mask, 10, two), Error);
  CHECK_THROWS_AS(backend->count_nonzero_rows(mask, stride + 1, three), Error);
  CHECK_THROWS_AS(backend->Backend::count_nonzero_rows(mask, stride + 1, three), Error);
  const DeviceTensor floats = backend->alloc(DType::F32, {rows, stride});
  CHECK_THROWS_AS(backend->count_nonzero_rows(floats, 10, three), Error);
  CHECK_THROWS_AS(backend->Backend::count_nonzero_rows(floats, 10, three), Error);
}

TEST_CASE("fill_columns and mask_and on U8 rows", "[policy_ops]") {
  auto backend = make_cpu_backend(1);
  DeviceTensor mask = backend->alloc(DType::U8, {3, kStride});
  backend->fill_columns(mask, 2, 5, 1);
  backend->fill_columns(mask, 8, 10, 3);
  backend->fill_columns(mask, 6, 6, 9);  // empty range
  backend->fill_columns(mask, 7, 4, 9);  // empty range
  std::vector<uint8_t> want = {0, 0, 1, 1, 1, 0, 0, 0, 3, 3};
  std::vector<uint8_t> rows3;
  for (int r = 0; r < 3; ++r) rows3.insert(rows3.end(), want.begin(), want.end());
  CHECK(read_u8(*backend, mask) == rows3);
  CHECK_THROWS_AS(backend->fill_columns(mask, 0, kStride + 1, 1), Error);
  CHECK_THROWS_AS(backend->fill_columns(mask, -1, 3, 1), Error);

  const std::vector<std::vector<uint8_t>> a = {{1, 1, 0, 0, 1, 1, 1}, {1, 0, 1, 0, 1, 0, 1}};
  const std::vector<std::vector<uint8_t>> b = {{1, 0, 1, 0, 1, 1, 0}, {0, 0, 1, 1, 1, 1, 1}};
  DeviceTensor m = make_u8(*backend, padded(a, 1), {2, kStride});
  const DeviceTensor other = make_u8(*backend, padded(b, 0), {2, kStride});
  backend->mask_and(m, other, kCols);
  CHECK(read_u8(*backend, m) ==
        padded(std::vector<std::vector<uint8_t>>{{1, 0, 0, 0, 1, 1, 0}, {0, 0, 1, 0, 1, 0, 1}}, 1));
  DeviceTensor wrong = backend->alloc(DType::U8, {3, kStride});
  CHECK_THROWS_AS(backend->mask_and(m, wrong, kCols), Error);

  // mark_columns: sinks [0, 2) and recent [5, 7) forced, less what `other` evicts; columns past
  // cols untouched.
  DeviceTensor forced = make_u8(*backend, padded(a, 1), {2, kStride});
  backend->mark_columns(forced, kCols, 2, 5, &other);
  CHECK(read_u8(*backend, forced) ==
        padded(std::vector<std::vector<uint8_t>>{{1, 0, 0, 0, 0, 1, 0}, {0, 0, 0, 0, 0, 1, 1}}, 1));
  backend->mark_columns(forced, kCols, 2, 5, nullptr);
  CHECK(read_u8(*backend, forced) ==
        padded(std::vector<std::vector<uint8_t>>{{1, 1, 0, 0, 0, 1, 1}, {1, 1, 0, 0, 0, 1, 1}}, 1));
  CHECK_THROWS_AS(backend->mark_columns(forced, kCols, 2, 5, &wrong), Error);

  // mark_and_select_top_k: mark_columns (keep = eligible), then the k best of the rest.
  const std::vector<std::vector<float>> scores = {{5, 1, 4, 2, 3, 0, 6}, {0, 9, 8, 7, 1, 2, 3}};
  const DeviceTensor score_t = make_f32(*backend, padded(scores, kSentinel), {2, kStride});
  DeviceTensor both = make_u8(*backend, padded(a, 1), {2, kStride});
  backend->mark_and_select_top_k(score_t, kCols, &other, 1, 6, 2, both);
  // row 0: forced {0, 6}, eligible (b) {0, 2, 4, 5}: forced less evicted {0}, then the 2 best
  // eligible of {2, 4, 5} by score: 2 (4) and 4 (3); row 1: forced {0, 6} -> {6}, then 2 of
  // eligible {2, 3, 4, 5}: 2 (8) and 3 (7).
  CHECK(read_u8(*backend, both) ==
        padded(std::vector<std::vector<uint8_t>>{{1, 0, 1, 0, 1, 0, 0}, {0, 0, 1, 1, 0, 0, 1}}, 1));
  backend->mark_and_select_top_k(score_t, kCols, nullptr, 2, 5, 0, both);  // k 0: the marks only
  CHECK(read_u8(*backend, both) ==
        padded(std::vector<std::vector<uint8_t>>{{1, 1, 0, 0, 0, 1, 1}, {1, 1, 0, 0, 0, 1, 1}}, 1));
  CHECK_THROWS_AS(backend->mark_and_select_top_k(score_t, kCols, &wrong, 2, 5, 1, both), Error);

  // keep_selected: kept && selected, then the sinks kept.
  DeviceTensor kept = make_u8(*backend, padded(a, 1), {2, kStride});
  backend->keep_selected(kept, other, kCols, 2);
  CHECK(read_u8(*backend, kept) ==
        padded(std::vector<std::vector<uint8_t>>{{1, 1, 0, 0, 1, 1, 0}, {1, 1, 1, 0, 1, 0, 1}}, 1));
  backend->keep_selected(kept, other, kCols, 0);
  CHECK(read_u8(*backend, kept) ==
        padded(std::vector<std::vector<uint8_t>>{{1, 0, 0, 0, 1, 1, 0}, {0, 0, 1, 0, 1, 0, 1}}, 1));
  CHECK_THROWS_AS(backend->keep_selected(kept, wrong, kCols, 1), Error);
}

TEST_CASE("accumulate_rows adds, and forgets where keep is 0", "[policy_ops]") {
  auto backend = make_cpu_backend(1);
  const std::vector<std::vector<float>> acc = {{1, 2, 3, 4, 5, 6, 7},
                                               {0.5f, kNaN, INFINITY, 0, 0, 0, 0}};
  const std::vector<std::vector<float>> x = {{0.25f, 0.5f, 1, 1, 1, 1, 1}, {1, 2, 3, 4, 5, 6, 7}};
  const DeviceTensor x_t = make_f32(*backend, padded(x, 1.0f), {2, kStride});

  DeviceTensor a = make_f32(*backend, padded(acc, kSentinel), {2, kStride});
  backend->accumulate_rows(a, x_t, nullptr, kCols);
  std::vector<float> got = read_f32(*backend, a);
  CHECK(got[0] == 1.25f);
  CHECK(got[1] == 2.5f);
  CHECK(got[6] == 8.0f);
  CHECK(std::isnan(got[size_t(kStride + 1)]));
  CHECK(got[size_t(kStride + 2)] == INFINITY);
  CHECK(got[size_t(kStride + 6)] == 7.0f);
  for (int64_t j = kCols; j < kStride; ++j) CHECK(got[size_t(j)] == kSentinel);

  // keep 0 replaces the score (even NaN or inf) by x; keep 1 adds.
  a = make_f32(*backend, padded(acc, kSentinel), {2, kStride});
  const DeviceTensor keep = make_u8(
      *backend,
      padded(std::vector<std::vector<uint8_t>>{{1, 0, 1, 0, 1, 0, 1}, {1, 0, 0, 1, 1, 1, 1}}, 0),
      {2, kStride});
  backend->accumulate_rows(a, x_t, &keep, kCols);
  got = read_f32(*backend, a);
  CHECK(std::vector<float>(got.begin(), got.begin() + kCols) ==
        std::vector<float>{1.25f, 0.5f, 4, 1, 6, 1, 8});
  CHECK(std::vector<float>(got.begin() + kStride, got.begin() + kStride + kCols) ==
        std::vector<float>{1.5f, 2, 3, 4, 5, 6, 7});
  for (int64_t j = kCols; j < kStride; ++j) CHECK(got[size_t(kStride + j)] == kSentinel);
}

TEST_CASE("accumulate_rows on long rows follows the per-column rule bit for bit", "[policy_ops]") {
  // Rows long enough for the vectorized loop and its tail; x holds -0, NaN and infinities, which
  // a dropped column must take over exactly and a kept one must add in order (acc + x).
  auto backend = make_cpu_backend(1);
  std::mt19937 rng(11);
  const int64_t rows = 3, cols = 203, stride = 211;
  const std::vector<float> specials = {-0.0f, 0.0f, kNaN, INFINITY, -INFINITY, 1e-42f, -3.5f};
  std::vector<float> acc(size_t(rows * stride)), x(acc.size());
  std::vector<uint8_t> keep(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    acc[i] = rng() % 5 == 0 ? specials[rng() % specials.size()]
                            : float(int(rng() % 2000) - 1000) / 64.0f;
    x[i] = rng() % 5 == 0 ? specials[rng() % specials.size()]
                          : float(int(rng() % 2000) - 1000) / 64.0f;
    keep[i] = uint8_t(rng() % 3 == 0 ? 0 : 1 + rng() % 3);
  }
  DeviceTensor a = make_f32(*backend, acc, {rows, stride});
  const DeviceTensor x_t = make_f32(*backend, x, {rows, stride});
  const DeviceTensor keep_t = make_u8(*backend, keep, {rows, stride});
  backend->accumulate_rows(a, x_t, &keep_t, cols);
  const std::vector<float> got = read_f32(*backend, a);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < stride; ++j) {
      const size_t i = size_t(r * stride + j);
      const float want = j >= cols ? acc[i] : keep[i] == 0 ? x[i] : acc[i] + x[i];
      INFO("row " << r << " column " << j);
      CHECK(std::bit_cast<uint32_t>(got[i]) == std::bit_cast<uint32_t>(want));
    }
}

TEST_CASE("sum_row_groups and expand_row_groups map query heads to KV groups", "[policy_ops]") {
  auto backend = make_cpu_backend(1);
  const std::vector<std::vector<float>> x = {{1, 2, 3, 4, 5, 6, 7},
                                             {10, 20, 30, 40, 50, 60, 70},
                                             {0.5f, 0, 0, 0, 0, 0, -1},
                                             {0.25f, 1, 1, 1, 1, 1, 1}};
  const DeviceTensor x_t = make_f32(*backend, padded(x, 5.0f), {H, kStride});
  // The output has its own stride (12), and its columns past cols keep their sentinel.
  DeviceTensor out = make_f32(*backend, std::vector<float>(size_t(G * 12), kSentinel), {G, 12});
  backend->sum_row_groups(x_t, kCols, 2, out);
  const std::vector<float> got = read_f32(*backend, out);
  const std::vector<float> want0 = {11, 22, 33, 44, 55, 66, 77};
  const std::vector<float> want1 = {0.75f, 1, 1, 1, 1, 1, 0};
  CHECK(std::vector<float>(got.begin(), got.begin() + kCols) == want0);
  CHECK(std::vector<float>(got.begin() + 12, got.begin() + 12 + kCols) == want1);
  for (int64_t j = kCols; j < 12; ++j) CHECK(got[size_t(j)] == kSentinel);
  // group 4: one row; group 3 does not divide 4 rows.
  DeviceTensor one = backend->alloc(DType::F32, {1, kStride});
  backend->sum_row_groups(x_t, kCols, 4, one);
  CHECK(read_f32(*backend, one)[6] == 77.0f);
  CHECK_THROWS_AS(backend->sum_row_groups(x_t, kCols, 3, one), Error);

  const std::vector<std::vector<uint8_t>> groups = {{1, 0, 0, 1, 0, 1, 1}, {0, 1, 1, 0, 0, 0, 1}};
  const DeviceTensor mask = make_u8(*backend, padded(groups, 1), {G, kStride});
  DeviceTensor heads =
      make_u8(*backend, std::vector<uint8_t>(size_t(H * kStride), kMaskSentinel), {H, kStride});
  backend->expand_row_groups(mask, kCols, 2, heads);
  CHECK(read_u8(*backend, heads) ==
        padded(std::vector<std::vector<uint8_t>>{groups[0], groups[0], groups[1], groups[1]},
               kMaskSentinel));
  DeviceTensor three = backend->alloc(DType::U8, {3, kStride});
  CHECK_THROWS_AS(backend->expand_row_groups(mask, kCols, 2, three), Error);
}

TEST_CASE("sum_row_groups: long rows add each group's rows in order, into a strided view",
          "[policy_ops]") {
  // 700 columns cross the CPU op's column blocks; groups of 8 and 3 (snapkv's full and partial
  // ring blocks); the output is every second row of a larger tensor (snapkv's block sums).
  // Bit for bit against adding the rows one at a time, with values whose sums round.
  auto backend = make_cpu_backend(1);
  const int64_t group = GENERATE(8, 3), groups = 3, cols = 700, stride = 712;
  std::mt19937 rng(77);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  std::vector<float> x(size_t(groups * group * stride));
  for (float& value : x) value = unit(rng) * (rng() % 5 == 0 ? 1e-7f : 1.0f);
  const DeviceTensor x_t = make_f32(*backend, x, {groups * group, stride});
  DeviceTensor all = make_f32(*backend, std::vector<float>(size_t(2 * groups * stride), kSentinel),
                              {2 * groups, stride});
  DeviceTensor every_second = all;
  every_second.data = all.as<float>() + stride;  // rows 1, 3, 5
  every_second.shape = {groups, 2 * stride};
  backend->sum_row_groups(x_t, cols, group, every_second);
  const std::vector<float> got = read_f32(*backend, all);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t j = 0; j < stride; ++j) {
      INFO("group " << g << " column " << j);
      float want = x[size_t(g * group * stride + j)];
      for (int64_t i = 1; i < group; ++i) want += x[size_t((g * group + i) * stride + j)];
      if (j >= cols) want = kSentinel;
      REQUIRE(std::bit_cast<uint32_t>(got[size_t((2 * g + 1) * stride + j)]) ==
              std::bit_cast<uint32_t>(want));
      REQUIRE(got[size_t(2 * g * stride + j)] == kSentinel);
    }
}

TEST_CASE("random_rows: deterministic splitmix64 values, uniform from 0 to 1", "[policy_ops]") {
  auto backend = make_cpu_backend(1);
  // splitmix64's published test vector (seed 1234567, successive states).
  CHECK(splitmix64(1234567) == 6457827717110365317ull);
  CHECK(splitmix64(1234567 + 0x9e3779b97f4a7c15ull) == 3203168211198807973ull);

  const int64_t rows = 4, cols = 2500, stride = 2503;
  auto draw = [&](uint64_t seed, uint64_t stream) {
    DeviceTensor out =
        make_f32(*backend, std::vector<float>(size_t(rows * stride), kSentinel), {rows, stride});
    backend->random_rows(seed, stream, cols, out);
    return read_f32(*backend, out);
  };
  const std::vector<float> a = draw(42, 7);
  CHECK(draw(42, 7) == a);  // a pure function of its arguments
  double sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < stride; ++j) {
      const float v = a[size_t(r * stride + j)];
      if (j >= cols) {
        CHECK(v == kSentinel);
        continue;
      }
      REQUIRE(v >= 0.0f);
      REQUIRE(v < 1.0f);
      REQUIRE(v == random_unit(42, 7, uint64_t(r), uint64_t(j)));
      // On the 2^-24 grid: the top 24 bits of the hash.
      REQUIRE(std::ldexp(double(v), 24) == std::floor(std::ldexp(double(v), 24)));
      sum += v;
    }
  }
  CHECK(std::fabs(sum / double(rows * cols) - 0.5) < 0.02);  // 10000 values: sd ~0.003
  // Another stream or seed gives unrelated values (equal ones only by chance: p = 2^-24 each).
  for (const std::vector<float>& other : {draw(42, 8), draw(43, 7)}) {
    int64_t equal = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        equal += a[size_t(r * stride + j)] == other[size_t(r * stride + j)];
    CHECK(equal < 5);
  }
  // Rows differ too.
  CHECK(!std::equal(a.begin(), a.begin() + cols, a.begin() + stride));
}

TEST_CASE("axpby_rows: fma rounding, beta 0 overwrites, a one-row x broadcasts", "[policy_ops]") {
  auto backend = make_cpu_backend(1);
  const std::vector<std::vector<float>> y = {{1, 2, 3, 4, 5, 6, 7},
                                             {kNaN, INFINITY, 0, 0, 1, 1, 1}};
  const std::vector<std::vector<float>> x = {{0.5f, 1, 2, 3, 4, 5, 6}, {1, 1, 1, 1, 1, 1, -1}};
  const DeviceTensor x_t = make_f32(*backend, padded(x, 1.0f), {2, kStride});
  auto head = [&](const std::vector<float>& got, int64_t row) {
    return std::vector<float>(got.begin() + row * kStride, got.begin() + row * kStride + kCols);
  };

  // y = 2 x + y
  DeviceTensor y_t = make_f32(*backend, padded(y, kSentinel), {2, kStride});
  backend->axpby_rows(y_t, 2.0f, x_t, 1.0f, kCols);
  std::vector<float> got = read_f32(*backend, y_t);
  CHECK(head(got, 0) == std::vector<float>{2, 4, 7, 10, 13, 16, 19});
  CHECK(std::isnan(got[size_t(kStride)]));
  CHECK(got[size_t(kStride + 1)] == INFINITY);
  CHECK(std::vector<float>(got.begin() + kStride + 2, got.begin() + kStride + kCols) ==
        std::vector<float>{2, 2, 3, 3, -1});
  for (int64_t j = kCols; j < kStride; ++j) CHECK(got[size_t(j)] == kSentinel);

  // beta 0: y = alpha x, stale NaN/inf gone; alpha 1 is a copy.
  y_t = make_f32(*backend, padded(y, kSentinel), {2, kStride});
  backend->axpby_rows(y_t, 1.0f, x_t, 0.0f, kCols);
  got = read_f32(*backend, y_t);
  CHECK(head(got, 0) == x[0]);
  CHECK(head(got, 1) == x[1]);
  CHECK(got[size_t(kStride + kCols)] == kSentinel);

  // y = -1 * x + 0.5 y with x broadcast from one row; the two roundings of the contract:
  // beta * y first, then one fused multiply-add.
  const std::vector<float> thirds = {1.0f / 3, 2.0f / 3, 0.1f, 0.2f, 0.3f, 1e-8f, 7};
  const DeviceTensor one_row = make_f32(*backend, padded({thirds}, 0.0f), {1, kStride});
  y_t = make_f32(*backend, padded(y, kSentinel), {2, kStride});
  backend->axpby_rows(y_t, -1.0f / 3, one_row, 0.5f, kCols);
  got = read_f32(*backend, y_t);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < kCols; ++j) {
      const float want = std::fma(-1.0f / 3, thirds[size_t(j)], 0.5f * y[size_t(r)][size_t(j)]);
      CHECK((same_bits(got[size_t(r * kStride + j)], want) ||
             (std::isnan(want) && std::isnan(got[size_t(r * kStride + j)]))));
    }
  // x with neither 1 nor y's rows, or too few columns, is refused.
  DeviceTensor three = backend->alloc(DType::F32, {3, kStride});
  CHECK_THROWS_AS(backend->axpby_rows(three, 1.0f, x_t, 1.0f, kCols), Error);
  DeviceTensor narrow = backend->alloc(DType::F32, {2, 5});
  CHECK_THROWS_AS(backend->axpby_rows(y_t, 1.0f, narrow, 1.0f, kCols), Error);
}

TEST_CASE("axpby_rows: long rows give the contract's bits with SIMD and portable kernels",
          "[policy_ops]") {
  // 3 rows of 45 columns (five 8-lane blocks and a tail) in a stride of 48: every lane and the
  // scalar tail go through the kernel; the 3 columns past cols must stay untouched.
  constexpr int64_t rows = 3, cols = 45, stride = 48;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::vector<float> x(size_t(rows * stride)), y(size_t(rows * stride));
  for (float& v : x) v = value(rng);
  for (float& v : y) v = value(rng);
  for (const bool simd : {true, false}) {
    auto backend = make_cpu_backend(CpuBackendOptions{1, simd});
    for (const float beta : {0.0f, 1.0f, 0.37f}) {
      const float alpha = -1.0f / 3;
      const DeviceTensor x_t = make_f32(*backend, x, {rows, stride});
      DeviceTensor y_t = make_f32(*backend, y, {rows, stride});
      backend->axpby_rows(y_t, alpha, x_t, beta, cols);
      const std::vector<float> got = read_f32(*backend, y_t);
      int64_t wrong = 0;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < stride; ++j) {
          const size_t i = size_t(r * stride + j);
          const float want = j >= cols      ? y[i]
                             : beta == 0.0f ? alpha * x[i]
                                            : std::fma(alpha, x[i], beta * y[i]);
          wrong += !same_bits(got[i], want);
        }
      INFO("simd " << simd << ", beta " << beta);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("pool_rows: max and average over odd kernels with same padding", "[policy_ops]") {
  auto backend = make_cpu_backend(1);
  const std::vector<std::vector<float>> x = {{1, 5, 2, 0, 3, 0, 0}, {-1, -2, -3, kNaN, -5, -6, -7}};
  const DeviceTensor x_t = make_f32(*backend, padded(x, 1000.0f), {2, kStride});
  auto pooled = [&](Backend::Pool pool, int64_t kernel) {
    DeviceTensor out =
        make_f32(*backend, std::vector<float>(size_t(2 * kStride), kSentinel), {2, kStride});
    backend->pool_rows(x_t, kCols, pool, kernel, out);
    const std::vector<float> got = read_f32(*backend, out);
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t j = kCols; j < kStride; ++j) CHECK(got[size_t(r * kStride + j)] == kSentinel);
    return got;
  };
  auto row = [](const std::vector<float>& got, int64_t r) {
    return std::vector<float>(got.begin() + r * kStride, got.begin() + r * kStride + kCols);
  };
  // Kernel 1 copies (max and average alike).
  std::vector<float> got = pooled(Backend::Pool::Max, 1);
  CHECK(row(got, 0) == x[0]);
  got = pooled(Backend::Pool::Average, 1);
  CHECK(row(got, 0) == x[0]);
  // Max over 3: the sentinel 1000 past cols is padding, never read. NaN is skipped (fmax).
  got = pooled(Backend::Pool::Max, 3);
  CHECK(row(got, 0) == std::vector<float>{5, 5, 5, 3, 3, 3, 0});
  CHECK(row(got, 1) == std::vector<float>{-1, -1, -2, -3, -5, -5, -6});
  // Average over 3: the in-range values summed left to right, divided by 3 (padding counts 0).
  got = pooled(Backend::Pool::Average, 3);
  CHECK(row(got, 0) == std::vector<float>{6.0f / 3, 8.0f / 3, 7.0f / 3, 5.0f / 3, 1, 1, 0});
  CHECK(std::isnan(got[size_t(kStride + 2)]));  // a NaN in the window of an average stays NaN
  CHECK(got[size_t(kStride)] == -3.0f / 3);
  // A kernel wider than the row: max of everything; average of everything / 9.
  got = pooled(Backend::Pool::Max, 9);
  CHECK(row(got, 0) == std::vector<float>{5, 5, 5, 5, 5, 5, 3});  // 6 sees columns 2..6
  got = pooled(Backend::Pool::Average, 15);
  CHECK(got[3] == 11.0f / 15);
  // Even or non-positive kernels, and out aliasing x, are refused.
  DeviceTensor out = backend->alloc(DType::F32, {2, kStride});
  CHECK_THROWS_AS(backend->pool_rows(x_t, kCols, Backend::Pool::Max, 4, out), Error);
  CHECK_THROWS_AS(backend->pool_rows(x_t, kCols, Backend::Pool::Max, 0, out), Error);
  DeviceTensor same = x_t;
  CHECK_THROWS_AS(backend->pool_rows(x_t, kCols, Backend::Pool::Max, 3, same), Error);
  DeviceTensor wrong_rows = backend->alloc(DType::F32, {3, kStride});
  CHECK_THROWS_AS(backend->pool_rows(x_t, kCols, Backend::Pool::Max, 3, wrong_rows), Error);
}

namespace {

// key_anchor_scores in double: anchor = mean of the member keys normalised, -cos to it.
std::vector<double> reference_anchor_scores(const std::vector<float>& keys, int64_t capacity,
                                            int64_t head_dim, int64_t kv, int64_t cols,
                                            const std::vector<uint8_t>& member_row) {
  auto key = [&](int64_t j, int64_t d) {
    return double(keys[size_t((kv * capacity + j) * head_dim + d)]);
  };
  auto norm_of = [&](int64_t j) {
    double sq = 0.0;
    for (int64_t d = 0; d < head_dim; ++d) sq += key(j, d) * key(j, d);
    return std::max(std::sqrt(sq), 1e-12);
  };
  std::vector<double> anchor(size_t(head_dim), 0.0);
  int64_t count = 0;
  for (int64_t j = 0; j < cols; ++j) {
    if (!member_row[size_t(j)]) continue;
    for (int64_t d = 0; d < head_dim; ++d) anchor[size_t(d)] += key(j, d) / norm_of(j);
    ++count;
  }
  double anchor_norm = 0.0;
  for (double& a : anchor) {
    if (count) a /= double(count);
    anchor_norm += a * a;
  }
  anchor_norm = std::max(std::sqrt(anchor_norm), 1e-12);
  std::vector<double> scores(static_cast<size_t>(cols));
  for (int64_t j = 0; j < cols; ++j) {
    double dot = 0.0;
    for (int64_t d = 0; d < head_dim; ++d) dot += key(j, d) * anchor[size_t(d)];
    scores[size_t(j)] = -dot / (norm_of(j) * anchor_norm);
  }
  return scores;
}

}  // namespace

TEST_CASE("key_anchor_scores: -cos to the mean normalised member key, per KV head",
          "[policy_ops]") {
  auto backend = make_cpu_backend(2);
  SECTION("hand cases") {
    // KV head 0: e1, 2 e1, e2, 3 e3, (1, 1, 0, 0), zero, -e1; KV head 1: e4 everywhere.
    std::vector<float> keys(size_t(G * kStride * D), 0.0f);
    auto set = [&](int64_t g, int64_t j, std::vector<float> k) {
      for (int64_t d = 0; d < D; ++d) keys[size_t((g * kStride + j) * D + d)] = k[size_t(d)];
    };
    set(0, 0, {1, 0, 0, 0});
    set(0, 1, {2, 0, 0, 0});
    set(0, 2, {0, 1, 0, 0});
    set(0, 3, {0, 0, 3, 0});
    set(0, 4, {1, 1, 0, 0});
    set(0, 6, {-1, 0, 0, 0});
    for (int64_t j = 0; j < kStride; ++j) set(1, j, {0, 0, 0, 1});
    const DeviceTensor k = make_f32(*backend, keys, {G, kStride, D});
    // Rows 0, 1 read KV head 0, rows 2, 3 KV head 1. Row 0: only token 3 is a member -> anchor
    // e3. Row 1: no member -> zero anchor, scores 0. Rows 2, 3: all members.
    const std::vector<std::vector<uint8_t>> members = {
        {0, 0, 0, 1, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 1, 1}, {1, 0, 1, 0, 1, 0, 1}};
    const DeviceTensor m = make_u8(*backend, padded(members, 1), {H, kStride});
    DeviceTensor out =
        make_f32(*backend, std::vector<float>(size_t(H * kStride), kSentinel), {H, kStride});
    keydiff_ops(*backend).key_anchor_scores(k, kCols, m, out);
    const std::vector<float> got = read_f32(*backend, out);
    CHECK(std::vector<float>(got.begin(), got.begin() + kCols) ==
          std::vector<float>{0, 0, 0, -1, 0, 0, 0});  // -0 == 0
    for (int64_t j = 0; j < kCols; ++j) CHECK(got[size_t(kStride + j)] == 0.0f);
    for (int64_t r = 2; r < H; ++r)
      for (int64_t j = 0; j < kCols; ++j) CHECK(got[size_t(r * kStride + j)] == -1.0f);
    for (int64_t r = 0; r < H; ++r)
      for (int64_t j = kCols; j < kStride; ++j) CHECK(got[size_t(r * kStride + j)] == kSentinel);

    // G rows (one per KV head), every member of KV head 0: anchor (1.707, 1.707, 1, 0) / 7 (the
    // zero key counts as a zero vector); against the double reference.
    const std::vector<std::vector<uint8_t>> all = {std::vector<uint8_t>(kCols, 1),
                                                   std::vector<uint8_t>(kCols, 1)};
    const DeviceTensor m2 = make_u8(*backend, padded(all, 0), {G, kStride});
    DeviceTensor out2 = backend->alloc(DType::F32, {G, kStride});
    keydiff_ops(*backend).key_anchor_scores(k, kCols, m2, out2);
    const std::vector<float> got2 = read_f32(*backend, out2);
    const std::vector<double> want =
        reference_anchor_scores(keys, kStride, D, 0, kCols, std::vector<uint8_t>(kCols, 1));
    for (int64_t j = 0; j < kCols; ++j)
      CHECK(got2[size_t(j)] == Approx(want[size_t(j)]).margin(1e-6));
    CHECK(want[0] ==
          Approx(-1.7071067811865475 / std::sqrt(2 * 1.7071067811865475 * 1.7071067811865475 + 1)));
    CHECK(got2[5] == 0.0f);  // the zero key
  }

  SECTION("random keys sharing a direction match the double reference within 1e-6") {
    const int64_t groups = 2, rows = 6, capacity = 1100, cols = 1001, head_dim = 64;
    std::vector<float> keys = random_values(size_t(groups * capacity * head_dim), 91);
    const std::vector<float> mean = random_values(size_t(head_dim), 92);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] += mean[i % size_t(head_dim)];
    std::mt19937 rng(93);
    std::vector<uint8_t> members(size_t(rows * capacity));
    for (auto& v : members) v = uint8_t(rng() % 3 != 0);
    const DeviceTensor k = make_f32(*backend, keys, {groups, capacity, head_dim});
    const DeviceTensor m = make_u8(*backend, members, {rows, capacity});
    DeviceTensor out = backend->alloc(DType::F32, {rows, capacity});
    keydiff_ops(*backend).key_anchor_scores(k, cols, m, out);
    const std::vector<float> got = read_f32(*backend, out);
    double worst = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<uint8_t> row(members.begin() + r * capacity,
                                     members.begin() + r * capacity + cols);
      const std::vector<double> want =
          reference_anchor_scores(keys, capacity, head_dim, r / (rows / groups), cols, row);
      for (int64_t j = 0; j < cols; ++j)
        worst = std::max(worst, std::fabs(double(got[size_t(r * capacity + j)]) - want[size_t(j)]));
    }
    INFO("worst error " << worst);
    CHECK(worst < 1e-6);
  }

  SECTION("rows repeating the row before them get the bits of that row computed alone") {
    // Groups of 4 rows with member patterns a b b a and c c c c: the op computes each distinct
    // run of rows once and copies it; every row must equal the same members in a group of one.
    const int64_t groups = 2, rows = 8, capacity = 80, cols = 77, head_dim = 16;
    const std::vector<float> keys = random_values(size_t(groups * capacity * head_dim), 94);
    std::mt19937 rng(95);
    auto random_members = [&] {
      std::vector<uint8_t> row(size_t(capacity), 0);
      for (int64_t j = 0; j < cols; ++j) row[size_t(j)] = uint8_t(rng() % 2);
      return row;
    };
    const std::vector<uint8_t> a = random_members(), b = random_members(), c = random_members();
    std::vector<uint8_t> members;
    for (const auto* row : {&a, &b, &b, &a, &c, &c, &c, &c})
      members.insert(members.end(), row->begin(), row->end());
    const DeviceTensor k = make_f32(*backend, keys, {groups, capacity, head_dim});
    DeviceTensor out = backend->alloc(DType::F32, {rows, capacity});
    keydiff_ops(*backend).key_anchor_scores(k, cols, make_u8(*backend, members, {rows, capacity}),
                                            out);
    const std::vector<float> got = read_f32(*backend, out);
    for (int64_t r = 0; r < rows; ++r) {
      // The same KV head's keys alone (G = 1) with this row's members alone.
      const int64_t g = r / 4;
      const std::vector<float> own_keys(keys.begin() + g * capacity * head_dim,
                                        keys.begin() + (g + 1) * capacity * head_dim);
      const std::vector<uint8_t> own_members(members.begin() + r * capacity,
                                             members.begin() + (r + 1) * capacity);
      DeviceTensor alone = backend->alloc(DType::F32, {1, capacity});
      keydiff_ops(*backend).key_anchor_scores(make_f32(*backend, own_keys, {1, capacity, head_dim}),
                                              cols, make_u8(*backend, own_members, {1, capacity}),
                                              alone);
      const std::vector<float> want = read_f32(*backend, alone);
      INFO("row " << r);
      CHECK(std::vector<float>(got.begin() + r * capacity, got.begin() + r * capacity + cols) ==
            std::vector<float>(want.begin(), want.begin() + cols));
    }
  }

  SECTION("members of one row per KV head give the scores of those rows expanded") {
    const int64_t groups = 2, rows = 8, capacity = 80, cols = 77, head_dim = 16;
    const std::vector<float> keys = random_values(size_t(groups * capacity * head_dim), 96);
    std::mt19937 rng(97);
    std::vector<uint8_t> per_group(size_t(groups * capacity), 9);  // past cols: never read
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t j = 0; j < cols; ++j) per_group[size_t(g * capacity + j)] = uint8_t(rng() % 2);
    std::vector<uint8_t> expanded;
    for (int64_t r = 0; r < rows; ++r) {
      const auto row = per_group.begin() + (r / (rows / groups)) * capacity;
      expanded.insert(expanded.end(), row, row + capacity);
    }
    const DeviceTensor k = make_f32(*backend, keys, {groups, capacity, head_dim});
    DeviceTensor want = backend->alloc(DType::F32, {rows, capacity});
    DeviceTensor got = backend->alloc(DType::F32, {rows, capacity});
    keydiff_ops(*backend).key_anchor_scores(k, cols, make_u8(*backend, expanded, {rows, capacity}),
                                            want);
    keydiff_ops(*backend).key_anchor_scores(k, cols,
                                            make_u8(*backend, per_group, {groups, capacity}), got);
    CHECK(read_f32(*backend, got) == read_f32(*backend, want));
  }

  SECTION("bad shapes are errors") {
    const DeviceTensor k = backend->alloc(DType::F32, {G, kStride, D});
    DeviceTensor out = backend->alloc(DType::F32, {3, kStride});  // not a multiple of G
    const DeviceTensor m3 = backend->alloc(DType::U8, {3, kStride});
    CHECK_THROWS_AS(keydiff_ops(*backend).key_anchor_scores(k, kCols, m3, out), Error);
    DeviceTensor ok = backend->alloc(DType::F32, {H, kStride});
    const DeviceTensor m_wrong = backend->alloc(DType::U8, {G + 1, kStride});  // neither H nor G
    CHECK_THROWS_AS(keydiff_ops(*backend).key_anchor_scores(k, kCols, m_wrong, ok), Error);
    const DeviceTensor m = backend->alloc(DType::U8, {H, kStride});
    CHECK_THROWS_AS(keydiff_ops(*backend).key_anchor_scores(k, kStride + 1, m, ok), Error);
  }
}

namespace {

// Page summaries [G, pages, D] filled with the sentinel.
DeviceTensor sentinel_pages(Backend& backend, int64_t pages) {
  return make_f32(backend, std::vector<float>(size_t(G * pages * D), kSentinel), {G, pages, D});
}

// Channel-wise min and max of keys[g][j0..j1) (a [G, kStride, D] host cache), for reference.
std::pair<std::vector<float>, std::vector<float>> reference_page(const std::vector<float>& keys,
                                                                 int64_t g, int64_t j0,
                                                                 int64_t j1) {
  std::vector<float> lo(size_t(D), INFINITY), hi(size_t(D), -INFINITY);
  for (int64_t j = j0; j < j1; ++j)
    for (int64_t d = 0; d < D; ++d) {
      const float k = keys[size_t((g * kStride + j) * D + d)];
      lo[size_t(d)] = std::min(lo[size_t(d)], k);
      hi[size_t(d)] = std::max(hi[size_t(d)], k);
    }
  return {lo, hi};
}

}  // namespace

TEST_CASE("page_minmax_update: channel-wise key min and max per page, grown step by step",
          "[policy_ops]") {
  auto backend = make_cpu_backend(2);
  // KV head 0 by hand; KV head 1 seeded random values. Pages of 3: {0, 1, 2}, {3, 4, 5}, {6}.
  std::vector<float> keys = random_values(size_t(G * kStride * D), 41);
  const std::vector<std::vector<float>> head0 = {{1, -2, 0, 5}, {3, -1, 0, 4}, {2, -3, 1, 6},
                                                 {-1, 0, 2, 0}, {0, 0, -2, 1}, {4, 1, 0, 2},
                                                 {5, 5, 5, 5}};
  for (size_t j = 0; j < head0.size(); ++j)
    for (size_t d = 0; d < size_t(D); ++d) keys[j * size_t(D) + d] = head0[j][d];
  const DeviceTensor k = make_f32(*backend, keys, {G, kStride, D});
  constexpr int64_t kPages = 4, kPageSize = 3;

  DeviceTensor lo = sentinel_pages(*backend, kPages), hi = sentinel_pages(*backend, kPages);
  quest_ops(*backend).page_minmax_update(k, 0, kCols, kPageSize, lo, hi);
  const std::vector<float> got_lo = read_f32(*backend, lo), got_hi = read_f32(*backend, hi);
  auto page = [&](const std::vector<float>& values, int64_t g, int64_t p) {
    return std::vector<float>(values.begin() + (g * kPages + p) * D,
                              values.begin() + (g * kPages + p + 1) * D);
  };
  CHECK(page(got_lo, 0, 0) == std::vector<float>{1, -3, 0, 4});
  CHECK(page(got_hi, 0, 0) == std::vector<float>{3, -1, 1, 6});
  CHECK(page(got_lo, 0, 1) == std::vector<float>{-1, 0, -2, 0});
  CHECK(page(got_hi, 0, 1) == std::vector<float>{4, 1, 2, 2});
  CHECK(page(got_lo, 0, 2) == std::vector<float>{5, 5, 5, 5});
  CHECK(page(got_hi, 0, 2) == std::vector<float>{5, 5, 5, 5});
  for (int64_t p = 0; p < 3; ++p) {
    const auto [want_lo, want_hi] = reference_page(keys, 1, p * 3, std::min<int64_t>(p * 3 + 3, 7));
    CHECK(page(got_lo, 1, p) == want_lo);
    CHECK(page(got_hi, 1, p) == want_hi);
  }
  for (int64_t g = 0; g < G; ++g) {  // page 3 holds no candidate: untouched
    CHECK(page(got_lo, g, 3) == std::vector<float>(size_t(D), kSentinel));
    CHECK(page(got_hi, g, 3) == std::vector<float>(size_t(D), kSentinel));
  }

  // Step by step: [0, 4) then [4, 7). The second call recomputes page 1 from its first column,
  // so the result equals one call over [0, 7); a call touches only the pages it intersects.
  DeviceTensor lo2 = sentinel_pages(*backend, kPages), hi2 = sentinel_pages(*backend, kPages);
  quest_ops(*backend).page_minmax_update(k, 0, 4, kPageSize, lo2, hi2);
  CHECK(page(read_f32(*backend, lo2), 0, 1) == std::vector<float>{-1, 0, 2, 0});  // column 3 only
  CHECK(page(read_f32(*backend, lo2), 0, 2) == std::vector<float>(size_t(D), kSentinel));
  quest_ops(*backend).page_minmax_update(k, 4, kCols, kPageSize, lo2, hi2);
  CHECK(read_f32(*backend, lo2) == got_lo);
  CHECK(read_f32(*backend, hi2) == got_hi);
  DeviceTensor lo3 = sentinel_pages(*backend, kPages), hi3 = sentinel_pages(*backend, kPages);
  quest_ops(*backend).page_minmax_update(k, 6, kCols, kPageSize, lo3, hi3);
  CHECK(page(read_f32(*backend, lo3), 0, 1) == std::vector<float>(size_t(D), kSentinel));
  CHECK(page(read_f32(*backend, lo3), 0, 2) == std::vector<float>{5, 5, 5, 5});
  quest_ops(*backend).page_minmax_update(k, 3, 3, kPageSize, lo3, hi3);  // an empty range: nothing
  CHECK(page(read_f32(*backend, lo3), 0, 1) == std::vector<float>(size_t(D), kSentinel));

  // Errors: a range past the capacity, too few pages, page size 0, another G or D.
  CHECK_THROWS_AS(quest_ops(*backend).page_minmax_update(k, 0, kStride + 1, 4, lo, hi), Error);
  DeviceTensor few = sentinel_pages(*backend, 2);
  CHECK_THROWS_AS(quest_ops(*backend).page_minmax_update(k, 0, kCols, kPageSize, few, few), Error);
  CHECK_THROWS_AS(quest_ops(*backend).page_minmax_update(k, 0, kCols, 0, lo, hi), Error);
  DeviceTensor wrong = backend->alloc(DType::F32, {1, kPages, D});
  CHECK_THROWS_AS(quest_ops(*backend).page_minmax_update(k, 0, kCols, kPageSize, wrong, wrong),
                  Error);
  CHECK_THROWS_AS(quest_ops(*backend).page_minmax_update(k, 0, kCols, kPageSize, lo, few), Error);
}

TEST_CASE("page_bounds over many pages is page_bound's arithmetic bit for bit", "[policy_ops]") {
  // 21 pages: the CPU computes pages eight at a time (interleaved sums) and the rest one by one;
  // every page must equal the shared page_bound (CUDA's arithmetic too), in both modes.
  auto backend = make_cpu_backend(2);
  constexpr int64_t kHeads = 4, kGroups = 2, kDim = 20, kPages = 21, kPageSize = 2;
  constexpr int64_t kColumns = kPages * kPageSize - 1, kRowStride = kPages * kPageSize + 3;
  const std::vector<float> q = random_values(size_t(kHeads * kDim), 61);
  std::vector<float> lo = random_values(size_t(kGroups * kPages * kDim), 62), hi = lo;
  const std::vector<float> spread = random_values(size_t(kGroups * kPages * kDim), 63);
  for (size_t i = 0; i < hi.size(); ++i) hi[i] += std::fabs(spread[i]);
  const DeviceTensor q_t = make_f32(*backend, q, {1, kHeads, kDim});
  const DeviceTensor lo_t = make_f32(*backend, lo, {kGroups, kPages, kDim});
  const DeviceTensor hi_t = make_f32(*backend, hi, {kGroups, kPages, kDim});
  const float scale = attention_scale(kDim);
  for (const bool max_only : {false, true}) {
    DeviceTensor out = make_f32(
        *backend, std::vector<float>(size_t(kHeads * kRowStride), kSentinel), {kHeads, kRowStride});
    quest_ops(*backend).page_bounds(q_t, lo_t, hi_t, kColumns, kPageSize, max_only, out);
    const std::vector<float> got = read_f32(*backend, out);
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t base = (h / (kHeads / kGroups)) * kPages * kDim;
      for (int64_t j = 0; j < kRowStride; ++j) {
        INFO("max_only " << max_only << " head " << h << " column " << j);
        const float value = got[size_t(h * kRowStride + j)];
        if (j >= kColumns) {
          CHECK(value == kSentinel);
          continue;
        }
        const int64_t p = j / kPageSize;
        const float want = page_bound(q.data() + h * kDim, lo.data() + base + p * kDim,
                                      hi.data() + base + p * kDim, kDim, max_only, scale);
        CHECK(std::bit_cast<uint32_t>(value) == std::bit_cast<uint32_t>(want));
      }
    }
  }
}

TEST_CASE("page_bounds: Quest's bound and the max_only bound on the logit scale", "[policy_ops]") {
  auto backend = make_cpu_backend(2);
  constexpr int64_t kPages = 3, kPageSize = 3;  // columns {0, 1, 2}, {3, 4, 5}, {6}
  // Head 0 and KV head 0's page 0 by hand: q = (1, -1, 0.5, 0), min (-1, -2, 0, 1),
  // max (2, 1, 4, 3). Quest: max(-1, 2) + max(2, -1) + max(0, 2) + max(0, 0) = 6; max_only:
  // 2 + 1 + 2 + 0 = 5; both times 1/sqrt(4).
  std::vector<float> q = random_values(size_t(H * D), 51);
  std::vector<float> lo = random_values(size_t(G * kPages * D), 52);
  std::vector<float> hi = lo;
  const std::vector<float> spread = random_values(size_t(G * kPages * D), 53);
  for (size_t i = 0; i < hi.size(); ++i) hi[i] += std::fabs(spread[i]);
  const std::vector<float> q0 = {1, -1, 0.5f, 0}, lo0 = {-1, -2, 0, 1}, hi0 = {2, 1, 4, 3};
  std::copy(q0.begin(), q0.end(), q.begin());
  std::copy(lo0.begin(), lo0.end(), lo.begin());
  std::copy(hi0.begin(), hi0.end(), hi.begin());
  const DeviceTensor q_t = make_f32(*backend, q, {1, H, D});
  const DeviceTensor lo_t = make_f32(*backend, lo, {G, kPages, D});
  const DeviceTensor hi_t = make_f32(*backend, hi, {G, kPages, D});

  for (const bool max_only : {false, true}) {
    INFO("max_only " << max_only);
    DeviceTensor out =
        make_f32(*backend, std::vector<float>(size_t(H * kStride), kSentinel), {H, kStride});
    quest_ops(*backend).page_bounds(q_t, lo_t, hi_t, kCols, kPageSize, max_only, out);
    const std::vector<float> got = read_f32(*backend, out);
    for (int64_t j = 0; j < 3; ++j) CHECK(got[size_t(j)] == (max_only ? 2.5f : 3.0f));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t j = 0; j < kStride; ++j) {
        const float value = got[size_t(h * kStride + j)];
        if (j >= kCols) {
          CHECK(value == kSentinel);
          continue;
        }
        const int64_t p = j / kPageSize;
        double bound = 0.0;
        for (int64_t d = 0; d < D; ++d) {
          const double qd = q[size_t(h * D + d)], mn = lo[size_t((g * kPages + p) * D + d)],
                       mx = hi[size_t((g * kPages + p) * D + d)];
          bound += max_only ? std::fabs(qd) * mx : std::max(qd * mn, qd * mx);
        }
        CHECK(value == Approx(bound / 2.0).margin(1e-6));
      }
    }
  }

  // Errors: pages that do not cover the columns, G not dividing H, another D.
  DeviceTensor out = backend->alloc(DType::F32, {H, kStride});
  CHECK_THROWS_AS(quest_ops(*backend).page_bounds(q_t, lo_t, hi_t, kCols, 2, false, out), Error);
  const DeviceTensor three = backend->alloc(DType::F32, {3, kPages, D});
  CHECK_THROWS_AS(quest_ops(*backend).page_bounds(q_t, three, three, kCols, kPageSize, false, out),
                  Error);
  const DeviceTensor wide = backend->alloc(DType::F32, {G, kPages, D + 1});
  CHECK_THROWS_AS(quest_ops(*backend).page_bounds(q_t, wide, wide, kCols, kPageSize, false, out),
                  Error);
  DeviceTensor short_rows = backend->alloc(DType::F32, {H, 5});
  CHECK_THROWS_AS(
      quest_ops(*backend).page_bounds(q_t, lo_t, hi_t, kCols, kPageSize, false, short_rows), Error);
}

TEST_CASE("select_pages: whole pages best first while they fit, forced columns kept",
          "[policy_ops]") {
  auto backend = make_cpu_backend(2);
  // Pages of 3: {0, 1, 2}, {3, 4, 5}, {6}.
  const std::vector<float> ranked = {1, 5, 2, 3, 3, 3, 4};  // page bests 5, 3, 4
  const std::vector<std::vector<float>> scores = {
      ranked, ranked, std::vector<float>(size_t(kCols), 0.0f), {kNaN, kNaN, kNaN, 1, 1, 1, 0}};
  const DeviceTensor s = make_f32(*backend, padded(scores, kSentinel), {H, kStride});
  auto run = [&](const std::vector<std::vector<uint8_t>>& forced, int64_t k) {
    DeviceTensor selected = make_u8(*backend, padded(forced, kMaskSentinel), {H, kStride});
    backend->select_pages(s, kCols, 3, k, selected);
    const std::vector<uint8_t> got = read_u8(*backend, selected);
    std::vector<std::vector<uint8_t>> rows;
    for (int64_t r = 0; r < H; ++r) {
      rows.emplace_back(got.begin() + r * kStride, got.begin() + r * kStride + kCols);
      for (int64_t j = kCols; j < kStride; ++j)
        CHECK(got[size_t(r * kStride + j)] == kMaskSentinel);
    }
    return rows;
  };
  const std::vector<uint8_t> none(size_t(kCols), 0);
  const std::vector<std::vector<uint8_t>> forced = {
      none, {0, 0, 0, 0, 1, 0, 0}, none, {1, 0, 0, 0, 0, 0, 0}};
  const auto got = run(forced, 4);
  // Row 0: page 0 (best 5, cost 3), then page 2 (4, cost 1); page 1 no longer fits.
  CHECK(got[0] == std::vector<uint8_t>{1, 1, 1, 0, 0, 0, 1});
  // Row 1, k = 4 with column 4 forced: the same pages (costs 3 and 1), column 4 kept.
  CHECK(got[1] == std::vector<uint8_t>{1, 1, 1, 0, 1, 0, 1});
  // Row 2, all equal: the most recent page first (cost 1), then page 1 (3), 0 left.
  CHECK(got[2] == std::vector<uint8_t>{0, 0, 0, 1, 1, 1, 1});
  // Row 3: NaN ranks lowest: page 1 (3), page 2 (1), then page 0 (cost 2 with 0 forced) misfits.
  CHECK(got[3] == std::vector<uint8_t>{1, 0, 0, 1, 1, 1, 1});

  // k = 2: row 0's best page costs 3 and ends the choice at once, though page 2 (cost 1) would
  // fit; row 2 takes page 2 only.
  const auto tight = run(forced, 2);
  CHECK(tight[0] == none);
  CHECK(tight[1] == std::vector<uint8_t>{0, 0, 0, 0, 1, 0, 0});
  CHECK(tight[2] == std::vector<uint8_t>{0, 0, 0, 0, 0, 0, 1});
  // Enough for everything: every column; k = 0: nothing added.
  for (const auto& row : run(forced, 100)) CHECK(row == std::vector<uint8_t>(size_t(kCols), 1));
  CHECK(run(forced, 0) == forced);
  // A page fully forced costs nothing and takes no part: row 3 with page 1 forced, k = 1.
  const auto partial = run({none, none, none, {0, 0, 0, 1, 1, 1, 0}}, 1);
  CHECK(partial[3] == std::vector<uint8_t>{0, 0, 0, 1, 1, 1, 1});

  // Errors: page size 0, row counts that differ.
  DeviceTensor selected = backend->alloc(DType::U8, {H, kStride});
  CHECK_THROWS_AS(backend->select_pages(s, kCols, 0, 2, selected), Error);
  DeviceTensor two_rows = backend->alloc(DType::U8, {2, kStride});
  CHECK_THROWS_AS(backend->select_pages(s, kCols, 3, 2, two_rows), Error);
}

TEST_CASE("select_pages: many pages follow the greedy rule of a sorting reference",
          "[policy_ops]") {
  // Up to 128 pages are ordered by counting, more by sorting: both against the rule itself.
  auto backend = make_cpu_backend(1);
  std::mt19937 rng(5);
  for (const int64_t cols : {5, 200, 1000}) {
    for (const int64_t page_size : {1, 3, 16}) {
      const int64_t rows = 3, stride = cols + 3;
      std::vector<float> scores(size_t(rows * stride), 1e9f);
      std::vector<uint8_t> forced(size_t(rows * stride), kMaskSentinel);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) {
          const uint32_t u = rng() % 16;
          scores[size_t(r * stride + j)] = u == 0 ? kNaN : float(int(rng() % 7)) * 0.5f;
          forced[size_t(r * stride + j)] = uint8_t(rng() % 5 == 0);
        }
      const DeviceTensor s = make_f32(*backend, scores, {rows, stride});
      for (const int64_t k : {int64_t(1), int64_t(10), cols / 3, cols}) {
        std::vector<uint8_t> want = forced;
        for (int64_t r = 0; r < rows; ++r) {
          struct Page {
            uint64_t key;
            int64_t first, cost;
          };
          std::vector<Page> pages;
          for (int64_t j0 = 0, p = 0; j0 < cols; j0 += page_size, ++p) {
            float best = scores[size_t(r * stride + j0)];
            int64_t cost = 0;
            for (int64_t j = j0; j < std::min(j0 + page_size, cols); ++j) {
              best = std::fmax(best, scores[size_t(r * stride + j)]);
              cost += forced[size_t(r * stride + j)] == 0;
            }
            if (cost > 0) pages.push_back({top_k_key(best, uint32_t(p)), j0, cost});
          }
          std::sort(pages.begin(), pages.end(),
                    [](const Page& a, const Page& b) { return a.key > b.key; });
          int64_t remaining = k;
          for (const Page& page : pages) {
            if (page.cost > remaining) break;
            remaining -= page.cost;
            for (int64_t j = page.first; j < std::min(page.first + page_size, cols); ++j)
              want[size_t(r * stride + j)] = 1;
          }
        }
        DeviceTensor selected = make_u8(*backend, forced, {rows, stride});
        backend->select_pages(s, cols, page_size, k, selected);
        INFO("cols " << cols << " page size " << page_size << " k " << k);
        CHECK(read_u8(*backend, selected) == want);
      }
    }
  }
}

TEST_CASE("anchor_cosine_update: cosine to the anchor, then the EMA step", "[policy_ops]") {
  auto backend = make_cpu_backend(1);
  std::vector<float> cache(size_t(G * kStride * D), 0.0f);
  auto set = [&](int64_t g, int64_t j, std::vector<float> x) {
    for (int64_t d = 0; d < D; ++d) cache[size_t((g * kStride + j) * D + d)] = x[size_t(d)];
  };
  set(0, 2, {3, 4, 0, 0});  // KV head 1 keeps a zero vector at column 2
  set(0, 3, {0, 0, 0, 2});
  set(1, 3, {1, 1, 0, 0});
  const DeviceTensor c = make_f32(*backend, cache, {G, kStride, D});
  DeviceTensor anchor = make_f32(*backend, {1, 0, 0, 0, 0, 1, 0, 0}, {G, D});
  DeviceTensor similarity = make_f32(*backend, {kSentinel, kSentinel}, {G});

  // Column 2, decay 0.5: cos((3, 4, 0, 0), e1) = 3/5; the zero vector gives 0. Anchors:
  // 0.5 e1 + 0.5 (3, 4, 0, 0) = (2, 2, 0, 0) and 0.5 e2 + 0 = (0, 0.5, 0, 0).
  tokenfilter_ops(*backend).anchor_cosine_update(c, 2, 0.5f, anchor, similarity);
  CHECK(read_f32(*backend, similarity) == std::vector<float>{0.6f, 0.0f});
  CHECK(read_f32(*backend, anchor) == std::vector<float>{2, 2, 0, 0, 0, 0.5f, 0, 0});
  // Column 3, decay 0: cos((0, 0, 0, 2), (2, 2, 0, 0)) = 0, cos((1, 1, 0, 0), (0, 0.5, 0, 0)) =
  // 1/sqrt(2); the anchors become the column's vectors exactly.
  tokenfilter_ops(*backend).anchor_cosine_update(c, 3, 0.0f, anchor, similarity);
  const std::vector<float> sim = read_f32(*backend, similarity);
  CHECK(sim[0] == 0.0f);
  CHECK(sim[1] == Approx(1.0 / std::sqrt(2.0)).margin(1e-7));
  CHECK(read_f32(*backend, anchor) == std::vector<float>{0, 0, 0, 2, 1, 1, 0, 0});
  // Decay 1 keeps the anchor; the similarity is still computed.
  tokenfilter_ops(*backend).anchor_cosine_update(c, 2, 1.0f, anchor, similarity);
  CHECK(read_f32(*backend, anchor) == std::vector<float>{0, 0, 0, 2, 1, 1, 0, 0});
  CHECK(read_f32(*backend, similarity) == std::vector<float>{0.0f, 0.0f});

  // Errors: a column past the capacity, another anchor shape, a similarity of another size.
  CHECK_THROWS_AS(
      tokenfilter_ops(*backend).anchor_cosine_update(c, kStride, 0.5f, anchor, similarity), Error);
  DeviceTensor wide = backend->alloc(DType::F32, {G, D + 1});
  CHECK_THROWS_AS(tokenfilter_ops(*backend).anchor_cosine_update(c, 2, 0.5f, wide, similarity),
                  Error);
  DeviceTensor three = backend->alloc(DType::F32, {3});
  CHECK_THROWS_AS(tokenfilter_ops(*backend).anchor_cosine_update(c, 2, 0.5f, anchor, three), Error);
}

TEST_CASE("token_filter_step: the rule by hand, the state it keeps, and its errors",
          "[policy_ops]") {
  auto backend = make_cpu_backend(1);
  double initial[kTokenFilterState] = {};
  initial[kTfTau] = 0.5;
  DeviceTensor state = backend->alloc(DType::U8, {int64_t(sizeof initial)});
  backend->from_host(state, initial, sizeof initial);
  DeviceTensor scores =
      make_f32(*backend, std::vector<float>(size_t(3 * kStride), 7.0f), {3, kStride});
  DeviceTensor keep = backend->alloc(DType::U8, {1, 1});
  auto read_state = [&] {
    double values[kTokenFilterState];
    backend->to_host(state, values, sizeof values);
    return std::vector<double>(values, values + kTokenFilterState);
  };
  // The first step: no similarity, no decision (kept), the threshold moves by eta * (0 - target).
  tokenfilter_ops(*backend).token_filter_step(nullptr, 0.1, 0.25, 0, state, scores, keep);
  CHECK(read_u8(*backend, keep) == std::vector<uint8_t>{1});
  std::vector<double> s = read_state();
  CHECK(s[kTfSteps] == 1.0);
  CHECK(s[kTfTau] == 0.5 + 0.1 * (0.0 - 0.25));
  CHECK(read_f32(*backend, scores)[0] == 7.0f);  // no score at the first step
  // Two KV heads, keys (0.9, 0.7), values (0.8, 0.8): s_k = 0.8, s_v = 0.8; the value variance
  // is 0, so alpha = 0.5 and S_kv = 0.8 > tau = 0.475: skipped; ratio 1/2, tau += 0.1 * 0.25.
  DeviceTensor similarity = make_f32(*backend, {0.9f, 0.7f, 0.8f, 0.8f}, {2, 2});
  tokenfilter_ops(*backend).token_filter_step(&similarity, 0.1, 0.25, 2, state, scores, keep);
  CHECK(read_u8(*backend, keep) == std::vector<uint8_t>{0});
  s = read_state();
  CHECK(s[kTfKeyCount] == 2.0);
  CHECK(s[kTfKeyMean] == Approx(0.8));
  CHECK(s[kTfKeyM2] == Approx(0.02));  // (0.1^2 + 0.1^2) around the mean 0.8
  CHECK(s[kTfValueM2] == 0.0);
  CHECK(s[kTfSkips] == 1.0);
  CHECK(s[kTfTau] == Approx(0.475 + 0.1 * (0.5 - 0.25)));
  const std::vector<float> written = read_f32(*backend, scores);
  const double s_k = (double(0.9f) + double(0.7f)) / 2.0, s_v = double(0.8f);
  for (int64_t r = 0; r < 3; ++r) {
    CHECK(written[size_t(r * kStride + 2)] == float(0.5 * s_k + 0.5 * s_v));
    CHECK(written[size_t(r * kStride + 1)] == 7.0f);  // other columns untouched
  }
  // Target 0 never skips, whatever the similarity.
  tokenfilter_ops(*backend).token_filter_step(&similarity, 0.1, 0.0, 3, state, scores, keep);
  CHECK(read_u8(*backend, keep) == std::vector<uint8_t>{1});

  // zero_unless: zeros where the gate is 0, untouched where it is 1.
  DeviceTensor rows = make_f32(*backend, {1.5f, -2.0f, 3.0f}, {1, 3});
  backend->zero_unless(rows, keep);
  CHECK(read_f32(*backend, rows) == std::vector<float>{1.5f, -2.0f, 3.0f});
  DeviceTensor closed = make_u8(*backend, {0}, {1, 1});
  backend->zero_unless(rows, closed);
  CHECK(read_f32(*backend, rows) == std::vector<float>{0.0f, 0.0f, 0.0f});

  // Errors: a state of another size, an odd similarity, a column past the scores, a U8 rows.
  DeviceTensor small = backend->alloc(DType::U8, {8});
  CHECK_THROWS_AS(
      tokenfilter_ops(*backend).token_filter_step(nullptr, 0.1, 0.2, 0, small, scores, keep),
      Error);
  DeviceTensor odd = make_f32(*backend, {0.1f, 0.2f, 0.3f}, {3});
  CHECK_THROWS_AS(
      tokenfilter_ops(*backend).token_filter_step(&odd, 0.1, 0.2, 0, state, scores, keep), Error);
  CHECK_THROWS_AS(
      tokenfilter_ops(*backend).token_filter_step(nullptr, 0.1, 0.2, kStride, state, scores, keep),
      Error);
  CHECK_THROWS_AS(backend->zero_unless(closed, keep), Error);
}
