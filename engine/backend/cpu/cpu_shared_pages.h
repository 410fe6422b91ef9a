// Host memory the CPU backend can share between tensors copy-on-write: large tensors live in
// mappings of their own, and one buffer copied into many (a dense prefill copied into every
// lockstep run's KV cache) is stored once: the destinations' whole pages are mapped from one
// snapshot, and the first write to such a page gives that destination a private copy of it (the
// kernel's copy-on-write). Several runs reading the shared prefix then read the same memory.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

namespace kvlens {

inline constexpr size_t kSharedPageBytes = 4096;
// Allocations from this size up get a page-aligned mapping of their own.
inline constexpr size_t kPageMappingBytes = 64 * 1024;

// Zero-filled memory of at least `bytes`, 64-byte aligned (page-aligned in a mapping of its own
// from kPageMappingBytes up; from 2 MiB up aligned to 2 MiB and advised to use transparent huge
// pages, so that a decode step streaming through weights and policy state needs a few TLB
// entries per tensor rather than one per 4 KiB). Resident from the start, as device memory is:
// the pages are faulted in here, not one at a time inside the steps that first write them (a
// lockstep step writes a fresh KV cache row, and policy state, per run, layer and head: left
// lazy, that was about 20 page faults per step in the caches alone, and the first obs_window
// steps of snapkv took about twice as long as the later ones).
std::shared_ptr<void> allocate_host(size_t bytes);

// True when [begin, begin + bytes) lies inside a mapping of its own made by allocate_host and
// owned by `storage`, so that its pages may be remapped.
bool pages_remappable(const std::shared_ptr<void>& storage, const void* begin, size_t bytes);

// Faults the pages of [begin, begin + bytes) in for writing now, contents unchanged (a
// copy-on-write page among them gets its private copy, so keep shared pages out of the range).
void fault_in_pages(void* begin, size_t bytes);

struct PageCopyTarget {
  std::byte* data = nullptr;
  bool remappable = false;  // pages_remappable for this destination's range
};

// Copies src[0, bytes) to every target. The whole pages of remappable targets whose start has
// the first such target's offset within a page are mapped from one snapshot of src; the rest is
// copied. A target may be src itself (its pages then join the snapshot) but must not otherwise
// overlap src. Returns the bytes mapped rather than copied, summed over the targets.
size_t copy_sharing_pages(const std::byte* src, size_t bytes,
                          std::span<const PageCopyTarget> targets);

}  // namespace kvlens
