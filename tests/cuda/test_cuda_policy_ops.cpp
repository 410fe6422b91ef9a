// The CUDA backend's token-selection (policy) ops beyond the op table (which compares every op
// with the CPU's: tests/support/backend_op_table.cpp): the GPU's own bit-equalities (the
// attention op's logits, probabilities without an output, per-group members), comparisons over
// sequences of calls on one mask (ranges, marks, kept sets), the deferred counts, keys that share
// a direction, quest's and tokenfilter's ops over runs of steps, and argument errors. Row buffers
// are [rows, stride] with stride > cols, and the columns past cols hold sentinels that must
// survive.
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
#include "engine/backend/policy_op_math.h"
#include "engine/common/error.h"
#include "engine/policy/keydiff_ops.h"
#include "engine/policy/magicpig_ops.h"
#include "engine/policy/quest_ops.h"
#include "engine/policy/tokenfilter_ops.h"
#include "kernels/cuda_backend.h"
#include "tests/support/backend_checks.h"
#include "tests/support/random_values.h"

using namespace kvlens;

namespace {

constexpr float kSentinel = 123.0f;

using kvlens::test::check_within;
using kvlens::test::random_values;

struct Backends {
  std::unique_ptr<Backend> cpu = make_cpu_backend(2);
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
};

// One logical tensor on both backends, filled with the same host values.
struct Pair {
  DeviceTensor cpu, gpu;
};

template <typename T>
Pair make_pair(Backends& b, const std::vector<T>& values, const std::vector<int64_t>& shape) {
  const DType dtype = sizeof(T) == 1 ? DType::U8 : DType::F32;
  Pair p{b.cpu->alloc(dtype, shape), b.gpu->alloc(dtype, shape)};
  REQUIRE(size_t(p.cpu.numel()) == values.size());
  b.cpu->from_host(p.cpu, values.data(), values.size() * sizeof(T));
  b.gpu->from_host(p.gpu, values.data(), values.size() * sizeof(T));
  return p;
}

template <typename T>
std::vector<T> read(Backend& backend, const DeviceTensor& t) {
  std::vector<T> values(size_t(t.numel()));
  backend.to_host(t, values.data(), values.size() * sizeof(T));
  return values;
}

// Both backends' copies of a tensor, read back.
template <typename T>
std::pair<std::vector<T>, std::vector<T>> read_both(Backends& b, const Pair& p) {
  return {read<T>(*b.cpu, p.cpu), read<T>(*b.gpu, p.gpu)};
}

// Identical values: the same bits (so -0 differs from +0), or both NaN (an x86 add keeps the
// NaN operand's payload, a GPU add returns the canonical NaN).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && !(std::isnan(a[i]) && std::isnan(b[i])))
      return false;
  return true;
}

struct Shape {
  int64_t heads, kv_heads, head_dim, stride, cols, window;
};

std::vector<uint8_t> random_mask(size_t count, uint32_t seed, unsigned one_in) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> mask(count);
  for (auto& m : mask) m = uint8_t(rng() % one_in == 0);
  return mask;
}

}  // namespace

