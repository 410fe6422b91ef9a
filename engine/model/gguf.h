// GgufFile: llama.cpp's GGUF model file, memory-mapped and fully validated on open: the header,
// the typed metadata (key -> scalar, string or array) and the tensor table (name, ggml type,
// dims innermost first, byte range in the data section). Every count, length, offset, size and
// alignment is checked against the file before use; bad input is a one-line kvlens::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/mapped_file.h"

namespace kvlens {

// GGUF metadata value types (the file's u32 type tags).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};
std::string_view gguf_type_name(GgufType type);  // "u32", "string", "array", ...

// One metadata value. Views point into the file's bytes (valid while the GgufFile lives).
struct GgufValue {
  GgufType type = GgufType::kU8;
  // Scalars: their little-endian bytes; strings: the text; arrays of numbers or bools: the
  // elements' bytes back to back.
  std::string_view raw;
  GgufType element_type = GgufType::kU8;  // arrays only (never kArray: nested arrays are refused)
  uint64_t count = 0;                     // arrays only
  std::vector<std::string_view> strings;  // arrays of strings only: each element's text
};

struct GgufTensorInfo {
  std::string name;
  uint32_t type = 0;                // ggml type id (dequantize.h)
  std::vector<uint64_t> dims;       // ne[0] (contiguous) first; the Hugging Face shape is reversed
  uint64_t elements = 0;            // product of dims
  uint64_t offset = 0;              // from the start of the data section (a multiple of alignment)
  uint64_t bytes = 0;               // elements / block_elements * block_bytes
  const std::byte* data = nullptr;  // inside the file's bytes

  // Row-major shape as Hugging Face / safetensors write it: dims reversed.
  std::vector<int64_t> shape() const;
};

class GgufFile {
 public:
  // Maps and validates the file; throws kvlens::Error naming `path` and the field.
  static std::shared_ptr<const GgufFile> open(const std::string& path);
  // Validates `bytes` (which must outlive the object; fuzzing and tests). `source` names it.
  GgufFile(std::string_view bytes, std::string source);

  const std::string& source() const { return source_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_bytes() const { return bytes_.size(); }
  std::string_view bytes() const { return bytes_; }  // the whole file (tensor data points in it)
  uint64_t data_offset() const { return data_offset_; }  // start of the data section

  // Metadata by key (sorted; each key appears once in a valid file).
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed getters. A missing key without a default, or a value of another type, throws
  // kvlens::Error naming the file, the key and the expected type.
  // Integers: any integer type whose value fits (u8 .. i64).
  uint64_t u64(std::string_view key) const;
  uint64_t u64(std::string_view key, uint64_t fallback) const;
  uint32_t u32(std::string_view key) const;
  uint32_t u32(std::string_view key, uint32_t fallback) const;
  int64_t i64(std::string_view key) const;
  // Numbers: f32, f64 or any integer type.
  double number(std::string_view key) const;
  double number(std::string_view key, double fallback) const;
  bool boolean(std::string_view key) const;
  bool boolean(std::string_view key, bool fallback) const;
  std::string string(std::string_view key) const;
  std::optional<std::string> optional_string(std::string_view key) const;
  // Arrays: string_array needs strings; float_array f32 or f64 elements; int_array any integer
  // element type whose values fit int32. Missing keys throw.
  std::vector<std::string> string_array(std::string_view key) const;
  std::vector<float> float_array(std::string_view key) const;
  std::vector<int32_t> int_array(std::string_view key) const;
  uint64_t array_size(std::string_view key) const;  // throws unless an array

  // Tensors in file order; names are unique.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* tensor(std::string_view name) const;  // nullptr when absent

 private:
  GgufFile() = default;
  void parse();
  const GgufValue& require(std::string_view key, std::string_view expected) const;

  std::unique_ptr<MappedFile> map_;  // set by open()
  std::string_view bytes_;
  std::string source_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue, std::less<>> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvlens
