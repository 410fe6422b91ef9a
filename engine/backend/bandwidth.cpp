// measure_copy_bandwidth_gbps: the median of timed memcpy calls between two page-faulted
// buffers; the median keeps one descheduled repeat on a busy machine from skewing the figure.
#include "engine/backend/bandwidth.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kvlens {

double measure_copy_bandwidth_gbps(size_t bytes, int repeats) {
  bytes = std::max<size_t>(bytes, 4096);
  repeats = std::max(repeats, 1);
  // Distinct fill values make sure both buffers are really backed by memory (a never-written
  // page may be a shared zero page, which reads at cache speed).
  std::unique_ptr<char[]> src(new char[bytes]);
  std::unique_ptr<char[]> dst(new char[bytes]);
  std::memset(src.get(), 0x5a, bytes);
  std::memset(dst.get(), 0xa5, bytes);
  std::memcpy(dst.get(), src.get(), bytes);  // warm-up

  std::vector<double> seconds;
  seconds.reserve(size_t(repeats));
  for (int r = 0; r < repeats; ++r) {
    src[size_t(r) % bytes] = char(r);  // a write between copies so none can be elided
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst.get(), src.get(), bytes);
    const auto stop = std::chrono::steady_clock::now();
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  // The copy result is read once so the optimiser must keep the copies.
  volatile char sink = dst[bytes / 2];
  (void)sink;
  return double(bytes) / median_of(std::move(seconds)) / 1e9;
}

double median_of(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

size_t largest_cache_bytes(const char* cache_dir) {
  size_t largest = 0;
  int largest_level = 0;
  for (int index = 0; index < 16; ++index) {
    const std::string dir = std::string(cache_dir) + "/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int level = 0;
    std::string type, size;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size)) continue;
    if (type != "Data" && type != "Unified") continue;
    // "32768K", "1M", or plain bytes.
    size_t multiplier = 1, digits = 0;
    while (digits < size.size() && std::isdigit(static_cast<unsigned char>(size[digits]))) ++digits;
    if (digits == 0) continue;
    const std::string unit = size.substr(digits);
    if (unit == "K")
      multiplier = size_t(1) << 10;
    else if (unit == "M")
      multiplier = size_t(1) << 20;
    else if (unit == "G")
      multiplier = size_t(1) << 30;
    else if (!unit.empty())
      continue;
    const size_t bytes = size_t(std::stoull(size.substr(0, digits))) * multiplier;
    if (level > largest_level || (level == largest_level && bytes > largest)) {
      largest_level = level;
      largest = bytes;
    }
  }
  return largest;
}

size_t last_level_cache_bytes() {
  const size_t from_topology = largest_cache_bytes("/sys/devices/system/cpu/cpu0/cache");
  if (from_topology > 0) return from_topology;
  long bytes = -1;
#if defined(_SC_LEVEL3_CACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
  bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (bytes <= 0) bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
  return bytes > 0 ? size_t(bytes) : 0;
}

size_t default_copy_bytes() {
  constexpr size_t kMin = size_t(256) << 20, kMax = size_t(1) << 30;
  return std::clamp(last_level_cache_bytes() * 4, kMin, kMax);
}

}  // namespace kvlens