// attention_logits and attention_visible against the CPU at these shapes: the op table's
// "attention_logits wide rows" and "attention_visible probs/out" entries. Here the GPU's own
// equalities: attention_logits gives the attention op's logits bit for bit and keeps the columns
// past cols, a head that sees nothing outputs zeros, probabilities without an output are those
// with one, and no output at all is an error.
TEST_CASE(
    "cuda policy ops: attention_logits is the attention op's logits, attention_visible's "
    "probabilities alone",
    "[cuda]") {
  Backends b;
  Backend& gpu = *b.gpu;
  uint32_t seed = 500;
  // 578 columns span three 256-key tiles; caches up to 1024 positions take attention_visible's
  // one-kernel path, wider ones its split over slices (the 1536-position shape).
  for (const Shape& s :
       {Shape{8, 2, 64, 600, 578, 0}, Shape{8, 2, 64, 600, 578, 100}, Shape{6, 1, 80, 40, 33, 0},
        Shape{4, 4, 16, 8, 1, 0}, Shape{8, 2, 64, 1536, 1301, 0}}) {
    INFO("H " << s.heads << " G " << s.kv_heads << " D " << s.head_dim << " cols " << s.cols
              << " window " << s.window);
    const int64_t H = s.heads, D = s.head_dim, position = s.cols - 1;
    const Pair q = make_pair(b, random_values(size_t(H * D), ++seed, 2.0f), {1, H, D});
    const Pair k = make_pair(b, random_values(size_t(s.kv_heads * s.stride * D), ++seed),
                             {s.kv_heads, s.stride, D});
    const Pair v = make_pair(b, random_values(size_t(s.kv_heads * s.stride * D), ++seed),
                             {s.kv_heads, s.stride, D});
    const std::vector<float> sentinels(size_t(H * s.stride), kSentinel);

    Pair logits = make_pair(b, sentinels, {H, s.stride});
    gpu.attention_logits(q.gpu, k.gpu, position, s.window, logits.gpu);
    const std::vector<float> got_logits = read<float>(gpu, logits.gpu);
    DeviceTensor dense_out = gpu.alloc(DType::F32, {1, H, D});
    DeviceTensor dense_logits = gpu.alloc(DType::F32, {1, H, s.cols});
    gpu.attention(q.gpu, k.gpu, v.gpu, position, s.window, {}, dense_out, &dense_logits);
    const std::vector<float> op_logits = read<float>(gpu, dense_logits);
    for (int64_t h = 0; h < H; ++h) {
      CHECK(same_bits(
          std::vector<float>(op_logits.begin() + h * s.cols, op_logits.begin() + (h + 1) * s.cols),
          std::vector<float>(got_logits.begin() + h * s.stride,
                             got_logits.begin() + h * s.stride + s.cols)));
      for (int64_t j = s.cols; j < s.stride; ++j)
        CHECK(got_logits[size_t(h * s.stride + j)] == kSentinel);
    }

    std::vector<uint8_t> mask = random_mask(size_t(H * s.stride), ++seed, 4);  // ~1/4 visible
    for (int64_t h = 0; h < H; ++h) mask[size_t(h * s.stride + position)] = 1;
    if (H > 1)  // head 1 sees nothing: zeros
      std::fill(mask.begin() + s.stride, mask.begin() + 2 * s.stride, uint8_t(0));
    const Pair visible = make_pair(b, mask, {H, s.stride});
    for (bool masked : {false, true}) {
      INFO("masked " << masked);
      Pair out = make_pair(b, std::vector<float>(size_t(H * D), kSentinel), {1, H, D});
      Pair probs = make_pair(b, sentinels, {H, s.stride});
      gpu.attention_visible(logits.gpu, s.cols, masked ? &visible.gpu : nullptr, v.gpu, out.gpu,
                            &probs.gpu);
      const std::vector<float> got_p = read<float>(gpu, probs.gpu);
      const std::vector<float> got_out = read<float>(gpu, out.gpu);
      if (masked && H > 1)
        for (int64_t d = 0; d < D; ++d) CHECK(got_out[size_t(D + d)] == 0.0f);
      // Without an output only the probabilities are computed: the same bits as with one.
      Pair probs_only = make_pair(b, sentinels, {H, s.stride});
      DeviceTensor no_output;
      gpu.attention_visible(logits.gpu, s.cols, masked ? &visible.gpu : nullptr, v.gpu, no_output,
                            &probs_only.gpu);
      CHECK(read<float>(gpu, probs_only.gpu) == got_p);
      CHECK_THROWS_AS(gpu.attention_visible(logits.gpu, s.cols, nullptr, v.gpu, no_output, nullptr),
                      Error);
    }
  }
}

// select_top_k and mark_and_select_top_k against the CPU (rows of 4100, 257, 7 and 1 columns;
// distinct, tied with NaN/+-inf/+-0, all-equal and probability scores; k from 0 past the
// columns, with and without eligibility, forced columns): the op table
// (tests/support/backend_op_table.cpp), which also runs every row op at rows of 1001 and 4100.

