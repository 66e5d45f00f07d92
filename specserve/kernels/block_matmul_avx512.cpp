// The block kernel of block_matmul.cpp for CPUs with AVX-512 (chosen at run time: the extension is
// compiled for AVX2, and only this file's kernel is built for AVX-512).
//
// A block of 32 weights is two 16-lane registers. Each block is dequantised once per call,
// w = d * q + m in fp32 (d * q is exact, at most 19 significant bits, so w is the GGUF value to
// the bit), and then costs each row two FMAs (the AVX2 build needs five: it keeps q as integers and
// scales per block). On a Xeon with AVX-512 that makes the marginal row ~1.4x cheaper at 4-16 rows
// (verify spans, decode batches) and one row a little faster.
//
// Same contract as the AVX2 build: every output is summed in one fixed order (two accumulators per
// row over the blocks, added, then one fixed reduction tree), whatever the number of rows or the split
// over threads, so a row's result does not depend on the rows beside it. The order differs from the
// AVX2 build's, so the two builds differ in the last bits; a process uses one of them throughout.
#include "ops.h"
#include "block_tile.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl")

namespace specserve {
namespace block {
namespace {

// 16 packed bytes -> 32 floats: low nibbles are elements 0..15, high nibbles 16..31 (GGML order).
inline void unpack_q4(const uint8_t* qs, __m512 q[2]) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  q[0] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(b, mask)));
  q[1] = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(b, 4), mask)));
}

inline void unpack_q8(const int8_t* qs, __m512 q[2]) {
  q[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
  q[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16))));
}

// Lane r (r < 8) of the result is the sum of v[r]'s 16 lanes, always as
// ((c0 + c2) + (c1 + c3)) with c_i = (v_i + v_{i+8}) + (v_{i+4} + v_{i+12}): one tree for every row,
// whichever other vectors share the call (rows past a tile's end are zeros and change nothing).
inline __m256 reduce8(const __m512 v[8]) {
  __m512 s[4], u[2];
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)  // [v_2i lanes j + j+8 | v_2i+1 lanes j + j+8], j < 8
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)  // one 128-bit lane per row: 4i, 4i+1, 4i+2, 4i+3
    u[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // In 128-bit lane L: [a0 + a2, b0 + b2, a1 + a3, b1 + b3] with a = row L, b = row 4 + L, then halves added.
  __m512 w = _mm512_add_ps(_mm512_unpacklo_ps(u[0], u[1]), _mm512_unpackhi_ps(u[0], u[1]));
  w = _mm512_add_ps(w, _mm512_permute_ps(w, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, w));
}

// Output column n for rows r0 .. r0+R-1 (R <= 8): per block, w = d * q + m once, then each row adds
// w . x into its two accumulators (elements 0..15 and 16..31 of every block).
template <int R, bool Q4>
inline void column(const Args& a, int64_t r0, int64_t n) {
  const uint8_t* qs = a.qs + n * a.row_bytes;
  const float* d = a.d + n * a.nblocks;
  const float* m = Q4 ? a.m + n * a.nblocks : nullptr;
  const float* x = a.x + r0 * a.K;
  __m512 lo[R], hi[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < a.nblocks; ++b) {
    __m512 w[2];
    if (Q4) unpack_q4(qs + b * (QK / 2), w);
    else unpack_q8(reinterpret_cast<const int8_t*>(qs) + b * QK, w);
    const __m512 db = _mm512_set1_ps(d[b]);
    if (Q4) {
      const __m512 mb = _mm512_set1_ps(m[b]);
      w[0] = _mm512_fmadd_ps(w[0], db, mb);
      w[1] = _mm512_fmadd_ps(w[1], db, mb);
    } else {
      w[0] = _mm512_mul_ps(w[0], db);
      w[1] = _mm512_mul_ps(w[1], db);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const float* xb = x + r * a.K + b * QK;
      lo[r] = _mm512_fmadd_ps(w[0], _mm512_loadu_ps(xb), lo[r]);
      hi[r] = _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xb + 16), hi[r]);
    }
  }
  __m512 v[8];
#pragma GCC unroll 8
  for (int r = 0; r < 8; ++r) v[r] = r < R ? _mm512_add_ps(lo[r], hi[r]) : _mm512_setzero_ps();
  alignas(32) float out[8];
  _mm256_store_ps(out, reduce8(v));
  for (int r = 0; r < R; ++r) a.y[(r0 + r) * a.N + n] = out[r];
}

template <int R, bool Q4>
void columns(const Args& a, int64_t r0, int64_t n0, int64_t n1, int64_t n_end) {
  for (int64_t n = n0; n < n1; ++n) {
    if (r0 == 0 && n + PREFETCH_COLUMNS < n_end) prefetch_column(a, n + PREFETCH_COLUMNS);
    column<R, Q4>(a, r0, n);
  }
}

constexpr int MAX_TILE_ROWS = 8;  // 2 R accumulators + 2 weight halves + scale + min: 20 of 32 registers

template <bool Q4, int R = MAX_TILE_ROWS>
void columns_rows(int rows, const Args& a, int64_t r0, int64_t n0, int64_t n1, int64_t n_end) {
  if constexpr (R > 1) {
    if (rows < R) return columns_rows<Q4, R - 1>(rows, a, r0, n0, n1, n_end);
  }
  columns<R, Q4>(a, r0, n0, n1, n_end);
}

template <bool Q4>
void run(const Args& a, int64_t M, int64_t n0, int64_t n1) {
  for_each_tile<MAX_TILE_ROWS>(M, n0, n1, [&](int rows, int64_t r0, int64_t g0, int64_t g1) {
    columns_rows<Q4>(rows, a, r0, g0, g1, n1);
  });
}

}  // namespace

void run_avx512(const Args& a, int64_t M, int64_t n0, int64_t n1, bool q4) {
  if (q4) run<true>(a, M, n0, n1);
  else run<false>(a, M, n0, n1);
}

}  // namespace block
}  // namespace specserve

#pragma GCC pop_options

namespace specserve {
namespace block {

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

}  // namespace block
}  // namespace specserve
