// TensorView's element count.
#include "engine/common/tensor_view.h"

namespace kvlens {

int64_t TensorView::numel() const {
  int64_t count = 1;
  for (const int64_t extent : shape) count *= extent;  // the parser checks it against the bytes
  return count;
}

}  // namespace kvlens
