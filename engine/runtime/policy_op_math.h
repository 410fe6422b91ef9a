// Bit-exact helpers shared by the CPU and CUDA token-selection ops of backend.h: the counter-based
// random values of random_rows and the total order select_top_k ranks by. Plain C++ that nvcc also
// compiles for the device (KVLENS_HOST_DEVICE), so both backends run literally the same integer
// arithmetic and agree bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVLENS_HOST_DEVICE __host__ __device__
#else
#define KVLENS_HOST_DEVICE
#endif

namespace kvlens {

// splitmix64's finaliser (Steele, Lea & Flood 2014; Java's SplittableRandom): the golden-ratio
// increment, then two xor-shift-multiply rounds and a final xor-shift. A bijection of uint64.
KVLENS_HOST_DEVICE constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// random_rows' value at (seed, stream, row, col): the four keys folded in one after another
// (h = splitmix64(h ^ key), starting from splitmix64(seed)), then the top 24 bits of the hash
// scaled by 2^-24, which is exact in F32: a uniform value on the 2^24-point grid of [0, 1).
KVLENS_HOST_DEVICE constexpr float random_unit(uint64_t seed, uint64_t stream, uint64_t row,
                                               uint64_t col) {
  uint64_t h = splitmix64(seed);
  h = splitmix64(h ^ stream);
  h = splitmix64(h ^ row);
  h = splitmix64(h ^ col);
  return float(uint32_t(h >> 40)) * (1.0f / 16777216.0f);
}

// select_top_k's ranking as one unsigned key, higher ranks first. The high 32 bits map the score
// to an order-preserving pattern (negative floats bit-inverted, positive ones with the sign bit
// set; -0 counts as +0 and every NaN maps to 0, below -inf); the low 32 bits hold the column, so
// equal scores go to the higher column. Keys of distinct columns differ: a strict total order.
KVLENS_HOST_DEVICE inline uint64_t top_k_key(float score, uint32_t col) {
  uint32_t ordered = 0;  // NaN
  if (score == score) {
    if (score == 0.0f) score = 0.0f;  // -0 -> +0
#if defined(__CUDA_ARCH__)
    const uint32_t bits = __float_as_uint(score);
#else
    uint32_t bits;
    std::memcpy(&bits, &score, sizeof bits);
#endif
    ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
  return (uint64_t(ordered) << 32) | col;
}

}  // namespace kvlens
