/* Helpers the example plug-ins share: growing [rows, stride] buffers as the session's stride
 * grows (columns keep their meaning), reading cached keys of any cache dtype as floats, and
 * writing an error message. Plain C11; only include/kvlens/policy_plugin.h is needed. */
#ifndef KVLENS_EXAMPLE_PLUGIN_UTIL_H
#define KVLENS_EXAMPLE_PLUGIN_UTIL_H

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvlens/policy_plugin.h"

/* Widens a [rows, old_stride] buffer of `elem` bytes to [rows, new_stride], new columns set to
 * `fill` (a byte value). Returns the new buffer (the old one freed), or NULL without memory. */
static inline void* widen_rows(void* old, int64_t rows, int64_t old_stride, int64_t new_stride,
                               size_t elem, int fill) {
  unsigned char* grown = (unsigned char*)malloc((size_t)(rows * new_stride) * elem);
  if (!grown) return NULL;
  memset(grown, fill, (size_t)(rows * new_stride) * elem);
  for (int64_t r = 0; old && r < rows; ++r)
    memcpy(grown + (size_t)(r * new_stride) * elem,
           (unsigned char*)old + (size_t)(r * old_stride) * elem, (size_t)old_stride * elem);
  free(old);
  return grown;
}

/* Element i of a cache of `dtype` as a float (BF16 and F16 widen exactly). */
static inline float cache_value(const void* cache, int32_t dtype, int64_t i) {
  if (dtype == KVLENS_F32) return ((const float*)cache)[i];
  const uint16_t bits = ((const uint16_t*)cache)[i];
  if (dtype == KVLENS_BF16) {
    const uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
  }
  /* IEEE binary16 */
  const uint32_t sign = (uint32_t)(bits & 0x8000u) << 16;
  uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x3ffu, wide;
  if (exponent == 0x1fu) {
    wide = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    wide = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    wide = sign;
  } else {
    exponent = 113u;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    wide = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  memcpy(&value, &wide, sizeof value);
  return value;
}

static inline void set_error(char* error, size_t size, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(error, size, format, args);
  va_end(args);
}

#endif
