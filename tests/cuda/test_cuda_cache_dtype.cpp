// KV caches in the model's dtype on the GPU: every op that reads or writes a cache gives, on a
// BF16 or F16 cache, the bits it gives on an F32 cache holding the same (rounded) values, because
// the kernels widen each element exactly and do all arithmetic in F32. Caches [G, capacity, D].
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/common/dtype.h"
#include "engine/common/error.h"
#include "engine/policy/keydiff_ops.h"
#include "engine/policy/quest_ops.h"
#include "engine/policy/registry.h"
#include "engine/policy/tokenfilter_ops.h"
#include "engine/session/decoder_session.h"
#include "engine/session/scoring.h"
#include "kernels/cuda_backend.h"
#include "tests/support/bf16_reference.h"
#include "tests/support/random_values.h"
#include "tests/support/test_paths.h"

using namespace kvlens;

namespace {

constexpr int64_t kHeads = 8, kKvHeads = 2, kDim = 64, kCapacity = 320, kContext = 257;

std::vector<float> host_f32(Backend& backend, const DeviceTensor& t) {
  std::vector<float> values(size_t(t.numel()));
  backend.to_host(t, values.data(), values.size() * sizeof(float));
  return values;
}

// The cache's contents widened to F32 (exact), read back from the device.
std::vector<float> widened(Backend& backend, const DeviceTensor& cache) {
  if (cache.dtype == DType::F32) return host_f32(backend, cache);
  std::vector<uint16_t> bits(size_t(cache.numel()));
  backend.to_host(cache, bits.data(), bits.size() * 2);
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    values[i] = cache.dtype == DType::BF16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
  return values;
}

void require_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("cuda KV caches in BF16 and F16 give the ops of an F32 cache of the same values",
          "[cuda]") {
  auto gpu = make_cuda_backend(0);
  for (const DType dtype : {DType::BF16, DType::F16}) {
    INFO(dtype_name(dtype));
    REQUIRE(gpu->supports_cache_dtype(dtype));
    // Keys and values [context, G, D], appended in a prefill chunk and a decode row.
    const std::vector<float> k_rows = test::random_values(kContext * kKvHeads * kDim, 11);
    const std::vector<float> v_rows = test::random_values(kContext * kKvHeads * kDim, 12);
    DeviceTensor k = gpu->alloc(DType::F32, {kContext, kKvHeads, kDim});
    DeviceTensor v = gpu->alloc(DType::F32, {kContext, kKvHeads, kDim});
    gpu->from_host(k, k_rows.data(), k_rows.size() * 4);
    gpu->from_host(v, v_rows.data(), v_rows.size() * 4);
    DeviceTensor narrow_k = gpu->alloc(dtype, {kKvHeads, kCapacity, kDim});
    DeviceTensor narrow_v = gpu->alloc(dtype, {kKvHeads, kCapacity, kDim});
    gpu->kv_append(k, v, narrow_k, narrow_v, 0);

    // kv_append rounds to nearest even: BF16 bits are those of f32_to_bf16 (F16's rounding is
    // __float2half_rn's; the comparisons below use the stored bits either way).
    const std::vector<float> k_stored = widened(*gpu, narrow_k);
    const std::vector<float> v_stored = widened(*gpu, narrow_v);
    if (dtype == DType::BF16) {
      for (int64_t p = 0; p < kContext; ++p)
        for (int64_t g = 0; g < kKvHeads; ++g)
          for (int64_t d = 0; d < kDim; ++d) {
            const float want =
                bf16_to_f32(f32_to_bf16(k_rows[size_t((p * kKvHeads + g) * kDim + d)]));
            const float got = k_stored[size_t((g * kCapacity + p) * kDim + d)];
            if (want != got) FAIL("key " << p << "," << g << "," << d << ": " << got);
          }
    }
    // The F32 cache holding exactly the stored values.
    DeviceTensor wide_k = gpu->alloc(DType::F32, {kKvHeads, kCapacity, kDim});
    DeviceTensor wide_v = gpu->alloc(DType::F32, {kKvHeads, kCapacity, kDim});
    gpu->from_host(wide_k, k_stored.data(), k_stored.size() * 4);
    gpu->from_host(wide_v, v_stored.data(), v_stored.size() * 4);

    const int64_t position = kContext - 1;
    const std::vector<float> q_rows = test::random_values(kContext * kHeads * kDim, 13);
    DeviceTensor q1 = gpu->alloc(DType::F32, {1, kHeads, kDim});
    gpu->from_host(q1, q_rows.data(), kHeads * kDim * 4);
    std::vector<uint8_t> mask_host(size_t(kHeads * kContext));
    for (size_t i = 0; i < mask_host.size(); ++i) mask_host[i] = (i * 7 + i / 13) % 3 != 0;
    DeviceTensor mask = gpu->alloc(DType::U8, {kHeads, kContext});
    gpu->from_host(mask, mask_host.data(), mask_host.size());

    SECTION("attention: decode (split kernel, masked or not, windowed) and a prefill") {
      for (const bool masked : {false, true}) {
        for (const int64_t window : {int64_t(0), int64_t(100)}) {
          DeviceTensor out_a = gpu->alloc(DType::F32, {1, kHeads, kDim});
          DeviceTensor out_b = gpu->alloc(DType::F32, {1, kHeads, kDim});
          DeviceTensor logits_a = gpu->alloc(DType::F32, {1, kHeads, kContext});
          DeviceTensor logits_b = gpu->alloc(DType::F32, {1, kHeads, kContext});
          const Visibility visible{masked ? &mask : nullptr};
          gpu->attention(q1, narrow_k, narrow_v, position, window, visible, out_a, &logits_a);
          gpu->attention(q1, wide_k, wide_v, position, window, visible, out_b, &logits_b);
          require_same_bits(host_f32(*gpu, out_a), host_f32(*gpu, out_b));
          require_same_bits(host_f32(*gpu, logits_a), host_f32(*gpu, logits_b));
        }
      }
      DeviceTensor q = gpu->alloc(DType::F32, {kContext, kHeads, kDim});
      gpu->from_host(q, q_rows.data(), q_rows.size() * 4);
      DeviceTensor out_a = gpu->alloc(DType::F32, {kContext, kHeads, kDim});
      DeviceTensor out_b = gpu->alloc(DType::F32, {kContext, kHeads, kDim});
      gpu->attention(q, narrow_k, narrow_v, 0, 0, {}, out_a, nullptr);
      gpu->attention(q, wide_k, wide_v, 0, 0, {}, out_b, nullptr);
      require_same_bits(host_f32(*gpu, out_a), host_f32(*gpu, out_b));
    }

    SECTION("policy ops: logits, visible attention, key anchors, pages, anchor cosine") {
      DeviceTensor logits_a = gpu->alloc(DType::F32, {kHeads, kCapacity});
      DeviceTensor logits_b = gpu->alloc(DType::F32, {kHeads, kCapacity});
      gpu->attention_logits(q1, narrow_k, position, 0, logits_a);
      gpu->attention_logits(q1, wide_k, position, 0, logits_b);
      require_same_bits(host_f32(*gpu, logits_a), host_f32(*gpu, logits_b));

      DeviceTensor visible = gpu->alloc(DType::U8, {kHeads, kCapacity});
      gpu->fill_columns(visible, 0, kContext, 1);
      gpu->fill_columns(visible, 10, 90, 0);
      DeviceTensor out_a = gpu->alloc(DType::F32, {1, kHeads, kDim});
      DeviceTensor out_b = gpu->alloc(DType::F32, {1, kHeads, kDim});
      DeviceTensor probs_a = gpu->alloc(DType::F32, {kHeads, kCapacity});
      DeviceTensor probs_b = gpu->alloc(DType::F32, {kHeads, kCapacity});
      gpu->attention_visible(logits_a, kContext, &visible, narrow_v, out_a, &probs_a);
      gpu->attention_visible(logits_b, kContext, &visible, wide_v, out_b, &probs_b);
      require_same_bits(host_f32(*gpu, out_a), host_f32(*gpu, out_b));
      require_same_bits(host_f32(*gpu, probs_a), host_f32(*gpu, probs_b));

      DeviceTensor anchors_a = gpu->alloc(DType::F32, {kHeads, kCapacity});
      DeviceTensor anchors_b = gpu->alloc(DType::F32, {kHeads, kCapacity});
      keydiff_ops(*gpu).key_anchor_scores(narrow_k, kContext, visible, anchors_a);
      keydiff_ops(*gpu).key_anchor_scores(wide_k, kContext, visible, anchors_b);
      require_same_bits(host_f32(*gpu, anchors_a), host_f32(*gpu, anchors_b));

      const int64_t page = 16, pages = kCapacity / page;
      DeviceTensor min_a = gpu->alloc(DType::F32, {kKvHeads, pages, kDim});
      DeviceTensor max_a = gpu->alloc(DType::F32, {kKvHeads, pages, kDim});
      DeviceTensor min_b = gpu->alloc(DType::F32, {kKvHeads, pages, kDim});
      DeviceTensor max_b = gpu->alloc(DType::F32, {kKvHeads, pages, kDim});
      quest_ops(*gpu).page_minmax_update(narrow_k, 0, kContext, page, min_a, max_a);
      quest_ops(*gpu).page_minmax_update(wide_k, 0, kContext, page, min_b, max_b);
      require_same_bits(host_f32(*gpu, min_a), host_f32(*gpu, min_b));
      require_same_bits(host_f32(*gpu, max_a), host_f32(*gpu, max_b));

      DeviceTensor anchor_a = gpu->alloc(DType::F32, {kKvHeads, kDim});
      DeviceTensor anchor_b = gpu->alloc(DType::F32, {kKvHeads, kDim});
      DeviceTensor similarity_a = gpu->alloc(DType::F32, {kKvHeads});
      DeviceTensor similarity_b = gpu->alloc(DType::F32, {kKvHeads});
      for (int64_t column = 0; column < 5; ++column) {
        tokenfilter_ops(*gpu).anchor_cosine_update(narrow_k, column, column == 0 ? 0.0f : 0.9f,
                                                   anchor_a, similarity_a);
        tokenfilter_ops(*gpu).anchor_cosine_update(wide_k, column, column == 0 ? 0.0f : 0.9f,
                                                   anchor_b, similarity_b);
        require_same_bits(host_f32(*gpu, similarity_a), host_f32(*gpu, similarity_b));
      }
      require_same_bits(host_f32(*gpu, anchor_a), host_f32(*gpu, anchor_b));
    }

    SECTION("copy_rows moves narrow rows; mixed dtypes are errors") {
      DeviceTensor grown = gpu->alloc(dtype, {kKvHeads, 2 * kCapacity, kDim});
      for (int64_t g = 0; g < kKvHeads; ++g)
        gpu->copy_rows(narrow_k, g * kCapacity, grown, g * 2 * kCapacity, kContext, kDim);
      const std::vector<float> copied = widened(*gpu, grown);
      for (int64_t g = 0; g < kKvHeads; ++g)
        CHECK(std::memcmp(copied.data() + g * 2 * kCapacity * kDim,
                          k_stored.data() + g * kCapacity * kDim, kContext * kDim * 4) == 0);
      CHECK_THROWS_AS(gpu->copy_rows(narrow_k, 0, wide_k, 0, 1, kDim), Error);
      DeviceTensor out = gpu->alloc(DType::F32, {1, kHeads, kDim});
      CHECK_THROWS_AS(gpu->attention(q1, narrow_k, wide_v, position, 0, {}, out, nullptr), Error);
    }
  }
}

TEST_CASE("a BF16 session's KV cache: the CPU refuses it, the GPU's stays close to F32", "[cuda]") {
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto cpu = make_cpu_backend(2);
  auto gpu = make_cuda_backend(0);
  UploadOptions bf16;
  bf16.weight_dtype = DType::BF16;
  CHECK(upload_model(model, *cpu, bf16)->kv_cache_dtype == DType::F32);
  UploadOptions bf16_cache = bf16;
  bf16_cache.kv_cache_dtype = DType::BF16;
  CHECK_THROWS_AS(upload_model(model, *cpu, bf16_cache), Error);

  const auto narrow = upload_model(model, *gpu, bf16);
  REQUIRE(narrow->weight_dtype() == DType::BF16);
  REQUIRE(narrow->kv_cache_dtype == DType::BF16);  // the default follows the weights
  UploadOptions wide_cache = bf16;
  wide_cache.kv_cache_dtype = DType::F32;
  const auto wide = upload_model(model, *gpu, wide_cache);

  const std::vector<int32_t> tokens = model->require_tokenizer().encode(
      "Once upon a time there was a little girl who loved the sea. Every morning she walked to "
      "the harbour and counted the boats.",
      true);
  for (const char* id : {"dense", "h2o", "quest", "keydiff"}) {
    INFO(id);
    ScoreOptions options;
    options.policy = {id, 0.5, {}};
    const ScoreResult a = score_tokens(narrow, tokens, options);
    const ScoreResult b = score_tokens(wide, tokens, options);
    // Keys and values rounded to BF16 (relative error 2^-9 each) move the attention outputs by
    // about that much, which the perplexity follows to well under 1% (dense). A selecting policy
    // can also flip a near tie between two keys, and on 27 tokens one flipped key moves the
    // perplexity by about 1%: keydiff on the round-7 demo model, 1.3% on the H200.
    CHECK(a.ppl == Approx(b.ppl).epsilon(std::string(id) == "dense" ? 1e-2 : 2.5e-2));
  }
}

TEST_CASE("the BF16 path (BF16 weights and KV cache on the GPU) against transformers in BF16",
          "[cuda]") {
  // The demo model's weights are BF16 on disk; the cache follows them by default on the GPU.
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu = make_cuda_backend(0);
  const auto resident = upload_model(model, *gpu);
  REQUIRE(resident->kv_cache_dtype == DType::BF16);
  for (const test::Bf16PromptComparison& c : test::compare_with_bf16_reference(resident)) {
    INFO(c.prompt);
    WARN("cuda bf16 cache: |kvlens - hf f32| "
         << c.gap_to_f32 << ", |kvlens - hf bf16| " << c.gap_to_bf16 << " (hf bf16 vs f32 "
         << c.reference_bf16_f32_gap << "); greedy differs from hf bf16 at "
         << c.first_difference_bf16 << " (margin " << c.bf16_margin_there << "), from hf f32 at "
         << c.first_difference_f32);
    CHECK(c.prompt_ids_match);
    // Our BF16 path rounds only the cache to BF16 (transformers BF16 also every activation):
    // keys and values off by 2^-9 relative move the attention outputs by about that much, the
    // logits (below 20) by a few 1e-2 (0.033 at most measured on an H200): 0.06 from F32. From
    // transformers' BF16 run, by the triangle inequality, at most that plus the reference's own
    // BF16-vs-F32 gap.
    constexpr double kCacheRounding = 0.06;
    CHECK(c.gap_to_f32 <= kCacheRounding);
    CHECK(c.gap_to_bf16 <= c.reference_bf16_f32_gap + kCacheRounding);
    // Greedy: transformers' BF16 continuation up to a near tie of its BF16 logits.
    if (c.first_difference_bf16 >= 0) CHECK(c.bf16_margin_there <= c.reference_bf16_f32_gap);
  }
}

TEST_CASE("every policy's visible sets on a BF16 cache equal the F32 cache's but for near ties",
          "[cuda]") {
  // Teacher-forced over one text, the same BF16 weights, caches BF16 vs F32: per policy, the
  // (step, layer, head) rows whose visible set differs and the tokens that differ in them.
  // Policies rank tokens by scores computed from the cache, so rounding keys and values to BF16
  // can swap two tokens whose scores were within rounding of each other; anything beyond a small
  // share means the BF16 kernels compute something else.
  const auto model = Model::load(test::source_path("assets/models/demo"));
  auto gpu = make_cuda_backend(0);
  UploadOptions f32_cache;
  f32_cache.kv_cache_dtype = DType::F32;
  const auto narrow = upload_model(model, *gpu);
  const auto wide = upload_model(model, *gpu, f32_cache);
  const std::vector<int32_t> tokens = model->require_tokenizer().encode(
      "Old sea charts mark a valley where the vineyards climb up terraces. The place is: "
      "Rourstelk. Courage is often mistaken for its opposite by those in a hurry. The valley with "
      "the terraced vineyards is called: Rourstelk",
      true);
  for (const char* id :
       {"oracle",         "streaming",    "h2o",           "random",      "snapkv",   "quest",
        "keydiff",        "tokenfilter",  "lazyllm",       "tokenbutler", "tova",     "pyramidkv",
        "adakv",          "snapkv+adakv", "h2o+pyramidkv", "tova+adakv",  "sparq",    "loki",
        "doublesparsity", "duoattention", "seerattention", "rocketkv",    "twilight", "magicpig"}) {
    INFO(id);
    DecoderSession a(narrow), b(wide);
    PolicyConfig config{id, 0.5, {}};
    if (std::string(id) == "magicpig") config.args.push_back("window=4");  // not all exact
    a.set_policy(make_policy(config, a.policy_shape(), *gpu));
    b.set_policy(make_policy(config, b.policy_shape(), *gpu));
    int64_t rows = 0, rows_differing = 0, tokens_seen = 0, tokens_differing = 0, decisions = 0,
            layer_steps = 0;
    for (const int32_t t : tokens) {
      a.forward(std::span<const int32_t>(&t, 1));
      b.forward(std::span<const int32_t>(&t, 1));
      const int64_t cols = a.position();
      for (size_t l = 0; l < a.decisions().size(); ++l) {
        ++layer_steps;
        if (a.decisions()[l] != b.decisions()[l]) ++decisions;
        if (a.decisions()[l] != LayerDecision::Masked || b.decisions()[l] != LayerDecision::Masked)
          continue;
        const DeviceTensor& va = a.visible()[l];
        const DeviceTensor& vb = b.visible()[l];
        std::vector<uint8_t> ha(va.bytes()), hb(vb.bytes());
        gpu->to_host(va, ha.data(), ha.size());
        gpu->to_host(vb, hb.data(), hb.size());
        const int64_t stride = va.dim(1);
        for (int64_t h = 0; h < va.dim(0); ++h) {
          int64_t differing = 0;
          for (int64_t j = 0; j < cols; ++j)
            differing += (ha[size_t(h * stride + j)] != 0) != (hb[size_t(h * stride + j)] != 0);
          ++rows;
          rows_differing += differing > 0;
          tokens_seen += cols;
          tokens_differing += differing;
        }
      }
    }
    WARN(id << ": visible sets differ in " << rows_differing << " of " << rows
            << " (step, layer, head) rows, " << tokens_differing << " of " << tokens_seen
            << " tokens; layer decisions (tokenfilter's skips) differ in " << decisions << " of "
            << layer_steps);
    CHECK(decisions <= layer_steps / 100);
    // Near ties: well under 1% of the tokens for a policy that ranks by exact or predicted logits.
    // sparq ranks by an estimate from its r largest query channels, coarser than the logit, so
    // more of its scores sit within BF16 rounding of each other: 1.16% of the tokens on an H200
    // (2026-11-28), allowed 2%. magicpig samples by 150 x K hash bits per key, each the sign of
    // a key's projection: every key within BF16 rounding of one hyperplane changes its code, so
    // its sample moves without any score tie (5.6% measured; it is a random sample either way,
    // and the CPU and GPU sample the same keys on the same cache: test_cuda_session.cpp).
    const std::string name = id;
    const int64_t allowed = name == "magicpig" ? tokens_seen / 10
                            : name == "sparq"  ? tokens_seen / 50
                                               : tokens_seen / 100;
    CHECK(tokens_differing <= allowed);
  }
}
