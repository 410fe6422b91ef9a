// Without a display the app renders its default dashboard to image files: the bundled model (or
// the given one) on a co-reference sample under the chosen policies, recorded up to the answer,
// each of the five views as a PNG drawn by the same figure code as the window.
#pragma once

#include <QString>

#include "app/gui/main_window.h"

namespace kvlens::app {

// Writes <out_dir>/kvlens-<view>.png for every view and prints where; returns the exit code.
int render_dashboard(const LaunchOptions& options, const QString& out_dir);

}  // namespace kvlens::app
