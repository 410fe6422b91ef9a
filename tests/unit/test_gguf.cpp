// GGUF files: the reader's metadata getters and tensor table, an error naming the file and field
// for every malformed input, dequantization of each supported type against hand-worked blocks,
// the metadata -> config mapping, the tensor names and q/k un-permutation (a GGUF of a tiny
// random Llama loads to the same weights as its safetensors folder) and kvlens-cli info.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "engine/common/dtype.h"
#include "engine/common/error.h"
#include "engine/model/dequantize.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_config.h"
#include "engine/model/gguf_weights.h"
#include "engine/model/model.h"
#include "tests/support/error_message.h"
#include "tests/support/gguf_writer.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using Catch::Matchers::Contains;
using kvlens::GgufFile;
using kvlens::test::error_message;
using kvlens::test::gguf_scalar;
using kvlens::test::gguf_string;
using kvlens::test::GgufTag;
using kvlens::test::GgufWriter;

namespace {

std::string f16(float value) {
  return gguf_scalar(kvlens::test::f32_to_f16_bits(value));
}

std::vector<float> dequantize(uint32_t type, const std::string& block, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  kvlens::dequantize_to_f32(type, reinterpret_cast<const std::byte*>(block.data()), count,
                            out.data(), "test");
  return out;
}

// A small well-formed file: a few metadata types and two tensors.
GgufWriter small_writer() {
  GgufWriter w;
  w.string("general.architecture", "llama");
  w.u32("llama.block_count", 2);
  w.f32("llama.rope.freq_base", 100000.0f);
  w.boolean("tokenizer.ggml.add_bos_token", false);
  w.string_array("tokenizer.ggml.tokens", {"a", "b", "<s>"});
  w.f32_array("tokenizer.ggml.scores", {0.5f, -1.0f, 0.0f});
  w.i32_array("tokenizer.ggml.token_type", {1, 1, 3});
  w.tensor_f32("w", {4, 2}, kvlens::test::kGgmlF32, {0, 1, 2, 3, 4, 5, 6, 7});
  w.tensor_f32("n", {4}, kvlens::test::kGgmlF16, {1, 2, 3, 4});
  return w;
}

std::string parse_error(const std::string& bytes) {
  return error_message([&] { GgufFile file(bytes, "bad.gguf"); });
}

// One-line error naming the file.
void check_one_line(const std::string& message) {
  CHECK_THAT(message, Contains("bad.gguf"));
  CHECK(message.find('\n') == std::string::npos);
}

void put_u64(std::string& bytes, size_t at, uint64_t value) {
  std::memcpy(bytes.data() + at, &value, 8);
}

}  // namespace

TEST_CASE("gguf: metadata getters and the tensor table of a well-formed file", "[gguf]") {
  const std::string bytes = small_writer().bytes();
  const GgufFile file(bytes, "small.gguf");
  CHECK(file.version() == 3);
  CHECK(file.alignment() == 32);
  CHECK(file.string("general.architecture") == "llama");
  CHECK(file.u32("llama.block_count") == 2);
  CHECK(file.u32("llama.missing", 7) == 7);
  CHECK(file.u64("llama.block_count") == 2);
  CHECK(file.number("llama.rope.freq_base") == 100000.0);
  CHECK(file.number("llama.block_count") == 2.0);
  CHECK_FALSE(file.boolean("tokenizer.ggml.add_bos_token", true));
  CHECK(file.boolean("tokenizer.ggml.add_eos_token", true));
  CHECK(file.string_array("tokenizer.ggml.tokens") == std::vector<std::string>{"a", "b", "<s>"});
  CHECK(file.float_array("tokenizer.ggml.scores") == std::vector<float>{0.5f, -1.0f, 0.0f});
  CHECK(file.int_array("tokenizer.ggml.token_type") == std::vector<int32_t>{1, 1, 3});
  CHECK(file.array_size("tokenizer.ggml.tokens") == 3);
  CHECK_FALSE(file.optional_string("general.name"));
  REQUIRE(file.tensors().size() == 2);
  const kvlens::GgufTensorInfo* w = file.tensor("w");
  REQUIRE(w != nullptr);
  CHECK(w->shape() == std::vector<int64_t>{2, 4});  // dims reversed
  CHECK(w->bytes == 32);
  CHECK(w->offset == 0);
  float third;
  std::memcpy(&third, w->data + 8, 4);
  CHECK(third == 2.0f);
  const kvlens::GgufTensorInfo* n = file.tensor("n");
  REQUIRE(n != nullptr);
  CHECK(n->offset == 32);
  CHECK(n->bytes == 8);
  CHECK(file.tensor("absent") == nullptr);
}

TEST_CASE("gguf: typed getters name the file, key and expected type", "[gguf]") {
  const std::string bytes = small_writer().bytes();
  const GgufFile file(bytes, "small.gguf");
  CHECK(error_message([&] { file.u32("llama.context_length"); }) ==
        "small.gguf: metadata \"llama.context_length\": expected a non-negative integer, found "
        "missing");
  CHECK(error_message([&] { file.string("llama.block_count"); }) ==
        "small.gguf: metadata \"llama.block_count\": expected a string, found u32");
  CHECK_THAT(error_message([&] { file.float_array("tokenizer.ggml.tokens"); }),
             Contains("expected an array of f32 or f64, found an array of string"));
  CHECK_THAT(error_message([&] { file.boolean("general.architecture"); }),
             Contains("expected a bool, found string"));
  CHECK_THAT(error_message([&] { file.u32("llama.rope.freq_base"); }),
             Contains("\"llama.rope.freq_base\": expected a non-negative integer, found f32"));
}