// One row long enough for the many-block select (Ada-KV's pooled top-k lays a layer's heads end to
// end): the same columns as the CPU's, with columns already selected, an eligibility mask, ties
// (scores on a coarse grid), NaN and infinities, and k from 1 past the candidates.
TEST_CASE("cuda policy ops: select_top_k of one long row", "[cuda]") {
  Backends b;
  uint32_t seed = 900;
  for (const int64_t cols : {int64_t(16384), int64_t(40001), int64_t(131100)}) {
    const int64_t stride = cols + 37;
    std::vector<float> scores = random_values(size_t(stride), ++seed);
    for (size_t j = 0; j < scores.size(); j += 3) scores[j] = std::round(scores[j] * 4.0f) / 4.0f;
    scores[5] = std::numeric_limits<float>::quiet_NaN();
    scores[6] = std::numeric_limits<float>::infinity();
    scores[7] = -std::numeric_limits<float>::infinity();
    scores[8] = -0.0f;
    const Pair score = make_pair(b, scores, {1, stride});
    const Pair eligible = make_pair(b, random_mask(size_t(stride), ++seed, 4), {1, stride});
    for (const bool with_eligible : {false, true}) {
      for (const int64_t k : {int64_t(1), int64_t(100), cols / 3, cols - 1, cols + 5}) {
        INFO("cols " << cols << " k " << k << " eligible " << with_eligible);
        std::vector<uint8_t> marks = random_mask(size_t(stride), ++seed, 9);  // ~1/9 chosen
        for (int64_t j = cols; j < stride; ++j) marks[size_t(j)] = 7;         // sentinels
        Pair selected = make_pair(b, marks, {1, stride});
        b.cpu->select_top_k(score.cpu, cols, with_eligible ? &eligible.cpu : nullptr, k,
                            selected.cpu);
        b.gpu->select_top_k(score.gpu, cols, with_eligible ? &eligible.gpu : nullptr, k,
                            selected.gpu);
        const auto [want, got] = read_both<uint8_t>(b, selected);
        CHECK(got == want);
        CHECK(std::count(got.begin() + cols, got.end(), uint8_t(7)) == stride - cols);
      }
    }
  }
}

