// The embedded interpreter of --policy-file (policy_file.h). The interpreter is started once and
// never finalized (policy instances may be destroyed late, from any thread); between calls into
// Python the GIL is released, so the engine's threads take it in the policies' functions.
#include "python/embed/policy_file.h"

#include <pybind11/embed.h>
#include <pybind11/stl.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "engine/common/error.h"
#include "python/src/py_policy.h"

namespace py = pybind11;

PYBIND11_EMBEDDED_MODULE(_kvlens_embedded, m) {
  m.doc() = "kvlens inside kvlens-cli / the app: the Python policy types and their registration";
  kvlens::python::bind_policy_types(m);
}

namespace kvlens::python {
namespace {

void start_interpreter() {
  if (Py_IsInitialized()) return;
  py::initialize_interpreter(false);  // no signal handlers: Ctrl+C stays the program's
  {
    // The kvlens package: beside this executable when installed (<prefix>/bin/..), else the
    // source tree's (a build), else where `cmake --install` was configured to put it.
    std::vector<std::string> dirs;
    std::error_code error;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
    if (!error) {
      const std::filesystem::path prefix = exe.parent_path().parent_path();
      dirs.push_back((prefix / "lib/python3/dist-packages").string());
      dirs.push_back((prefix / ("lib/python" KVLENS_PYTHON_VERSION "/dist-packages")).string());
    }
    dirs.push_back(KVLENS_PYTHON_SOURCE_DIR);
    const std::string installed = KVLENS_PYTHON_INSTALLED_DIRS;
    for (size_t begin = 0, end; begin <= installed.size(); begin = end + 1) {
      end = installed.find(':', begin);
      if (end == std::string::npos) end = installed.size();
      dirs.push_back(installed.substr(begin, end - begin));
    }
    py::list path = py::module_::import("sys").attr("path");
    size_t at = 0;
    for (const std::string& dir : dirs) {
      if (std::filesystem::is_directory(dir + "/kvlens", error)) path.insert(at++, dir);
    }
  }
  PyEval_SaveThread();  // the GIL is taken where Python runs
}

}  // namespace

std::vector<std::string> load_policy_file(const std::string& path) {
  start_interpreter();
  py::gil_scoped_acquire gil;
  try {
    return py::module_::import("kvlens")
        .attr("load_policy_file")(path)
        .cast<std::vector<std::string>>();
  } catch (const py::error_already_set& e) {
    throw Error(path, "--policy-file", "a Python file defining kvlens.Policy subclasses", e.what());
  }
}

}  // namespace kvlens::python