TEST_CASE("gguf: every truncation of a valid file is a one-line error", "[gguf]") {
  const std::string bytes = small_writer().bytes();
  // The last tensor ends 8 bytes before... the file ends with its data: every shorter prefix
  // cuts a header field, a metadata value, a tensor entry or tensor data.
  for (size_t size = 0; size < bytes.size(); ++size) {
    INFO("prefix of " << size << " bytes");
    check_one_line(parse_error(bytes.substr(0, size)));
  }
  CHECK_THAT(parse_error(bytes.substr(0, 30)),
             Contains("bad.gguf: metadata count: expected at most 0 entries (the bytes left)"));
  CHECK_THAT(parse_error(bytes.substr(0, 136)),
             Contains("metadata \"llama.rope.freq_base\": expected 4 bytes at offset 134, found "
                      "the file ends after 2"));
  CHECK_THAT(parse_error(bytes.substr(0, bytes.size() - 1)),
             Contains("tensor \"n\" data: expected 8 bytes at data offset 32"));
}

TEST_CASE("gguf: bad header fields name the field", "[gguf]") {
  std::string bytes = small_writer().bytes();
  SECTION("magic") {
    bytes[0] = 'X';
    CHECK_THAT(parse_error(bytes), Contains("bad.gguf: magic: expected a GGUF file"));
  }
  SECTION("version") {
    bytes[4] = 1;
    CHECK(parse_error(bytes) ==
          "bad.gguf: version: expected GGUF version 2 or 3 (little-endian), found 1");
  }
  SECTION("absurd tensor count") {
    put_u64(bytes, 8, uint64_t(1) << 60);
    CHECK_THAT(parse_error(bytes), Contains("bad.gguf: tensor count: expected at most"));
  }
  SECTION("absurd metadata count") {
    put_u64(bytes, 16, ~uint64_t(0));
    CHECK_THAT(parse_error(bytes), Contains("bad.gguf: metadata count: expected at most"));
  }
  SECTION("key length past the end") {
    put_u64(bytes, 24, uint64_t(1) << 40);
    CHECK_THAT(parse_error(bytes), Contains("metadata entry 0 key length: expected at most the"));
  }
}

TEST_CASE("gguf: bad metadata values name the key", "[gguf]") {
  GgufWriter w;
  std::string expected, found;
  SECTION("string length past the end") {
    w.raw("general.name", uint32_t(GgufTag::kString), gguf_scalar(uint64_t(1000)) + "abc");
    expected = "bad.gguf: metadata \"general.name\" length: expected at most the ";
    found = "bytes left in the file, found 1000";
  }
  SECTION("array count past the end") {
    w.raw("tokenizer.ggml.scores", uint32_t(GgufTag::kArray),
          gguf_scalar(uint32_t(GgufTag::kF32)) + gguf_scalar(uint64_t(1) << 61) + "abcd");
    expected = "bad.gguf: metadata \"tokenizer.ggml.scores\" count: expected at most ";
    found = "elements (the bytes left), found 2305843009213693952";
  }
  SECTION("string array element past the end") {
    w.raw("tokenizer.ggml.tokens", uint32_t(GgufTag::kArray),
          gguf_scalar(uint32_t(GgufTag::kString)) + gguf_scalar(uint64_t(2)) + gguf_string("a") +
              gguf_scalar(uint64_t(99)));
    expected = "bad.gguf: metadata \"tokenizer.ggml.tokens\"[1] length: expected at most the ";
    found = "found 99";
  }
  SECTION("nested arrays") {
    w.raw("x", uint32_t(GgufTag::kArray),
          gguf_scalar(uint32_t(GgufTag::kArray)) + gguf_scalar(uint64_t(0)));
    expected = "bad.gguf: metadata \"x\" element type: expected an array of scalars or strings";
  }
  SECTION("unknown value type") {
    w.raw("x", 13, gguf_scalar(uint32_t(0)));
    expected = "bad.gguf: metadata \"x\" type: expected a GGUF value type (0 to 12), found 13";
  }
  SECTION("bool other than 0 or 1") {
    w.raw("x", uint32_t(GgufTag::kBool), std::string(1, '\2'));
    expected = "bad.gguf: metadata \"x\": expected a bool (0 or 1), found 2";
  }
  SECTION("a key twice") {
    w.u32("x", 1);
    w.u32("x", 2);
    expected = "bad.gguf: metadata \"x\": expected each metadata key once";
  }
  SECTION("alignment not a power of two") {
    w.u32("general.alignment", 24);
    expected = "bad.gguf: metadata \"general.alignment\": expected a power of two, found 24";
  }
  SECTION("alignment of another type") {
    w.u64("general.alignment", 32);
    expected = "bad.gguf: metadata \"general.alignment\": expected a u32, found u64";
  }
  const std::string message = parse_error(w.bytes());
  CHECK_THAT(message, Contains(expected) && Contains(found));
  check_one_line(message);
}

