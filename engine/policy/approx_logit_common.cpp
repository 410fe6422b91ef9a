// The approximate-logit policies' shared knob (approx_logit_common.h).
#include "engine/policy/approx_logit_common.h"

#include <algorithm>
#include <cmath>

#include "engine/common/error.h"

namespace kvlens {

int64_t channel_count(double value, int64_t head_dim, const std::string& owner,
                      const std::string& param) {
  const std::string expected = "a fraction of head_dim in (0, 1) or a whole count in [1, " +
                               std::to_string(head_dim) + "] (head_dim " +
                               std::to_string(head_dim) + ")";
  if (!(value > 0.0)) throw Error(owner, param, expected, std::to_string(value));
  if (value < 1.0) return std::max<int64_t>(1, int64_t(std::ceil(value * double(head_dim))));
  if (value != std::floor(value) || value > double(head_dim))
    throw Error(owner, param, expected, std::to_string(value));
  return int64_t(value);
}

}  // namespace kvlens
