// What the approximate-logit policies (sparq, loki, doublesparsity) share beyond their ops: the
// count-or-fraction knob of how many channels or directions of a head_dim-wide head they keep.
#pragma once

#include <cstdint>
#include <string>

namespace kvlens {

// `value` channels of a head of `head_dim`: a fraction of head_dim when below 1 (rounded up, at
// least 1), else a whole count <= head_dim. Throws kvlens::Error naming `owner` ("policy
// sparq") and `param` otherwise.
int64_t channel_count(double value, int64_t head_dim, const std::string& owner,
                      const std::string& param);

}  // namespace kvlens
