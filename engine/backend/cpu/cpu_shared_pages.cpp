// Page sharing for the CPU backend (see cpu_shared_pages.h). A snapshot is an anonymous memory
// file (memfd) holding src's whole pages; each target maps it privately at a temporary address,
// then mremap moves that mapping over the target's pages in one step (the old pages go, and a
// failed move leaves them as they were, so the bytes are then copied instead). Closing the file
// leaves it alive as long as some target still maps one of its pages.
#include "engine/backend/cpu/cpu_shared_pages.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#define KVLENS_HAVE_PAGE_SHARING 1
#else
#define KVLENS_HAVE_PAGE_SHARING 0
#endif

namespace kvlens {
namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kHugePageBytes = 2u << 20;

// The deleter of a mapping of its own; std::get_deleter finds it to recognise such storage.
struct PageMapping {
  size_t bytes = 0;
  void operator()(void* memory) const {
#if KVLENS_HAVE_PAGE_SHARING
    munmap(memory, bytes);
#else
    (void)memory;
#endif
  }
};

std::shared_ptr<void> allocate_heap(size_t bytes) {
  const size_t rounded = std::max(kAlignment, (bytes + kAlignment - 1) / kAlignment * kAlignment);
  void* memory = std::aligned_alloc(kAlignment, rounded);
  if (!memory) throw std::bad_alloc();
  std::memset(memory, 0, rounded);
  return std::shared_ptr<void>(memory, std::free);
}

#if KVLENS_HAVE_PAGE_SHARING
// Maps `length` bytes of `file` privately over [target, target + length); false (target
// untouched) when the system refuses.
bool map_snapshot(int file, std::byte* target, size_t length) {
  void* staged = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, file, 0);
  if (staged == MAP_FAILED) return false;
  if (mremap(staged, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, target) == MAP_FAILED) {
    munmap(staged, length);
    return false;
  }
  return true;
}
#endif

}  // namespace

std::shared_ptr<void> allocate_host(size_t bytes) {
#if KVLENS_HAVE_PAGE_SHARING
  if (bytes >= kHugePageBytes) {
    const size_t length = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    // Over-allocated by one huge page, then trimmed to a range aligned to one.
    void* raw = mmap(nullptr, length + kHugePageBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) throw std::bad_alloc();
    const auto base = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (base + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
    const uintptr_t end = base + length + kHugePageBytes;
    if (aligned > base) munmap(raw, aligned - base);
    if (end > aligned + length)
      munmap(reinterpret_cast<void*>(aligned + length), end - aligned - length);
    void* memory = reinterpret_cast<void*>(aligned);
    // Advice only: without transparent huge pages the mapping works as any other, and pages
    // that copy_sharing_pages later maps from a snapshot are split off as small pages.
    madvise(memory, length, MADV_HUGEPAGE);
    fault_in_pages(memory, length);
    return std::shared_ptr<void>(memory, PageMapping{length});
  }
  if (bytes >= kPageMappingBytes) {
    const size_t length = (bytes + kSharedPageBytes - 1) / kSharedPageBytes * kSharedPageBytes;
    void* memory =
        mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) throw std::bad_alloc();
    fault_in_pages(memory, length);
    return std::shared_ptr<void>(memory, PageMapping{length});
  }
#endif
  return allocate_heap(bytes);
}

bool pages_remappable(const std::shared_ptr<void>& storage, const void* begin, size_t bytes) {
  const PageMapping* mapping = std::get_deleter<PageMapping>(storage);
  if (!mapping) return false;
  const auto base = reinterpret_cast<uintptr_t>(storage.get());
  const auto first = reinterpret_cast<uintptr_t>(begin);
  return first >= base && first + bytes <= base + mapping->bytes;
}

void fault_in_pages(void* begin, size_t bytes) {
  if (bytes == 0) return;
#if KVLENS_HAVE_PAGE_SHARING && defined(MADV_POPULATE_WRITE)
  // One call for the range (Linux 5.14 on); older kernels refuse it, then the pages are touched.
  const uintptr_t first = reinterpret_cast<uintptr_t>(begin) / kSharedPageBytes * kSharedPageBytes;
  const uintptr_t end = reinterpret_cast<uintptr_t>(begin) + bytes;
  if (madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE) == 0) return;
#endif
  // A write that leaves the byte as it is: an atomic OR with 0 on one byte of every page.
  auto* bytes_begin = static_cast<unsigned char*>(begin);
  const uintptr_t start = reinterpret_cast<uintptr_t>(begin);
  for (size_t at = 0; at < bytes;) {
    __atomic_fetch_or(bytes_begin + at, static_cast<unsigned char>(0), __ATOMIC_RELAXED);
    at += kSharedPageBytes - (start + at) % kSharedPageBytes;  // the next page's first byte
  }
}

size_t copy_sharing_pages(const std::byte* src, size_t bytes,
                          std::span<const PageCopyTarget> targets) {
  size_t shared = 0;
#if KVLENS_HAVE_PAGE_SHARING
  // The pages to share: those of the first remappable target, starting at its first page
  // boundary; targets with the same offset within a page get the same pages.
  const auto first = std::find_if(targets.begin(), targets.end(),
                                  [](const PageCopyTarget& target) { return target.remappable; });
  int file = -1;
  size_t head = 0, length = 0, offset = 0;
  if (first != targets.end()) {
    offset = reinterpret_cast<uintptr_t>(first->data) % kSharedPageBytes;
    head = (kSharedPageBytes - offset) % kSharedPageBytes;
    length = bytes > head ? (bytes - head) / kSharedPageBytes * kSharedPageBytes : 0;
  }
  if (length > 0) {
    file = memfd_create("kvlens-shared-rows", MFD_CLOEXEC);
    if (file >= 0 && (ftruncate(file, off_t(length)) != 0 ||
                      pwrite(file, src + head, length, 0) != ssize_t(length))) {
      close(file);
      file = -1;
    }
  }
#endif
  for (const PageCopyTarget& target : targets) {
    bool mapped = false;
#if KVLENS_HAVE_PAGE_SHARING
    if (file >= 0 && target.remappable &&
        reinterpret_cast<uintptr_t>(target.data) % kSharedPageBytes == offset) {
      mapped = map_snapshot(file, target.data + head, length);
    }
#endif
    if (mapped) {
      shared += length;
      if (target.data != src) {
        std::memcpy(target.data, src, head);
        std::memcpy(target.data + head + length, src + head + length, bytes - head - length);
      }
    } else if (target.data != src) {
      std::memcpy(target.data, src, bytes);
    }
  }
#if KVLENS_HAVE_PAGE_SHARING
  if (file >= 0) close(file);
#endif
  return shared;
}

}  // namespace kvlens
