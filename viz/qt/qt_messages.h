// Qt's messages for headless runs (kvlens-cli figure, the app without a display): passed to
// stderr as they come, except QStandardPaths' note that XDG_RUNTIME_DIR is unset, a headless
// machine's normal state and nothing kvlens uses.
#pragma once

namespace kvlens::viz {

void install_headless_message_filter();

}  // namespace kvlens::viz
