// Where the bundled demo model is: assets/models/demo, found as every bundled asset is
// (bundled_asset_path: $KVLENS_ASSETS_DIR, a build tree, or beside an installed binary).
#pragma once

#include <QString>

namespace kvlens::app {

// Throws kvlens::Error listing where it looked when the model is not there.
QString bundled_model_dir();

}  // namespace kvlens::app
