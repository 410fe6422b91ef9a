// ggml's tensor element types (the ids GGUF files store) with their block shapes, and the
// dequantization of the common ones to F32: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (blocks
// of 32 values) and Q4_K, Q5_K, Q6_K (super-blocks of 256 values).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvlens {

struct GgmlTypeInfo {
  uint32_t id = 0;
  const char* name = "";
  int64_t block_elements = 1;  // values per block (1 for plain F32, F16, ...)
  int64_t block_bytes = 0;     // bytes per block
  bool dequantizable = false;  // dequantize_to_f32 handles it
};

// The type of that id, or nullptr for an id ggml does not define.
const GgmlTypeInfo* ggml_type_info(uint32_t id);
// "Q4_K", or "type 99" for an unknown id.
std::string ggml_type_name(uint32_t id);
// The types dequantize_to_f32 handles, for messages: "F32, F16, BF16, Q4_0, ...".
std::string dequantizable_type_names();

// Throws the kvlens::Error dequantize_to_f32 gives for a type it cannot dequantize.
void require_dequantizable(uint32_t type, const std::string& source);

// dst[i] = value i of `count` values of ggml type `type` stored at `src` (count / block_elements
// whole blocks; `src` may be unaligned). Throws kvlens::Error naming `source` and the type when
// the type is unknown or not dequantizable, or count is not a whole number of blocks.
void dequantize_to_f32(uint32_t type, const std::byte* src, int64_t count, float* dst,
                       const std::string& source);

}  // namespace kvlens
