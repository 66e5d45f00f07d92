// The GGUF block kernel of gguf_matmul.cpp for CPUs with AVX-512 (chosen at run time): each chunk
// of 32 weights is decoded in two 16-lane registers to its exact fp32 values (the same values as
// gguf_blocks.h's decode_block), and each row then adds it into two accumulators with two FMAs
// (elements 0..15 and 16..31 of every chunk), added at the end: the order of every output's sum is
// the same whatever the number of rows beside it. A one-row pass is bound by the decoding (widening
// bytes and looking up values: shuffles), a pass of many rows by the FMAs, two per 32 weights a row.
#include "ops.h"
#include "gguf_blocks.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")

namespace specserve {
namespace gguf {
namespace {

constexpr int MAX_TILE_ROWS = 8;
constexpr int64_t GROUP = 16;
constexpr int64_t PREFETCH_COLUMNS = 4;

inline void prefetch_row(const uint8_t* p, int64_t bytes) {
  // Inline asm: GCC deletes loops of __builtin_prefetch as side-effect free (see block_tile.h).
  for (int64_t off = 0; off < bytes; off += 64) asm volatile("prefetcht0 %0" : : "m"(p[off]));
}

// 32 unsigned bytes -> two 16-lane float vectors (elements 0..15, 16..31).
__attribute__((always_inline)) inline void u8_to_ps(__m256i v, __m512 w[2]) {
  w[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_castsi256_si128(v)));
  w[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm256_extracti128_si256(v, 1)));
}

// Per row r: lo[r] += w[0] * x[r, off:off+16], hi[r] += w[1] * x[r, off+16:off+32] (acc = [lo | hi]).
template <int R>
__attribute__((always_inline)) inline void rows(const __m512 w[2], const float* x, int64_t K, int64_t off, __m512 acc[2 * R]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const float* xb = x + r * K + off;
    acc[r] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xb), acc[r]);
    acc[R + r] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xb + 16), acc[R + r]);
  }
}

// The 32-element formats: one chunk per block.
template <int T>
__attribute__((always_inline)) inline void decode32(const uint8_t* b, __m512 w[2]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (T == Q8_0) {
    const __m512 d = _mm512_set1_ps(fp16(b));
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
    w[0] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q))));
    w[1] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1))));
  } else {
    // Q4_0 / Q4_1 / Q5_0 / Q5_1: 16 bytes of nibbles (low: elements 0..15, high: 16..31), Q5's 32 high bits.
    constexpr bool five = T == Q5_0 || T == Q5_1, has_min = T == Q4_1 || T == Q5_1;
    const uint8_t* qs = b + (has_min ? 4 : 2) + (five ? 4 : 0);
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), low4);
    if constexpr (five) {
      uint32_t qh;
      std::memcpy(&qh, b + (has_min ? 4 : 2), 4);
      q = _mm256_mask_add_epi8(q, static_cast<__mmask32>(qh), q, _mm256_set1_epi8(0x10));
    }
    u8_to_ps(q, w);
    const __m512 d = _mm512_set1_ps(fp16(b));
    if constexpr (has_min) {
      const __m512 m = _mm512_set1_ps(fp16(b + 2));
      w[0] = _mm512_fmadd_ps(w[0], d, m);
      w[1] = _mm512_fmadd_ps(w[1], d, m);
    } else {
      // d (q - 16) = q d - 16 d: both terms exact and so is their difference (a small integer times d)
      const __m512 off = _mm512_mul_ps(d, _mm512_set1_ps(five ? -16.0f : -8.0f));
      w[0] = _mm512_fmadd_ps(w[0], d, off);
      w[1] = _mm512_fmadd_ps(w[1], d, off);
    }
  }
}

