// bundled_model_dir (bundled_paths.h).
#include "app/gui/bundled_paths.h"

#include <QFileInfo>

#include "engine/common/bundled_assets.h"

namespace kvlens::app {

QString bundled_model_dir() {
  const std::string config = bundled_asset_path("models/demo/config.json", "bundled demo model");
  return QFileInfo(QString::fromStdString(config)).absolutePath();
}

}  // namespace kvlens::app
