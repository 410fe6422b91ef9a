// libFuzzer entry for the GGUF reader: arbitrary bytes as a whole .gguf file, then every
// metadata getter on every key and the dequantization of every tensor the reader accepted.
// kvlens::Error is the expected outcome for bad input; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "engine/common/error.h"
#include "engine/model/dequantize.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_config.h"

namespace {

template <class F>
void expect_value_or_error(F&& read) {
  try {
    read();
  } catch (const kvlens::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const kvlens::GgufFile file(bytes, "fuzz");
    for (const auto& entry : file.metadata()) {
      const std::string& key = entry.first;
      expect_value_or_error([&] { file.u64(key); });
      expect_value_or_error([&] { file.number(key); });
      expect_value_or_error([&] { file.boolean(key); });
      expect_value_or_error([&] { file.string(key); });
      expect_value_or_error([&] { file.string_array(key); });
      expect_value_or_error([&] { file.float_array(key); });
      expect_value_or_error([&] { file.int_array(key); });
    }
    expect_value_or_error([&] { kvlens::gguf_config_json(file); });
    // Dequantizing reads every byte of each accepted tensor: AddressSanitizer checks that the
    // byte ranges lie inside the input. Large tensors are skipped to keep runs fast.
    std::vector<float> values;
    for (const kvlens::GgufTensorInfo& tensor : file.tensors()) {
      if (tensor.elements > (1u << 16)) continue;
      values.resize(tensor.elements);
      expect_value_or_error([&] {
        kvlens::dequantize_to_f32(tensor.type, tensor.data, int64_t(tensor.elements), values.data(),
                                  "fuzz");
      });
    }
  } catch (const kvlens::Error&) {
  }
  return 0;
}
