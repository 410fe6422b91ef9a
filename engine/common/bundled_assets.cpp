// bundled_asset_path (bundled_assets.h).
#include "engine/common/bundled_assets.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "engine/common/error.h"

namespace kvlens {

namespace fs = std::filesystem;

std::string bundled_asset_path(const std::string& relative, const std::string& what) {
  std::vector<fs::path> tried;
  if (const char* dir = std::getenv("KVLENS_ASSETS_DIR"); dir && *dir) {
    tried.push_back(fs::path(dir) / relative);
  }
  // The executable's own path, so the lookup does not depend on the working directory.
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  if (!error) {
    for (fs::path dir = exe.parent_path(); !dir.empty(); dir = dir.parent_path()) {
      tried.push_back(dir / "assets" / relative);
      tried.push_back(dir / "share" / "kvlens" / relative);
      if (dir == dir.root_path()) break;
    }
  }
  std::string listed;
  for (const fs::path& candidate : tried) {
    if (fs::is_regular_file(candidate, error)) return candidate.string();
    if (listed.size() < 400) listed += (listed.empty() ? "" : ", ") + candidate.string();
  }
  throw Error("assets/" + relative, "(" + what + ")",
              "the file under $KVLENS_ASSETS_DIR or above the executable",
              listed.empty() ? "no place to look" : "none of " + listed);
}

}  // namespace kvlens
