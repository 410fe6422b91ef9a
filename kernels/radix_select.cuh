// The radix select of the token-selection kernels (policy_ops.cu's top-k and page selection,
// twilight's top-p prefix): the k-th largest of distinct 64-bit keys (top_k_key's), 8 bits a
// pass from the top, by one block (radix_select_key) or, one digit at a time, by one warp over a
// histogram many blocks filled (radix_pick_digit). Included by .cu files only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvlens::cuda {

// One digit of the radix select: given the 256 counts of the next digit (among the items that
// match the digits fixed so far), the walk from digit 255 down that passes each digit whose count
// stays below (Exceeds: at or below) what remains, by one warp: lane l holds the 8 digits
// 255 - 8l .. 248 - 8l, a scan of the lanes' totals finds the lane where the walk stops, which
// walks its own 8. (One thread walking all 256 took most of a 512-column selection: about 4 us a
// digit.) The matching items weigh at least (Exceeds: more than) `remaining`, so the walk ends by
// digit 0. Called by the 32 threads of one warp; the lane that stops writes the new prefix and
// what remains below it.
template <bool Exceeds>
__device__ void radix_pick_digit(const unsigned* histogram, int shift, uint64_t prefix,
                                 unsigned remaining, uint64_t* next_prefix,
                                 unsigned* next_remaining, unsigned* digit_count = nullptr) {
  const int lane = threadIdx.x & 31, top = 255 - 8 * lane;
  unsigned total = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) total += histogram[top - i];
  unsigned before = total;  // inclusive scan from lane 0 (the highest digits)
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const unsigned other = __shfl_up_sync(0xffffffffu, before, offset);
    if (lane >= offset) before += other;
  }
  const bool stops = Exceeds ? before > remaining : before >= remaining;
  const unsigned stopping = __ballot_sync(0xffffffffu, stops);
  const int owner = stopping != 0 ? __ffs(int(stopping)) - 1 : 31;
  if (lane == owner) {
    unsigned left = remaining - (before - total);
    int digit = top;
    while (digit > 0 && digit > top - 7 &&
           (Exceeds ? histogram[digit] <= left : histogram[digit] < left))
      left -= histogram[digit--];
    *next_prefix = prefix | (uint64_t(digit) << shift);
    *next_remaining = left;
    if (digit_count != nullptr) *digit_count = histogram[digit];
  }
}

// histogram[digit] += weight for the calling lanes, every lane of the warp calling it (digit
// kNoDigit: not counted). With `aggregate`, lanes with the same digit add once: a row's scores
// share their top digits (sign and exponent), so plain atomics queued up on one or two counters,
// 32 deep per warp. Without it (the later digits, spread out or mostly kNoDigit) a warp whose
// lanes all hold one digit adds once and any other adds lane by lane: __match_any_sync on every
// item of every pass was most of the instructions of a many-row selection (H200, 480 rows of
// 4096 columns: about one item a multiprocessor cycle).
constexpr unsigned kNoDigit = 256;
__device__ __forceinline__ void add_to_histogram(unsigned* histogram, unsigned digit,
                                                 unsigned weight, bool aggregate = true) {
  if (!aggregate) {
    const unsigned first = __shfl_sync(0xffffffffu, digit, 0);
    if (__all_sync(0xffffffffu, digit == first)) {
      const unsigned total = __reduce_add_sync(0xffffffffu, weight);
      if (first != kNoDigit && (threadIdx.x & 31) == 0 && total > 0)
        atomicAdd(&histogram[first], total);
    } else if (digit != kNoDigit && weight > 0) {
      atomicAdd(&histogram[digit], weight);
    }
    return;
  }
  const unsigned peers = __match_any_sync(0xffffffffu, digit);
  const unsigned total = __reduce_add_sync(peers, weight);
  const int lane = int(threadIdx.x & 31);
  if (digit != kNoDigit && lane == __ffs(int(peers)) - 1 && total > 0)
    atomicAdd(&histogram[digit], total);
}

// The radix select by one block: among items 0..items-1, each with a distinct 64-bit key
// and a weight (item(i, key, weight); weight 0 = not a candidate), walk the keys from the largest
// down and return the key at which the running weight reaches `wanted` (Exceeds false: the k-th
// largest key of unit weights) or first exceeds it (Exceeds true: the boundary item whose weight
// no longer fits). 8 bits at a time from the top: a histogram of the next digit over the items
// matching the digits fixed so far, then the digit where the count from the top gets there.
// Needs the caller to know that the total weight is above `wanted` (>= for Exceeds false).
// Exceeds false with top_k_key's keys (score bits above, column below): once the score's 32 bits
// are fixed, if every item with that score is wanted the answer is that score's lowest key
// (column bits 0: every key of it is >= and none below), and the four column digits are not
// walked: the same keys pass `key >= result` either way.
template <bool Exceeds, class Item>
__device__ uint64_t radix_select_key(int64_t items, unsigned wanted, Item item) {
  __shared__ unsigned histogram[256];
  __shared__ uint64_t shared_prefix;
  __shared__ unsigned shared_remaining, shared_digit_count;
  uint64_t prefix = 0;
  unsigned remaining = wanted;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) histogram[i] = 0;
    __syncthreads();
    const uint64_t fixed = shift == 56 ? 0 : ~uint64_t(0) << (shift + 8);
    // (a warp-uniform trip count: every lane reaches add_to_histogram's shuffles)
    for (int64_t base = 0; base < items; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      unsigned digit = kNoDigit, weight = 0;
      if (i < items) {
        uint64_t key;
        item(i, key, weight);
        if (weight > 0 && (key & fixed) == prefix) digit = unsigned(key >> shift) & 255u;
      }
      add_to_histogram(histogram, digit, weight, /*aggregate=*/shift == 56);
    }
    __syncthreads();
    if (threadIdx.x < 32)
      radix_pick_digit<Exceeds>(histogram, shift, prefix, remaining, &shared_prefix,
                                &shared_remaining, &shared_digit_count);
    __syncthreads();
    prefix = shared_prefix;
    remaining = shared_remaining;
    if (!Exceeds && shift == 32 && shared_digit_count == remaining) return prefix;
  }
  return prefix;
}

}  // namespace kvlens::cuda
