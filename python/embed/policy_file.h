// --policy-file FILE.py in kvlens-cli and the app: an embedded CPython (pybind11::embed, started
// on first use) runs the file and registers every kvlens.Policy subclass it defines into this
// process's policy registry, through the same adapter as the kvlens module (py_policy.h).
#pragma once

#include <string>
#include <vector>

namespace kvlens::python {

// Returns the ids registered. Throws kvlens::Error naming the file and the Python error.
std::vector<std::string> load_policy_file(const std::string& path);

}  // namespace kvlens::python
