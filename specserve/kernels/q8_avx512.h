// Reading q8_pack's packed blocks with AVX-512, for the two builds that do (q8_matmul_avx512.cpp dots
// the vectors with VPDPBUSD; q8_matmul_amx.cpp stores them as tile rows). Each 64-byte vector holds 4
// consecutive values of each of 16 columns, one 32-bit lane a column. Include it inside an AVX-512
// target region.
#pragma once
#include "q8_blocks.h"

namespace specserve {
namespace q8 {
namespace packed {

inline __m512i load(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline __m512 halfs(const uint8_t* p) {  // 16 fp16 scales, one per column
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Q4_K: the 12 bytes of 6-bit scales and mins (p + 64: three vectors), unpacked in every lane at once
// (gguf::k4_scale_min): sub-block s's is byte s % 4 of sc[s / 4] and mn[s / 4].
struct K4Scales {
  __m512i sc[2], mn[2];
  explicit K4Scales(const uint8_t* p) {
    const __m512i w0 = load(p), w1 = load(p + 64), w2 = load(p + 128);
    const __m512i m1 = _mm512_set1_epi32(0x3f3f3f3f), m2 = _mm512_set1_epi32(0x0f0f0f0f), m3 = _mm512_set1_epi32(0x03030303);
    sc[0] = _mm512_and_si512(w0, m1);
    sc[1] = _mm512_or_si512(_mm512_and_si512(w2, m2), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w0, 6), m3), 4));
    mn[0] = _mm512_and_si512(w1, m1);
    mn[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), m2), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(w1, 6), m3), 4));
  }
  static __m512 byte(__m512i v, int s) {  // as floats, one per column
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(v, 8 * (s % 4)), _mm512_set1_epi32(0xFF)));
  }
  __m512 scale(__m512 d, int s) const { return _mm512_mul_ps(d, byte(sc[s / 4], s)); }  // ws = d sc
  __m512 min(__m512 dmin, int s) const {  // wm = -(dmin m)
    return _mm512_xor_ps(_mm512_mul_ps(dmin, byte(mn[s / 4], s)), _mm512_set1_ps(-0.0f));
  }
};

// Q6_K sub-block s (16 values): its 4 vectors u = low nibble | two high bits << 4, steps 0..3, from the
// packed block's low-nibble area lo and high-bit area hb.
inline void q6_vectors(const uint8_t* lo, const uint8_t* hb, int s, __m512i v[4]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
  const __m512i l0 = load(lo + 128 * s), l1 = load(lo + 128 * s + 64), h = load(hb + 64 * s);
  v[0] = _mm512_or_si512(_mm512_and_si512(l0, low4), _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
  v[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), low4), _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
  v[2] = _mm512_or_si512(_mm512_and_si512(l1, low4), _mm512_and_si512(h, top));
  v[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), low4), _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
}

// Q6_K sub-block s's 16 column scales ws = d sc (sc: the 16 int8 scales of each sub-block, by column).
inline __m512 q6_scale(__m512 d, const uint8_t* sc, int s) {
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + 16 * s)))));
}

// Q4_0 / Q4_1 / Q5_0 / Q5_1 step k of 4: the vectors of elements 4k.. (lo) and 16 + 4k.. (hi), the fifth
// bits added from the 64-bit masks (Q5).
template <bool FIVE>
inline void q45_vectors(const uint8_t* masks, const uint8_t* v, int k, __m512i* lo, __m512i* hi) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i x = load(v + 64 * k);
  *lo = _mm512_and_si512(x, low4);
  *hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
  if constexpr (FIVE) {
    const __m512i sixteen = _mm512_set1_epi8(0x10);
    uint64_t ml, mh;
    std::memcpy(&ml, masks + 8 * k, 8);
    std::memcpy(&mh, masks + 8 * (k + 4), 8);
    *lo = _mm512_mask_add_epi8(*lo, _cvtu64_mask64(ml), *lo, sixteen);
    *hi = _mm512_mask_add_epi8(*hi, _cvtu64_mask64(mh), *hi, sixteen);
  }
}

}  // namespace packed
}  // namespace q8
}  // namespace specserve
