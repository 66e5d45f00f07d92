// The body of the int8-activation builds for 256-bit vectors (no AVX-512), over the same packed groups
// as q8_matmul_avx512.cpp: a group's 16 columns in two halves of 8 (one 32-bit lane each). Included by
// q8_matmul_avx2.cpp (VPMADDUBSW + VPMADDWD with ones in place of VPDPBUSD, and VPDPBUSD emulated) and
// q8_matmul_avxvnni.cpp (AVX-VNNI's VEX-encoded VPDPBUSD), each with its own dot policy D:
//   D::dot(acc, u, s)  acc plus the products of u's unsigned bytes and s's signed bytes, 4 a 32-bit lane
//                      (D::WIDE) or 2 a 16-bit lane (not D::WIDE: VPMADDUBSW's pairs, widened later);
// everything here is in an anonymous namespace, so each file compiles its own copy for its target.
// The integer sums are the same integers whatever D, and the float steps per sub-block those of
// q8_blocks.h in its order, so each output has the bits of q8_reference's.
//
// VPMADDUBSW saturates a pair of products at 16 bits: 4-, 5- and 6-bit values (at most 63 x 127 x 2)
// never reach it; Q8_0's weights are dotted signed instead (|w| against x with w's sign, as llama.cpp),
// which gives sum w x: the sum the VNNI build reaches as sum (w + 128) x - 128 sum x.
#pragma once

#include <utility>  // q8_matmul_avxvnni.cpp includes it first, before its target pragma

namespace specserve {
namespace q8 {
namespace {

constexpr int MAX_TILE_ROWS = 4;  // 16 registers: R integer sums + R outputs + decoded weights and scratch

inline __m256i load_half(const uint8_t* p, int h) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h)); }
inline __m256 halfs8(const uint8_t* p, int h) {  // 8 fp16 scales: columns 8h .. 8h+7
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
}
inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

template <int R>
struct Tile {
  const int8_t* q[R];
  int64_t r0;
  __m256 y[R];
};

// acc[r] += u . q[r][e .. e + 3] (u: unsigned bytes of at most 6 bits). With VPMADDUBSW (D::WIDE false)
// as pairs of 16-bit sums: a pair of products cannot saturate (63 x 127 x 2 < 2^15), and each caller
// adds at most as many pairs into a 16-bit lane as stay below 2^15 (the bound is beside each), so
// widening them later (widen) gives the same integers as widening each one: one VPMADDWD a sub-block
// instead of one a vector. With VPDPBUSD the sums are 32-bit already.
template <class D, int R>
inline void dot16(__m256i u, int64_t e, const Tile<R>& tl, __m256i acc[R]) {
  for (int r = 0; r < R; ++r) acc[r] = D::dot(acc[r], u, bcast4(tl.q[r] + e));
}

// acc[r]'s 16-bit pairs widened and summed per 32-bit lane, in place
template <class D, int R>
inline void widen(__m256i acc[R]) {
  if constexpr (!D::WIDE) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_madd_epi16(acc[r], ones);
  }
}

// Q8_0's weights are signed: |w| against x with w's sign (both instructions take one unsigned operand),
// with VPMADDUBSW widened every vector (a pair reaches 128 x 127 x 2).
template <class D, int R>
inline void dot_signed(__m256i w, int64_t e, const Tile<R>& tl, __m256i isum[R]) {
  const __m256i a = _mm256_sign_epi8(w, w);
  for (int r = 0; r < R; ++r) {
    const __m256i x = _mm256_sign_epi8(bcast4(tl.q[r] + e), w);
    if constexpr (D::WIDE) isum[r] = D::dot(isum[r], a, x);
    else isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(a, x), _mm256_set1_epi16(1)));
  }
}

template <int R, int G, int OFF, bool MIN>
inline void finish(const __m256i isum[R], int64_t e0, __m256 ws, __m256 wm, const Acts& a, Tile<R>& tl) {
  for (int r = 0; r < R; ++r) {
    const int64_t row = tl.r0 + r;
    __m256i s = isum[r];
    if constexpr (OFF != 0) {
      const int32_t* s16 = a.sr(row) + e0 / 16;
      s = _mm256_sub_epi32(s, _mm256_set1_epi32(OFF * (G == 32 ? s16[0] + s16[1] : s16[0])));
    }
    tl.y[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(ws, _mm256_set1_ps(a.dr(row)[e0 / 32])), tl.y[r]);
    if constexpr (MIN) tl.y[r] = _mm256_fmadd_ps(wm, _mm256_set1_ps(a.xsr(row)[e0 / 32]), tl.y[r]);
  }
}

template <int R>
inline void zero(__m256i v[R]) {
  for (int r = 0; r < R; ++r) v[r] = _mm256_setzero_si256();
}

