// load_policy_files (python_policies.h).
#include "app/session/python_policies.h"

#include "engine/common/error.h"

#if KVLENS_HAVE_PYTHON
#include "python/embed/policy_file.h"
#endif

namespace kvlens::session {

std::vector<std::string> load_policy_files(const std::vector<std::string>& files) {
  std::vector<std::string> ids;
  for (const std::string& file : files) {
#if KVLENS_HAVE_PYTHON
    for (std::string& id : python::load_policy_file(file)) ids.push_back(std::move(id));
#else
    throw Error(file, "--policy-file",
                "a kvlens built with Python (python3-dev, python3-numpy, pybind11-dev)",
                "one built without it");
#endif
  }
  return ids;
}

}  // namespace kvlens::session
