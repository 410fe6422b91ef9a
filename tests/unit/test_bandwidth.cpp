// The last-level cache size read from a sysfs cache folder (the bench's memcpy size and its
// "weights may fit in the cache" note depend on it): the highest level's data or unified cache,
// in any of the size units sysfs writes, and 0 where nothing can be read.
#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "engine/backend/bandwidth.h"
#include "tests/support/test_paths.h"
#include "tests/support/tiny_checkpoint.h"

using namespace kvlens;

namespace {

void write_cache(const std::string& dir, int index, const std::string& level,
                 const std::string& type, const std::string& size) {
  const std::string folder = dir + "/index" + std::to_string(index);
  std::filesystem::create_directories(folder);
  test::write_file(folder + "/level", level + "\n");
  test::write_file(folder + "/type", type + "\n");
  test::write_file(folder + "/size", size + "\n");
}

}  // namespace

TEST_CASE("largest_cache_bytes reads the highest data or unified cache level", "[bandwidth]") {
  // A VM's topology: CPUID (sysconf) reported the host's 384 MiB L3 here, sysfs the 32 MiB given.
  const std::string vm = test::make_temp_dir("cache-vm");
  write_cache(vm, 0, "1", "Data", "48K");
  write_cache(vm, 1, "1", "Instruction", "32K");
  write_cache(vm, 2, "2", "Unified", "1024K");
  write_cache(vm, 3, "3", "Unified", "32768K");
  CHECK(largest_cache_bytes(vm.c_str()) == size_t(32) << 20);

  // The level decides, not the size (an L3 smaller than the L2 is still the last level).
  const std::string small_l3 = test::make_temp_dir("cache-small-l3");
  write_cache(small_l3, 0, "2", "Unified", "2M");
  write_cache(small_l3, 1, "3", "Unified", "1M");
  CHECK(largest_cache_bytes(small_l3.c_str()) == size_t(1) << 20);

  // No L3: the L2; an instruction cache never counts; plain bytes and a gap in the indices.
  const std::string l2_only = test::make_temp_dir("cache-l2");
  write_cache(l2_only, 0, "1", "Instruction", "65536");
  write_cache(l2_only, 2, "2", "Unified", "524288");
  CHECK(largest_cache_bytes(l2_only.c_str()) == 524288);
}

TEST_CASE("largest_cache_bytes: unreadable or malformed entries count as unknown", "[bandwidth]") {
  CHECK(largest_cache_bytes("/nonexistent/cache") == 0);
  const std::string bad = test::make_temp_dir("cache-bad");
  write_cache(bad, 0, "3", "Unified", "lots");
  write_cache(bad, 1, "3", "Unified", "12Q");
  write_cache(bad, 2, "x", "Unified", "1M");
  CHECK(largest_cache_bytes(bad.c_str()) == 0);
  // A good entry next to bad ones still counts.
  write_cache(bad, 3, "2", "Data", "256K");
  CHECK(largest_cache_bytes(bad.c_str()) == size_t(256) << 10);
}