// byte S % 4 of each 32-bit lane of v, as floats
template <int S>
inline __m256 byte_ps(__m256i v) {
  return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 8 * (S % 4)), _mm256_set1_epi32(0xFF)));
}

// Q4_K sub-block S (32 values: the low nibbles of vectors 8 (S / 2) .. +7 for even S, the high ones for
// odd S; 8 pairs a lane, at most 8 x 15 x 127 x 2 < 2^15), then its float steps.
template <class D, int S, int R>
inline void q4k_sub(const uint8_t* qs, int h, int64_t e, __m256 d, __m256 dmin, const __m256i sc[2], const __m256i mn[2],
                    const Acts& a, Tile<R>& tl) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i acc[R];
  zero<R>(acc);
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const __m256i v = load_half(qs + 64 * (8 * (S / 2) + k), h);
    dot16<D, R>(_mm256_and_si256(S % 2 ? _mm256_srli_epi16(v, 4) : v, low4), e + 32 * S + 4 * k, tl, acc);
  }
  widen<D, R>(acc);
  const __m256 ws = _mm256_mul_ps(d, byte_ps<S>(sc[S / 4]));
  const __m256 wm = _mm256_xor_ps(_mm256_mul_ps(dmin, byte_ps<S>(mn[S / 4])), _mm256_set1_ps(-0.0f));
  finish<R, 32, 0, true>(acc, e + 32 * S, ws, wm, a, tl);
}

template <class D, int R, int... S>
inline void q4k_subs(std::integer_sequence<int, S...>, const uint8_t* qs, int h, int64_t e, __m256 d, __m256 dmin,
                     const __m256i sc[2], const __m256i mn[2], const Acts& a, Tile<R>& tl) {
  (q4k_sub<D, S, R>(qs, h, e, d, dmin, sc, mn, a, tl), ...);
}

// One packed block, columns 8h .. 8h+7 of its group (the layout: q8_matmul.cpp's pack_block).
template <class D, int T, int R>
inline void block(const uint8_t* p, int h, int64_t e, const Acts& a, Tile<R>& tl) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256i isum[R];
  if constexpr (T == Q4_K) {
    const __m256 d = halfs8(p, h), dmin = halfs8(p + 32, h);
    const __m256i w0 = load_half(p + 64, h), w1 = load_half(p + 128, h), w2 = load_half(p + 192, h);
    const __m256i m1 = _mm256_set1_epi32(0x3f3f3f3f), m2 = _mm256_set1_epi32(0x0f0f0f0f), m3 = _mm256_set1_epi32(0x03030303);
    const __m256i sc[2] = {_mm256_and_si256(w0, m1),
                           _mm256_or_si256(_mm256_and_si256(w2, m2), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w0, 6), m3), 4))};
    const __m256i mn[2] = {_mm256_and_si256(w1, m1),
                           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), m2),
                                           _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(w1, 6), m3), 4))};
    q4k_subs<D, R>(std::make_integer_sequence<int, 8>{}, p + 256, h, e, d, dmin, sc, mn, a, tl);
  } else if constexpr (T == Q6_K) {
    // 16 sub-blocks of 16 values (4 vectors), decoded once, then dotted row by row; a lane takes two pairs
    // of products before widening (2 x 2 x 63 x 127 < 2^15)
    const __m256 d = halfs8(p, h);
    const uint8_t* sc = p + 32;
    const uint8_t* lo = p + 32 + 256;
    const uint8_t* hb = lo + 32 * 64;
    const __m256i top = _mm256_set1_epi8(0x30);
    for (int s = 0; s < 16; ++s) {
      const __m256i l0 = load_half(lo + 128 * s, h), l1 = load_half(lo + 128 * s + 64, h), hv = load_half(hb + 64 * s, h);
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(hv, 4), top)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(_mm256_slli_epi16(hv, 2), top)),
          _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(hv, top)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), _mm256_and_si256(_mm256_srli_epi16(hv, 2), top))};
      const int64_t e0 = e + 16 * s;
      for (int r = 0; r < R; ++r) {
        const int8_t* q = tl.q[r] + e0;
        if constexpr (D::WIDE) {
          isum[r] = D::dot(D::dot(D::dot(D::dot(_mm256_setzero_si256(), u[0], bcast4(q)), u[1], bcast4(q + 4)),
                                  u[2], bcast4(q + 8)), u[3], bcast4(q + 12));
        } else {
          const __m256i a01 = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], bcast4(q)), _mm256_maddubs_epi16(u[1], bcast4(q + 4)));
          const __m256i a23 = _mm256_add_epi16(_mm256_maddubs_epi16(u[2], bcast4(q + 8)), _mm256_maddubs_epi16(u[3], bcast4(q + 12)));
          const __m256i ones = _mm256_set1_epi16(1);
          isum[r] = _mm256_add_epi32(_mm256_madd_epi16(a01, ones), _mm256_madd_epi16(a23, ones));
        }
      }
      int64_t s8;
      std::memcpy(&s8, sc + 16 * s + 8 * h, 8);
      const __m256 ws = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_cvtsi64_si128(s8))));
      finish<R, 16, 32, false>(isum, e0, ws, ws, a, tl);
    }
  } else if constexpr (T == Q8_0) {
    zero<R>(isum);
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int k = 0; k < 8; ++k) dot_signed<D, R>(_mm256_xor_si256(load_half(p + 32 + 64 * k, h), flip), e + 4 * k, tl, isum);
    finish<R, 32, 0, false>(isum, e, halfs8(p, h), halfs8(p, h), a, tl);  // sum w x already: no offset
  } else {  // Q4_0 / Q4_1 / Q5_0 / Q5_1: 8 vectors a block, widened every 4 (4 x 31 x 127 x 2 < 2^15)
    constexpr bool five = T == Q5_0 || T == Q5_1, mn = T == Q4_1 || T == Q5_1;
    const __m256 ws = halfs8(p, h), wm = mn ? halfs8(p + 32, h) : ws;
    const uint8_t* masks = p + (mn ? 64 : 32);
    const uint8_t* v = masks + (five ? 64 : 0);
    const __m256i sixteen = _mm256_set1_epi8(0x10);
    __m256i acc[R];
#pragma GCC unroll 2
    for (int g = 0; g < 2; ++g) {  // the low nibbles (elements 4k..), then the high ones (16 + 4k..)
      zero<R>(acc);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m256i x = load_half(v + 64 * k, h);
        __m256i u = _mm256_and_si256(g ? _mm256_srli_epi16(x, 4) : x, low4);
        if constexpr (five) {
          uint32_t m;
          std::memcpy(&m, masks + 8 * (k + 4 * g) + 4 * h, 4);
          u = _mm256_or_si256(u, _mm256_and_si256(bits_to_bytes(m), sixteen));
        }
        dot16<D, R>(u, e + 16 * g + 4 * k, tl, acc);
      }
      widen<D, R>(acc);
      for (int r = 0; r < R; ++r) isum[r] = g ? _mm256_add_epi32(isum[r], acc[r]) : acc[r];
    }
    finish<R, 32, offset(T), mn>(isum, e, ws, wm, a, tl);
  }
}

