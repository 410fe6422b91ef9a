// A memcpy bandwidth probe: the yardstick `kvlens-cli bench` compares decode speed against,
// measured in the same process so both numbers see the same machine, load and memory.
#pragma once

#include <cstddef>
#include <vector>

namespace kvlens {

// The median of timings (the mean of the middle two for an even count; 0 for none): every
// figure kvlens quotes from repeats is one, so that one descheduled repeat does not skew it.
double median_of(std::vector<double> values);

// Copies a `bytes`-long buffer into another `repeats` times (after one untimed warm-up copy
// that also faults both buffers in) and returns bytes / median copy time, in GB/s (1e9 bytes/s).
// That is the rate at which bytes are *copied*: each byte is read once and written once, so
// the memory system moves at least twice that. Pass a size well above the last-level cache
// (e.g. default_copy_bytes()) or the figure measures the cache. Single-threaded.
double measure_copy_bandwidth_gbps(size_t bytes, int repeats);

// The last-level cache size the system reports (L3, else L2), or 0 when unknown: the kernel's
// cache topology (sysfs) first, which is what a virtual machine was given, then CPUID through
// sysconf, which on a VM may report the host's whole L3 (384 MiB for a VM given 32 MiB).
size_t last_level_cache_bytes();
// The largest data or unified cache described under a sysfs cache folder of one CPU
// (/sys/devices/system/cpu/cpu0/cache: index*/level, type, size such as "32768K"), in bytes;
// 0 when there is none or it cannot be read.
size_t largest_cache_bytes(const char* cache_dir);

// A buffer size that defeats the caches: four times the last-level cache reported by the
// system, at least 256 MiB and at most 1 GiB.
size_t default_copy_bytes();

}  // namespace kvlens
