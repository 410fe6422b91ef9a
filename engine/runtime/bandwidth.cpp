// measure_copy_bandwidth_gbps: the median of timed memcpy calls between two page-faulted
// buffers; the median keeps one descheduled repeat on a busy machine from skewing the figure.
#include "engine/runtime/bandwidth.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
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
  std::sort(seconds.begin(), seconds.end());
  const size_t mid = seconds.size() / 2;
  const double median = seconds.size() % 2 ? seconds[mid] : 0.5 * (seconds[mid - 1] + seconds[mid]);
  return double(bytes) / median / 1e9;
}

size_t last_level_cache_bytes() {
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
