// TensorView: a tensor in host memory that something else owns (a mapped weight file, a
// converted buffer): name, dtype, shape and bytes. What a backend uploads weights from.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/dtype.h"

namespace kvlens {

// A tensor inside a mapped file; data points into the map (valid while the file lives).
struct TensorView {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t bytes = 0;
  std::string file;  // the .safetensors file it lives in, for messages

  int64_t numel() const;
};

}  // namespace kvlens
