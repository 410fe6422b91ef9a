// Safetensors: round trips through the test writer (single file and sharded folders) and every
// corrupt-header path; each error must name the file, the tensor or field, and the expectation.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <set>

#include "engine/common/error.h"
#include "engine/model/safetensors.h"
#include "tests/support/error_message.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using Catch::Matchers::Contains;
using kvlens::parse_safetensors_header;
using kvlens::SafetensorsFile;
using kvlens::SafetensorsSet;
using kvlens::test::make_tensor;
using kvlens::test::safetensors_raw;

namespace {

using kvlens::test::error_message;

std::string header_error(const std::string& header_json, const std::string& data) {
  return error_message(
      [&] { parse_safetensors_header(safetensors_raw(header_json, data), "bad.safetensors"); });
}

std::vector<float> view_floats(const kvlens::TensorView& view) {
  REQUIRE(view.dtype == kvlens::DType::F32);
  std::vector<float> values(view.bytes / 4);
  std::memcpy(values.data(), view.data, view.bytes);
  return values;
}

}  // namespace

TEST_CASE("safetensors: a written file reads back", "[model]") {
  const std::string dir = kvlens::test::make_temp_dir("st-roundtrip");
  const std::string path = dir + "/weights.safetensors";
  kvlens::test::write_safetensors(
      path,
      {make_tensor("a", "F32", {2, 3}, {1, 2, 3, 4, 5, 6}),
       make_tensor("b.bf16", "BF16", {2}, {0.5f, -2.0f}),
       make_tensor("c.f16", "F16", {1, 1, 2}, {0.25f, 65504.0f}),
       make_tensor("scalar", "F32", {}, {7.0f}), make_tensor("empty", "F32", {0, 4}, {})},
      {{"format", "pt"}});

  const SafetensorsFile file(path);
  CHECK(file.path() == path);
  CHECK(file.header().metadata.at("format") == "pt");
  CHECK(file.header().tensors.size() == 5);
  CHECK((file.header().header_size + 8) % 8 == 0);  // the writer pads like the reference one

  const kvlens::TensorView a = file.tensor("a");
  CHECK(a.name == "a");
  CHECK(a.file == path);
  CHECK(a.shape == std::vector<int64_t>{2, 3});
  CHECK(a.numel() == 6);
  CHECK(a.bytes == 24);
  CHECK(view_floats(a) == std::vector<float>{1, 2, 3, 4, 5, 6});

  const kvlens::TensorView b = file.tensor("b.bf16");
  CHECK(b.dtype == kvlens::DType::BF16);
  CHECK(b.bytes == 4);
  uint16_t bits[2];
  std::memcpy(bits, b.data, 4);
  CHECK(kvlens::bf16_to_f32(bits[0]) == 0.5f);
  CHECK(kvlens::bf16_to_f32(bits[1]) == -2.0f);

  const kvlens::TensorView c = file.tensor("c.f16");
  CHECK(c.dtype == kvlens::DType::F16);
  std::memcpy(bits, c.data, 4);
  CHECK(kvlens::f16_to_f32(bits[0]) == 0.25f);
  CHECK(kvlens::f16_to_f32(bits[1]) == 65504.0f);

  CHECK(file.tensor("scalar").numel() == 1);
  CHECK(file.tensor("empty").numel() == 0);
  CHECK(file.tensor("empty").bytes == 0);

  const std::string message = error_message([&] { file.tensor("nope"); });
  CHECK_THAT(message, Contains(path) && Contains("nope"));
}

