// Safetensors reading: header parsing (bounds-checked, fuzzed) and a memory-mapped file set
// that resolves tensor names across shards (model.safetensors.index.json).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/common/dtype.h"
#include "engine/common/mapped_file.h"
#include "engine/common/tensor_view.h"

namespace kvlens {

struct TensorEntry {
  // Every safetensors dtype is accepted here (its size is known, so offsets can be checked);
  // `dtype` is meaningful only when stored_dtype is F32, F16 or BF16. SafetensorsFile::tensor()
  // refuses the others, so a file holding an extra I64 buffer still opens.
  std::string stored_dtype;  // safetensors spelling, e.g. "BF16", "I64"
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets relative to the start of the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t header_size = 0;  // the JSON length from the 8-byte prefix
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::string> metadata;
};

// Parses the 8-byte length prefix and the JSON header of a whole file's bytes and checks every
// entry: known dtype, shape * dtype size == end - begin, offsets inside the data section,
// no two tensors overlapping. `source` names the file in errors. Never reads out of bounds.
// Tensor data is not guaranteed to be aligned for its dtype (the format does not require it).
SafetensorsHeader parse_safetensors_header(std::string_view file_bytes, const std::string& source);

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  const SafetensorsHeader& header() const { return header_; }
  const std::string& path() const { return file_.path(); }
  bool contains(const std::string& name) const { return header_.tensors.count(name) != 0; }
  // Throws Error when missing or when its dtype is not F32, F16 or BF16.
  TensorView tensor(const std::string& name) const;

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

// All weights of a checkpoint folder: model.safetensors, or the shards listed by
// model.safetensors.index.json ("weight_map": name -> file).
class SafetensorsSet {
 public:
  static SafetensorsSet open_folder(const std::string& model_dir);
  // Tensors whose bytes live elsewhere (a GGUF file's, some dequantized), named as in a
  // checkpoint folder; `owner` keeps those bytes alive as long as the set. `source` names them.
  static SafetensorsSet from_views(std::string source, std::vector<TensorView> views,
                                   std::shared_ptr<const void> owner);
  bool contains(const std::string& name) const;
  TensorView tensor(const std::string& name) const;  // throws Error naming folder and tensor
  std::vector<std::string> names() const;
  const std::string& folder() const { return folder_; }

 private:
  std::string folder_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, size_t> file_of_tensor_;
  std::map<std::string, TensorView> views_;  // from_views only
  std::shared_ptr<const void> views_owner_;
};

}  // namespace kvlens