TEST_CASE("cuda policy ops: mask ops over ranges, deferred counts and argument errors", "[cuda]") {
  Backends b;
  const int64_t H = 8, stride = 1030, cols = 1001;
  uint32_t seed = 700;

  // fill_columns, then mask_and with a random mask.
  Pair mask = make_pair(b, random_mask(size_t(H * stride), ++seed, 2), {H, stride});
  for (auto [begin, end, value] :
       {std::tuple{int64_t(0), cols, uint8_t(0)}, std::tuple{int64_t(0), int64_t(4), uint8_t(1)},
        std::tuple{int64_t(990), stride, uint8_t(1)},
        std::tuple{int64_t(500), int64_t(500), uint8_t(3)},
        std::tuple{int64_t(17), int64_t(300), uint8_t(5)}}) {
    b.cpu->fill_columns(mask.cpu, begin, end, value);
    b.gpu->fill_columns(mask.gpu, begin, end, value);
  }
  {
    const auto [want, got] = read_both<uint8_t>(b, mask);
    CHECK(got == want);
  }
  std::vector<uint8_t> other_values = random_mask(size_t(H * stride), ++seed, 2);
  const Pair other = make_pair(b, other_values, {H, stride});
  b.cpu->mask_and(mask.cpu, other.cpu, cols);
  b.gpu->mask_and(mask.gpu, other.gpu, cols);
  {
    const auto [want, got] = read_both<uint8_t>(b, mask);
    CHECK(got == want);
  }
  CHECK_THROWS_AS(b.gpu->fill_columns(mask.gpu, 0, stride + 1, 1), Error);
  // mark_columns: the GPU's one pass against the default's fills and mask_and (the CPU's), with
  // and without evictions, and ranges that meet, overlap nothing or cover every column.
  for (const auto& [ones_end, ones_begin, with_keep] :
       {std::tuple{int64_t(4), int64_t(990), true}, std::tuple{int64_t(0), cols, false},
        std::tuple{int64_t(4), int64_t(4), true}, std::tuple{cols, cols, false},
        std::tuple{int64_t(0), int64_t(0), true}}) {
    INFO("ones_end " << ones_end << " ones_begin " << ones_begin << " keep " << with_keep);
    b.cpu->mark_columns(mask.cpu, cols, ones_end, ones_begin, with_keep ? &other.cpu : nullptr);
    b.gpu->mark_columns(mask.gpu, cols, ones_end, ones_begin, with_keep ? &other.gpu : nullptr);
    const auto [want, got] = read_both<uint8_t>(b, mask);
    CHECK(got == want);
  }
  CHECK_THROWS_AS(b.gpu->mark_columns(mask.gpu, cols, cols + 1, cols, nullptr), Error);
  // keep_selected (an eviction policy's kept set after its selection): one pass against the
  // default's mask_and and fill_columns, sinks inside, at and past the columns.
  for (const int64_t sinks : {int64_t(0), int64_t(4), cols, stride}) {
    INFO("sinks " << sinks);
    Pair kept = make_pair(b, random_mask(size_t(H * stride), ++seed, 3), {H, stride});
    b.cpu->keep_selected(kept.cpu, other.cpu, cols, sinks);
    b.gpu->keep_selected(kept.gpu, other.gpu, cols, sinks);
    const auto [want, got] = read_both<uint8_t>(b, kept);
    CHECK(got == want);
  }
  {
    Pair kept = make_pair(b, random_mask(size_t(H * stride), ++seed, 3), {H, stride});
    const DeviceTensor short_rows = b.gpu->alloc(DType::U8, {H - 1, stride});
    CHECK_THROWS_AS(b.gpu->keep_selected(kept.gpu, short_rows, cols, 1), Error);
    CHECK_THROWS_AS(b.gpu->mark_and_select_top_k(kept.gpu, cols, &short_rows, 0, 0, 1, kept.gpu),
                    Error);
  }
  CHECK_THROWS_AS(b.gpu->mark_columns(mask.gpu, stride + 1, 0, 0, nullptr), Error);
  // count_nonzero_rows (counted on the GPU; the default reads the mask back), columns past cols
  // (set to 1 above) not counted.
  for (const int64_t counted : {cols, int64_t(0), int64_t(1), stride}) {
    std::vector<int64_t> want(static_cast<size_t>(H)), got(static_cast<size_t>(H));
    b.cpu->count_nonzero_rows(mask.cpu, counted, want);
    b.gpu->count_nonzero_rows(mask.gpu, counted, got);
    CHECK(got == want);
  }
  {
    std::vector<int64_t> wrong_rows(static_cast<size_t>(H + 1));
    CHECK_THROWS_AS(b.gpu->count_nonzero_rows(mask.gpu, cols, wrong_rows), Error);
    CHECK_THROWS_AS(b.gpu->count_nonzero_rows_deferred(mask.gpu, cols, wrong_rows), Error);
  }
  // The deferred counts (a step's, read back once at its end): nothing is written before
  // synchronize(), every call's counts after it, also past the backend's first buffer filling up
  // (4,800 counts: a larger buffer takes the rest, with no wait for the device in between, which
  // delivered the first buffer's counts early before).
  {
    const std::vector<int64_t> sentinel(static_cast<size_t>(H), -1);
    std::vector<std::vector<int64_t>> got(600, sentinel);
    std::vector<int64_t> want(static_cast<size_t>(H));
    for (size_t i = 0; i < got.size(); ++i)
      b.gpu->count_nonzero_rows_deferred(mask.gpu, int64_t(i) % (stride + 1), got[i]);
    CHECK(std::all_of(got.begin(), got.end(), [&](const auto& g) { return g == sentinel; }));
    b.gpu->synchronize();
    for (size_t i = 0; i < got.size(); ++i) {
      b.cpu->count_nonzero_rows(mask.cpu, int64_t(i) % (stride + 1), want);
      CHECK(got[i] == want);
    }
    std::vector<int64_t> later = sentinel;
    b.gpu->count_nonzero_rows_deferred(mask.gpu, cols, later);
    b.gpu->count_nonzero_rows(mask.gpu, cols, want);  // waits, but delivers nothing deferred
    CHECK(later == sentinel);
    b.gpu->synchronize();
    CHECK(later == want);
  }

  // accumulate_rows (onto NaN and inf), sum_row_groups (into wider rows) and expand_row_groups
  // against the CPU at these sizes: the op table.
  // random_rows against the CPU (the shared integer hash, extreme seeds and streams): the op
  // table.
}