TEST_CASE("safetensors: F16 writer rounds like IEEE", "[model]") {
  using kvlens::test::f32_to_f16_bits;
  CHECK(f32_to_f16_bits(1.0f) == 0x3c00);
  CHECK(f32_to_f16_bits(-2.0f) == 0xc000);
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);    // halfway to the next power: rounds to inf
  CHECK(f32_to_f16_bits(0x1.0p-24f) == 0x0001);  // smallest subnormal
  CHECK(f32_to_f16_bits(0x1.0p-25f) == 0x0000);  // tie rounds to even (zero)
  CHECK(f32_to_f16_bits(0x1.8p-25f) == 0x0001);
  CHECK(f32_to_f16_bits(0x1.0p-14f) == 0x0400);         // smallest normal
  CHECK(f32_to_f16_bits(1.0f + 0x1.0p-11f) == 0x3c00);  // tie to even
  CHECK(f32_to_f16_bits(1.0f + 0x1.8p-11f) == 0x3c01);  // 0.75 ulp rounds up
  CHECK(f32_to_f16_bits(1.0f + 0x1.8p-10f) == 0x3c02);  // 1.5 ulp: tie to even
  for (const float v : {0.1f, -3.14159f, 1e-5f, 3e-7f, 1000.5f}) {
    CHECK(kvlens::f16_to_f32(f32_to_f16_bits(v)) == Approx(v).epsilon(1e-3).margin(6e-8));
  }
}

TEST_CASE("safetensors: corrupt headers are refused with a clear message", "[model]") {
  const std::string eight_floats(32, '\0');

  SECTION("a file shorter than the length prefix") {
    const std::string message =
        error_message([] { parse_safetensors_header("abc", "short.safetensors"); });
    CHECK_THAT(message,
               Contains("short.safetensors") && Contains("header length") && Contains("8-byte"));
  }
  SECTION("header length past the end of the file") {
    std::string bytes = safetensors_raw("{}", "");
    bytes[0] = char(200);
    const std::string message =
        error_message([&] { parse_safetensors_header(bytes, "bad.safetensors"); });
    CHECK_THAT(message, Contains("bad.safetensors") && Contains("header length") &&
                            Contains("past the end of the file"));
    // The largest possible length must not wrap around.
    std::string huge(16, '\xff');
    CHECK_THAT(error_message([&] { parse_safetensors_header(huge, "bad.safetensors"); }),
               Contains("past the end of the file"));
  }
  SECTION("a header that is not JSON") {
    CHECK_THAT(header_error("this is not json", ""),
               Contains("bad.safetensors") && Contains("header") && Contains("JSON"));
    CHECK_THAT(header_error("", ""), Contains("bad.safetensors") && Contains("JSON"));
    CHECK_THAT(header_error("[1, 2, 3]", ""),
               Contains("bad.safetensors") && Contains("JSON object") && Contains("array"));
  }
  SECTION("offsets out of range") {
    const std::string message = header_error(
        R"({"w": {"dtype": "F32", "shape": [8], "data_offsets": [0, 32]}})", std::string(16, 0));
    CHECK_THAT(message, Contains("bad.safetensors") && Contains("\"w\"") &&
                            Contains("data_offsets") && Contains("16 bytes"));
    CHECK_THAT(header_error(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})",
                            eight_floats),
               Contains("\"w\"") && Contains("begin <= end"));
    CHECK_THAT(header_error(R"({"w": {"dtype": "F32", "shape": [2],
                               "data_offsets": [18446744073709551615, 8]}})",
                            eight_floats),
               Contains("\"w\"") && Contains("data_offsets"));
    CHECK_THAT(header_error(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}})",
                            eight_floats),
               Contains("\"w\"") && Contains("non-negative"));
  }
  SECTION("a truncated file") {
    const std::string full =
        kvlens::test::safetensors_bytes({make_tensor("first", "F32", {4}, {1, 2, 3, 4}),
                                         make_tensor("last", "F32", {4}, {5, 6, 7, 8})});
    const std::string message = error_message(
        [&] { parse_safetensors_header(full.substr(0, full.size() - 3), "trunc.safetensors"); });
    CHECK_THAT(message,
               Contains("trunc.safetensors") && Contains("\"last\"") && Contains("truncated"));
    // And through the file API, so the path shows up.
    const std::string path = kvlens::test::make_temp_dir("st-trunc") + "/model.safetensors";
    kvlens::test::write_file(path, full.substr(0, full.size() - 3));
    CHECK_THAT(error_message([&] { SafetensorsFile file(path); }),
               Contains(path) && Contains("\"last\"") && Contains("truncated"));
  }
  SECTION("overlapping offsets") {
    const std::string message = header_error(R"({
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                                             eight_floats);
    CHECK_THAT(message, Contains("bad.safetensors") && Contains("\"a\"") && Contains("\"b\"") &&
                            Contains("not shared"));
  }
  SECTION("a size that does not match shape and dtype") {
    CHECK_THAT(header_error(R"({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})",
                            eight_floats),
               Contains("\"w\"") && Contains("end - begin == 8 bytes") && Contains("16 bytes"));
  }
  SECTION("an unknown dtype") {
    const std::string message = header_error(
        R"({"w": {"dtype": "Q4_K", "shape": [2], "data_offsets": [0, 2]}})", eight_floats);
    CHECK_THAT(message, Contains("bad.safetensors") && Contains("\"w\"") && Contains("dtype") &&
                            Contains("Q4_K"));
    CHECK_THAT(
        header_error(R"({"w": {"dtype": 5, "shape": [2], "data_offsets": [0, 2]}})", eight_floats),
        Contains("\"w\" dtype") && Contains("the number 5"));
  }
  SECTION("bad shapes") {
    CHECK_THAT(header_error(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})",
                            eight_floats),
               Contains("\"w\" shape") && Contains("non-negative"));
    CHECK_THAT(header_error(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})",
                            eight_floats),
               Contains("\"w\" shape"));
    CHECK_THAT(header_error(R"({"w": {"dtype": "F32", "shape": 3, "data_offsets": [0, 4]}})",
                            eight_floats),
               Contains("\"w\" shape") && Contains("array"));
    // 2^32 * 2^32 elements overflow 64 bits: refused, not wrapped to a small size.
    CHECK_THAT(header_error(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296],
                               "data_offsets": [0, 0]}})",
                            eight_floats),
               Contains("\"w\" shape") && Contains("64 bits"));
    // A zero extent makes the product 0 even after an overflowing partial product.
    CHECK_NOTHROW(parse_safetensors_header(
        safetensors_raw(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 0],
                           "data_offsets": [0, 0]}})",
                        eight_floats),
        "ok"));
  }
  SECTION("missing or malformed entry fields") {
    CHECK_THAT(header_error(R"({"w": {"dtype": "F32", "shape": [2]}})", eight_floats),
               Contains("\"w\" data_offsets") && Contains("missing"));
    CHECK_THAT(
        header_error(R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})", eight_floats),
        Contains("\"w\" data_offsets"));
    CHECK_THAT(header_error(R"({"w": [1, 2]})", eight_floats),
               Contains("\"w\"") && Contains("dtype, shape and data_offsets"));
    CHECK_THAT(header_error(R"({"__metadata__": {"format": 1}})", ""),
               Contains("__metadata__.format") && Contains("a string"));
  }
}

TEST_CASE("safetensors: dtypes other than F32/F16/BF16 parse but cannot be loaded", "[model]") {
  const std::string dir = kvlens::test::make_temp_dir("st-i32");
  const std::string path = dir + "/model.safetensors";
  kvlens::test::TestTensor ids{"ids", "I32", {2}, std::string(8, '\0')};
  kvlens::test::TestTensor positions{"position_ids", "I64", {1, 2}, std::string(16, '\0')};
  kvlens::test::write_safetensors(path, {ids, positions, make_tensor("w", "F32", {1}, {1})});
  const SafetensorsFile file(path);
  CHECK(file.header().tensors.at("ids").stored_dtype == "I32");
  CHECK(file.tensor("w").numel() == 1);
  const std::string message = error_message([&] { file.tensor("ids"); });
  CHECK_THAT(message, Contains(path) && Contains("\"ids\"") && Contains("dtype F32, F16 or BF16") &&
                          Contains("I32"));
}

TEST_CASE("safetensors: folders, single and sharded", "[model]") {
  kvlens::test::TinyLlamaSpec spec;
  spec.dtype = "BF16";
  const std::vector<kvlens::test::TestTensor> expected = kvlens::test::tiny_llama_tensors(spec);

  SECTION("sharded round trip") {
    spec.sharded = true;
    const std::string dir =
        kvlens::test::write_tiny_llama(kvlens::test::make_temp_dir("st-sharded"), spec);
    REQUIRE_FALSE(std::filesystem::exists(dir + "/model.safetensors"));
    const SafetensorsSet set = SafetensorsSet::open_folder(dir);
    CHECK(set.folder() == dir);
    CHECK(set.names().size() == expected.size());
    std::set<std::string> files;
    for (const auto& tensor : expected) {
      REQUIRE(set.contains(tensor.name));
      const kvlens::TensorView view = set.tensor(tensor.name);
      files.insert(view.file);
      CHECK(view.shape == tensor.shape);
      CHECK(view.dtype == kvlens::DType::BF16);
      REQUIRE(view.bytes == tensor.bytes.size());
      CHECK(std::memcmp(view.data, tensor.bytes.data(), view.bytes) == 0);
    }
    CHECK(files.size() == 2);
    CHECK_FALSE(set.contains("lm_head.bias"));
    CHECK_THAT(error_message([&] { set.tensor("lm_head.bias"); }),
               Contains(dir) && Contains("lm_head.bias"));
  }
  SECTION("single file") {
    const std::string dir =
        kvlens::test::write_tiny_llama(kvlens::test::make_temp_dir("st-single"), spec);
    const SafetensorsSet set = SafetensorsSet::open_folder(dir);
    CHECK(set.names().size() == expected.size());
    CHECK(set.tensor("model.norm.weight").file == dir + "/model.safetensors");
  }
  SECTION("a folder without weights") {
    const std::string dir = kvlens::test::make_temp_dir("st-empty");
    CHECK_THAT(error_message([&] { SafetensorsSet::open_folder(dir); }),
               Contains(dir) && Contains("model.safetensors or model.safetensors.index.json"));
  }
  SECTION("an index pointing to a missing shard") {
    spec.sharded = true;
    const std::string dir =
        kvlens::test::write_tiny_llama(kvlens::test::make_temp_dir("st-noshard"), spec);
    std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
    const std::string message = error_message([&] { SafetensorsSet::open_folder(dir); });
    CHECK_THAT(message, Contains("model.safetensors.index.json") && Contains("weight_map") &&
                            Contains("model-00002-of-00002.safetensors") &&
                            Contains("existing shard"));
  }
  SECTION("an index listing a tensor its shard lacks") {
    const std::string dir = kvlens::test::make_temp_dir("st-lying-index");
    kvlens::test::write_safetensors(dir + "/part.safetensors",
                                    {make_tensor("present", "F32", {1}, {1})});
    kvlens::test::write_file(dir + "/model.safetensors.index.json",
                             R"({"weight_map": {"present": "part.safetensors",
                                                "absent": "part.safetensors"}})");
    CHECK_THAT(error_message([&] { SafetensorsSet::open_folder(dir); }),
               Contains(dir + "/part.safetensors") && Contains("\"absent\"") &&
                   Contains("model.safetensors.index.json"));
  }
  SECTION("malformed indexes") {
    const std::string dir = kvlens::test::make_temp_dir("st-bad-index");
    const std::string index = dir + "/model.safetensors.index.json";
    kvlens::test::write_file(index, "{\"weight_map\": ");
    CHECK_THAT(error_message([&] { SafetensorsSet::open_folder(dir); }),
               Contains(index) && Contains("JSON"));
    kvlens::test::write_file(index, R"({"metadata": {}})");
    CHECK_THAT(error_message([&] { SafetensorsSet::open_folder(dir); }),
               Contains(index) && Contains("weight_map"));
    kvlens::test::write_file(index, R"({"weight_map": {"w": "../../etc/passwd"}})");
    CHECK_THAT(error_message([&] { SafetensorsSet::open_folder(dir); }),
               Contains(index) && Contains("\"w\"") && Contains("inside the model folder"));
  }
}
