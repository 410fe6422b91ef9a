// bundled_model_dir and fetched_models (bundled_paths.h).
#include "app/gui/bundled_paths.h"

#include <QDir>
#include <QFileInfo>
#include <QStandardPaths>

#include "engine/common/bundled_assets.h"

namespace kvlens::app {

QString bundled_model_dir() {
  const std::string config = bundled_asset_path("models/demo/config.json", "bundled demo model");
  return QFileInfo(QString::fromStdString(config)).absolutePath();
}

QStringList fetched_models() {
  QString cache = qEnvironmentVariable("KVLENS_MODEL_CACHE");
  if (cache.isEmpty()) cache = QDir::homePath() + "/.cache/kvlens/models";
  QStringList models;
  const QDir root(cache);
  for (const QString& folder : root.entryList(QDir::Dirs | QDir::NoDotAndDotDot, QDir::Name)) {
    const QDir dir(root.filePath(folder));
    for (const QString& file : dir.entryList({"*.gguf"}, QDir::Files, QDir::Name))
      models << dir.filePath(file);
  }
  return models;
}

}  // namespace kvlens::app
