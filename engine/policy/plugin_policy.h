// Policies implemented through the C contract (include/kvlens/policy_plugin.h): a C plug-in
// loaded from a shared library, or a Python class the kvlens module wraps in the same table of
// function pointers. Registered next to the built-ins, they run in every command, view, metric
// and evaluation as a built-in does; kvlens applies the budget and the common knobs and checks
// every answer (sizes, finiteness), turning a failure into an error naming the plug-in.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/policy/policy.h"
#include "include/kvlens/policy_plugin.h"

namespace kvlens {

// Registers the policy `plugin` describes; `source` names where it came from (a file path, a
// Python class) in every message, and `keep_alive` owns what the table points into (the
// library handle, the Python object) for as long as the policy is registered or any instance
// of it lives. Checks the ABI version, the struct size, the name (new, well formed), the knobs
// and the function pointers. Registering a source again with the same name is a no-op; another
// source with a taken name is an error. Throws kvlens::Error naming `source`.
const PolicyInfo& register_plugin_policy(const kvlens_policy_plugin* plugin,
                                         const std::string& source,
                                         std::shared_ptr<void> keep_alive);

// dlopen()s a shared library and registers the policy its kvlens_policy_plugin_v1 describes.
// Errors (a file that is not there or not a library, a missing symbol, another ABI version,
// a bad description) name the file and what is wrong.
const PolicyInfo& load_policy_plugin(const std::string& path);

// Every *.so in `folder` (sorted by name), loaded as load_policy_plugin does; a folder that
// does not exist holds none. A bad file is reported in `errors` ("FILE: why") and skipped, so
// one broken plug-in does not keep kvlens from starting. Returns the ids registered.
std::vector<std::string> load_policy_plugin_folder(const std::string& folder,
                                                   std::vector<std::string>& errors);

// The folders searched at start: $KVLENS_PLUGIN_PATH (':'-separated), then
// $XDG_DATA_HOME/kvlens/plugins (~/.local/share/kvlens/plugins).
std::vector<std::string> default_plugin_folders();

}  // namespace kvlens