TEST_CASE("gguf: bad tensor entries name the tensor", "[gguf]") {
  using kvlens::test::kGgmlF32;
  GgufWriter w;
  std::string expected;
  std::string bytes;
  SECTION("no dims") {
    w.tensor("t", {}, kGgmlF32, "");
    expected = "tensor \"t\" n_dims: expected 1 to 4, found 0";
  }
  SECTION("five dims") {
    w.tensor("t", {1, 1, 1, 1, 1}, kGgmlF32, "abcd");
    expected = "tensor \"t\" n_dims: expected 1 to 4, found 5";
  }
  SECTION("a zero extent") {
    w.tensor("t", {4, 0}, kGgmlF32, "");
    expected = "tensor \"t\" dims: expected extents of at least 1";
  }
  SECTION("extents whose product overflows") {
    w.tensor("t", {uint64_t(1) << 40, uint64_t(1) << 40}, kGgmlF32, "");
    expected = "tensor \"t\" dims: expected extents of at least 1 whose product fits in int64";
  }
  SECTION("unknown type") {
    w.tensor("t", {4}, 77, "");
    expected = "tensor \"t\" type: expected a ggml type id, found 77";
  }
  SECTION("a row that is not whole blocks") {
    w.tensor("t", {16}, kvlens::test::kGgmlQ8_0, std::string(34, '\0'));
    expected = "tensor \"t\" dims: expected a first extent that is a multiple of 32 (the Q8_0";
  }
  SECTION("data past the end") {
    w.tensor("t", {64}, kGgmlF32, std::string(16, '\0'));
    expected =
        "tensor \"t\" data: expected 256 bytes at data offset 0 inside the data section, "
        "found a data section of 16 bytes";
  }
  SECTION("a name twice") {
    w.tensor("t", {4}, kGgmlF32, std::string(16, '\0'));
    w.tensor("t", {4}, kGgmlF32, std::string(16, '\0'));
    expected = "tensor \"t\": expected each tensor name once";
  }
  SECTION("overlapping data") {
    w.tensor("a", {16}, kGgmlF32, std::string(64, '\0'));
    w.tensor("b", {4}, kGgmlF32, std::string(16, '\0'));
    bytes = w.bytes();
    // b's offset (the last field of the table) moved from 64 into a's bytes.
    const size_t b_offset_at =
        w.tensor_table_offset() + (8 + 1 + 4 + 8 + 4 + 8) + (8 + 1 + 4 + 8 + 4);
    put_u64(bytes, b_offset_at, 32);
    expected =
        "tensor \"b\" offset: expected data that does not overlap tensor \"a\" (which ends "
        "at 64), found 32";
  }
  SECTION("misaligned offset") {
    w.tensor("a", {4}, kGgmlF32, std::string(16, '\0'));
    bytes = w.bytes();
    put_u64(bytes, w.tensor_table_offset() + 8 + 1 + 4 + 8 + 4, 4);
    expected = "tensor \"a\" offset: expected a multiple of the alignment 32, found 4";
  }
  if (bytes.empty()) bytes = w.bytes();
  const std::string message = parse_error(bytes);
  CHECK_THAT(message, Contains("bad.gguf: " + expected));
  check_one_line(message);
}

TEST_CASE("gguf: a file that is only a header opens, and GgufFile::open maps a file", "[gguf]") {
  const std::string empty = GgufWriter().bytes();
  CHECK(GgufFile(empty, "e.gguf").tensors().empty());
  const std::string path = kvlens::test::make_temp_dir("gguf_open") + "/small.gguf";
  kvlens::test::write_file(path, small_writer().bytes());
  const auto file = GgufFile::open(path);
  CHECK(file->source() == path);
  CHECK(file->tensors().size() == 2);
  CHECK_THAT(error_message([&] { GgufFile::open(path + ".missing"); }), Contains(".missing"));
}

TEST_CASE("dequantize: F32, F16 and BF16 widen exactly", "[gguf][dequantize]") {
  CHECK(dequantize(kvlens::test::kGgmlF32, gguf_scalar(1.5f) + gguf_scalar(-2.25f), 2) ==
        std::vector<float>{1.5f, -2.25f});
  CHECK(dequantize(kvlens::test::kGgmlF16, f16(0.5f) + f16(-3.0f), 2) ==
        std::vector<float>{0.5f, -3.0f});
  CHECK(dequantize(kvlens::test::kGgmlBF16, gguf_scalar(uint16_t(0x3fc0)), 1) ==
        std::vector<float>{1.5f});
}

TEST_CASE("dequantize: 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0)", "[gguf][dequantize]") {
  // qs[j]: low nibble j (value j), high nibble 15 - j (value j + 16).
  std::string nibbles;
  for (int j = 0; j < 16; ++j) nibbles.push_back(char(j | ((15 - j) << 4)));
  SECTION("Q4_0: d * (q - 8)") {
    const auto y = dequantize(kvlens::test::kGgmlQ4_0, f16(0.5f) + nibbles, 32);
    for (int j = 0; j < 16; ++j) {
      CHECK(y[size_t(j)] == 0.5f * float(j - 8));
      CHECK(y[size_t(j + 16)] == 0.5f * float(7 - j));
    }
    CHECK(y[0] == -4.0f);
    CHECK(y[31] == -4.0f);
  }
  SECTION("Q4_1: d * q + m") {
    const auto y = dequantize(kvlens::test::kGgmlQ4_1, f16(0.25f) + f16(-1.0f) + nibbles, 32);
    CHECK(y[0] == -1.0f);
    CHECK(y[15] == 2.75f);
    CHECK(y[16] == 2.75f);  // high nibble of qs[0] is 15
    CHECK(y[31] == -1.0f);
  }
  // qh: bits 0, 2, ..., 14 (values 0, 2, ..., 14) and 17, 19, ..., 31 (values 17, ..., 31).
  const std::string qh = gguf_scalar(uint32_t(0xAAAA5555u));
  const auto q5_value = [](int v) {
    const int low = v < 16 ? v : 15 - (v - 16);
    return low + ((v % 2 == 0) == (v < 16) ? 16 : 0);
  };
  SECTION("Q5_0: d * (q - 16) with the fifth bit from qh") {
    const auto y = dequantize(kvlens::test::kGgmlQ5_0, f16(1.0f) + qh + nibbles, 32);
    for (int v = 0; v < 32; ++v) CHECK(y[size_t(v)] == float(q5_value(v) - 16));
    CHECK(y[0] == 0.0f);    // 0 | 16, minus 16
    CHECK(y[1] == -15.0f);  // 1 without the bit
    CHECK(y[17] == 14.0f);  // 14 | 16, minus 16
  }
  SECTION("Q5_1: d * q + m") {
    const auto y = dequantize(kvlens::test::kGgmlQ5_1, f16(0.5f) + f16(2.0f) + qh + nibbles, 32);
    for (int v = 0; v < 32; ++v) CHECK(y[size_t(v)] == 0.5f * float(q5_value(v)) + 2.0f);
    CHECK(y[0] == 10.0f);
  }
  SECTION("Q8_0: d * q") {
    std::string block = f16(0.125f);
    for (int j = 0; j < 32; ++j) block.push_back(char(int8_t(j - 16)));
    const auto y = dequantize(kvlens::test::kGgmlQ8_0, block + block, 64);
    for (int j = 0; j < 64; ++j) CHECK(y[size_t(j)] == 0.125f * float(j % 32 - 16));
  }
}

