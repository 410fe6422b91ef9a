// bundled_asset_path (bundled_assets.h): the search order, and the build tree's fallback on the
// source tree (KVLENS_BUILD_TREE_DIR, KVLENS_SOURCE_ASSETS_DIR: engine/CMakeLists.txt).
#include "engine/common/bundled_assets.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "engine/common/error.h"

namespace kvlens {

namespace fs = std::filesystem;

#if defined(KVLENS_BUILD_TREE_DIR) && defined(KVLENS_SOURCE_ASSETS_DIR)
namespace {

// Whether `path` is `dir` or lies below it (both made absolute and canonical where they exist).
bool is_inside(const fs::path& path, const fs::path& dir) {
  std::error_code error;
  const fs::path p = fs::weakly_canonical(path, error);
  if (error) return false;
  const fs::path d = fs::weakly_canonical(dir, error);
  if (error || d.empty()) return false;
  return std::mismatch(d.begin(), d.end(), p.begin(), p.end()).first == d.end();
}

}  // namespace
#endif

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
#if defined(KVLENS_BUILD_TREE_DIR) && defined(KVLENS_SOURCE_ASSETS_DIR)
  // A build folder outside the source tree points back to it, as long as the binary stays in
  // that build folder (a copied or installed binary does not depend on the source tree).
  if (!error && is_inside(exe, KVLENS_BUILD_TREE_DIR)) {
    tried.push_back(fs::path(KVLENS_SOURCE_ASSETS_DIR) / relative);
  }
#endif
  std::string listed;
  for (const fs::path& candidate : tried) {
    if (fs::is_regular_file(candidate, error)) return candidate.string();
    if (listed.size() < 800) listed += (listed.empty() ? "" : ", ") + candidate.string();
  }
  throw Error("assets/" + relative, "(" + what + ")",
              "the file under $KVLENS_ASSETS_DIR, above the executable or in its build tree's "
              "source tree",
              listed.empty() ? "no place to look" : "none of " + listed);
}

}  // namespace kvlens
