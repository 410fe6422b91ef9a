// Comma-separated lists as flags, script commands and settings write them ("dense, h2o,quest").
#pragma once

#include <string>
#include <vector>

namespace kvlens {

// "a, b,c" -> {"a", "b", "c"}: split at commas, spaces around items trimmed, empty items kept
// (callers reject them with their own flag's message).
std::vector<std::string> split_comma_list(const std::string& text);

}  // namespace kvlens
