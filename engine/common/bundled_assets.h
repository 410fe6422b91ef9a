// Files kvlens ships in assets/ (the co-reference pools, the demo model and its predictor), found
// the same way by every binary, in this order: $KVLENS_ASSETS_DIR; then from the running
// executable's directory upwards, <dir>/assets (a build tree inside the source tree) and
// <dir>/share/kvlens (an installed binary: <prefix>/bin/../share/kvlens); last, for a binary still
// inside the build tree it was built in (a build folder anywhere), the source tree's assets/.
#pragma once

#include <string>

namespace kvlens {

// The path of assets/<relative> (a file). Throws kvlens::Error (file "assets/<relative>", field
// "(<what>)") listing where it looked when none exists.
std::string bundled_asset_path(const std::string& relative, const std::string& what);

}  // namespace kvlens
