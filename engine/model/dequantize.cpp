// Dequantization of ggml's block formats to F32, written from the block definitions: each block
// holds F16 scale(s) and packed integer quants, value = scale * quant (+ min, or - offset). The
// K-quants group 256 values in sub-blocks whose 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) scales are
// themselves scaled by the super-block's F16 d (and dmin).
#include "engine/model/dequantize.h"

#include <cstring>

#include "engine/common/dtype.h"
#include "engine/common/error.h"

namespace kvlens {
namespace {

// Block sizes as ggml defines them; a known size lets a file holding other types still be
// validated, and named in the error when one of those tensors is needed.
constexpr GgmlTypeInfo kTypes[] = {
    {0, "F32", 1, 4, true},          {1, "F16", 1, 2, true},
    {2, "Q4_0", 32, 18, true},       {3, "Q4_1", 32, 20, true},
    {6, "Q5_0", 32, 22, true},       {7, "Q5_1", 32, 24, true},
    {8, "Q8_0", 32, 34, true},       {9, "Q8_1", 32, 36, false},
    {10, "Q2_K", 256, 84, false},    {11, "Q3_K", 256, 110, false},
    {12, "Q4_K", 256, 144, true},    {13, "Q5_K", 256, 176, true},
    {14, "Q6_K", 256, 210, true},    {15, "Q8_K", 256, 292, false},
    {16, "IQ2_XXS", 256, 66, false}, {17, "IQ2_XS", 256, 74, false},
    {18, "IQ3_XXS", 256, 98, false}, {19, "IQ1_S", 256, 50, false},
    {20, "IQ4_NL", 32, 18, false},   {21, "IQ3_S", 256, 110, false},
    {22, "IQ2_S", 256, 82, false},   {23, "IQ4_XS", 256, 136, false},
    {24, "I8", 1, 1, false},         {25, "I16", 1, 2, false},
    {26, "I32", 1, 4, false},        {27, "I64", 1, 8, false},
    {28, "F64", 1, 8, false},        {29, "IQ1_M", 256, 56, false},
    {30, "BF16", 1, 2, true},        {34, "TQ1_0", 256, 54, false},
    {35, "TQ2_0", 256, 66, false},   {39, "MXFP4", 32, 17, false},
};

float half_at(const uint8_t* p) {
  return f16_to_f32(uint16_t(p[0] | (p[1] << 8)));
}

// Q4_0 [d f16][16 bytes]: low nibbles are values 0..15, high nibbles 16..31; value = d*(q-8).
void q4_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(int(qs[j] & 0xf) - 8);
    y[j + 16] = d * float(int(qs[j] >> 4) - 8);
  }
}

// Q4_1 [d f16][m f16][16 bytes]: value = d*q + m.
void q4_1(const uint8_t* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * float(qs[j] & 0xf) + m;
    y[j + 16] = d * float(qs[j] >> 4) + m;
  }
}

// Q5_0 [d f16][qh u32][16 bytes]: bit i of qh is the fifth bit of value i; value = d*(q-16).
// Q5_1 [d f16][m f16][qh u32][16 bytes]: value = d*q + m.
void q5(const uint8_t* b, float* y, bool with_min) {
  const float d = half_at(b);
  const float m = with_min ? half_at(b + 2) : 0.0f;
  const uint8_t* p = b + (with_min ? 4 : 2);
  uint32_t qh;
  std::memcpy(&qh, p, 4);
  const uint8_t* qs = p + 4;
  for (int j = 0; j < 16; ++j) {
    const int lo = int(qs[j] & 0xf) | int(((qh >> j) & 1u) << 4);
    const int hi = int(qs[j] >> 4) | int(((qh >> (j + 16)) & 1u) << 4);
    if (with_min) {
      y[j] = d * float(lo) + m;
      y[j + 16] = d * float(hi) + m;
    } else {
      y[j] = d * float(lo - 16);
      y[j + 16] = d * float(hi - 16);
    }
  }
}

// Q8_0 [d f16][32 x int8]: value = d*q.
void q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < 32; ++j) y[j] = d * float(int8_t(b[2 + j]));
}

