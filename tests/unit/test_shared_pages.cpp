// Copy-on-write page sharing of the CPU backend (cpu_shared_pages.h, broadcast_rows): copies hold
// src's bytes, stay independent of each other and of src when any of them is written, and whole
// pages of page-mapped destinations are really mapped rather than copied.
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstring>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cpu/cpu_shared_pages.h"
#include "engine/common/error.h"

using namespace kvlens;

namespace {

constexpr size_t kBytes = 256 * 1024;

std::byte* bytes_of(const std::shared_ptr<void>& memory) {
  return static_cast<std::byte*>(memory.get());
}

void fill_pattern(std::byte* data, size_t count, unsigned seed) {
  for (size_t i = 0; i < count; ++i) data[i] = std::byte((i * 131 + seed * 7 + i / 4096) & 255);
}

}  // namespace

TEST_CASE("allocate_host: zeroed, aligned, page mappings from the threshold up", "[shared_pages]") {
  const auto small = allocate_host(1000);
  const auto large = allocate_host(kBytes + 5);
  CHECK(reinterpret_cast<uintptr_t>(small.get()) % 64 == 0);
  CHECK(reinterpret_cast<uintptr_t>(large.get()) % kSharedPageBytes == 0);
  for (size_t i = 0; i < kBytes + 5; ++i) REQUIRE(bytes_of(large)[i] == std::byte(0));
  for (size_t i = 0; i < 1000; ++i) REQUIRE(bytes_of(small)[i] == std::byte(0));
  CHECK(pages_remappable(large, bytes_of(large) + 100, kBytes));
  CHECK_FALSE(pages_remappable(large, bytes_of(large) + 100, kBytes + kSharedPageBytes));
  CHECK_FALSE(pages_remappable(small, bytes_of(small), 1000));
}

#if defined(__linux__)
TEST_CASE(
    "allocate_host: page mappings are resident from the start, and fault_in_pages keeps bytes",
    "[shared_pages]") {
  // Resident pages (mincore): the decode steps that first write them take no page faults.
  auto resident_pages = [](const std::byte* data, size_t bytes) {
    std::vector<unsigned char> flags((bytes + kSharedPageBytes - 1) / kSharedPageBytes);
    REQUIRE(mincore(const_cast<std::byte*>(data), bytes, flags.data()) == 0);
    size_t resident = 0;
    for (unsigned char flag : flags) resident += flag & 1;
    return std::pair(resident, flags.size());
  };
  for (const size_t bytes : {kBytes + 5, size_t(2u << 20) + 12345}) {
    INFO(bytes << " bytes");
    const auto memory = allocate_host(bytes);
    const auto [resident, pages] = resident_pages(bytes_of(memory), bytes);
    CHECK(resident == pages);
  }
  // A lazily mapped range: fault_in_pages makes it resident and leaves its bytes as they are.
  const size_t bytes = 16 * kSharedPageBytes;
  void* raw = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(raw != MAP_FAILED);
  auto* data = static_cast<std::byte*>(raw);
  data[3 * kSharedPageBytes + 7] = std::byte(0x5a);
  fault_in_pages(data + 100, bytes - 200);
  CHECK(resident_pages(data, bytes).first == 16);
  for (size_t i = 0; i < bytes; ++i)
    REQUIRE(data[i] == (i == 3 * kSharedPageBytes + 7 ? std::byte(0x5a) : std::byte(0)));
  munmap(raw, bytes);
}
#endif

TEST_CASE("allocate_host: from 2 MiB up, aligned to 2 MiB, zeroed, writable, remappable",
          "[shared_pages]") {
  constexpr size_t kHuge = 2u << 20, kSize = kHuge + 12345;
  const auto memory = allocate_host(kSize);
  CHECK(reinterpret_cast<uintptr_t>(memory.get()) % kHuge == 0);
  std::byte* data = bytes_of(memory);
  for (size_t i = 0; i < kSize; i += 4096) REQUIRE(data[i] == std::byte(0));
  REQUIRE(data[kSize - 1] == std::byte(0));
  std::vector<std::byte> want(kSize);
  fill_pattern(want.data(), kSize, 3);
  std::memcpy(data, want.data(), kSize);  // the whole range is mapped and writable
  CHECK(pages_remappable(memory, data, kSize));
  // A copy into it still shares whole pages (they split off the huge page).
  std::vector<std::byte> src(kBytes);
  fill_pattern(src.data(), src.size(), 5);
  std::memcpy(want.data() + kSharedPageBytes, src.data(), kBytes);
  const PageCopyTarget target{data + kSharedPageBytes, true};
  CHECK(copy_sharing_pages(src.data(), src.size(), {&target, 1}) == kBytes);
  // The copied pages hold src, the bytes around them what was written before.
  CHECK(std::memcmp(data, want.data(), kSize) == 0);
}

