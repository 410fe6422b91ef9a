// GgufWriter: builds GGUF files for tests, from the format's definition (little-endian header,
// typed metadata, tensor table, data aligned to general.alignment), plus the tiny random Llama of
// tiny_checkpoint.h written the way llama.cpp's converter writes it (GGUF names, q/k permuted).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "tests/support/tiny_checkpoint.h"

namespace kvlens::test {

// GGUF metadata type tags (the reader's), and the ggml type ids the tests use.
using GgufTag = GgufType;
constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ5_0 = 6,
                   kGgmlQ5_1 = 7, kGgmlQ8_0 = 8, kGgmlQ4_K = 12, kGgmlQ5_K = 13, kGgmlQ6_K = 14,
                   kGgmlBF16 = 30;

class GgufWriter {
 public:
  void u32(const std::string& key, uint32_t value);
  void u64(const std::string& key, uint64_t value);
  void i32(const std::string& key, int32_t value);
  void f32(const std::string& key, float value);
  void boolean(const std::string& key, bool value);
  void string(const std::string& key, const std::string& value);
  void string_array(const std::string& key, const std::vector<std::string>& values);
  void f32_array(const std::string& key, const std::vector<float>& values);
  void i32_array(const std::string& key, const std::vector<int32_t>& values);
  // A value given as its type tag and encoded bytes (after the tag), for hand-made bad entries.
  void raw(const std::string& key, uint32_t tag, const std::string& encoded);

  // dims innermost first (ggml's ne); `data` is the tensor's bytes in that type's layout.
  void tensor(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
              const std::string& data);
  // F32 values stored as F32, F16, BF16 or Q8_0 (quantized here: d = max|x| / 127 per block).
  void tensor_f32(const std::string& name, const std::vector<uint64_t>& dims, uint32_t type,
                  const std::vector<float>& values);

  // The whole file. Tensors are laid out in the order given, each at a multiple of `alignment`
  // (general.alignment is written only when a key of that name was added).
  std::string bytes(uint32_t version = 3, uint32_t alignment = 32) const;
  // Where the tensor table's first entry starts in bytes() (after the metadata).
  size_t tensor_table_offset() const;

 private:
  struct Entry {
    std::string key;
    uint32_t tag;
    std::string encoded;
  };
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::string data;
  };
  std::vector<Entry> metadata_;
  std::vector<Tensor> tensors_;
};

// GGUF encodings of a string and a little-endian scalar, for hand-built bytes.
std::string gguf_string(const std::string& text);
template <class T>
std::string gguf_scalar(T value) {
  return std::string(reinterpret_cast<const char*>(&value), sizeof(T));
}

// The tiny random Llama of `spec` (tiny_llama_tensors) as llama.cpp's converter writes it:
// llama.* metadata, GGUF tensor names, attn_q/attn_k rows permuted, matrices stored as
// `matrix_type` (F32, F16, BF16 or Q8_0), norms as F32. tokenizer.ggml.bos/eos ids 1 and 2.
std::string tiny_llama_gguf(const TinyLlamaSpec& spec, uint32_t matrix_type = kGgmlF32);

}  // namespace kvlens::test