namespace {

// Q4_K / Q5_K's 12 scale bytes for 6-bit scales sc[8] and mins m[8].
std::string pack_k4_scales(const int sc[8], const int m[8]) {
  std::string bytes(12, '\0');
  for (int j = 0; j < 4; ++j) {
    bytes[size_t(j)] = char(sc[j] | ((sc[j + 4] >> 4) << 6));
    bytes[size_t(j + 4)] = char(m[j] | ((m[j + 4] >> 4) << 6));
    bytes[size_t(j + 8)] = char((sc[j + 4] & 0xf) | ((m[j + 4] & 0xf) << 4));
  }
  return bytes;
}

constexpr int kScales[8] = {1, 2, 3, 4, 17, 33, 49, 63};
constexpr int kMins[8] = {0, 1, 2, 3, 20, 40, 50, 60};

}  // namespace

TEST_CASE("dequantize: Q4_K and Q5_K super-blocks", "[gguf][dequantize]") {
  // Value v is in sub-block s = v / 32; its 4 low bits sit in byte 32 * (s / 2) + v % 32 of the
  // quants (low nibble for even s, high for odd), Q5_K's fifth bit in bit s of qh[v % 32].
  const auto quant = [](int v, int mod) { return (v * 7 + 3) % mod; };
  SECTION("Q4_K: d * scale * q - dmin * min") {
    std::string qs(128, '\0');
    for (int v = 0; v < 256; ++v) {
      const int s = v / 32, byte = 32 * (s / 2) + v % 32;
      qs[size_t(byte)] = char(uint8_t(qs[size_t(byte)]) | (quant(v, 16) << (s % 2 ? 4 : 0)));
    }
    const auto y = dequantize(kvlens::test::kGgmlQ4_K,
                              f16(1.0f) + f16(0.5f) + pack_k4_scales(kScales, kMins) + qs, 256);
    for (int v = 0; v < 256; ++v) {
      INFO("value " << v);
      CHECK(y[size_t(v)] == float(kScales[v / 32] * quant(v, 16)) - 0.5f * float(kMins[v / 32]));
    }
    // Worked by hand: v = 200 is in sub-block 6 (scale 49, min 50), q = 1403 % 16 = 11.
    CHECK(y[200] == 49.0f * 11.0f - 25.0f);
    // v = 40: sub-block 1 (scale 2, min 1), q = 283 % 16 = 11.
    CHECK(y[40] == 22.0f - 0.5f);
  }
  SECTION("Q5_K: the fifth bit from qh") {
    std::string qs(128, '\0'), qh(32, '\0');
    for (int v = 0; v < 256; ++v) {
      const int s = v / 32, q = quant(v, 32), byte = 32 * (s / 2) + v % 32;
      qs[size_t(byte)] = char(uint8_t(qs[size_t(byte)]) | ((q & 15) << (s % 2 ? 4 : 0)));
      qh[size_t(v % 32)] = char(uint8_t(qh[size_t(v % 32)]) | ((q >> 4) << s));
    }
    const auto y =
        dequantize(kvlens::test::kGgmlQ5_K,
                   f16(0.5f) + f16(0.25f) + pack_k4_scales(kScales, kMins) + qh + qs, 256);
    for (int v = 0; v < 256; ++v) {
      INFO("value " << v);
      CHECK(y[size_t(v)] ==
            0.5f * float(kScales[v / 32] * quant(v, 32)) - 0.25f * float(kMins[v / 32]));
    }
    // v = 255: sub-block 7 (scale 63, min 60), q = 1788 % 32 = 28 (fifth bit set).
    CHECK(y[255] == 0.5f * 63.0f * 28.0f - 15.0f);
  }
}

TEST_CASE("dequantize: Q6_K super-blocks", "[gguf][dequantize]") {
  // Value 128h + 32k + l: low 4 bits in ql[64h + l] (k = 0 low nibble, k = 2 high) or
  // ql[64h + 32 + l] (k = 1 low, k = 3 high); top 2 bits in bits 2k..2k+1 of qh[32h + l];
  // scale index 8h + 2k + l / 16; value = d * scale * (q - 32).
  const auto quant = [](int v) { return (v * 13 + 5) % 64; };
  std::string ql(128, '\0'), qh(64, '\0'), scales;
  for (int v = 0; v < 256; ++v) {
    const int h = v / 128, k = (v % 128) / 32, l = v % 32, q = quant(v);
    const size_t low_at = size_t(64 * h + (k % 2) * 32 + l);
    ql[low_at] = char(uint8_t(ql[low_at]) | ((q & 15) << (k >= 2 ? 4 : 0)));
    qh[size_t(32 * h + l)] = char(uint8_t(qh[size_t(32 * h + l)]) | ((q >> 4) << (2 * k)));
  }
  for (int i = 0; i < 16; ++i) scales.push_back(char(int8_t(i - 8)));
  const auto y = dequantize(kvlens::test::kGgmlQ6_K, ql + qh + scales + f16(0.5f), 256);
  for (int v = 0; v < 256; ++v) {
    const int h = v / 128, k = (v % 128) / 32, l = v % 32;
    const int scale = 8 * h + 2 * k + l / 16 - 8;
    INFO("value " << v);
    CHECK(y[size_t(v)] == 0.5f * float(scale) * float(quant(v) - 32));
  }
  // Worked by hand: v = 0: q = 5, scale index 0 (-8): 0.5 * -8 * (5 - 32) = 108.
  CHECK(y[0] == 108.0f);
  // v = 255: h 1, k 3, l 31: scale index 8 + 6 + 1 = 15 (7); q = 3320 % 64 = 56: 0.5 * 7 * 24.
  CHECK(y[255] == 84.0f);
}

TEST_CASE("dequantize: other types are named in the error", "[gguf][dequantize]") {
  CHECK(error_message([] { dequantize(10, std::string(84, '\0'), 256); }) ==
        "test: tensor type: expected one of F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, "
        "Q6_K, BF16, found Q2_K");
  CHECK_THAT(error_message([] { dequantize(99, "", 0); }), Contains("found type 99"));
  CHECK_THAT(error_message([] { dequantize(kvlens::test::kGgmlQ8_0, std::string(34, '\0'), 16); }),
             Contains("expected a multiple of 32 values for Q8_0, found 16"));
}

TEST_CASE("gguf config: llama metadata becomes the config transformers would use", "[gguf]") {
  kvlens::test::TinyLlamaSpec spec;
  const std::string bytes = kvlens::test::tiny_llama_gguf(spec);
  const GgufFile file(bytes, "tiny.gguf");
  const kvlens::ModelConfig c = kvlens::gguf_model_config(file);
  CHECK(c.model_type == "llama");
  CHECK(c.vocab_size == spec.vocab);
  CHECK(c.hidden_size == spec.hidden);
  CHECK(c.intermediate_size == spec.intermediate);
  CHECK(c.num_layers == spec.layers);
  CHECK(c.num_heads == spec.heads);
  CHECK(c.num_kv_heads == spec.kv_heads);
  CHECK(c.head_dim == spec.hidden / spec.heads);
  CHECK(c.max_position_embeddings == spec.max_positions);
  CHECK(c.rope_theta == spec.rope_theta);
  CHECK(c.rms_norm_eps == 1e-5);  // the f32 1e-5, as the decimal it was written from
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.bos_token_id == 1);
  CHECK(c.eos_token_ids == std::vector<int64_t>{2});
  CHECK(c.source == "tiny.gguf");
}

