// Where the bundled demo model is: assets/models/demo, found as every bundled asset is
// (bundled_asset_path: $KVLENS_ASSETS_DIR, a build tree, or beside an installed binary); and the
// real models tools/get_model.sh has fetched into its cache.
#pragma once

#include <QString>
#include <QStringList>

namespace kvlens::app {

// Throws kvlens::Error listing where it looked when the model is not there.
QString bundled_model_dir();

// The .gguf files one folder below tools/get_model.sh's cache ($KVLENS_MODEL_CACHE, else
// ~/.cache/kvlens/models), by path; empty when nothing was fetched.
QStringList fetched_models();

}  // namespace kvlens::app
