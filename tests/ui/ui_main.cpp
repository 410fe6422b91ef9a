// Main of the Qt test suite (kvlens_ui_tests): one QGuiApplication for the whole run, made before
// any test paints and destroyed after the last (Qt's font and platform state must not outlive
// it). Exports use the offscreen platform unless QT_QPA_PLATFORM names another (xcb under Xvfb).
#include <QGuiApplication>
#include "tests/support/catch_session.h"

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  int qt_argc = 1;
  QGuiApplication application(qt_argc, argv);
  return run_catch_session(argc, argv);
}