TEST_CASE("gguf config: unsupported architectures and missing keys are named", "[gguf]") {
  GgufWriter w;
  w.string("general.architecture", "mamba");
  std::string bytes = w.bytes();
  // Model::check (the app's check before it opens a model) refuses it as load does.
  const std::string mamba = kvlens::test::make_temp_dir("gg") + "/mamba.gguf";
  kvlens::test::write_file(mamba, bytes);
  CHECK_THAT(error_message([&] { kvlens::Model::check(mamba); }),
             Contains("\"general.architecture\": expected llama"));
  CHECK_THAT(error_message([&] { kvlens::Model::load(mamba); }),
             Contains("\"general.architecture\": expected llama"));
  CHECK(error_message([&] { kvlens::gguf_model_config(GgufFile(bytes, "m.gguf")); }) ==
        "m.gguf: metadata \"general.architecture\": expected llama, qwen2, qwen3, phi3 or gemma3, "
        "found \"mamba\"");
  GgufWriter llama;
  llama.string("general.architecture", "llama");
  llama.u32("llama.embedding_length", 32);
  bytes = llama.bytes();
  CHECK(error_message([&] { kvlens::gguf_model_config(GgufFile(bytes, "m.gguf")); }) ==
        "m.gguf: metadata \"llama.attention.head_count\": expected a non-negative integer, found "
        "missing");
  GgufWriter scaled;
  scaled.string("general.architecture", "qwen2");
  for (const char* key : {"qwen2.embedding_length", "qwen2.block_count",
                          "qwen2.feed_forward_length", "qwen2.context_length"}) {
    scaled.u32(key, 64);
  }
  scaled.u32("qwen2.attention.head_count", 4);
  scaled.f32("qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
  scaled.u32("qwen2.vocab_size", 10);
  scaled.string("qwen2.rope.scaling.type", "ntk");
  bytes = scaled.bytes();
  CHECK(error_message([&] { kvlens::gguf_model_config(GgufFile(bytes, "m.gguf")); }) ==
        "m.gguf: metadata \"qwen2.rope.scaling.type\": expected \"none\", \"linear\" or "
        "\"yarn\", found \"ntk\"");
}

namespace {

// The keys every architecture needs: hidden 64, 4 heads of 16, 2 layers, context 4096.
GgufWriter minimal_model(const std::string& arch) {
  GgufWriter w;
  w.string("general.architecture", arch);
  w.u32(arch + ".embedding_length", 64);
  w.u32(arch + ".block_count", 2);
  w.u32(arch + ".feed_forward_length", 128);
  w.u32(arch + ".context_length", 4096);
  w.u32(arch + ".attention.head_count", 4);
  w.f32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.u32(arch + ".vocab_size", 100);
  return w;
}

kvlens::ModelConfig config_of(const GgufWriter& w) {
  const std::string bytes = w.bytes();
  return kvlens::gguf_model_config(GgufFile(bytes, "r.gguf"));
}

}  // namespace

TEST_CASE("gguf config: rope scaling from metadata and from factor tensors", "[gguf]") {
  using Type = kvlens::RopeScaling::Type;
  SECTION("linear") {
    GgufWriter w = minimal_model("qwen2");
    w.string("qwen2.rope.scaling.type", "linear");
    w.f32("qwen2.rope.scaling.factor", 4.0f);
    const kvlens::ModelConfig c = config_of(w);
    CHECK(c.rope_scaling.type == Type::kLinear);
    CHECK(c.rope_scaling.factor == 4.0);
  }
  SECTION("yarn") {
    GgufWriter w = minimal_model("qwen3");
    w.string("qwen3.rope.scaling.type", "yarn");
    w.f32("qwen3.rope.scaling.factor", 4.0f);
    w.u32("qwen3.rope.scaling.original_context_length", 1024);
    const kvlens::ModelConfig c = config_of(w);
    CHECK(c.rope_scaling.type == Type::kYarn);
    CHECK(c.rope_scaling.original_max_position_embeddings == 1024);
  }
  SECTION("llama3's per-frequency divisors in rope_freqs.weight") {
    GgufWriter w = minimal_model("llama");
    const std::vector<float> divisors = {1, 1, 1.5f, 2, 4, 8, 8, 8};  // head_dim 16: 8 pairs
    w.tensor_f32("rope_freqs.weight", {8}, kvlens::test::kGgmlF32, divisors);
    const kvlens::ModelConfig c = config_of(w);
    CHECK(c.rope_scaling.type == Type::kLongRope);
    CHECK(c.rope_attention_scale() == 1.0);
    const std::vector<float> inv_freq = c.rope_inv_freq();
    REQUIRE(inv_freq.size() == 8);
    for (size_t i = 0; i < 8; ++i) {
      const double plain = 1.0 / std::pow(10000.0, double(2 * i) / 16.0);
      CHECK(inv_freq[i] == Approx(plain / divisors[i]).epsilon(1e-6));
    }
    CHECK(c.rope_inv_freq(100000) == inv_freq);  // the same table past the context
  }
  SECTION("phi3's longrope factors and partial rotation") {
    GgufWriter w = minimal_model("phi3");
    w.u32("phi3.rope.dimension_count", 8);  // half of head_dim 16: 4 pairs
    w.u32("phi3.rope.scaling.original_context_length", 1024);
    w.f32("phi3.rope.scaling.attn_factor", 1.25f);
    w.u32("phi3.attention.sliding_window", 512);
    w.tensor_f32("rope_factors_long.weight", {4}, kvlens::test::kGgmlF32, {2, 3, 4, 5});
    w.tensor_f32("rope_factors_short.weight", {4}, kvlens::test::kGgmlF32, {1, 1, 1, 2});
    const kvlens::ModelConfig c = config_of(w);
    CHECK(c.rotary_dim == 8);
    CHECK(c.sliding_window == 512);
    CHECK(c.rope_scaling.type == Type::kLongRope);
    CHECK(c.rope_scaling.long_factor == std::vector<double>{2, 3, 4, 5});
    CHECK(c.rope_scaling.short_factor == std::vector<double>{1, 1, 1, 2});
    CHECK(c.rope_scaling.original_max_position_embeddings == 1024);
    CHECK(c.rope_attention_scale() == 1.25);
  }
  SECTION("one part of a split file") {
    GgufWriter w = minimal_model("llama");
    w.u32("split.count", 3);
    CHECK(error_message([&] { config_of(w); }) ==
          "r.gguf: metadata \"split.count\": expected a single-file GGUF (join the parts with "
          "llama-gguf-split --merge), found 3 parts");
  }
  SECTION("a rope dimension other than the head's outside phi3") {
    GgufWriter w = minimal_model("llama");
    w.u32("llama.rope.dimension_count", 8);
    CHECK(error_message([&] { config_of(w); }) ==
          "r.gguf: metadata \"llama.rope.dimension_count\": expected the head dimension 16 (llama "
          "rotates whole heads), found 8");
  }
}

TEST_CASE("gguf config: gemma3 metadata gives gemma3_text's layer pattern and scalars", "[gguf]") {
  GgufWriter w;
  w.string("general.architecture", "gemma3");
  w.u32("gemma3.embedding_length", 64);
  w.u32("gemma3.block_count", 7);
  w.u32("gemma3.feed_forward_length", 128);
  w.u32("gemma3.context_length", 1024);
  w.u32("gemma3.attention.head_count", 4);
  w.u32("gemma3.attention.head_count_kv", 1);
  w.u32("gemma3.attention.key_length", 32);
  w.u32("gemma3.attention.value_length", 32);
  w.u32("gemma3.attention.sliding_window", 16);
  w.f32("gemma3.rope.freq_base", 1000000.0f);
  w.f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6f);
  w.u32("gemma3.vocab_size", 100);
  const std::string bytes = w.bytes();
  const nlohmann::json c = kvlens::gguf_config_json(GgufFile(bytes, "g.gguf"));
  CHECK(c["model_type"] == "gemma3_text");
  CHECK(c["head_dim"] == 32);
  CHECK(c["sliding_window"] == 16);
  CHECK(c["query_pre_attn_scalar"] == 32);
  CHECK(c["rope_local_base_freq"] == 10000.0);
  CHECK(c["rope_theta"] == 1000000.0);
  CHECK(c["hidden_activation"] == "gelu_pytorch_tanh");
  CHECK(c["tie_word_embeddings"] == true);
  CHECK(c["final_logit_softcapping"].is_null());
  const std::vector<std::string> layers = c["layer_types"];
  CHECK(layers == std::vector<std::string>{"sliding_attention", "sliding_attention",
                                           "sliding_attention", "sliding_attention",
                                           "sliding_attention", "full_attention",
                                           "sliding_attention"});
}