// The 6-bit scale and min of sub-block j (0..7) from Q4_K / Q5_K's 12 packed bytes: bytes 0-3
// hold the scales of 0-3 (low 6 bits), bytes 4-7 their mins; sub-blocks 4-7 keep their low 4
// bits in the nibbles of bytes 8-11 and their top 2 bits in the top bits of bytes 0-7.
void scale_min_k4(int j, const uint8_t* q, float& scale, float& min) {
  if (j < 4) {
    scale = float(q[j] & 63);
    min = float(q[j + 4] & 63);
  } else {
    scale = float((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4));
    min = float((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Q4_K [d f16][dmin f16][12 scale bytes][128 bytes] and Q5_K [d f16][dmin f16][12 scale
// bytes][qh 32 bytes][128 bytes]: 8 sub-blocks of 32; each 32 quant bytes give two sub-blocks
// (low nibbles, then high nibbles); value = d*scale*q - dmin*min. Q5_K's fifth bit per value
// comes from qh: bit 2*chunk of qh[l] for the low-nibble value l, bit 2*chunk+1 for the high.
// `qh` is null for Q4_K.
void q4_q5_k(const uint8_t* b, const uint8_t* qh, const uint8_t* qs, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  for (int chunk = 0; chunk < 4; ++chunk) {
    float sc0, m0, sc1, m1;
    scale_min_k4(2 * chunk, scales, sc0, m0);
    scale_min_k4(2 * chunk + 1, scales, sc1, m1);
    const float d0 = d * sc0, mm0 = dmin * m0, d1 = d * sc1, mm1 = dmin * m1;
    for (int l = 0; l < 32; ++l) {
      const int lo = int(qs[l] & 0xf) + (qh ? ((qh[l] >> (2 * chunk)) & 1) << 4 : 0);
      const int hi = int(qs[l] >> 4) + (qh ? ((qh[l] >> (2 * chunk + 1)) & 1) << 4 : 0);
      y[l] = d0 * float(lo) - mm0;
      y[l + 32] = d1 * float(hi) - mm1;
    }
    qs += 32;
    y += 64;
  }
}

void q4_k(const uint8_t* b, float* y) {
  q4_q5_k(b, nullptr, b + 16, y);
}
void q5_k(const uint8_t* b, float* y) {
  q4_q5_k(b, b + 16, b + 48, y);
}

// Q6_K [ql 128 bytes][qh 64 bytes][16 x int8 scales][d f16]: two halves of 128 values. In a
// half, value l + 32k (l < 32, k = 0..3) has its low 4 bits in ql[l] (k = 0: low nibble, k = 2:
// high) or ql[l + 32] (k = 1: low, k = 3: high) and its top 2 bits in bits 2k, 2k+1 of qh[l];
// value = d * scale[l / 16 + 2k] * (q - 32).
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_at(b + 208);
  for (int half = 0; half < 2; ++half) {
    for (int l = 0; l < 32; ++l) {
      const int group = l / 16;
      const int q0 = int((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q1 = int((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q2 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q3 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * float(sc[group]) * float(q0);
      y[l + 32] = d * float(sc[group + 2]) * float(q1);
      y[l + 64] = d * float(sc[group + 4]) * float(q2);
      y[l + 96] = d * float(sc[group + 6]) * float(q3);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t id) {
  for (const GgmlTypeInfo& info : kTypes) {
    if (info.id == id) return &info;
  }
  return nullptr;
}

std::string ggml_type_name(uint32_t id) {
  const GgmlTypeInfo* info = ggml_type_info(id);
  return info ? std::string(info->name) : "type " + std::to_string(id);
}

std::string dequantizable_type_names() {
  std::string names;
  for (const GgmlTypeInfo& info : kTypes) {
    if (!info.dequantizable) continue;
    if (!names.empty()) names += ", ";
    names += info.name;
  }
  return names;
}

void require_dequantizable(uint32_t type, const std::string& source) {
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (info == nullptr || !info->dequantizable) {
    throw Error(source, "tensor type", "one of " + dequantizable_type_names(),
                ggml_type_name(type));
  }
}

void dequantize_to_f32(uint32_t type, const std::byte* src, int64_t count, float* dst,
                       const std::string& source) {
  require_dequantizable(type, source);
  const GgmlTypeInfo* info = ggml_type_info(type);
  if (count < 0 || count % info->block_elements != 0) {
    throw Error(
        source, "tensor size",
        "a multiple of " + std::to_string(info->block_elements) + " values for " + info->name,
        std::to_string(count));
  }
  const auto* bytes = reinterpret_cast<const uint8_t*>(src);
  const int64_t blocks = count / info->block_elements;
  const auto block_at = [&](int64_t i) { return bytes + i * info->block_bytes; };
  switch (type) {
    case 0:
      std::memcpy(dst, src, size_t(count) * 4);
      return;
    case 1:
      for (int64_t i = 0; i < count; ++i) dst[i] = half_at(bytes + 2 * i);
      return;
    case 30:
      for (int64_t i = 0; i < count; ++i) {
        dst[i] = bf16_to_f32(uint16_t(bytes[2 * i] | (bytes[2 * i + 1] << 8)));
      }
      return;
  }
  for (int64_t i = 0; i < blocks; ++i) {
    float* y = dst + i * info->block_elements;
    switch (type) {
      case 2:
        q4_0(block_at(i), y);
        break;
      case 3:
        q4_1(block_at(i), y);
        break;
      case 6:
        q5(block_at(i), y, false);
        break;
      case 7:
        q5(block_at(i), y, true);
        break;
      case 8:
        q8_0(block_at(i), y);
        break;
      case 12:
        q4_k(block_at(i), y);
        break;
      case 13:
        q5_k(block_at(i), y);
        break;
      case 14:
        q6_k(block_at(i), y);
        break;
    }
  }
}

}  // namespace kvlens
