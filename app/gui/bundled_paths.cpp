// bundled_model_dir (bundled_paths.h).
#include "app/gui/bundled_paths.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>

namespace kvlens::app {

QString bundled_model_dir() {
  const QString from_env = qEnvironmentVariable("KVLENS_DEMO_MODEL");
  if (!from_env.isEmpty()) return from_env;
  const QString installed =
      QDir(QCoreApplication::applicationDirPath()).filePath("../share/kvlens/models/demo");
  if (QFileInfo::exists(installed + "/config.json")) return QDir::cleanPath(installed);
  return QString(KVLENS_SOURCE_ASSETS) + "/models/demo";
}

}  // namespace kvlens::app