template <class D, int T, int R>
void half_group(const PCall& c, const PSeg& s, int64_t g, int h, int64_t r0) {
  const int elems = block_elems(T), pbytes = LANES * block_bytes(T);
  const int64_t nb = c.K / elems;
  const uint8_t* p = s.data + g * nb * pbytes;
  Tile<R> tl;
  tl.r0 = r0;
  for (int r = 0; r < R; ++r) {
    tl.q[r] = c.a.qr(r0 + r);
    tl.y[r] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    if (h == 0 && r0 == 0) {  // the first pass over the group streams it in: 4 KB ahead (as the VNNI build)
      const uint8_t* ahead = p + b * pbytes + 4096;
      for (int off = 0; off < pbytes; off += 64) asm volatile("prefetcht0 %0" : : "m"(ahead[off]));
    }
    block<D, T, R>(p + b * pbytes, h, b * elems, c.a, tl);
  }
  const int64_t col = s.first + g * LANES + 8 * h, valid = std::min<int64_t>(8, s.rows - g * LANES - 8 * h);
  if (valid <= 0) return;
  alignas(32) float out[8];
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(out, tl.y[r]);
    std::memcpy(c.y + (r0 + r) * c.N + col, out, valid * sizeof(float));
  }
}

template <class D, int T>
void run_type(const PCall& c, const PSeg& s, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g)
    for (int h = 0; h < 2; ++h)
      for (int64_t r0 = 0; r0 < c.M; r0 += MAX_TILE_ROWS) {
        switch (std::min<int64_t>(MAX_TILE_ROWS, c.M - r0)) {
          case 1: half_group<D, T, 1>(c, s, g, h, r0); break;
          case 2: half_group<D, T, 2>(c, s, g, h, r0); break;
          case 3: half_group<D, T, 3>(c, s, g, h, r0); break;
          default: half_group<D, T, 4>(c, s, g, h, r0); break;
        }
      }
}

// Every type of segment `seg`, groups g0 .. g1-1, with the dot policy D.
template <class D>
void run(const PCall& c, int seg, int64_t g0, int64_t g1) {
  const PSeg& s = c.segs[seg];
  by_type(s.type, [&](auto t) { run_type<D, decltype(t)::value>(c, s, g0, g1); });
}

}  // namespace
}  // namespace q8
}  // namespace specserve
