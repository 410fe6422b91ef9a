// Policies written in Python (a kvlens.Policy subclass) behind the C plug-in contract
// (include/kvlens/policy_plugin.h): each class is wrapped in a kvlens_policy_plugin table whose
// functions call into Python (holding the GIL) and registered with register_plugin_policy, so it
// runs everywhere a built-in does. Shared by the kvlens module and the embedded interpreter of
// kvlens-cli and the app (python/embed/).
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace kvlens::python {

// The types select() and observe() receive (_Step, _Observation), the decision constants, and
// _register_policy(cls) / _policy_source(id), into `m`.
void bind_policy_types(pybind11::module_& m);

// Registers the kvlens.Policy subclass `cls` (GIL held); returns its policy id. Registering a
// class of a name already registered from the same source (a notebook cell run again) makes new
// instances use the new class. Throws kvlens::Error or a Python error naming the class.
std::string register_python_policy(pybind11::handle cls);

// Where a registered policy comes from ("" for a built-in, or without plug-in support).
std::string policy_source_of(const std::string& id);

}  // namespace kvlens::python