// One block: one chunk of 32 weights (Q4_0 .. Q8_0) or 8 (the k-quants), each handed to
// sink(w, offset of its first element in the row) decoded.
template <int T, class Sink>
__attribute__((always_inline)) inline void block(const uint8_t* b, int64_t e0, Sink&& sink) {
  __m512 w[2];
  if constexpr (T == Q4_K) {
    // 8 sub-blocks of 32; bytes 32j..32j+31 of qs hold sub-block 2j (low nibbles) and 2j+1 (high).
    // The 12 bytes of 6-bit scales and mins are unpacked once per block.
    uint32_t u[4];
    k4_scales_mins(b + 4, u);
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(u));
    alignas(64) float ds[8], ms[8];
    _mm256_store_ps(ds, _mm256_mul_ps(_mm256_set1_ps(fp16(b)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sm))));
    _mm256_store_ps(ms, _mm256_mul_ps(_mm256_set1_ps(-fp16(b + 2)),
                                      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8)))));
    // Each sub-block's 16 possible weights, d q - m for q = 0..15 (the reference's values), form a
    // table; a byte widened to 32 bits indexes it by its low nibble (permutexvar reads 4 bits), so a
    // chunk costs a widening and a permute per 16 weights, and the high nibbles one shift more.
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * j));
      const __m512i b0 = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(v));
      const __m512i b1 = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(v, 1));
      const __m512 lo = _mm512_fmadd_ps(iota, _mm512_set1_ps(ds[2 * j]), _mm512_set1_ps(ms[2 * j]));
      w[0] = _mm512_permutexvar_ps(b0, lo);
      w[1] = _mm512_permutexvar_ps(b1, lo);
      sink(w, e0 + 64 * j);
      const __m512 hi = _mm512_fmadd_ps(iota, _mm512_set1_ps(ds[2 * j + 1]), _mm512_set1_ps(ms[2 * j + 1]));
      w[0] = _mm512_permutexvar_ps(_mm512_srli_epi32(b0, 4), hi);
      w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(b1, 4), hi);
      sink(w, e0 + 64 * j + 32);
    }
  } else if constexpr (T == Q6_K) {
    // Two halves of 128; chunk c of a half: ql bytes 32 (c & 1).., nibble c >> 1, qh bits 2c, 2c+1.
    const float d = fp16(b + 208);
    const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(0x03);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b + 64 * h;
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * h;
      for (int c = 0; c < 4; ++c) {
        const __m256i l = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * (c & 1)));
        const __m256i lo = _mm256_and_si256(c >> 1 ? _mm256_srli_epi16(l, 4) : l, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), low2);
        u8_to_ps(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), w);
        // (d sc) (q - 32) = q (d sc) - 32 (d sc): d sc exact, both terms exact, and so is the
        // difference (at most 23 significant bits), as the reference's product
        const float s0 = d * sc[2 * c], s1 = d * sc[2 * c + 1];
        w[0] = _mm512_fmadd_ps(w[0], _mm512_set1_ps(s0), _mm512_set1_ps(-32.0f * s0));
        w[1] = _mm512_fmadd_ps(w[1], _mm512_set1_ps(s1), _mm512_set1_ps(-32.0f * s1));
        sink(w, e0 + 128 * h + 32 * c);
      }
    }
  } else {
    decode32<T>(b, w);
    sink(w, e0);
  }
}

template <int R, int T>
void columns(const Segment& s, int64_t c0, int64_t c1, int64_t c_end, const Call& c, int64_t r0) {
  constexpr int elems = T == Q4_K || T == Q6_K ? 256 : 32;
  const int bytes = block_bytes(T);
  const int64_t nb = c.K / elems;
  const float* x = c.x + r0 * c.K;
  for (int64_t col = c0; col < c1; ++col) {
    if (r0 == 0 && col + PREFETCH_COLUMNS < c_end) prefetch_row(s.data + (col + PREFETCH_COLUMNS) * s.row_bytes, s.row_bytes);
    const uint8_t* row = s.data + col * s.row_bytes;
    __m512 acc[2 * R];
#pragma GCC unroll 16
    for (int r = 0; r < 2 * R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b)
      block<T>(row + b * bytes, b * elems, [&](const __m512 w[2], int64_t off) { rows<R>(w, x, c.K, off, acc); });
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      c.y[(r0 + r) * c.N + s.first + col] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r], acc[R + r]));
  }
}

template <int T, int R = MAX_TILE_ROWS>
void columns_rows(int rows, const Segment& s, int64_t c0, int64_t c1, int64_t c_end, const Call& c, int64_t r0) {
  if constexpr (R > 1) {
    if (rows < R) return columns_rows<T, R - 1>(rows, s, c0, c1, c_end, c, r0);
  }
  columns<R, T>(s, c0, c1, c_end, c, r0);
}

template <int T>
void run_type(const Segment& s, int64_t a, int64_t b, const Call& c) {
  for (int64_t g = a; g < b; g += GROUP) {
    const int64_t g1 = std::min(g + GROUP, b);
    for (int64_t r0 = 0; r0 < c.M; r0 += MAX_TILE_ROWS)
      columns_rows<T>(static_cast<int>(std::min<int64_t>(MAX_TILE_ROWS, c.M - r0)), s, g - s.first, g1 - s.first,
                      b - s.first, c, r0);
  }
}

}  // namespace

void run_avx512(const Call& c, int64_t n0, int64_t n1) {
  for (int i = 0; i < c.nsegs; ++i) {
    const Segment& s = c.segs[i];
    const int64_t a = std::max(n0, s.first), b = std::min(n1, s.first + s.rows);
    if (a >= b) continue;
    switch (s.type) {
      case Q4_0: run_type<Q4_0>(s, a, b, c); break;
      case Q4_1: run_type<Q4_1>(s, a, b, c); break;
      case Q5_0: run_type<Q5_0>(s, a, b, c); break;
      case Q5_1: run_type<Q5_1>(s, a, b, c); break;
      case Q8_0: run_type<Q8_0>(s, a, b, c); break;
      case Q4_K: run_type<Q4_K>(s, a, b, c); break;
      case Q6_K: run_type<Q6_K>(s, a, b, c); break;
      default: break;
    }
  }
}

}  // namespace gguf
}  // namespace specserve

#pragma GCC pop_options