TEST_CASE("gguf weights: names map back to Hugging Face's per family", "[gguf]") {
  using kvlens::hf_tensor_name;
  CHECK(hf_tensor_name("token_embd.weight", "llama") == "model.embed_tokens.weight");
  CHECK(hf_tensor_name("output.weight", "qwen2") == "lm_head.weight");
  CHECK(hf_tensor_name("blk.12.attn_q.bias", "qwen2") == "model.layers.12.self_attn.q_proj.bias");
  CHECK(hf_tensor_name("blk.0.attn_k_norm.weight", "qwen3") ==
        "model.layers.0.self_attn.k_norm.weight");
  CHECK(hf_tensor_name("blk.1.ffn_norm.weight", "llama") ==
        "model.layers.1.post_attention_layernorm.weight");
  CHECK(hf_tensor_name("blk.1.ffn_norm.weight", "gemma3_text") ==
        "model.layers.1.pre_feedforward_layernorm.weight");
  CHECK(hf_tensor_name("blk.1.post_attention_norm.weight", "gemma3_text") ==
        "model.layers.1.post_attention_layernorm.weight");
  CHECK(hf_tensor_name("blk.1.post_ffw_norm.weight", "gemma3_text") ==
        "model.layers.1.post_feedforward_layernorm.weight");
  CHECK(hf_tensor_name("blk.3.ffn_up.weight", "phi3") == "model.layers.3.mlp.gate_up_proj.weight");
  CHECK(hf_tensor_name("blk.3.ffn_up.weight", "llama") == "model.layers.3.mlp.up_proj.weight");
  CHECK(hf_tensor_name("blk.3.attn_qkv.weight", "phi3") ==
        "model.layers.3.self_attn.qkv_proj.weight");
  CHECK_FALSE(hf_tensor_name("rope_freqs.weight", "llama"));
  CHECK_FALSE(hf_tensor_name("blk.x.attn_q.weight", "llama"));
  CHECK_FALSE(hf_tensor_name("blk..attn_q.weight", "llama"));
}

TEST_CASE("gguf model: a converted tiny Llama loads to its safetensors folder's weights",
          "[gguf]") {
  kvlens::test::TinyLlamaSpec spec;
  spec.intermediate = 64;  // whole Q8_0 blocks in every row
  spec.predictor = false;
  const uint32_t type =
      GENERATE(kvlens::test::kGgmlF32, kvlens::test::kGgmlF16, kvlens::test::kGgmlQ8_0);
  const std::string dir = kvlens::test::write_tiny_llama(kvlens::test::make_temp_dir("gg"), spec);
  const std::string path = dir + "/tiny.gguf";
  kvlens::test::write_file(path, kvlens::test::tiny_llama_gguf(spec, type));
  const auto folder = kvlens::Model::load(dir);
  const auto gguf = kvlens::Model::load(path);
  // (the front ends' cheap check accepts what load accepts)
  CHECK_NOTHROW(kvlens::Model::check(path));
  REQUIRE(gguf->gguf != nullptr);
  CHECK(gguf->tokenizer == nullptr);
  CHECK_THAT(error_message([&] { gguf->require_tokenizer(); }), Contains("tiny.gguf: tokenizer"));
  CHECK(gguf->config.hidden_size == folder->config.hidden_size);
  const auto values = [](const kvlens::TensorView& view) {
    std::vector<float> out(size_t(view.numel()));
    REQUIRE(kvlens::widen_to_f32(view.data, view.dtype, view.numel(), out.data()));
    return out;
  };
  const auto same = [&](const kvlens::TensorView& a, const kvlens::TensorView& b, float tolerance) {
    INFO(a.name);
    REQUIRE(a.shape == b.shape);
    const std::vector<float> x = values(a), y = values(b);
    float worst = 0.0f;
    for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
    CHECK(worst <= tolerance);
  };
  // F16 rounds to 11 significant bits, Q8_0 to 1/254 of each block's largest |value| (~0.2).
  const float tolerance = type == kvlens::test::kGgmlF32   ? 0.0f
                          : type == kvlens::test::kGgmlF16 ? 2e-4f
                                                           : 1.5e-3f;
  const kvlens::ModelWeights& a = gguf->weights;
  const kvlens::ModelWeights& b = folder->weights;
  same(a.embed, b.embed, tolerance);
  same(a.lm_head, b.lm_head, tolerance);
  same(a.final_norm, b.final_norm, 0.0f);
  for (size_t i = 0; i < b.layers.size(); ++i) {
    same(a.layers[i].wq, b.layers[i].wq, tolerance);
    same(a.layers[i].wk, b.layers[i].wk, tolerance);
    same(a.layers[i].wv, b.layers[i].wv, tolerance);
    same(a.layers[i].wo, b.layers[i].wo, tolerance);
    same(a.layers[i].w_down, b.layers[i].w_down, tolerance);
    same(a.layers[i].attn_norm, b.layers[i].attn_norm, 0.0f);
  }
  // Plain float tensors are read in place; quantized ones dequantized to F32.
  const auto* base = reinterpret_cast<const std::byte*>(gguf->gguf->bytes().data());
  const bool norm_in_place =
      a.final_norm.data >= base && a.final_norm.data < base + gguf->gguf->bytes().size();
  CHECK(norm_in_place);
  CHECK(a.layers[0].wv.dtype ==
        (type == kvlens::test::kGgmlF16 ? kvlens::DType::F16 : kvlens::DType::F32));
}

TEST_CASE("gguf model: large quantized models are dequantized to BF16", "[gguf]") {
  kvlens::test::TinyLlamaSpec spec;
  spec.intermediate = 64;
  const std::string bytes = kvlens::test::tiny_llama_gguf(spec, kvlens::test::kGgmlQ8_0);
  auto file = std::make_shared<GgufFile>(bytes, "t.gguf");
  // About 33k quantized values: 130 kB as F32.
  CHECK(kvlens::gguf_dequantized_dtype(*file) == kvlens::DType::F32);
  CHECK(kvlens::gguf_dequantized_dtype(*file, 1000) == kvlens::DType::BF16);
  const kvlens::ModelConfig config = kvlens::gguf_model_config(*file);
  const auto f32 = kvlens::load_gguf_tensors(file, config, kvlens::DType::F32);
  const auto bf16 = kvlens::load_gguf_tensors(file, config, kvlens::DType::BF16);
  for (const std::string& name : f32->names()) {
    INFO(name);
    const kvlens::TensorView a = f32->tensor(name), b = bf16->tensor(name);
    CHECK(b.dtype == (a.shape.size() == 2 ? kvlens::DType::BF16 : kvlens::DType::F32));
    std::vector<float> x(size_t(a.numel())), y(size_t(a.numel()));
    kvlens::widen_to_f32(a.data, a.dtype, a.numel(), x.data());
    kvlens::widen_to_f32(b.data, b.dtype, b.numel(), y.data());
    for (size_t i = 0; i < x.size(); ++i) {
      const float expected =
          a.shape.size() == 2 ? kvlens::bf16_to_f32(kvlens::f32_to_bf16(x[i])) : x[i];
      if (y[i] != expected) FAIL("value " << i);
    }
  }
}

