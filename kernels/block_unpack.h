// The integer quants of GGML blocks, unpacked in element order: the one
// place that knows where each format keeps its bits (layouts in quant.h).
// DequantizeRow (quant.cc) scales them to floats; the dot products
// (matmul.cc) multiply them with quantized activations.
//
// Internal to kernels/. Stateless, header-only.
#ifndef PDSERVE_KERNELS_BLOCK_UNPACK_H_
#define PDSERVE_KERNELS_BLOCK_UNPACK_H_

#include <cstdint>

namespace pdserve::kernels::internal {

// Q4_0 / Q4_1: 16 bytes of nibbles -> 32 quants 0..15 (the low nibble of
// byte j is element j, the high nibble element j + 16).
inline void UnpackQ4(const uint8_t* qs, uint8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = qs[j] & 0x0F;
    q[j + 16] = qs[j] >> 4;
  }
}

// Q5_0 / Q5_1: nibbles as Q4 plus the fifth bit of element j in bit j of
// qh -> 32 quants 0..31.
inline void UnpackQ5(uint32_t qh, const uint8_t* qs, uint8_t* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<uint8_t>((qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10));
    q[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | ((qh >> (j + 12)) & 0x10));
  }
}

// Q4_K / Q5_K: the 6-bit scale and min of each of the eight 32-element
// sub-blocks, packed in 12 bytes (ggml's get_scale_min_k4, j = 0..7).
inline void UnpackScalesMinsK4(const uint8_t* s, int32_t* sc, int32_t* mn) {
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

// Q4_K: 128 bytes -> 256 quants 0..15; each 64 elements take the low
// nibbles of 32 bytes, then their high nibbles.
inline void UnpackQ4_K(const uint8_t* qs, uint8_t* q) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = qs[32 * c + l] & 0x0F;
      q[64 * c + 32 + l] = qs[32 * c + l] >> 4;
    }
  }
}

// Q5_K: as Q4_K, with the fifth bit of element 32 * i + l (sub-block i) in
// bit i of qh[l] -> 256 quants 0..31.
inline void UnpackQ5_K(const uint8_t* qh, const uint8_t* qs, uint8_t* q) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      q[64 * c + l] = static_cast<uint8_t>((qs[32 * c + l] & 0x0F) |
                                           (((qh[l] >> (2 * c)) & 1) << 4));
      q[64 * c + 32 + l] = static_cast<uint8_t>(
          (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4));
    }
  }
}

// Q6_K: 128 bytes of low nibbles and 64 of high bit pairs -> 256 quants
// 0..63 (the -32 offset not applied).
inline void UnpackQ6_K(const uint8_t* ql, const uint8_t* qh, uint8_t* q) {
  for (int h = 0; h < 2; ++h) {  // 128 elements from 64 ql and 32 qh bytes
    const uint8_t* l4 = ql + 64 * h;
    const uint8_t* h2 = qh + 32 * h;
    uint8_t* o = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      o[l] = static_cast<uint8_t>((l4[l] & 0x0F) | ((h2[l] & 3) << 4));
      o[l + 32] =
          static_cast<uint8_t>((l4[l + 32] & 0x0F) | (((h2[l] >> 2) & 3) << 4));
      o[l + 64] =
          static_cast<uint8_t>((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4));
      o[l + 96] =
          static_cast<uint8_t>((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4));
    }
  }
}

}  // namespace pdserve::kernels::internal

#endif  // PDSERVE_KERNELS_BLOCK_UNPACK_H_