TEST_CASE("cuda policy ops: pool_rows rejects an even kernel, key_anchor_scores", "[cuda]") {
  Backends b;
  const int64_t H = 8, G = 2, stride = 1030, cols = 1001;
  uint32_t seed = 803;  // past the three seeds the moved axpby_rows inputs took

  // axpby_rows (NaN and inf in y, broadcast rows) and pool_rows (kernels 1 to 2049) against the
  // CPU: the op table. Here pool_rows' error and key_anchor_scores on keys that share a direction.
  const Pair scores = make_pair(b, random_values(size_t(H * stride), ++seed), {H, stride});
  Pair scratch = make_pair(b, std::vector<float>(size_t(H * stride)), {H, stride});
  CHECK_THROWS_AS(b.gpu->pool_rows(scores.gpu, cols, Backend::Pool::Max, 4, scratch.gpu), Error);

  // key_anchor_scores: F32 sums in different orders (CPU: 8-lane dots and norms, anchors summed in
  // column order; GPU: dots and norms by lanes of 8 channels, anchors summed per lane over its
  // keys, then across the warp's keys, the warps and the row's segments). The keys share
  // a mean direction, as real keys do (that is why KeyDiff works), so the anchor's norm is of the
  // order of one normalised key rather than cancelling towards 0. The anchor sums n <= 1001 unit
  // vectors: a random-walk rounding error of about sqrt(n) * 2^-24 ~ 2e-6 relative on each side,
  // and the D-term dot products and norms add sqrt(D) * 2^-24 ~ 5e-7; a cosine is at most 1 in
  // size, so 1e-5 absolute keeps a margin of about 4. (The CPU against a double reference stays
  // below 1e-6 on the same kind of input: tests/unit.)
  for (const auto& [head_dim, rows] :
       {std::pair{int64_t(64), H}, std::pair{int64_t(128), G}, std::pair{int64_t(16), H}}) {
    INFO("D " << head_dim << " rows " << rows);
    std::vector<float> keys = random_values(size_t(G * stride * head_dim), ++seed);
    const std::vector<float> mean = random_values(size_t(head_dim), ++seed);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] += mean[i % size_t(head_dim)];
    for (int64_t d = 0; d < head_dim; ++d) keys[size_t(3 * head_dim + d)] = 0.0f;  // a zero key
    const Pair k = make_pair(b, keys, {G, stride, head_dim});
    std::vector<uint8_t> members = random_mask(size_t(rows * stride), ++seed, 3);
    for (auto& m : members) m = uint8_t(!m);                           // ~2/3 members
    std::fill(members.begin(), members.begin() + stride, uint8_t(0));  // row 0: no member
    const Pair m = make_pair(b, members, {rows, stride});
    // The GPU cuts a row into up to 8 segments of at least 64 columns (a cluster of blocks):
    // 1001 columns in 8, 130 in 3 (the last of 2 columns), a single column in one.
    for (const int64_t columns : {cols, int64_t(130), int64_t(1)}) {
      INFO("cols " << columns);
      Pair out = make_pair(b, std::vector<float>(size_t(rows * stride), kSentinel), {rows, stride});
      keydiff_ops(*b.cpu).key_anchor_scores(k.cpu, columns, m.cpu, out.cpu);
      keydiff_ops(*b.gpu).key_anchor_scores(k.gpu, columns, m.gpu, out.gpu);
      const auto [want, got] = read_both<float>(b, out);
      check_within(want, got, std::vector<double>(want.size(), 1e-5), "key_anchor_scores");
      for (int64_t j = 0; j < columns; ++j) CHECK(got[size_t(j)] == 0.0f);  // zero anchor
      CHECK(got[size_t(columns)] == kSentinel);
    }
    // Members of one row per KV head (as keydiff passes its kept rows): the GPU's bits of those
    // rows expanded to every query head.
    if (rows == H) {
      std::vector<uint8_t> per_group(size_t(G * stride));
      std::vector<uint8_t> expanded(size_t(H * stride));
      for (int64_t g = 0; g < G; ++g)
        std::copy_n(members.begin() + (g * (H / G) + 1) * stride, stride,
                    per_group.begin() + g * stride);
      for (int64_t r = 0; r < H; ++r)
        std::copy_n(per_group.begin() + (r / (H / G)) * stride, stride,
                    expanded.begin() + r * stride);
      const Pair m_group = make_pair(b, per_group, {G, stride});
      const Pair m_expanded = make_pair(b, expanded, {H, stride});
      Pair by_group = make_pair(b, std::vector<float>(size_t(H * stride)), {H, stride});
      Pair by_row = make_pair(b, std::vector<float>(size_t(H * stride)), {H, stride});
      keydiff_ops(*b.gpu).key_anchor_scores(k.gpu, cols, m_group.gpu, by_group.gpu);
      keydiff_ops(*b.gpu).key_anchor_scores(k.gpu, cols, m_expanded.gpu, by_row.gpu);
      CHECK(same_bits(read<float>(*b.gpu, by_group.gpu), read<float>(*b.gpu, by_row.gpu)));
    }
  }
}

