// Where the bundled demo model is: $KVLENS_DEMO_MODEL, beside an installed binary
// (../share/kvlens/models/demo), or the source tree's assets/ for a build-tree binary.
#pragma once

#include <QString>

namespace kvlens::app {

QString bundled_model_dir();

}  // namespace kvlens::app
