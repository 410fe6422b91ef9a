// install_headless_message_filter (qt_messages.h).
#include "viz/qt/qt_messages.h"

#include <QString>
#include <QtGlobal>
#include <cstdio>

namespace kvlens::viz {
namespace {

void filter(QtMsgType type, const QMessageLogContext& context, const QString& message) {
  if (message.contains("XDG_RUNTIME_DIR")) return;
  std::fprintf(stderr, "%s\n", qFormatLogMessage(type, context, message).toLocal8Bit().constData());
}

}  // namespace

void install_headless_message_filter() {
  qInstallMessageHandler(filter);
}

}  // namespace kvlens::viz