TEST_CASE(
    "cuda policy ops: quest's page ops and tokenfilter's ops agree bit for bit, and their errors",
    "[cuda]") {
  Backends b;
  const int64_t H = 8, G = 2, stride = 1030, cols = 1001;
  uint32_t seed = 900;

  for (const int64_t head_dim : {int64_t(64), int64_t(16)}) {
    const Pair k =
        make_pair(b, random_values(size_t(G * stride * head_dim), ++seed), {G, stride, head_dim});
    const Pair q = make_pair(b, random_values(size_t(H * head_dim), ++seed), {1, H, head_dim});
    for (const int64_t page_size : {int64_t(16), int64_t(1), int64_t(7)}) {
      INFO("D " << head_dim << " page_size " << page_size);
      const int64_t pages = (stride + page_size - 1) / page_size;
      const std::vector<float> sentinels(size_t(G * pages * head_dim), kSentinel);
      Pair lo = make_pair(b, sentinels, {G, pages, head_dim});
      Pair hi = make_pair(b, sentinels, {G, pages, head_dim});
      // page_minmax_update: comparisons only, so identical; grown as a run grows it (a prompt
      // at once, then one column at a time), and pages past cols stay untouched.
      for (const auto& [begin, end] :
           {std::pair{int64_t(0), int64_t(900)}, std::pair{int64_t(900), int64_t(901)},
            std::pair{int64_t(901), cols}}) {
        quest_ops(*b.cpu).page_minmax_update(k.cpu, begin, end, page_size, lo.cpu, hi.cpu);
        quest_ops(*b.gpu).page_minmax_update(k.gpu, begin, end, page_size, lo.gpu, hi.gpu);
      }
      {
        const auto [want_lo, got_lo] = read_both<float>(b, lo);
        const auto [want_hi, got_hi] = read_both<float>(b, hi);
        CHECK(same_bits(got_lo, want_lo));
        CHECK(same_bits(got_hi, want_hi));
        CHECK(got_lo.back() == kSentinel);
      }
      // page_bounds: the shared page_bound arithmetic (explicit roundings) on both.
      for (const bool max_only : {false, true}) {
        INFO("max_only " << max_only);
        Pair out = make_pair(b, std::vector<float>(size_t(H * stride), kSentinel), {H, stride});
        quest_ops(*b.cpu).page_bounds(q.cpu, lo.cpu, hi.cpu, cols, page_size, max_only, out.cpu);
        quest_ops(*b.gpu).page_bounds(q.gpu, lo.gpu, hi.gpu, cols, page_size, max_only, out.gpu);
        const auto [want, got] = read_both<float>(b, out);
        CHECK(same_bits(got, want));
        CHECK(got[size_t(cols)] == kSentinel);
      }
    }
  }
  {
    const Pair q = make_pair(b, random_values(size_t(H * 16), ++seed), {1, H, 16});
    const Pair lo = make_pair(b, std::vector<float>(size_t(G * 10 * 16)), {G, 10, 16});
    Pair out = make_pair(b, std::vector<float>(size_t(H * stride)), {H, stride});
    CHECK_THROWS_AS(quest_ops(*b.gpu).page_bounds(q.gpu, lo.gpu, lo.gpu, cols, 16, false, out.gpu),
                    Error);
  }

  // select_pages against the CPU (page-constant scores with ties and NaN, noise; page sizes 1 to
  // 2000; k to 5000): the op table.

  // anchor_cosine_update: the shared cosine_similarity and EMA roundings, identical; a few
  // steps in a row, one KV head with a zero vector.
  for (const int64_t head_dim : {int64_t(128), int64_t(4)}) {
    const int64_t kv_heads = 8;
    std::vector<float> cache = random_values(size_t(kv_heads * stride * head_dim), ++seed);
    for (int64_t d = 0; d < head_dim; ++d) cache[size_t((3 * stride + 5) * head_dim + d)] = 0.0f;
    const Pair c = make_pair(b, cache, {kv_heads, stride, head_dim});
    Pair anchor =
        make_pair(b, std::vector<float>(size_t(kv_heads * head_dim)), {kv_heads, head_dim});
    Pair similarity = make_pair(b, std::vector<float>(size_t(kv_heads), kSentinel), {kv_heads});
    for (const auto& [column, decay] :
         {std::pair{int64_t(0), 0.0f}, std::pair{int64_t(5), 0.9f}, std::pair{int64_t(6), 0.9f},
          std::pair{int64_t(1000), 0.3f}}) {
      INFO("D " << head_dim << " column " << column);
      tokenfilter_ops(*b.cpu).anchor_cosine_update(c.cpu, column, decay, anchor.cpu,
                                                   similarity.cpu);
      tokenfilter_ops(*b.gpu).anchor_cosine_update(c.gpu, column, decay, anchor.gpu,
                                                   similarity.gpu);
      const auto [want_sim, got_sim] = read_both<float>(b, similarity);
      const auto [want_anchor, got_anchor] = read_both<float>(b, anchor);
      CHECK(same_bits(got_sim, want_sim));
      CHECK(same_bits(got_anchor, want_anchor));
    }
    CHECK_THROWS_AS(tokenfilter_ops(*b.gpu).anchor_cosine_update(c.gpu, stride, 0.5f, anchor.gpu,
                                                                 similarity.gpu),
                    Error);
  }

  // token_filter_step: the same double arithmetic (no fused multiply-adds on the device), so the
  // same state bits, gates and scores over a run of steps; zero_unless follows the gate.
  {
    const int64_t kv_heads = 8, rows = 32;
    double initial[kTokenFilterState] = {};
    initial[kTfTau] = 0.3;
    auto state_of = [&](Backend& backend) {
      DeviceTensor t = backend.alloc(DType::U8, {int64_t(sizeof initial)});
      backend.from_host(t, initial, sizeof initial);
      return t;
    };
    Pair state{state_of(*b.cpu), state_of(*b.gpu)};
    Pair scores = make_pair(b, std::vector<float>(size_t(rows * stride), 0.0f), {rows, stride});
    Pair keep{b.cpu->alloc(DType::U8, {1, 1}), b.gpu->alloc(DType::U8, {1, 1})};
    int64_t skipped = 0;
    for (int64_t step = 0; step < 40; ++step) {
      INFO("step " << step);
      std::vector<float> sims = random_values(size_t(2 * kv_heads), ++seed);
      for (float& x : sims) x = 0.5f + 0.5f * x;  // mostly positive, as cosines of neighbours
      const Pair similarity = make_pair(b, sims, {2, kv_heads});
      const double target = step < 30 ? 0.4 : 0.0;
      tokenfilter_ops(*b.cpu).token_filter_step(step == 0 ? nullptr : &similarity.cpu, 0.05, target,
                                                step, state.cpu, scores.cpu, keep.cpu);
      tokenfilter_ops(*b.gpu).token_filter_step(step == 0 ? nullptr : &similarity.gpu, 0.05, target,
                                                step, state.gpu, scores.gpu, keep.gpu);
      const auto [want_state, got_state] = read_both<uint8_t>(b, state);
      const auto [want_keep, got_keep] = read_both<uint8_t>(b, keep);
      const auto [want_scores, got_scores] = read_both<float>(b, scores);
      CHECK(got_state == want_state);
      CHECK(got_keep == want_keep);
      CHECK(same_bits(got_scores, want_scores));
      skipped += want_keep[0] == 0;
      Pair out = make_pair(b, random_values(64, ++seed), {1, 64});
      b.cpu->zero_unless(out.cpu, keep.cpu);
      b.gpu->zero_unless(out.gpu, keep.gpu);
      const auto [want_out, got_out] = read_both<float>(b, out);
      CHECK(same_bits(got_out, want_out));
    }
    CHECK(skipped > 0);  // the comparison covered both outcomes
    CHECK(skipped < 39);
    DeviceTensor small = b.gpu->alloc(DType::U8, {8});
    CHECK_THROWS_AS(tokenfilter_ops(*b.gpu).token_filter_step(nullptr, 0.1, 0.2, 0, small,
                                                              scores.gpu, keep.gpu),
                    Error);
  }
}