TEST_CASE("gguf model: gemma3 norm weights lose the +1 llama.cpp's converter added", "[gguf]") {
  GgufWriter w;
  w.tensor_f32("blk.0.attn_norm.weight", {2}, kvlens::test::kGgmlF32, {1.5f, 0.75f});
  w.tensor_f32("blk.0.attn_v.weight", {2}, kvlens::test::kGgmlF32, {1.5f, 0.75f});
  const std::string bytes = w.bytes();
  auto file = std::make_shared<GgufFile>(bytes, "g.gguf");
  kvlens::ModelConfig config;
  config.model_type = "gemma3_text";
  const auto set = kvlens::load_gguf_tensors(file, config);
  std::vector<float> norm(2), v(2);
  const kvlens::TensorView norm_view = set->tensor("model.layers.0.input_layernorm.weight");
  const kvlens::TensorView v_view = set->tensor("model.layers.0.self_attn.v_proj.weight");
  kvlens::widen_to_f32(norm_view.data, norm_view.dtype, 2, norm.data());
  kvlens::widen_to_f32(v_view.data, v_view.dtype, 2, v.data());
  CHECK(norm == std::vector<float>{0.5f, -0.25f});
  CHECK(v == std::vector<float>{1.5f, 0.75f});
}

TEST_CASE("gguf model: a tensor type that cannot be dequantized is named with the tensor",
          "[gguf]") {
  GgufWriter w;
  w.tensor("blk.0.attn_v.weight", {256}, 10, std::string(84, '\0'));  // Q2_K
  const std::string bytes = w.bytes();
  auto file = std::make_shared<GgufFile>(bytes, "q.gguf");
  kvlens::ModelConfig config;
  config.model_type = "llama";
  CHECK_THAT(error_message([&] { kvlens::load_gguf_tensors(file, config); }),
             Contains("q.gguf: tensor \"blk.0.attn_v.weight\": tensor type: expected one of F32") &&
                 Contains("found Q2_K"));
}

TEST_CASE("gguf cli: info reports the file's tensor types and the dequantized size", "[gguf]") {
  kvlens::test::TinyLlamaSpec spec;
  spec.intermediate = 64;
  const std::string path = kvlens::test::make_temp_dir("gguf_info") + "/tiny.gguf";
  kvlens::test::write_file(path, kvlens::test::tiny_llama_gguf(spec, kvlens::test::kGgmlQ8_0));
  const auto result = kvlens::test::run_command(kvlens::test::cli_path() + " info --model " + path);
  REQUIRE(result.exit_code == 0);
  const nlohmann::json info = nlohmann::json::parse(result.out);
  CHECK(info["model_type"] == "llama");
  CHECK(info["gguf"]["tensor_types"]["Q8_0"] ==
        2 + 7 * spec.layers);  // embed, lm_head, 7 per layer
  CHECK(info["gguf"]["tensor_types"]["F32"] == 1 + 2 * spec.layers);
  CHECK(info["gguf"]["dequantized_to"] == "F32");
  CHECK(info["gguf"]["in_place_bytes"] == (1 + 2 * spec.layers) * spec.hidden * 4);
  CHECK(info["tokenizer"].is_null());
  const auto bad =
      kvlens::test::run_command(kvlens::test::cli_path() + " info --model " + path + ".missing");
  CHECK(bad.exit_code != 0);
}

// The real SmolLM2-135M-Instruct Q4_1 file (tools fetch it; never committed), when
// $KVLENS_SMOLLM2_GGUF names it: its config must be SmolLM2-135M's.
TEST_CASE("gguf real: SmolLM2-135M-Instruct's config from its GGUF metadata", "[gguf]") {
  const char* path = std::getenv("KVLENS_SMOLLM2_GGUF");
  if (path == nullptr || !std::filesystem::exists(path)) {
    WARN("KVLENS_SMOLLM2_GGUF not set or missing: the real-file check was skipped");
    return;
  }
  const auto model = kvlens::Model::load(path);
  const kvlens::ModelConfig& c = model->config;
  CHECK(c.model_type == "llama");
  CHECK(c.num_layers == 30);
  CHECK(c.hidden_size == 576);
  CHECK(c.intermediate_size == 1536);
  CHECK(c.num_heads == 9);
  CHECK(c.num_kv_heads == 3);
  CHECK(c.head_dim == 64);
  CHECK(c.vocab_size == 49152);
  CHECK(c.tie_word_embeddings);
  CHECK(c.rope_theta == 100000.0);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.max_position_embeddings == 8192);
  CHECK(model->weights.layers.size() == 30);
}

TEST_CASE("gguf cli: score on a converted F32 GGUF equals score on its folder", "[gguf]") {
  kvlens::test::TinyLlamaSpec spec;
  spec.predictor = false;
  const std::string dir = kvlens::test::write_tiny_llama(kvlens::test::make_temp_dir("gs"), spec);
  const std::string path = dir + "/tiny.gguf";
  kvlens::test::write_file(path, kvlens::test::tiny_llama_gguf(spec));
  const std::string args = " --tokens 1,5,9,3,3,7,12,40 --json --threads 1";
  const auto folder =
      kvlens::test::run_command(kvlens::test::cli_path() + " score --model " + dir + args);
  const auto gguf =
      kvlens::test::run_command(kvlens::test::cli_path() + " score --model " + path + args);
  REQUIRE(folder.exit_code == 0);
  REQUIRE(gguf.exit_code == 0);
  CHECK(gguf.out == folder.out);
}
