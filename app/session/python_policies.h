// --policy-file FILE.py (kvlens-cli and the app): Python policies (kvlens.Policy subclasses)
// registered next to the built-ins through an embedded CPython (python/embed/).
#pragma once

#include <string>
#include <vector>

namespace kvlens::session {

// Runs each file and registers the policies it defines; returns their ids. Throws kvlens::Error
// naming the file (and, in a build without Python, saying so).
std::vector<std::string> load_policy_files(const std::vector<std::string>& files);

}  // namespace kvlens::session
