// Files kvlens ships in assets/ (the co-reference pools, the demo model), found the same way for
// every binary: under $KVLENS_ASSETS_DIR, then from the running executable's directory upwards,
// <dir>/assets (a build tree inside the source tree) and <dir>/share/kvlens (an installed binary).
#pragma once

#include <string>

namespace kvlens {

// The path of assets/<relative> (a file). Throws kvlens::Error (file "assets/<relative>", field
// "(<what>)") listing where it looked when none exists.
std::string bundled_asset_path(const std::string& relative, const std::string& what);

}  // namespace kvlens
