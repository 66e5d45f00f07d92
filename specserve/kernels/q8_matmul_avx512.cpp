// The int8-activation build for CPUs with AVX-512 VNNI, over weights regrouped by q8_pack: each 32-bit
// lane is one output column, so VPDPBUSD adds 4 products (4 weights of a column times the same 4
// activations, broadcast) into each column's lane, and a sub-block's integer sum ends in its column's
// lane with no horizontal reduction. The float steps per sub-block are those of q8_blocks.h, in its
// order, so each output has the bits of q8_reference's.
#include "ops.h"
#include "q8_blocks.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")

#include "q8_avx512.h"

namespace specserve {
namespace q8 {
namespace {

constexpr int MAX_TILE_ROWS = 8;
constexpr int64_t PREFETCH_BYTES = 4096;  // docs/decisions.md#q8-prefetch

using packed::halfs;
using packed::load;

inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <int R>
struct Tile {
  const int8_t* q[R];  // each row's quantised activations
  int64_t r0;
  __m512 y[R];
};

// isum[r] += u . q[r][e .. e + 3] in every column's lane
template <int R>
__attribute__((always_inline)) inline void dot(__m512i u, int64_t e, const Tile<R>& tl, __m512i isum[R]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) isum[r] = _mm512_dpbusd_epi32(isum[r], u, bcast4(tl.q[r] + e));
}

// The sub-block at element e0 of the row ends: y = fma(isum, ws d, y) (+ wm xs).
template <int R, bool MIN>
__attribute__((always_inline)) inline void finish(const __m512i isum[R], int64_t e0, __m512 ws, __m512 wm, const Acts& a,
                                                  Tile<R>& tl) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int64_t row = tl.r0 + r;
    tl.y[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(ws, _mm512_set1_ps(a.dr(row)[e0 / 32])), tl.y[r]);
    if constexpr (MIN) tl.y[r] = _mm512_fmadd_ps(wm, _mm512_set1_ps(a.xsr(row)[e0 / 32]), tl.y[r]);
  }
}

template <int R>
inline void zero(__m512i v[R]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) v[r] = _mm512_setzero_si512();
}

// A sub-block of G values at element e0 starts: isum = -OFF (the row's sum of q over it, the quantiser's
// sums per 16), exact.
template <int R, int G, int OFF>
__attribute__((always_inline)) inline void start(int64_t e0, const Acts& a, const Tile<R>& tl, __m512i isum[R]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int32_t* s16 = a.sr(tl.r0 + r) + e0 / 16;
    isum[r] = _mm512_set1_epi32(-OFF * (G == 32 ? s16[0] + s16[1] : s16[0]));
  }
}