TEST_CASE("copy_sharing_pages: shared copies read src and part on the first write",
          "[shared_pages]") {
  const auto src = allocate_host(kBytes), a = allocate_host(kBytes), b = allocate_host(kBytes);
  const auto heap = std::shared_ptr<std::byte[]>(new std::byte[kBytes]);
  fill_pattern(bytes_of(src), kBytes, 1);
  for (std::byte* dst : {bytes_of(a), bytes_of(b), heap.get()}) std::memset(dst, 0x5a, kBytes);
  // A range starting and ending inside pages: 100 bytes in, 50 pages and 300 bytes long, so 49
  // whole pages (3996 bytes before the first boundary, 604 after the last).
  const size_t offset = 100, count = 50 * kSharedPageBytes + 300;
  const PageCopyTarget targets[] = {{bytes_of(a) + offset, true},
                                    {bytes_of(b) + offset, true},
                                    {heap.get() + offset, false},
                                    {bytes_of(src) + offset, true}};
  const size_t shared = copy_sharing_pages(bytes_of(src) + offset, count, targets);
  // a, b and src itself map the whole pages of the range; the heap target is a plain copy.
  CHECK(shared == 3 * 49 * kSharedPageBytes);
  for (std::byte* dst : {bytes_of(a), bytes_of(b), heap.get()}) {
    CHECK(std::memcmp(dst + offset, bytes_of(src) + offset, count) == 0);
    // Bytes outside the range are untouched.
    CHECK(dst[offset - 1] == std::byte(0x5a));
    CHECK(dst[offset + count] == std::byte(0x5a));
  }
  std::vector<std::byte> original(bytes_of(src), bytes_of(src) + kBytes);
  CHECK(std::memcmp(bytes_of(src), original.data(), kBytes) == 0);

  // Writing a shared page of one copy changes none of the others, nor src.
  bytes_of(a)[offset + 5000] = std::byte(1);
  bytes_of(src)[offset + 9000] = std::byte(2);
  CHECK(bytes_of(b)[offset + 5000] == original[offset + 5000]);
  CHECK(bytes_of(b)[offset + 9000] == original[offset + 9000]);
  CHECK(bytes_of(a)[offset + 9000] == original[offset + 9000]);
  CHECK(bytes_of(src)[offset + 5000] == original[offset + 5000]);
  CHECK(bytes_of(a)[offset + 5000] == std::byte(1));
  CHECK(bytes_of(src)[offset + 9000] == std::byte(2));
}

TEST_CASE("copy_sharing_pages: a destination at another page offset gets a plain copy",
          "[shared_pages]") {
  const auto src = allocate_host(kBytes), a = allocate_host(kBytes), b = allocate_host(kBytes);
  fill_pattern(bytes_of(src), kBytes, 3);
  const size_t count = 10 * kSharedPageBytes;
  const PageCopyTarget targets[] = {{bytes_of(a), true}, {bytes_of(b) + 8, true}};
  CHECK(copy_sharing_pages(bytes_of(src), count, targets) == 10 * kSharedPageBytes);
  CHECK(std::memcmp(bytes_of(a), bytes_of(src), count) == 0);
  CHECK(std::memcmp(bytes_of(b) + 8, bytes_of(src), count) == 0);
  // Less than a page: nothing to share, still copied.
  const PageCopyTarget short_target[] = {{bytes_of(a) + 3 * kSharedPageBytes, true}};
  CHECK(copy_sharing_pages(bytes_of(src) + 7, 1000, short_target) == 0);
  CHECK(std::memcmp(bytes_of(a) + 3 * kSharedPageBytes, bytes_of(src) + 7, 1000) == 0);
}

TEST_CASE(
    "broadcast_rows: every destination holds the rows, overlaps and short tensors are refused",
    "[shared_pages]") {
  auto backend = make_cpu_backend(1);
  // KV-cache-like tensors [2, 1024, 32] F32 (256 KiB, page-mapped) and a small one.
  DeviceTensor src = backend->alloc(DType::F32, {2, 1024, 32});
  std::vector<float> values(size_t(src.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i % 977) * 0.25f;
  backend->from_host(src, values.data(), values.size() * sizeof(float));
  DeviceTensor a = backend->alloc(DType::F32, {2, 1024, 32});
  DeviceTensor b = backend->alloc(DType::F32, {2, 1024, 32});
  DeviceTensor* dsts[] = {&src, &a, &b};
  // Rows 1024 + 3 .. 1024 + 602 (the second head's first 600 rows after 3): 2 whole pages and
  // partial ones at both ends.
  backend->broadcast_rows(src, 1027, dsts, 1027, 600, 32);
  for (const DeviceTensor* t : {&a, &b}) {
    std::vector<float> got(values.size());
    backend->to_host(*t, got.data(), got.size() * sizeof(float));
    int64_t wrong = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool inside = i >= 1027 * 32 && i < (1027 + 600) * 32;
      wrong += got[i] != (inside ? values[i] : 0.0f);
    }
    CHECK(wrong == 0);
  }
  std::vector<float> after(values.size());
  backend->to_host(src, after.data(), after.size() * sizeof(float));
  CHECK(after == values);

  DeviceTensor small = backend->alloc(DType::F32, {4, 32});
  DeviceTensor* too_small[] = {&small};
  CHECK_THROWS_AS(backend->broadcast_rows(src, 0, too_small, 0, 8, 32), Error);
  DeviceTensor* itself[] = {&src};
  CHECK_THROWS_AS(backend->broadcast_rows(src, 0, itself, 1, 8, 32), Error);
  CHECK_THROWS_AS(backend->broadcast_rows(src, 2040, dsts, 0, 16, 32), Error);
}
