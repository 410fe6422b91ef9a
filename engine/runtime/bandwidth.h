// A memcpy bandwidth probe: the yardstick `kvlens-cli bench` compares decode speed against,
// measured in the same process so both numbers see the same machine, load and memory.
#pragma once

#include <cstddef>

namespace kvlens {

// Copies a `bytes`-long buffer into another `repeats` times (after one untimed warm-up copy
// that also faults both buffers in) and returns bytes / median copy time, in GB/s (1e9 bytes/s).
// That is the rate at which bytes are *copied*: each byte is read once and written once, so
// the memory system moves at least twice that. Pass a size well above the last-level cache
// (e.g. default_copy_bytes()) or the figure measures the cache. Single-threaded.
double measure_copy_bandwidth_gbps(size_t bytes, int repeats);

// The last-level cache size the system reports (L3, else L2), or 0 when unknown.
size_t last_level_cache_bytes();

// A buffer size that defeats the caches: four times the last-level cache reported by the
// system, at least 256 MiB and at most 1 GiB.
size_t default_copy_bytes();

}  // namespace kvlens