TEST_CASE("cuda policy ops: magicpig's hash and sample agree bit for bit at D = 64, and errors",
          "[cuda]") {
  // The op table runs small shapes; here a real head width, many tables and a BF16-free F32
  // cache, where every query head's codes, samples, weights and scores must be the CPU's bits.
  Backends b;
  const int64_t H = 8, G = 2, D = 64, stride = 300, cols = 257, bits = 6, tables = 60;
  const Pair k = make_pair(b, random_values(size_t(G * stride * D), 71), {G, stride, D});
  const Pair q = make_pair(b, random_values(size_t(H * D), 72), {1, H, D});
  const Pair planes =
      make_pair(b, random_values(size_t(tables * bits * D), 73), {tables * bits, D});
  Pair codes =
      make_pair(b, std::vector<float>(size_t(G * stride * tables), kSentinel), {G, stride, tables});
  Pair visible = make_pair(b, std::vector<uint8_t>(size_t(H * stride), 7), {H, stride});
  Pair weights = make_pair(b, std::vector<float>(size_t(H * stride), kSentinel), {H, stride});
  Pair scores = make_pair(b, std::vector<float>(size_t(H * stride), kSentinel), {H, stride});
  for (auto [backend, side] : {std::pair{b.cpu.get(), 0}, std::pair{b.gpu.get(), 1}}) {
    auto pick = [side](Pair& p) -> DeviceTensor& { return side == 0 ? p.cpu : p.gpu; };
    auto pick_const = [side](const Pair& p) -> const DeviceTensor& {
      return side == 0 ? p.cpu : p.gpu;
    };
    MagicpigOps& ops = magicpig_ops(*backend);
    // In two pieces, as the policy hashes the keys its cache gained since its last step.
    ops.hash_keys(pick_const(k), 0, 100, pick_const(planes), bits, pick(codes));
    ops.hash_keys(pick_const(k), 100, cols, pick_const(planes), bits, pick(codes));
    ops.lsh_sample(pick_const(q), pick_const(k), pick(codes), pick_const(planes), bits, cols, 4,
                   cols - 8, pick(visible), pick(weights), pick(scores));
  }
  const auto [codes_cpu, codes_gpu] = read_both<float>(b, codes);
  CHECK(same_bits(codes_cpu, codes_gpu));
  const auto [visible_cpu, visible_gpu] = read_both<uint8_t>(b, visible);
  CHECK(visible_cpu == visible_gpu);
  const auto [weights_cpu, weights_gpu] = read_both<float>(b, weights);
  CHECK(same_bits(weights_cpu, weights_gpu));
  const auto [scores_cpu, scores_gpu] = read_both<float>(b, scores);
  CHECK(same_bits(scores_cpu, scores_gpu));
  // Some keys sampled and some not (the example is not trivially all or nothing), columns past
  // cols untouched.
  int64_t sampled = 0;
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 4; j < cols - 8; ++j) sampled += visible_gpu[size_t(h * stride + j)];
  CHECK(sampled > 0);
  CHECK(sampled < H * (cols - 12));
  CHECK(visible_gpu[size_t(cols)] == 7);
  CHECK(weights_gpu[size_t(cols)] == kSentinel);

  // The GPU's argument errors name the op and the operand, as the CPU's do.
  MagicpigOps& gpu_ops = magicpig_ops(*b.gpu);
  auto message = [](auto&& action) {
    try {
      action();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(message([&] { gpu_ops.hash_keys(k.gpu, 0, cols, planes.gpu, 0, codes.gpu); }),
             Catch::Matchers::Contains("hash_keys: bits"));
  CHECK_THAT(message([&] { gpu_ops.hash_keys(k.gpu, 5, 4, planes.gpu, bits, codes.gpu); }),
             Catch::Matchers::Contains("hash_keys: columns"));
  CHECK_THAT(message([&] { gpu_ops.hash_keys(k.gpu, 0, cols, planes.gpu, bits + 1, codes.gpu); }),
             Catch::Matchers::Contains("hash_keys: planes"));
  CHECK_THAT(message([&] {
               gpu_ops.lsh_sample(q.gpu, k.gpu, codes.gpu, planes.gpu, bits, cols, 9, 8,
                                  visible.gpu, weights.gpu, scores.gpu);
             }),
             Catch::Matchers::Contains("lsh_sample: forced columns"));
  DeviceTensor small_q = b.gpu->alloc(DType::F32, {1, 2, D});
  CHECK_THAT(message([&] {
               gpu_ops.lsh_sample(small_q, k.gpu, codes.gpu, planes.gpu, bits, cols, 4, 8,
                                  visible.gpu, weights.gpu, scores.gpu);
             }),
             Catch::Matchers::Contains("lsh_sample: q"));
  DeviceTensor narrow_codes = b.gpu->alloc(DType::F32, {G, 10, tables});
  CHECK_THAT(message([&] {
               gpu_ops.lsh_sample(q.gpu, k.gpu, narrow_codes, planes.gpu, bits, cols, 4, 8,
                                  visible.gpu, weights.gpu, scores.gpu);
             }),
             Catch::Matchers::Contains("lsh_sample: codes"));
  DeviceTensor odd_rows = b.gpu->alloc(DType::U8, {3, stride});
  DeviceTensor odd_f32 = b.gpu->alloc(DType::F32, {3, stride});
  CHECK_THAT(message([&] {
               gpu_ops.lsh_sample(q.gpu, k.gpu, codes.gpu, planes.gpu, bits, cols, 4, 8, odd_rows,
                                  odd_f32, odd_f32);
             }),
             Catch::Matchers::Contains("lsh_sample: visible"));
}