// One packed block (16 columns' file blocks) at element e of the rows, for the tile's rows.
template <int T, int R>
__attribute__((always_inline)) inline void block(const uint8_t* p, int64_t e, const Acts& a, Tile<R>& tl) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512i isum[R];
  if constexpr (T == Q4_K) {
    const __m512 d = halfs(p), dmin = halfs(p + 32);
    const packed::K4Scales k4(p + 64);
    const uint8_t* qs = p + 256;
#pragma GCC unroll 1
    for (int j = 0; j < 4; ++j) {
      __m512i hi[R];
      zero<R>(isum);
      zero<R>(hi);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i v = load(qs + 64 * (8 * j + k));
        dot<R>(_mm512_and_si512(v, low4), e + 64 * j + 4 * k, tl, isum);
        dot<R>(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), e + 64 * j + 32 + 4 * k, tl, hi);
      }
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * j + h;
        finish<R, true>(h ? hi : isum, e + 32 * s, k4.scale(d, s), k4.min(dmin, s), a, tl);
      }
    }
  } else if constexpr (T == Q6_K) {
    const __m512 d = halfs(p);
    const uint8_t* sc = p + 32;
    const uint8_t* lo = p + 32 + 256;
    const uint8_t* hb = lo + 32 * 64;
#pragma GCC unroll 2
    for (int s = 0; s < 16; ++s) {
      __m512i v[4];
      packed::q6_vectors(lo, hb, s, v);
      const int64_t e0 = e + 16 * s;
      start<R, 16, 32>(e0, a, tl, isum);
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) dot<R>(v[k], e0 + 4 * k, tl, isum);
      const __m512 ws = packed::q6_scale(d, sc, s);
      finish<R, false>(isum, e0, ws, ws, a, tl);
    }
  } else if constexpr (T == Q8_0) {
    start<R, 32, 128>(e, a, tl, isum);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) dot<R>(load(p + 32 + 64 * k), e + 4 * k, tl, isum);
    finish<R, false>(isum, e, halfs(p), halfs(p), a, tl);
  } else {  // Q4_0 / Q4_1 / Q5_0 / Q5_1
    constexpr bool five = T == Q5_0 || T == Q5_1, mn = T == Q4_1 || T == Q5_1;
    const __m512 ws = halfs(p), wm = mn ? halfs(p + 32) : ws;
    const uint8_t* masks = p + (mn ? 64 : 32);
    const uint8_t* v = masks + (five ? 64 : 0);
    if constexpr (offset(T) != 0) start<R, 32, offset(T)>(e, a, tl, isum);
    else zero<R>(isum);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m512i lo, hi;
      packed::q45_vectors<five>(masks, v, k, &lo, &hi);
      dot<R>(lo, e + 4 * k, tl, isum);
      dot<R>(hi, e + 16 + 4 * k, tl, isum);
    }
    finish<R, mn>(isum, e, ws, wm, a, tl);
  }
}

template <int T, int R>
void group(const PCall& c, const PSeg& s, int64_t g, int64_t r0) {
  const int elems = block_elems(T), pbytes = LANES * block_bytes(T);
  const int64_t nb = c.K / elems;
  const uint8_t* p = s.data + g * nb * pbytes;
  Tile<R> tl;
  tl.r0 = r0;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    tl.q[r] = c.a.qr(r0 + r);
    tl.y[r] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    // a stream per thread: ask for the bytes PREFETCH_BYTES ahead (past this group's end too: groups
    // lie one after another); the hardware prefetcher alone reached about half the read bandwidth
    const uint8_t* ahead = p + b * pbytes + PREFETCH_BYTES;
    for (int off = 0; off < pbytes; off += 64) asm volatile("prefetcht0 %0" : : "m"(ahead[off]));
    block<T, R>(p + b * pbytes, b * elems, c.a, tl);
  }
  const int64_t col = s.first + g * LANES, valid = std::min<int64_t>(LANES, s.rows - g * LANES);
  const __mmask16 keep = valid == LANES ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1);
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(c.y + (r0 + r) * c.N + col, keep, tl.y[r]);
}

template <int T, int R = MAX_TILE_ROWS>
void group_rows(int rows, const PCall& c, const PSeg& s, int64_t g, int64_t r0) {
  if constexpr (R > 1) {
    if (rows < R) return group_rows<T, R - 1>(rows, c, s, g, r0);
  }
  group<T, R>(c, s, g, r0);
}

template <int T>
void run_type(const PCall& c, const PSeg& s, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t r0 = 0; r0 < c.M; r0 += MAX_TILE_ROWS)
      group_rows<T>(static_cast<int>(std::min<int64_t>(MAX_TILE_ROWS, c.M - r0)), c, s, g, r0);
}

}  // namespace

void run_vnni(const PCall& c, int seg, int64_t g0, int64_t g1) {
  const PSeg& s = c.segs[seg];
  by_type(s.type, [&](auto t) { run_type<decltype(t)::value>(c, s, g0, g1); });
}

}  // namespace q8
}  // namespace specserve

#pragma GCC pop_options

namespace specserve {
namespace q8 {
bool cpu_has_vnni() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni");
}
}  // namespace q8
}  // namespace specserve
